//! Staging of a revision being written, outside sled: entries and chunk lists go to files in
//! `staging/<revision>/`, and finalize reads them back in path order.
//!
//! Files arrive in archive order, the manifest wants path order, and neither the entries nor their
//! paths may be held in memory whole (a million-file archive). So entries are appended to
//! `entries`, their chunk refs to `refs`, and (path, entry offset) pairs are collected in a run
//! that is sorted and written out whenever it reaches [`RUN_BYTES`]; finalize merges the sorted
//! runs. The only per-entry memory is a 64-bit path hash → entry offset map (duplicate paths and
//! hard link targets are found through it), about 30 bytes an entry, which the file-count limit
//! bounds. A crash leaves the directory behind; the next open removes every staging directory.
//!
//! The bytes of chunks the store did not hold when they arrived go to the *spool*, a third file,
//! until finalize packs them in tar order; each staged chunk ref says where its bytes are spooled
//! (or that the store holds them). A chunk met twice is spooled twice (no per-chunk memory);
//! finalize stores it once.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::fs::File;
use std::hash::{BuildHasher, Hasher};
use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::chunks::{ChunkRef, CHUNK_REF_LEN};

/// A staged ref: the chunk, and where its bytes are in the spool (`None`: the store holds them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StagedRef {
    pub chunk: ChunkRef,
    pub spooled: Option<u64>,
}

const STAGED_REF_LEN: usize = CHUNK_REF_LEN + 8;
/// The spool offset of a ref whose chunk the store holds.
const IN_STORE: u64 = u64::MAX;
use super::manifest::{decode_entry, encode_entry, ChunkList, Cursor};
use super::{EntryKind, FileEntry, Result, RevisionId, StorageError};

/// Path bytes (plus a little per entry) collected in memory before a sorted run is written.
const RUN_BYTES: usize = 4 << 20;

/// The staging files of one revision.
pub struct Staging {
    dir: PathBuf,
    entries: BufWriter<File>,
    entries_len: u64,
    refs: BufWriter<File>,
    refs_len: u64,
    spool: BufWriter<File>,
    spool_len: u64,
    by_hash: HashMap<u64, u64>,
    /// Paths whose hash another path already has (practically never).
    collisions: HashMap<String, u64>,
    run: Vec<(String, u64)>,
    run_bytes: usize,
    runs: Vec<PathBuf>,
    hasher: std::collections::hash_map::RandomState,
    /// Finalize of a tar that came in path order reads both files front to back.
    entries_read: ReadWindow,
    refs_read: ReadWindow,
}

/// The staging directory of a revision under the store's `staging/` directory.
pub fn dir_of(root: &Path, rev: RevisionId) -> PathBuf {
    root.join(format!("{rev:016x}"))
}

impl Staging {
    pub fn create(dir: PathBuf) -> Result<Staging> {
        // A directory left by a crash of an earlier process with the same id cannot exist (ids are
        // never reused), but an empty start is cheap to guarantee.
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let open_with = |name: &str, buffer: usize| -> Result<BufWriter<File>> {
            let file = std::fs::OpenOptions::new().create_new(true).read(true).append(true).open(dir.join(name))?;
            Ok(BufWriter::with_capacity(buffer, file))
        };
        let open = |name: &str| open_with(name, 64 << 10);
        Ok(Staging {
            entries: open("entries")?,
            refs: open("refs")?,
            spool: open_with("spool", 256 << 10)?,
            dir,
            entries_len: 0,
            refs_len: 0,
            spool_len: 0,
            by_hash: HashMap::new(),
            collisions: HashMap::new(),
            run: Vec::new(),
            run_bytes: 0,
            runs: Vec::new(),
            hasher: std::collections::hash_map::RandomState::new(),
            entries_read: ReadWindow::default(),
            refs_read: ReadWindow::default(),
        })
    }

    fn hash_of(&self, path: &str) -> u64 {
        let mut h = self.hasher.build_hasher();
        h.write(path.as_bytes());
        h.finish()
    }

    /// Where the entry at `path` was staged, if it was.
    fn find(&mut self, path: &str) -> Result<Option<u64>> {
        if let Some(&offset) = self.collisions.get(path) {
            return Ok(Some(offset));
        }
        let Some(&offset) = self.by_hash.get(&self.hash_of(path)) else { return Ok(None) };
        let entry = self.read_entry(offset)?;
        Ok((entry.path == path).then_some(offset))
    }

