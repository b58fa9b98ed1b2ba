//! Converting a store written before manifests: per-file sled keys become manifests, once, at open.
//!
//! The old layout kept, per revision, a `f` key per file (path → compact record), `k` keys with its
//! chunk-list segments and `t` keys indexing tar offsets, and per chunk `r` (reference count) and
//! `z` (sweep candidate) keys. Each committed revision's manifest is built from its `f` and `k`
//! keys (already in path order, with their tar offsets), recorded and flushed; only then are the
//! old keys deleted, in bounded batches. A crash in between leaves old keys that the next open
//! deletes; a revision whose manifest was recorded is not converted twice.

use super::chunks::{BlockBuilder, ChunkRef, Hash};
use super::manifest::{chunk_list, ChunkList, ManifestBuilder};
use super::objects::key_revision;
use super::revision::WriterChunks;
use super::{
    be, decode_json, encode_json, key, EntryKind, FileEntry, Result, RevisionRecord, RevisionState, StorageError, Store,
};

/// Kinds of the old per-file and per-chunk keys.
const OLD_KINDS: [u8; 5] = [b'f', b'k', b't', b'r', b'z'];
/// Keys deleted per batch.
const DELETE_BATCH: usize = 1024;

const FLAG_EXECUTABLE: u8 = 1;
const FLAG_SYMLINK: u8 = 2;
/// flags(1) size(8) sha256(32) file_id(8) tar_offset(8), then the symlink target.
const FILE_RECORD: usize = 1 + 8 + 32 + 8 + 8;

/// Decodes an old `f` record: the entry and the id of its chunk list.
fn decode_old_entry(path: &str, value: &[u8]) -> Result<(FileEntry, u64)> {
    let corrupt = || StorageError::Corrupt("undecodable file record".into());
    let (Some(&flags), Some(sha256), Some(rest)) = (value.first(), value.get(9..41), value.get(FILE_RECORD..)) else {
        return Err(corrupt());
    };
    let u64_at = |i: usize| value.get(i..).and_then(<[u8]>::first_chunk::<8>).map_or(0, |b| u64::from_le_bytes(*b));
    let target =
        if flags & FLAG_SYMLINK != 0 { Some(String::from_utf8(rest.to_vec()).map_err(|_| corrupt())?) } else { None };
    // What the old layout served: 0777 symlinks, 0755 files with the executable flag, else 0644;
    // so the converted revision's tar, and its digest, stay the same.
    let (kind, mode) = match (target.is_some(), flags & FLAG_EXECUTABLE != 0) {
        (true, _) => (EntryKind::Symlink, 0o777),
        (false, true) => (EntryKind::File, 0o755),
        (false, false) => (EntryKind::File, 0o644),
    };
    let entry = FileEntry {
        path: path.to_string(),
        kind,
        chunks: if target.is_some() { ChunkList::None } else { ChunkList::Inline(Vec::new()) },
        target,
        mode,
        size: u64_at(1),
        sha256: hex::encode(sha256),
        tar_offset: u64_at(49),
    };
    Ok((entry, u64_at(41)))
}

impl Store {
    /// Converts revisions of the old layout and removes its keys; nothing to do on a new store.
    pub(super) fn migrate(&self) -> Result<()> {
        if OLD_KINDS.iter().all(|k| self.tree().scan_prefix([*k]).next().is_none()) {
            return Ok(());
        }
        tracing::info!("converting the store's revisions to manifests (once)");
        let records: Vec<RevisionRecord> = self
            .tree()
            .scan_prefix(b"v")
            .map(|item| item.map(|(_, v)| v))
            .map(|v| v.and_then(|v| decode_json(&v)))
            .collect::<Result<_>>()?;
        let mut pinned: Vec<Hash> = Vec::new();
        for mut record in records {
            if record.state != RevisionState::Committed || !record.manifest.is_empty() {
                continue; // unfinished ones are released by recovery
            }
            let mut blocks = BlockBuilder::default();
            let mut meta = WriterChunks { store: self, blocks: &mut blocks, pinned: &mut pinned };
            let mut put = |bytes: &[u8]| meta.put(bytes);
            let mut manifest = ManifestBuilder::default();
            let prefix = key(b'f', &[&be(record.id)]);
            for item in self.tree().scan_prefix(&prefix) {
                let (k, v) = item?;
                let path = k.get(prefix.len()..).and_then(|p| std::str::from_utf8(p).ok());
                let path = path.ok_or_else(|| StorageError::Corrupt("undecodable file key".into()))?;
                let (mut entry, file_id) = decode_old_entry(path, &v)?;
                if entry.target.is_none() {
                    entry.chunks = chunk_list(self.old_chunk_list(record.id, file_id)?, &mut put)?;
                }
                manifest.push(&entry, &mut put)?;
            }
            let root = manifest.finish(&mut put)?;
            self.seal_block(&mut blocks)?;
            record.manifest = hex::encode(root.hash);
            record.manifest_len = root.len;
            self.tree().insert(key_revision(record.id), encode_json(&record))?;
        }
        self.flush()?;
        self.unpin_all(&pinned);
        for kind in OLD_KINDS {
            let mut batch = super::meta::Batch::default();
            let mut batched = 0;
            for k in self.tree().scan_prefix([kind]).map(|item| item.map(|(k, _)| k)) {
                batch.remove(k?);
                batched += 1;
                if batched == DELETE_BATCH {
                    self.tree().apply_batch(std::mem::take(&mut batch))?;
                    batched = 0;
                }
            }
            self.tree().apply_batch(batch)?;
        }
        self.flush()
    }

