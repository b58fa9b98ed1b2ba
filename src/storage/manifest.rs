//! Revision manifests: a finalized revision's entries, in path order, as checksummed pages stored
//! in the pack files like any other chunk — sled keeps one pointer per revision.
//!
//! Why: per-file sled keys (file record, tar index, chunk-list segments) made sled's share of the
//! data directory larger than the compressed content, and releasing a 1,000,000-file revision meant
//! deleting millions of keys. A page is a chunk: content-addressed (BLAKE3), compressed in a block
//! with its neighbours, verified on every read, deduplicated and collected like content.
//!
//! Layout (integers little-endian):
//! - *page*: `count(4)`, then `count` entries in path order (about [`PAGE_TARGET`] bytes).
//! - *entry*: `path_len(4) path kind(1) mode(4) size(8) sha256(32) tar_offset(8)`, then for a
//!   symlink `target_len(4) target`, for a regular file its chunk list (`list(1) n(4)` and `n`
//!   chunk refs inline, or `n` segments `start(8) hash(32) len(4)` each naming a chunk that holds
//!   up to [`SEGMENT_REFS`] refs), for a directory nothing.
//! - *index* (the root, the chunk the revision record names): `count(4)`, then per page
//!   `first_path_len(4) first_path first_tar_offset(8) hash(32) len(4)`.
//!
//! Tar order is path order, so the index answers both "which page holds this path" and "which page
//! holds this offset of the served tar" by binary search.

use std::sync::Arc;

use super::chunks::{ChunkRef, Hash, CHUNK_REF_LEN};
use super::{EntryKind, FileEntry, Result, StorageError, PERMISSION_BITS};

/// Raw bytes of entries collected before a page is closed.
pub const PAGE_TARGET: usize = 64 * 1024;
/// Chunk refs kept inside an entry; a longer list goes to segment chunks.
pub const INLINE_REFS: usize = 64;
/// Chunk refs per segment chunk (36 KiB).
pub const SEGMENT_REFS: usize = 1024;
/// Largest encoded entry (a file's segment list grows by 44 bytes per 32 MiB of it): a block holds
/// at most 4 MiB, so a single page must stay well under that.
const MAX_ENTRY: usize = 2 << 20;

const KIND_FILE: u8 = 0;
const KIND_SYMLINK: u8 = 1;
const KIND_DIRECTORY: u8 = 2;
const LIST_INLINE: u8 = 0;
const LIST_SEGMENTS: u8 = 1;
const LIST_STAGED: u8 = 2;

/// Where a regular file's chunk list is.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ChunkList {
    /// Symlinks and directories.
    #[default]
    None,
    Inline(Vec<ChunkRef>),
    /// Segment chunks in file order, each with the file offset its first chunk starts at.
    Segments(Vec<(u64, ChunkRef)>),
    /// While staged: `count` refs at `offset` of the writer's refs file ([`super::staging`]).
    Staged {
        offset: u64,
        count: u64,
    },
}

/// Decoding cursor over a byte slice; every read is checked.
pub(super) struct Cursor<'a> {
    bytes: &'a [u8],
}

fn corrupt() -> StorageError {
    StorageError::Corrupt("undecodable manifest page".into())
}