    /// Refuses a path already staged.
    pub fn ensure_new(&mut self, path: &str) -> Result<()> {
        if self.find(path)?.is_some() {
            return Err(StorageError::DuplicatePath { path: path.into() });
        }
        Ok(())
    }

    /// Appends chunk refs of the file being written.
    pub fn push_refs(&mut self, refs: &[StagedRef]) -> Result<()> {
        let mut bytes = Vec::with_capacity(refs.len() * STAGED_REF_LEN);
        for r in refs {
            r.chunk.encode_into(&mut bytes);
            bytes.extend_from_slice(&r.spooled.unwrap_or(IN_STORE).to_le_bytes());
        }
        self.refs.write_all(&bytes)?;
        self.refs_len += bytes.len() as u64;
        Ok(())
    }

    /// Refs written so far (the start of the next file's list).
    pub fn refs_written(&self) -> u64 {
        self.refs_len / STAGED_REF_LEN as u64
    }

    /// Appends a chunk's bytes to the spool; returns where they are.
    pub fn spool(&mut self, bytes: &[u8]) -> Result<u64> {
        let at = self.spool_len;
        self.spool.write_all(bytes)?;
        self.spool_len += bytes.len() as u64;
        Ok(at)
    }

    /// Bytes spooled so far.
    #[cfg(test)]
    pub fn spooled_bytes(&self) -> u64 {
        self.spool_len
    }

    /// A spooled chunk's bytes, checked against its hash.
    pub fn read_spooled(&mut self, chunk: &ChunkRef, at: u64) -> Result<Vec<u8>> {
        self.spool.flush()?;
        let mut data = vec![0u8; chunk.len as usize];
        self.spool.get_ref().read_exact_at(&mut data, at)?;
        if blake3::hash(&data).as_bytes() != &chunk.hash {
            return Err(StorageError::Corrupt(format!(
                "spooled chunk {} does not match its hash",
                hex::encode(chunk.hash)
            )));
        }
        Ok(data)
    }

