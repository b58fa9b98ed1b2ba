//! Writing a revision: stream files in, cut them into chunks, then finalize into the served form.
//!
//! A revision is `Staging` while written. Entries (files, symlinks, directories) arrive in any
//! order; a file is chunked with FastCDC (content-defined, so an edit moves few cut points), its
//! chunk list written in segments of at most [`SEGMENT_CHUNKS`] references (small sled values, bounded writer memory). `finalize` walks the
//! entries in path order, assigns each its offset in the deterministic tar, and hashes that tar by
//! reading every chunk back (which also verifies them) — the digest. The revision becomes visible
//! only when an API object attaches it ([`PendingRevision::commit`]), after everything was flushed.

use std::io::Read;

use sha2::{Digest, Sha256};

use super::chunks::{BlockBuilder, ChunkRef, AVG_CHUNK, MAX_CHUNK, MIN_CHUNK};
use super::objects::key_revision;
use super::tarfmt::{self, padded};
use super::{
    be, encode_json, key, EntryKind, FileEntry, ObjectWrite, Result, RevisionId, RevisionRecord, RevisionState,
    StorageError, Store, WriteOutcome, PERMISSION_BITS,
};

/// Chunk references per segment record (36 bytes each: a 9 KiB sled value).
pub const SEGMENT_CHUNKS: usize = 256;
/// Entries per batch while finalizing.
const FINALIZE_BATCH: usize = 512;

pub(super) fn file_key(rev: RevisionId, path: &str) -> Vec<u8> {
    key(b'f', &[&be(rev), path.as_bytes()])
}

pub(super) fn segment_key(rev: RevisionId, file_id: u64, start: u64) -> Vec<u8> {
    key(b'k', &[&be(rev), &be(file_id), &be(start)])
}

pub(super) fn tar_index_key(rev: RevisionId, offset: u64) -> Vec<u8> {
    key(b't', &[&be(rev), &be(offset)])
}

/// Streams files into a new `Staging` revision. Dropping it without [`RevisionWriter::finalize`]
/// releases everything written.
pub struct RevisionWriter {
    store: Store,
    id: RevisionId,
    next_file_id: u64,
    open: bool,
    /// New chunks not yet sealed into a block.
    blocks: BlockBuilder,
}

impl Store {
    pub fn begin_revision(&self) -> Result<RevisionWriter> {
        self.ensure_space(super::WriteKind::Content)?;
        let id = self.inner.db.generate_id()?;
        let record = RevisionRecord {
            id,
            state: RevisionState::Staging,
            digest: String::new(),
            tar_size: 0,
            files: 0,
            size: 0,
            stored_size: 0,
        };
        self.tree().insert(key_revision(id), encode_json(&record))?;
        Ok(RevisionWriter { store: self.clone(), id, next_file_id: 0, open: true, blocks: BlockBuilder::default() })
    }

    /// Marks a revision for deletion; the collector frees its data.
    pub fn release_revision(&self, id: RevisionId) -> Result<()> {
        if let Ok(mut record) = self.revision_record(id) {
            record.state = RevisionState::Deleting;
            self.tree().insert(key_revision(id), encode_json(&record))?;
        }
        self.request_gc();
        Ok(())
    }
}

impl RevisionWriter {
    pub fn id(&self) -> RevisionId {
        self.id
    }

