//! Reading committed revisions: one file, a byte range of a file, a byte range of the served tar,
//! or the tar of a subtree — all streamed chunk by chunk, each chunk verified on the way out.
//!
//! Entries come from the revision's manifest ([`super::manifest`]): its index is read once (and
//! kept in a small cache), a page at a time after that. A tar range starts at the page and entry
//! holding its first byte, then walks entries in path order; nothing is materialised.

use std::sync::Arc;

use super::chunks::ChunkRef;
use super::manifest::{decode_page, ChunkList, Manifest};
use super::tarfmt::{self, BLOCK};
use super::{FileEntry, Result, RevisionId, RevisionRecord, RevisionState, StorageError, Store};

/// A resolved, satisfiable byte range `[start, end)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RangeSpec {
    pub start: u64,
    pub end: u64,
}

/// Receives output bytes; returning an error (e.g. [`StorageError::Cancelled`]) stops the read.
pub type Sink<'a> = dyn FnMut(&[u8]) -> Result<()> + 'a;

/// Entries of a revision in path order, from some starting point, a page at a time.
pub struct FileListing {
    store: Store,
    manifest: Arc<Manifest>,
    next_page: usize,
    page: std::vec::IntoIter<FileEntry>,
    /// Entries before this path (or up to and including it, with `exclusive`) are skipped.
    skip_before: Option<(String, bool)>,
    prefix: String,
    failed: Option<StorageError>,
    done: bool,
}

impl FileListing {
    fn failed(store: &Store, error: StorageError) -> FileListing {
        FileListing {
            store: store.clone(),
            manifest: Arc::default(),
            next_page: 0,
            page: Vec::new().into_iter(),
            skip_before: None,
            prefix: String::new(),
            failed: Some(error),
            done: false,
        }
    }
}

impl Iterator for FileListing {
    type Item = Result<FileEntry>;
    fn next(&mut self) -> Option<Self::Item> {
        if let Some(e) = self.failed.take() {
            self.done = true;
            return Some(Err(e));
        }
        loop {
            if self.done {
                return None;
            }
            let Some(entry) = self.page.next() else {
                let Some(page) = self.manifest.pages.get(self.next_page) else {
                    self.done = true;
                    return None;
                };
                self.next_page += 1;
                match self.store.page(&page.chunk) {
                    Ok(entries) => self.page = entries.into_iter(),
                    Err(e) => {
                        self.done = true;
                        return Some(Err(e));
                    }
                }
                continue;
            };
            if let Some((start, exclusive)) = &self.skip_before {
                if entry.path < *start || (*exclusive && entry.path == *start) {
                    continue;
                }
                self.skip_before = None;
            }
            if !entry.path.starts_with(&self.prefix) {
                self.done = true;
                return None;
            }
            return Some(Ok(entry));
        }
    }
}

const ZEROS: [u8; BLOCK as usize] = [0; BLOCK as usize];

/// Where a reader of a revision's tar is: its manifest and the last page it decoded
/// ([`Store::read_tar_at`]).
pub struct TarCursor {
    rev: RevisionId,
    tar_size: u64,
    manifest: Option<Arc<Manifest>>,
    page: Option<(usize, Arc<Vec<FileEntry>>)>,
}

impl TarCursor {
    pub fn new(rev: RevisionId, tar_size: u64) -> TarCursor {
        TarCursor { rev, tar_size, manifest: None, page: None }
    }
}

impl Store {
    /// The record of a committed revision.
    pub fn revision(&self, id: RevisionId) -> Result<RevisionRecord> {
        let record = self.revision_record(id)?;
        if record.state != RevisionState::Committed {
            return Err(StorageError::NotFound(format!("revision {id}")));
        }
        Ok(record)
    }

    /// The decoded manifest index of a finalized revision.
    pub(super) fn manifest(&self, rev: RevisionId) -> Result<Arc<Manifest>> {
        let record = self.revision_record(rev)?;
        self.manifest_of(&record)
    }

    pub(super) fn manifest_of(&self, record: &RevisionRecord) -> Result<Arc<Manifest>> {
        let root = record.manifest_root()?;
        if let Some(manifest) = self.inner.manifests.get(&root.hash) {
            return Ok(manifest);
        }
        let (bytes, _) = self.get_chunk(&root)?;
        let manifest = Arc::new(Manifest::decode(&bytes)?);
        self.inner.manifests.put(root.hash, manifest.clone());
        Ok(manifest)
    }