    /// Stages an entry (whose chunks, for a file, are `ChunkList::Staged`).
    pub fn add(&mut self, entry: &FileEntry) -> Result<()> {
        let mut record = Vec::with_capacity(96 + entry.path.len());
        encode_entry(entry, &mut record);
        let offset = self.entries_len;
        self.entries.write_all(&(record.len() as u32).to_le_bytes())?;
        self.entries.write_all(&record)?;
        self.entries_len += 4 + record.len() as u64;
        let hash = self.hash_of(&entry.path);
        match self.by_hash.entry(hash) {
            std::collections::hash_map::Entry::Occupied(_) => {
                self.collisions.insert(entry.path.clone(), offset);
            }
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(offset);
            }
        }
        self.run_bytes += entry.path.len() + 32;
        self.run.push((entry.path.clone(), offset));
        if self.run_bytes >= RUN_BYTES {
            self.write_run()?;
        }
        Ok(())
    }

    /// The staged regular file at `path` (a hard link's target).
    pub fn regular_file(&mut self, path: &str) -> Result<Option<FileEntry>> {
        let Some(offset) = self.find(path)? else { return Ok(None) };
        Ok(Some(self.read_entry(offset)?).filter(|e| e.kind == EntryKind::File))
    }

    fn write_run(&mut self) -> Result<()> {
        let mut run = std::mem::take(&mut self.run);
        self.run_bytes = 0;
        run.sort_unstable();
        let path = self.dir.join(format!("run-{}", self.runs.len()));
        let mut out = BufWriter::with_capacity(64 << 10, File::create(&path)?);
        for (p, offset) in &run {
            out.write_all(&(p.len() as u32).to_le_bytes())?;
            out.write_all(p.as_bytes())?;
            out.write_all(&offset.to_le_bytes())?;
        }
        out.flush()?;
        self.runs.push(path);
        Ok(())
    }

    /// Reads back the entry staged at `offset`.
    pub fn read_entry(&mut self, offset: u64) -> Result<FileEntry> {
        self.entries.flush()?;
        let file = self.entries.get_ref();
        let mut len = [0u8; 4];
        self.entries_read.read_exact_at(file, &mut len, offset)?;
        let mut record = vec![0u8; u32::from_le_bytes(len) as usize];
        self.entries_read.read_exact_at(file, &mut record, offset + 4)?;
        decode_entry(&mut Cursor::new(&record))
    }

    /// Reads `count` refs starting at ref index `first`.
    pub fn read_refs(&mut self, first: u64, count: u64) -> Result<Vec<StagedRef>> {
        self.refs.flush()?;
        let mut bytes = vec![0u8; usize::try_from(count).unwrap_or(usize::MAX).saturating_mul(STAGED_REF_LEN)];
        self.refs_read.read_exact_at(self.refs.get_ref(), &mut bytes, first * STAGED_REF_LEN as u64)?;
        let mut refs = Vec::with_capacity(bytes.len() / STAGED_REF_LEN);
        for record in bytes.chunks_exact(STAGED_REF_LEN) {
            let (chunk, spooled) = record.split_at(CHUNK_REF_LEN);
            let chunk = ChunkRef::decode_all(chunk)?.pop().ok_or_else(|| StorageError::Corrupt("staged ref".into()))?;
            let spooled = spooled.first_chunk::<8>().map_or(IN_STORE, |b| u64::from_le_bytes(*b));
            refs.push(StagedRef { chunk, spooled: (spooled != IN_STORE).then_some(spooled) });
        }
        Ok(refs)
    }

    /// Entry offsets in path order.
    pub fn sorted(&mut self) -> Result<Sorted> {
        self.entries.flush()?;
        if self.runs.is_empty() {
            let mut run = std::mem::take(&mut self.run);
            run.sort_unstable();
            return Ok(Sorted::Memory(run.into_iter()));
        }
        if !self.run.is_empty() {
            self.write_run()?;
        }
        let mut readers = Vec::with_capacity(self.runs.len());
        let mut heap = BinaryHeap::new();
        for (i, path) in self.runs.iter().enumerate() {
            let mut reader = BufReader::with_capacity(64 << 10, File::open(path)?);
            if let Some((p, offset)) = read_run_item(&mut reader)? {
                heap.push(Reverse((p, offset, i)));
            }
            readers.push(reader);
        }
        Ok(Sorted::Merge { readers, heap })
    }

    /// Removes the staging files.
    pub fn remove(&self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Bytes read ahead from a staging file while it is read in order, so that a walk of its
/// records costs a `pread` per [`WINDOW`] rather than one or two per record; reads out of order
/// are read as asked. The files are only appended to, so bytes once read stay true.
#[derive(Default)]
struct ReadWindow {
    start: u64,
    data: Vec<u8>,
    /// Where the last read ended, and how many reads in a row started there.
    next: u64,
    in_order: u32,
}

/// Bytes read ahead at once.
const WINDOW: usize = 32 << 10;
/// Reads in a row, each starting where the last ended, before reading ahead.
const IN_ORDER: u32 = 3;

impl ReadWindow {
    fn read_exact_at(&mut self, file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        let end = offset + buf.len() as u64;
        self.in_order = if offset == self.next { self.in_order.saturating_add(1) } else { 0 };
        self.next = end;
        let held = offset.checked_sub(self.start).and_then(|from| self.data.get(from as usize..)?.get(..buf.len()));
        if let Some(bytes) = held {
            buf.copy_from_slice(bytes);
            return Ok(());
        }
        if self.in_order < IN_ORDER || buf.len() >= WINDOW {
            return file.read_exact_at(buf, offset);
        }
        self.data.resize(WINDOW, 0);
        let mut got = 0;
        while let Some(rest) = self.data.get_mut(got..).filter(|rest| !rest.is_empty()) {
            match file.read_at(rest, offset + got as u64) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.data.clear();
                    return Err(e);
                }
            }
        }
        self.data.truncate(got);
        self.start = offset;
        match self.data.get(..buf.len()) {
            Some(bytes) => {
                buf.copy_from_slice(bytes);
                Ok(())
            }
            None => Err(std::io::ErrorKind::UnexpectedEof.into()),
        }
    }
}

fn read_run_item(reader: &mut BufReader<File>) -> Result<Option<(String, u64)>> {
    if reader.fill_buf()?.is_empty() {
        return Ok(None);
    }
    let mut len = [0u8; 4];
    reader.read_exact(&mut len)?;
    let mut path = vec![0u8; u32::from_le_bytes(len) as usize];
    reader.read_exact(&mut path)?;
    let mut offset = [0u8; 8];
    reader.read_exact(&mut offset)?;
    let path = String::from_utf8(path).map_err(|_| StorageError::Corrupt("staging run holds a bad path".into()))?;
    Ok(Some((path, u64::from_le_bytes(offset))))
}