    /// Adds a regular file with permission bits `mode` (masked to 0o777), streaming `data`
    /// through the chunker.
    pub fn add_file(&mut self, path: &str, mode: u32, data: &mut dyn Read) -> Result<()> {
        self.ensure_new(path)?;
        let file_id = self.take_file_id();
        let mut sha = Sha256::new();
        let mut size = 0u64;
        let mut segment: Vec<ChunkRef> = Vec::with_capacity(SEGMENT_CHUNKS);
        let mut segment_start = 0u64;
        let chunker = fastcdc::v2020::StreamCDC::new(data, MIN_CHUNK as usize, AVG_CHUNK as usize, MAX_CHUNK as usize);
        for chunk in chunker {
            let chunk = match chunk {
                Ok(c) => c,
                Err(e) => {
                    self.store.unpin(&segment);
                    return Err(StorageError::Io(e.into()));
                }
            };
            sha.update(&chunk.data);
            size += chunk.length as u64;
            let hash = *blake3::hash(&chunk.data).as_bytes();
            let known = match self.store.pin_and_check(hash) {
                Ok(known) => known || self.blocks.contains(&hash),
                Err(e) => {
                    self.store.unpin(&segment);
                    return Err(e);
                }
            };
            segment.push(ChunkRef { hash, len: chunk.length as u32 });
            if !known {
                self.blocks.push(hash, &chunk.data);
                if self.blocks.is_full() {
                    if let Err(e) = self.store.seal_block(&mut self.blocks) {
                        self.store.unpin(&segment);
                        return Err(e);
                    }
                }
            }
            if segment.len() == SEGMENT_CHUNKS {
                let len: u64 = segment.iter().map(|c| c.len as u64).sum();
                self.write_segment(file_id, segment_start, &segment)?;
                segment_start += len;
                segment.clear();
            }
        }
        if !segment.is_empty() {
            self.write_segment(file_id, segment_start, &segment)?;
        }
        let entry = FileEntry {
            path: path.to_string(),
            kind: EntryKind::File,
            target: None,
            mode: mode & PERMISSION_BITS,
            size,
            sha256: hex::encode(sha.finalize()),
            file_id,
            tar_offset: 0,
        };
        self.store.tree().insert(file_key(self.id, path), entry.encode())?;
        Ok(())
    }

    pub fn add_symlink(&mut self, path: &str, target: &str) -> Result<()> {
        self.ensure_new(path)?;
        let entry = FileEntry {
            path: path.to_string(),
            kind: EntryKind::Symlink,
            target: Some(target.to_string()),
            mode: 0o777,
            size: 0,
            sha256: hex::encode(Sha256::digest(target.as_bytes())),
            file_id: self.take_file_id(),
            tar_offset: 0,
        };
        self.store.tree().insert(file_key(self.id, path), entry.encode())?;
        Ok(())
    }

    /// Adds a directory the archive names (an empty one included), with permission bits `mode`
    /// (masked to 0o777). Its path is stored with a trailing `/`, so it sorts right before its
    /// contents and never collides with a file's key.
    pub fn add_dir(&mut self, path: &str, mode: u32) -> Result<()> {
        let path = format!("{}/", path.trim_end_matches('/'));
        self.ensure_new(&path)?;
        let entry = FileEntry {
            path: path.clone(),
            kind: EntryKind::Directory,
            target: None,
            mode: mode & PERMISSION_BITS,
            size: 0,
            sha256: hex::encode(Sha256::digest(b"")),
            file_id: self.take_file_id(),
            tar_offset: 0,
        };
        self.store.tree().insert(file_key(self.id, &path), entry.encode())?;
        Ok(())
    }

    /// Adds `path` as a copy of the earlier regular file `target` (sharing its chunks); returns
    /// the copy's size.
    pub fn add_hardlink(&mut self, path: &str, target: &str) -> Result<u64> {
        self.ensure_new(path)?;
        let invalid = |reason: &str| StorageError::InvalidEntry { path: path.into(), reason: reason.into() };
        let source: FileEntry = match self.store.tree().get(file_key(self.id, target))? {
            Some(v) => FileEntry::decode_at(target, &v)?,
            None => return Err(invalid("hard link target is not an earlier file of the archive")),
        };
        if source.kind != EntryKind::File {
            return Err(invalid("hard link target is not a regular file"));
        }
        let file_id = self.take_file_id();
        let prefix = key(b'k', &[&be(self.id), &be(source.file_id)]);
        for item in self.store.tree().scan_prefix(&prefix) {
            let (k, v) = item?;
            let start = super::read_be(k.get(prefix.len()..).unwrap_or_default())?;
            let refs = ChunkRef::decode_all(&v)?;
            let mut batch = sled::Batch::default();
            batch.insert(segment_key(self.id, file_id, start), v.to_vec());
            // The source file's references keep these chunks alive: no pins needed.
            self.store.record_refs(batch, &refs, 1, &[])?;
        }
        let entry = FileEntry { path: path.to_string(), file_id, ..source };
        self.store.tree().insert(file_key(self.id, path), entry.encode())?;
        Ok(entry.size)
    }