impl<'a> Cursor<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        Cursor { bytes }
    }

    pub fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let (head, rest) = self.bytes.split_at_checked(n).ok_or_else(corrupt)?;
        self.bytes = rest;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        self.take(N)?.try_into().map_err(|_| corrupt())
    }

    pub fn u8(&mut self) -> Result<u8> {
        Ok(self.array::<1>()?[0])
    }

    pub fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    pub fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    pub fn hash(&mut self) -> Result<Hash> {
        self.array()
    }

    pub fn string(&mut self) -> Result<String> {
        let len = self.u32()? as usize;
        String::from_utf8(self.take(len)?.to_vec()).map_err(|_| corrupt())
    }

    fn chunk_ref(&mut self) -> Result<ChunkRef> {
        Ok(ChunkRef { hash: self.hash()?, len: self.u32()? })
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u32).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// Appends `entry`'s encoding (see the module doc).
pub(super) fn encode_entry(entry: &FileEntry, out: &mut Vec<u8>) {
    put_str(out, &entry.path);
    let kind = match entry.kind {
        EntryKind::File => KIND_FILE,
        EntryKind::Symlink => KIND_SYMLINK,
        EntryKind::Directory => KIND_DIRECTORY,
    };
    out.push(kind);
    out.extend_from_slice(&entry.mode().to_le_bytes());
    out.extend_from_slice(&entry.size.to_le_bytes());
    let mut sha = [0u8; 32];
    // Our own hex from sha2; a malformed value cannot occur.
    let _ = hex::decode_to_slice(&entry.sha256, &mut sha);
    out.extend_from_slice(&sha);
    out.extend_from_slice(&entry.tar_offset.to_le_bytes());
    match entry.kind {
        EntryKind::Symlink => return put_str(out, entry.target.as_deref().unwrap_or_default()),
        EntryKind::Directory => return,
        EntryKind::File => {}
    }
    match &entry.chunks {
        ChunkList::None => {
            out.push(LIST_INLINE);
            out.extend_from_slice(&0u32.to_le_bytes());
        }
        ChunkList::Inline(refs) => {
            out.push(LIST_INLINE);
            out.extend_from_slice(&(refs.len() as u32).to_le_bytes());
            for r in refs {
                r.encode_into(out);
            }
        }
        ChunkList::Segments(segments) => {
            out.push(LIST_SEGMENTS);
            out.extend_from_slice(&(segments.len() as u32).to_le_bytes());
            for (start, r) in segments {
                out.extend_from_slice(&start.to_le_bytes());
                r.encode_into(out);
            }
        }
        ChunkList::Staged { offset, count } => {
            out.push(LIST_STAGED);
            out.extend_from_slice(&offset.to_le_bytes());
            out.extend_from_slice(&count.to_le_bytes());
        }
    }
}

/// Decodes one entry at the cursor.
pub(super) fn decode_entry(c: &mut Cursor<'_>) -> Result<FileEntry> {
    let path = c.string()?;
    let kind = c.u8()?;
    let mode = c.u32()?;
    let size = c.u64()?;
    let sha256 = hex::encode(c.hash()?);
    let tar_offset = c.u64()?;
    let (kind, target, chunks) = match kind {
        KIND_SYMLINK => (EntryKind::Symlink, Some(c.string()?), ChunkList::None),
        KIND_DIRECTORY => (EntryKind::Directory, None, ChunkList::None),
        KIND_FILE => {
            let list = match c.u8()? {
                LIST_INLINE => {
                    let n = c.u32()?;
                    ChunkList::Inline((0..n).map(|_| c.chunk_ref()).collect::<Result<_>>()?)
                }
                LIST_SEGMENTS => {
                    let n = c.u32()?;
                    ChunkList::Segments((0..n).map(|_| Ok((c.u64()?, c.chunk_ref()?))).collect::<Result<_>>()?)
                }
                LIST_STAGED => ChunkList::Staged { offset: c.u64()?, count: c.u64()? },
                _ => return Err(corrupt()),
            };
            (EntryKind::File, None, list)
        }
        _ => return Err(corrupt()),
    };
    let mode = mode & PERMISSION_BITS;
    Ok(FileEntry { path, kind, target, mode, size, sha256, tar_offset, chunks })
}

/// One page of a manifest, as the index names it.
#[derive(Clone, Debug)]
pub struct PageRef {
    pub first_path: String,
    pub first_tar_offset: u64,
    pub chunk: ChunkRef,
}

/// A revision's decoded index.
#[derive(Debug, Default)]
pub struct Manifest {
    pub pages: Vec<PageRef>,
}