/// Staged entry offsets in path order: one run sorted in memory, or a merge of runs on disk.
pub enum Sorted {
    Memory(std::vec::IntoIter<(String, u64)>),
    Merge { readers: Vec<BufReader<File>>, heap: BinaryHeap<Reverse<(String, u64, usize)>> },
}

impl Iterator for Sorted {
    type Item = Result<u64>;

    fn next(&mut self) -> Option<Result<u64>> {
        match self {
            Sorted::Memory(items) => items.next().map(|(_, offset)| Ok(offset)),
            Sorted::Merge { readers, heap } => {
                let Reverse((_, offset, run)) = heap.pop()?;
                let reader = readers.get_mut(run)?;
                match read_run_item(reader) {
                    Ok(Some((p, next))) => heap.push(Reverse((p, next, run))),
                    Ok(None) => {}
                    Err(e) => return Some(Err(e)),
                }
                Some(Ok(offset))
            }
        }
    }
}

impl ChunkList {
    /// The staged refs range of a staged file.
    pub fn staged(&self) -> Option<(u64, u64)> {
        match self {
            ChunkList::Staged { offset, count } => Some((*offset, *count)),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str) -> FileEntry {
        FileEntry {
            path: path.into(),
            kind: EntryKind::File,
            target: None,
            mode: 0o644,
            size: 1,
            sha256: "00".repeat(32),
            tar_offset: 0,
            chunks: ChunkList::Staged { offset: 0, count: 0 },
        }
    }

    #[test]
    fn entries_come_back_in_path_order_across_runs_and_duplicates_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut staging = Staging::create(dir.path().join("s")).unwrap();
        // Enough long paths for several runs.
        let pad = "p".repeat(2000);
        let mut expected: Vec<String> = (0..6000).map(|i| format!("{}/{pad}", (i * 7919) % 6000)).collect();
        for p in &expected {
            staging.add(&file(p)).unwrap();
        }
        assert!(staging.runs.len() >= 2, "the entries spilled into runs");
        assert!(staging.ensure_new(&expected[10]).is_err());
        assert!(staging.ensure_new("new").is_ok());
        assert_eq!(staging.regular_file(&expected[3]).unwrap().unwrap().path, expected[3]);
        expected.sort();
        let sorted: Vec<u64> = staging.sorted().unwrap().map(Result::unwrap).collect();
        let paths: Vec<String> = sorted.into_iter().map(|o| staging.read_entry(o).unwrap().path).collect();
        assert_eq!(paths, expected);
        staging.remove();
        assert!(!dir.path().join("s").exists());
    }

    /// Entries and refs read back in the order written (read ahead) and out of it, also after
    /// more were appended past what was read ahead: each comes back as staged.
    #[test]
    fn entries_and_refs_read_back_in_any_order_while_more_are_appended() {
        let dir = tempfile::tempdir().unwrap();
        let mut staging = Staging::create(dir.path().join("s")).unwrap();
        let refs_of = |i: u64| -> Vec<StagedRef> {
            (0..i % 5)
                .map(|k| StagedRef {
                    chunk: ChunkRef { hash: [(i * 5 + k) as u8; 32], len: (i * 100 + k) as u32 },
                    spooled: (k % 2 == 0).then_some(i * 1000 + k),
                })
                .collect()
        };
        let mut staged = Vec::new();
        let check = |staging: &mut Staging, staged: &[(u64, u64, String)], order: &mut dyn Iterator<Item = usize>| {
            for i in order {
                let (entry_at, refs_at, path) = &staged[i];
                assert_eq!(&staging.read_entry(*entry_at).unwrap().path, path);
                let refs = staging.read_refs(*refs_at, i as u64 % 5).unwrap();
                assert_eq!(refs, refs_of(i as u64), "refs of entry {i}");
            }
        };
        for round in 0..3 {
            for i in staged.len()..staged.len() + 700 {
                let path = format!("{round}/{i}/{}", "x".repeat(i % 300));
                let (entry_at, refs_at) = (staging.entries_len, staging.refs_written());
                staging.push_refs(&refs_of(i as u64)).unwrap();
                staging.add(&file(&path)).unwrap();
                staged.push((entry_at, refs_at, path));
            }
            check(&mut staging, &staged, &mut (0..staged.len()));
            check(&mut staging, &staged, &mut (0..staged.len()).rev());
            check(&mut staging, &staged, &mut (0..staged.len()).map(|i| (i * 7919) % staged.len()));
        }
    }
}