    /// Computes tar offsets and the digest, flushes, and hands back the revision ready to attach.
    pub fn finalize(mut self) -> Result<PendingRevision> {
        let store = self.store.clone();
        store.seal_block(&mut self.blocks)?;
        let id = self.id;
        let mut offset = 0u64;
        let mut tar_hash = Sha256::new();
        let (mut files, mut size, mut stored) = (0u64, 0u64, 0u64);
        let mut batch = sled::Batch::default();
        let mut batched = 0;
        for item in store.tree().scan_prefix(key(b'f', &[&be(id)])) {
            let (k, v) = item?;
            let mut entry = FileEntry::decode(&k, &v)?;
            entry.tar_offset = offset;
            let header = tarfmt::header_bytes(&entry.header_spec());
            tar_hash.update(&header);
            if entry.kind == EntryKind::File {
                stored += store.for_each_chunk(id, &entry, 0, entry.size, &mut |bytes| {
                    tar_hash.update(bytes);
                    Ok(())
                })?;
                let pad = padded(entry.size) - entry.size;
                tar_hash.update([0u8; tarfmt::BLOCK as usize].get(..pad as usize).unwrap_or_default());
            }
            batch.insert(tar_index_key(id, offset), entry.path.as_bytes());
            offset += header.len() as u64 + entry.tar_data_len();
            // Files and symlinks: what `status.files` counts (directories hold no content).
            files += u64::from(!entry.is_dir());
            size += entry.size;
            batch.insert(k, entry.encode());
            batched += 1;
            if batched == FINALIZE_BATCH {
                store.tree().apply_batch(std::mem::take(&mut batch))?;
                batched = 0;
            }
        }
        tar_hash.update([0u8; tarfmt::TRAILER_LEN as usize]);
        let record = RevisionRecord {
            id,
            state: RevisionState::Staging,
            digest: format!("sha256:{}", hex::encode(tar_hash.finalize())),
            tar_size: offset + tarfmt::TRAILER_LEN,
            files,
            size,
            stored_size: stored,
        };
        batch.insert(key_revision(id), encode_json(&record));
        store.tree().apply_batch(batch)?;
        store.flush()?;
        self.open = false;
        Ok(PendingRevision { store, record, armed: true })
    }

    /// Leaves the revision `Staging` as a crash would (tests of recovery).
    #[cfg(test)]
    pub fn simulate_crash(mut self) {
        self.open = false;
    }

    fn ensure_new(&self, path: &str) -> Result<()> {
        if self.store.tree().contains_key(file_key(self.id, path))? {
            return Err(StorageError::InvalidEntry { path: path.into(), reason: "duplicate path".into() });
        }
        Ok(())
    }

    fn take_file_id(&mut self) -> u64 {
        self.next_file_id += 1;
        self.next_file_id
    }

    fn write_segment(&self, file_id: u64, start: u64, refs: &[ChunkRef]) -> Result<()> {
        let mut value = Vec::with_capacity(refs.len() * super::chunks::CHUNK_REF_LEN);
        for r in refs {
            r.encode_into(&mut value);
        }
        let mut batch = sled::Batch::default();
        batch.insert(segment_key(self.id, file_id, start), value);
        self.store.record_refs(batch, refs, 1, refs)
    }
}

impl Drop for RevisionWriter {
    fn drop(&mut self) {
        if self.open {
            if let Err(e) = self.store.release_revision(self.id) {
                tracing::warn!(revision = self.id, error = %e, "could not release an abandoned revision");
            }
        }
    }
}

/// A finalized revision not yet attached to any object. Dropping it releases the revision.
pub struct PendingRevision {
    store: Store,
    record: RevisionRecord,
    armed: bool,
}

impl PendingRevision {
    pub fn record(&self) -> &RevisionRecord {
        &self.record
    }

    /// Applies `writes`, which must attach this revision to an object (`ObjectWrite::Put` with
    /// `revision: Some(id)`), atomically making it visible. On failure the revision is released.
    pub fn commit(&mut self, writes: Vec<ObjectWrite>) -> Result<WriteOutcome> {
        let outcome = self.store.write_objects(writes)?;
        self.armed = false;
        Ok(outcome)
    }
}

impl Drop for PendingRevision {
    fn drop(&mut self) {
        if self.armed {
            if let Err(e) = self.store.release_revision(self.record.id) {
                tracing::warn!(revision = self.record.id, error = %e, "could not release an unused revision");
            }
        }
    }
}