    /// The entries of one manifest page.
    pub(super) fn page(&self, chunk: &ChunkRef) -> Result<Vec<FileEntry>> {
        decode_page(&self.get_chunk(chunk)?.0)
    }

    pub fn file(&self, rev: RevisionId, path: &str) -> Result<Option<FileEntry>> {
        let manifest = self.manifest(rev)?;
        let Some(page) = manifest.pages.get(manifest.page_for_path(path)) else { return Ok(None) };
        let entries = self.page(&page.chunk)?;
        Ok(entries.binary_search_by(|e| e.path.as_str().cmp(path)).ok().and_then(|i| entries.into_iter().nth(i)))
    }

    /// Entries whose path starts with `prefix` (all entries for `""`).
    pub fn files(&self, rev: RevisionId, prefix: &str) -> FileListing {
        self.listing(rev, prefix, prefix, false)
    }

    /// Entries under `prefix` from `start` on (after it, with `exclusive`), in path order.
    fn listing(&self, rev: RevisionId, prefix: &str, start: &str, exclusive: bool) -> FileListing {
        let manifest = match self.manifest(rev) {
            Ok(m) => m,
            Err(e) => return FileListing::failed(self, e),
        };
        FileListing {
            store: self.clone(),
            next_page: manifest.page_for_path(start),
            manifest,
            page: Vec::new().into_iter(),
            skip_before: Some((start.to_string(), exclusive)),
            prefix: prefix.to_string(),
            failed: None,
            done: false,
        }
    }

    /// Streams bytes `[start, end)` of a regular file. Returns the stored bytes of the chunks read.
    pub(super) fn for_each_chunk(&self, entry: &FileEntry, start: u64, end: u64, out: &mut Sink<'_>) -> Result<u64> {
        if start >= end {
            return Ok(0);
        }
        let short = || StorageError::Corrupt(format!("{}: chunk list shorter than the file", entry.path));
        match &entry.chunks {
            ChunkList::Inline(refs) => {
                let (stored, delivered) = self.stream_refs(refs, 0, start, end, out)?;
                if delivered < end {
                    return Err(short());
                }
                Ok(stored)
            }
            ChunkList::Segments(segments) => {
                // The segment containing `start` is the last one starting at or before it.
                let first = segments.partition_point(|(s, _)| *s <= start).saturating_sub(1);
                let mut stored = 0;
                for (segment_start, segment) in segments.get(first..).unwrap_or_default() {
                    let refs = ChunkRef::decode_all(&self.get_chunk(segment)?.0)?;
                    let (read, delivered) = self.stream_refs(&refs, *segment_start, start, end, out)?;
                    stored += read;
                    if delivered >= end {
                        return Ok(stored);
                    }
                }
                Err(short())
            }
            ChunkList::None | ChunkList::Staged { .. } => Err(short()),
        }
    }

    /// Streams the part of `[start, end)` covered by `refs`, whose first chunk starts at file
    /// offset `pos`. Returns the stored bytes read and the offset delivered up to.
    pub(super) fn stream_refs(
        &self,
        refs: &[ChunkRef],
        mut pos: u64,
        start: u64,
        end: u64,
        out: &mut Sink<'_>,
    ) -> Result<(u64, u64)> {
        let mut stored = 0u64;
        // A later segment starts past `start`: what came before it was delivered already.
        let mut delivered = start.max(pos);
        for chunk in refs {
            if delivered >= end {
                break;
            }
            let chunk_end = pos + chunk.len as u64;
            if chunk_end > delivered {
                let (data, share) = self.get_chunk(chunk)?;
                stored += share;
                let from = (delivered - pos) as usize;
                let to = (end.min(chunk_end) - pos) as usize;
                out(data.get(from..to).ok_or_else(|| StorageError::Corrupt("short chunk".into()))?)?;
                delivered = pos + to as u64;
            }
            pos = chunk_end;
        }
        Ok((stored, delivered.max(start.min(end))))
    }

    /// Streams bytes `[start, end)` of a regular file.
    pub fn read_file(&self, _rev: RevisionId, entry: &FileEntry, range: RangeSpec, out: &mut Sink<'_>) -> Result<()> {
        self.for_each_chunk(entry, range.start, range.end.min(entry.size), out).map(|_| ())
    }

    /// Streams bytes `[start, end)` of the revision's deterministic tar.
    pub fn read_tar(&self, rev: RevisionId, tar_size: u64, range: RangeSpec, out: &mut Sink<'_>) -> Result<()> {
        self.read_tar_at(&mut TarCursor::new(rev, tar_size), range, out)
    }