    /// The chunk list of an old-layout file, from its segments in order.
    fn old_chunk_list(&self, rev: u64, file_id: u64) -> Result<Vec<ChunkRef>> {
        let mut refs = Vec::new();
        for item in self.tree().scan_prefix(key(b'k', &[&be(rev), &be(file_id)])) {
            let (_, v) = item?;
            refs.extend(ChunkRef::decode_all(&v)?);
        }
        Ok(refs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::chunks::BlockBuilder;
    use crate::storage::tests::{noise, open};
    use crate::storage::{ObjectKey, ObjectWrite, Precondition, RangeSpec};

    /// Writes a two-file revision in the old layout, as the previous release did.
    fn write_old_revision(store: &Store, data: &[u8]) -> (u64, String) {
        let id = 7_000;
        let hash = *blake3::hash(data).as_bytes();
        let mut blocks = BlockBuilder::default();
        blocks.push(hash, data);
        store.seal_block(&mut blocks).unwrap();
        let tar_len = 512 + crate::storage::tarfmt::padded(data.len() as u64);
        let mut f = vec![FLAG_EXECUTABLE];
        f.extend_from_slice(&(data.len() as u64).to_le_bytes());
        f.extend_from_slice(&sha2::Sha256::digest(data));
        f.extend_from_slice(&1u64.to_le_bytes());
        f.extend_from_slice(&0u64.to_le_bytes());
        let mut link = vec![FLAG_SYMLINK];
        link.extend_from_slice(&0u64.to_le_bytes());
        link.extend_from_slice(&sha2::Sha256::digest(b"a.bin"));
        link.extend_from_slice(&2u64.to_le_bytes());
        link.extend_from_slice(&tar_len.to_le_bytes());
        link.extend_from_slice(b"a.bin");
        let mut segment = Vec::new();
        ChunkRef { hash, len: data.len() as u32 }.encode_into(&mut segment);
        let tree = store.tree();
        tree.insert(key(b'f', &[&be(id), b"a.bin"]), f).unwrap();
        tree.insert(key(b'f', &[&be(id), b"b.link"]), link).unwrap();
        tree.insert(key(b'k', &[&be(id), &be(1), &be(0)]), segment).unwrap();
        tree.insert(key(b't', &[&be(id), &be(0)]), &b"a.bin"[..]).unwrap();
        tree.insert(key(b'r', &[&hash]), &be(1)[..]).unwrap();
        let record = RevisionRecord {
            id,
            state: RevisionState::Committed,
            digest: String::new(),
            tar_size: tar_len + 512 + 1024,
            files: 2,
            size: data.len() as u64,
            stored_size: 0,
            writer: String::new(),
            manifest: String::new(),
            manifest_len: 0,
            frames: String::new(),
            frames_len: 0,
            frames_anchored: false,
            repacked: false,
        };
        tree.insert(key_revision(id), encode_json(&record)).unwrap();
        let attach = ObjectWrite::Put {
            key: ObjectKey::new("bundlecontents", "ns", "old"),
            object: serde_json::json!({"metadata": {"name": "old"}}),
            precondition: Precondition::MustNotExist,
            revision: None,
        };
        store.write_objects(vec![attach]).unwrap();
        store.flush().unwrap();
        (id, hex::encode(sha2::Sha256::digest(data)))
    }

    use sha2::Digest;

    #[test]
    fn a_store_of_the_old_layout_is_converted_and_serves_the_same_files() {
        let dir = tempfile::tempdir().unwrap();
        let data = noise(3, 200_000);
        let (id, sha) = {
            let store = open(dir.path());
            write_old_revision(&store, &data)
        };
        let store = open(dir.path());
        for kind in OLD_KINDS {
            assert_eq!(store.tree().scan_prefix([kind]).count(), 0, "old {} keys remain", kind as char);
        }
        let file = store.file(id, "a.bin").unwrap().expect("the file is listed");
        assert_eq!((file.kind, file.mode()), (EntryKind::File, 0o755), "the executable flag is mode 0755");
        assert_eq!(file.sha256, sha);
        let mut read = Vec::new();
        store
            .read_file(id, &file, RangeSpec { start: 0, end: data.len() as u64 }, &mut |b| {
                read.extend_from_slice(b);
                Ok(())
            })
            .unwrap();
        assert_eq!(read, data);
        let link = store.file(id, "b.link").unwrap().unwrap();
        assert_eq!((link.kind, link.target.as_deref()), (EntryKind::Symlink, Some("a.bin")));
        // Its chunks survive a collection: the manifest reaches them.
        drop(store);
        let store = open(dir.path());
        store.collect().unwrap();
        let file = store.file(id, "a.bin").unwrap().unwrap();
        store.read_file(id, &file, RangeSpec { start: 0, end: 10 }, &mut |_| Ok(())).unwrap();
    }
}