impl Manifest {
    pub fn decode(bytes: &[u8]) -> Result<Manifest> {
        let mut c = Cursor::new(bytes);
        let count = c.u32()?;
        let pages = (0..count)
            .map(|_| Ok(PageRef { first_path: c.string()?, first_tar_offset: c.u64()?, chunk: c.chunk_ref()? }))
            .collect::<Result<Vec<_>>>()?;
        Ok(Manifest { pages })
    }

    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(4 + self.pages.len() * 80);
        out.extend_from_slice(&(self.pages.len() as u32).to_le_bytes());
        for p in &self.pages {
            put_str(&mut out, &p.first_path);
            out.extend_from_slice(&p.first_tar_offset.to_le_bytes());
            p.chunk.encode_into(&mut out);
        }
        out
    }

    /// The page that holds `path` if any page does: the last one starting at or before it.
    pub fn page_for_path(&self, path: &str) -> usize {
        self.pages.partition_point(|p| p.first_path.as_str() <= path).saturating_sub(1)
    }

    /// The page holding byte `offset` of the served tar.
    pub fn page_for_tar_offset(&self, offset: u64) -> usize {
        self.pages.partition_point(|p| p.first_tar_offset <= offset).saturating_sub(1)
    }
}

/// Decodes a page's entries.
pub(super) fn decode_page(bytes: &[u8]) -> Result<Vec<FileEntry>> {
    let mut c = Cursor::new(bytes);
    let count = c.u32()?;
    let entries = (0..count).map(|_| decode_entry(&mut c)).collect::<Result<Vec<_>>>()?;
    if !c.is_empty() {
        return Err(corrupt());
    }
    Ok(entries)
}

/// Builds a manifest from entries given in path order. Closed pages (and finally the index) are
/// handed to `store_chunk`, which stores them as chunks.
#[derive(Default)]
pub struct ManifestBuilder {
    page: Vec<u8>,
    page_entries: u32,
    first: Option<(String, u64)>,
    manifest: Manifest,
}

impl ManifestBuilder {
    pub fn push(&mut self, entry: &FileEntry, store_chunk: &mut dyn FnMut(&[u8]) -> Result<ChunkRef>) -> Result<()> {
        let mut encoded = Vec::new();
        encode_entry(entry, &mut encoded);
        if encoded.len() > MAX_ENTRY {
            return Err(StorageError::InvalidEntry {
                path: entry.path.clone(),
                reason: "the file is too large for one revision".into(),
            });
        }
        if self.page.len() + encoded.len() > PAGE_TARGET && self.page_entries > 0 {
            self.close_page(store_chunk)?;
        }
        if self.first.is_none() {
            self.first = Some((entry.path.clone(), entry.tar_offset));
        }
        self.page.extend_from_slice(&encoded);
        self.page_entries += 1;
        Ok(())
    }

    fn close_page(&mut self, store_chunk: &mut dyn FnMut(&[u8]) -> Result<ChunkRef>) -> Result<()> {
        let Some((first_path, first_tar_offset)) = self.first.take() else { return Ok(()) };
        let mut bytes = Vec::with_capacity(4 + self.page.len());
        bytes.extend_from_slice(&self.page_entries.to_le_bytes());
        bytes.append(&mut self.page);
        self.page_entries = 0;
        let chunk = store_chunk(&bytes)?;
        self.manifest.pages.push(PageRef { first_path, first_tar_offset, chunk });
        Ok(())
    }

    /// Closes the last page and stores the index; returns the index chunk.
    pub fn finish(mut self, store_chunk: &mut dyn FnMut(&[u8]) -> Result<ChunkRef>) -> Result<ChunkRef> {
        self.close_page(store_chunk)?;
        store_chunk(&self.manifest.encode())
    }
}

/// Splits a long chunk list into segment chunks (stored by `store_chunk`).
pub(super) fn chunk_list(
    refs: Vec<ChunkRef>,
    store_chunk: &mut dyn FnMut(&[u8]) -> Result<ChunkRef>,
) -> Result<ChunkList> {
    if refs.len() <= INLINE_REFS {
        return Ok(if refs.is_empty() { ChunkList::Inline(Vec::new()) } else { ChunkList::Inline(refs) });
    }
    let mut segments = Vec::with_capacity(refs.len().div_ceil(SEGMENT_REFS));
    let mut start = 0u64;
    for group in refs.chunks(SEGMENT_REFS) {
        let mut bytes = Vec::with_capacity(group.len() * CHUNK_REF_LEN);
        for r in group {
            r.encode_into(&mut bytes);
        }
        segments.push((start, store_chunk(&bytes)?));
        start += group.iter().map(|r| r.len as u64).sum::<u64>();
    }
    Ok(ChunkList::Segments(segments))
}

