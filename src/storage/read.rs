//! Reading committed revisions: one file, a byte range of a file, a byte range of the served tar,
//! or the tar of a subtree — all streamed chunk by chunk, each chunk verified on the way out.
//!
//! A tar range starts by looking up the entry containing its first byte in the `t` offset index,
//! then walks entries in path order; nothing is materialised.

use super::chunks::ChunkRef;
use super::revision::{file_key, segment_key, tar_index_key};
use super::tarfmt::{self, BLOCK};
use super::{be, key, read_be, FileEntry, Result, RevisionId, RevisionRecord, RevisionState, StorageError, Store};

/// A resolved, satisfiable byte range `[start, end)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RangeSpec {
    pub start: u64,
    pub end: u64,
}

/// Receives output bytes; returning an error (e.g. [`StorageError::Cancelled`]) stops the read.
pub type Sink<'a> = dyn FnMut(&[u8]) -> Result<()> + 'a;

/// Entries of a revision under a path prefix, in path order.
pub struct FileListing<'a> {
    iter: sled::Iter,
    _store: &'a Store,
}

impl Iterator for FileListing<'_> {
    type Item = Result<FileEntry>;
    fn next(&mut self) -> Option<Self::Item> {
        let item = self.iter.next()?;
        Some(item.map_err(StorageError::from).and_then(|(k, v)| FileEntry::decode(&k, &v)))
    }
}

const ZEROS: [u8; BLOCK as usize] = [0; BLOCK as usize];

impl Store {
    /// The record of a committed revision.
    pub fn revision(&self, id: RevisionId) -> Result<RevisionRecord> {
        let record = self.revision_record(id)?;
        if record.state != RevisionState::Committed {
            return Err(StorageError::NotFound(format!("revision {id}")));
        }
        Ok(record)
    }

    pub fn file(&self, rev: RevisionId, path: &str) -> Result<Option<FileEntry>> {
        self.tree().get(file_key(rev, path))?.map(|v| FileEntry::decode_at(path, &v)).transpose()
    }

    /// Entries whose path starts with `prefix` (all entries for `""`).
    pub fn files(&self, rev: RevisionId, prefix: &str) -> FileListing<'_> {
        FileListing { iter: self.tree().scan_prefix(file_key(rev, prefix)), _store: self }
    }

    /// Streams bytes `[start, end)` of a regular file. Returns the stored bytes of the chunks read.
    pub(super) fn for_each_chunk(
        &self,
        rev: RevisionId,
        entry: &FileEntry,
        start: u64,
        end: u64,
        out: &mut Sink<'_>,
    ) -> Result<u64> {
        if start >= end {
            return Ok(0);
        }
        let prefix = key(b'k', &[&be(rev), &be(entry.file_id)]);
        // The segment containing `start` is the last one starting at or before it.
        let first = self
            .tree()
            .range(prefix.clone()..=segment_key(rev, entry.file_id, start))
            .next_back()
            .transpose()?
            .map(|(k, _)| k)
            .ok_or_else(|| StorageError::Corrupt(format!("{}: no chunk list", entry.path)))?;
        let mut stored = 0u64;
        let mut delivered = start;
        for item in self.tree().range(first.to_vec()..segment_key(rev, entry.file_id, u64::MAX)) {
            let (k, v) = item?;
            let mut pos = read_be(k.get(prefix.len()..).unwrap_or_default())?;
            for chunk in ChunkRef::decode_all(&v)? {
                let chunk_end = pos + chunk.len as u64;
                if chunk_end > delivered {
                    let (data, share) = self.get_chunk(&chunk)?;
                    stored += share;
                    let from = (delivered - pos) as usize;
                    let to = (end.min(chunk_end) - pos) as usize;
                    out(data
                        .get(from..to)
                        .ok_or_else(|| StorageError::Corrupt(format!("{}: short chunk", entry.path)))?)?;
                    delivered = pos + to as u64;
                    if delivered >= end {
                        return Ok(stored);
                    }
                }
                pos = chunk_end;
            }
        }
        Err(StorageError::Corrupt(format!("{}: chunk list shorter than the file", entry.path)))
    }

    /// Streams bytes `[start, end)` of a regular file.
    pub fn read_file(&self, rev: RevisionId, entry: &FileEntry, range: RangeSpec, out: &mut Sink<'_>) -> Result<()> {
        self.for_each_chunk(rev, entry, range.start, range.end.min(entry.size), out).map(|_| ())
    }

    /// Streams bytes `[start, end)` of the revision's deterministic tar.
    pub fn read_tar(&self, rev: RevisionId, tar_size: u64, range: RangeSpec, out: &mut Sink<'_>) -> Result<()> {
        let end = range.end.min(tar_size);
        let mut pos = range.start;
        let first_path = self
            .tree()
            .range(tar_index_key(rev, 0)..=tar_index_key(rev, pos))
            .next_back()
            .transpose()?
            .map(|(_, path)| path);
        if let Some(path) = first_path {
            let path = String::from_utf8_lossy(&path).into_owned();
            for entry in self.entries_from(rev, &path) {
                if pos >= end {
                    break;
                }
                pos = self.emit_entry(rev, &entry?, pos, end, out)?;
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
        let prefix_key = file_key(rev, prefix);
        let start = match after {
            // The smallest key past `after`'s: its own key with a zero byte appended.
            Some(after) => {
                let mut start = file_key(rev, after);
                start.push(0);
                start.max(prefix_key.clone())
            }
            None => prefix_key.clone(),
        };
        self.tree()
            .range(start..)
            .take_while(move |item| item.as_ref().map_or(true, |(k, _)| k.starts_with(&prefix_key)))
            .map(|item| item.map_err(StorageError::from).and_then(|(k, v)| FileEntry::decode(&k, &v)))
    }

    /// Length of `entry` in a tar (header, data, padding).
    pub fn entry_tar_len(entry: &FileEntry) -> u64 {
        tarfmt::header_len(&entry.header_spec()) + entry.tar_data_len()
    }

    /// Streams bytes `[from, to)` of `entry`'s tar form as if it started at offset 0: a subtree
    /// tar is these, one after the other, then [`tarfmt::TRAILER_LEN`] zero bytes.
    pub fn read_entry_tar(
        &self,
        rev: RevisionId,
        entry: &FileEntry,
        from: u64,
        to: u64,
        out: &mut Sink<'_>,
    ) -> Result<()> {
        let mut relocated = entry.clone();
        relocated.tar_offset = 0;
        self.emit_entry(rev, &relocated, from, to, out).map(|_| ())
    }

    fn entries_from(&self, rev: RevisionId, path: &str) -> impl Iterator<Item = Result<FileEntry>> + '_ {
        self.tree()
            .range(file_key(rev, path)..key(b'f', &[&be(rev + 1)]))
            .map(|item| item.map_err(StorageError::from).and_then(|(k, v)| FileEntry::decode(&k, &v)))
    }

    /// Emits the part of `entry` (header, data, padding) that falls in `[pos, end)`; returns the
    /// position after it.
    fn emit_entry(&self, rev: RevisionId, entry: &FileEntry, pos: u64, end: u64, out: &mut Sink<'_>) -> Result<u64> {
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
            self.for_each_chunk(rev, entry, pos - data_start, to - data_start, out)?;
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