    /// [`Store::read_tar`] for a reader that goes on where it stopped: the cursor keeps the
    /// manifest and the page it was in, so consecutive ranges decode each page once.
    pub fn read_tar_at(&self, cursor: &mut TarCursor, range: RangeSpec, out: &mut Sink<'_>) -> Result<()> {
        let tar_size = cursor.tar_size;
        let end = range.end.min(tar_size);
        let mut pos = range.start;
        let manifest = match &cursor.manifest {
            Some(manifest) => manifest.clone(),
            None => cursor.manifest.insert(self.manifest(cursor.rev)?).clone(),
        };
        let mut index = manifest.page_for_tar_offset(pos);
        while pos < end {
            let Some(page) = manifest.pages.get(index) else { break };
            let entries = match &cursor.page {
                Some((at, entries)) if *at == index => entries.clone(),
                _ => cursor.page.insert((index, Arc::new(self.page(&page.chunk)?))).1.clone(),
            };
            // From the entry holding `pos` (the last one starting at or before it) on.
            let first = entries.partition_point(|e| e.tar_offset <= pos).saturating_sub(1);
            for entry in entries.get(first..).unwrap_or_default() {
                if pos >= end {
                    break;
                }
                pos = self.emit_entry(entry, pos, end, out)?;
            }
            if pos < end {
                index += 1;
            }
        }
        // The two zero blocks that end the archive.
        let trailer_start = tar_size - tarfmt::TRAILER_LEN;
        while pos < end {
            let from = pos.max(trailer_start);
            let n = (end - from).min(BLOCK);
            out(ZEROS.get(..n as usize).unwrap_or(&ZEROS))?;
            pos = from + n;
        }
        Ok(())
    }

    /// Entries under `prefix` whose path sorts after `after` (all of them for `None`), in path
    /// order: a listing resumed where an earlier step stopped.
    pub fn files_after(
        &self,
        rev: RevisionId,
        prefix: &str,
        after: Option<&str>,
    ) -> impl Iterator<Item = Result<FileEntry>> + '_ {
        match after {
            Some(after) if after >= prefix => self.listing(rev, prefix, after, true),
            _ => self.listing(rev, prefix, prefix, false),
        }
    }

    /// Length of `entry` in a tar (header, data, padding).
    pub fn entry_tar_len(entry: &FileEntry) -> u64 {
        tarfmt::header_len(&entry.header_spec()) + entry.tar_data_len()
    }

    /// Streams bytes `[from, to)` of `entry`'s tar form as if it started at offset 0: a subtree
    /// tar is these, one after the other, then [`tarfmt::TRAILER_LEN`] zero bytes.
    pub fn read_entry_tar(
        &self,
        _rev: RevisionId,
        entry: &FileEntry,
        from: u64,
        to: u64,
        out: &mut Sink<'_>,
    ) -> Result<()> {
        let mut relocated = entry.clone();
        relocated.tar_offset = 0;
        self.emit_entry(&relocated, from, to, out).map(|_| ())
    }

    /// Emits the part of `entry` (header, data, padding) that falls in `[pos, end)`; returns the
    /// position after it.
    fn emit_entry(&self, entry: &FileEntry, pos: u64, end: u64, out: &mut Sink<'_>) -> Result<u64> {
        let header = tarfmt::header_bytes(&entry.header_spec());
        let header_start = entry.tar_offset;
        let data_start = header_start + header.len() as u64;
        let data_end = data_start + entry.data_size();
        let entry_end = data_start + entry.tar_data_len();
        let mut pos = pos.max(header_start);
        if pos < data_start && pos < end {
            let to = data_start.min(end);
            let part = header.get((pos - header_start) as usize..(to - header_start) as usize);
            out(part.ok_or_else(|| StorageError::Corrupt(format!("{}: tar offsets", entry.path)))?)?;
            pos = to;
        }
        if pos < data_end && pos < end {
            let to = data_end.min(end);
            self.for_each_chunk(entry, pos - data_start, to - data_start, out)?;
            pos = to;
        }
        while pos < entry_end && pos < end {
            let to = entry_end.min(end).min(pos + BLOCK);
            out(ZEROS.get(..(to - pos) as usize).unwrap_or(&ZEROS))?;
            pos = to;
        }
        Ok(pos.max(entry_end.min(end)))
    }
}