/// Decoded manifests of recently read revisions: a download or listing in steps looks its
/// revision up once per step.
#[derive(Default)]
pub struct ManifestCache {
    entries: std::sync::Mutex<std::collections::VecDeque<(Hash, Arc<Manifest>)>>,
}

const MANIFEST_CACHE_ENTRIES: usize = 16;

impl ManifestCache {
    pub fn get(&self, root: &Hash) -> Option<Arc<Manifest>> {
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.iter().find(|(key, _)| key == root).map(|(_, m)| m.clone())
    }

    pub fn put(&self, root: Hash, manifest: Arc<Manifest>) {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if entries.len() >= MANIFEST_CACHE_ENTRIES {
            entries.pop_front();
        }
        entries.push_back((root, manifest));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(path: &str, chunks: ChunkList) -> FileEntry {
        FileEntry {
            path: path.into(),
            kind: EntryKind::File,
            target: None,
            mode: 0o755,
            size: 7,
            sha256: "ab".repeat(32),
            tar_offset: 512,
            chunks,
        }
    }

    #[test]
    fn entries_round_trip_through_pages_and_index() {
        let mut stored: Vec<Vec<u8>> = Vec::new();
        let mut store = |bytes: &[u8]| {
            stored.push(bytes.to_vec());
            Ok(ChunkRef { hash: *blake3::hash(bytes).as_bytes(), len: bytes.len() as u32 })
        };
        let refs: Vec<ChunkRef> = (0..3000u32).map(|i| ChunkRef { hash: [i as u8; 32], len: 100 + i }).collect();
        let long = chunk_list(refs, &mut store).unwrap();
        let ChunkList::Segments(segments) = &long else { panic!("a long list goes to segments") };
        assert_eq!(segments.len(), 3);
        assert_eq!(segments[1].0, (0..1024u64).map(|i| 100 + i).sum::<u64>());
        let mut builder = ManifestBuilder::default();
        let mut expected = Vec::new();
        for i in 0..5000 {
            let mut e = entry(&format!("dir/{i:06}"), ChunkList::Inline(vec![]));
            e.tar_offset = i * 1024;
            if i == 17 {
                e.chunks = long.clone();
            }
            if i == 18 {
                (e.kind, e.target, e.mode) = (EntryKind::Symlink, Some("../x".into()), 0o777);
                e.chunks = ChunkList::None;
            }
            builder.push(&e, &mut store).unwrap();
            expected.push(e);
        }
        let root = builder.finish(&mut store).unwrap();
        let index = Manifest::decode(stored.last().unwrap()).unwrap();
        assert_eq!(root.len as usize, stored.last().unwrap().len());
        assert!(index.pages.len() > 2);
        let mut decoded = Vec::new();
        for p in &index.pages {
            let bytes = stored.iter().find(|b| blake3::hash(b).as_bytes() == &p.chunk.hash).unwrap();
            decoded.extend(decode_page(bytes).unwrap());
        }
        assert_eq!(decoded.len(), expected.len());
        for (d, e) in decoded.iter().zip(&expected) {
            assert_eq!((&d.path, &d.target, d.tar_offset, &d.chunks), (&e.path, &e.target, e.tar_offset, &e.chunks));
        }
        let second = &index.pages[1];
        assert_eq!(index.page_for_path(&second.first_path), 1);
        assert_eq!(index.page_for_path("dir/000000"), 0);
        assert_eq!(index.page_for_path("a"), 0);
        assert_eq!(index.page_for_tar_offset(second.first_tar_offset + 1), 1);
        assert!(decode_page(&stored[0][..10]).is_err());
    }
}
