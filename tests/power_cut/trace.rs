//! The trace the shim (shim.c) writes, and the directory a power cut at any point of it leaves.
//!
//! # Crash-state model
//!
//! A power cut after the first `p` operations of the trace leaves:
//!
//! - **File data**: each file holds every write (and truncation) made before the *start* of its
//!   last sync (fsync or fdatasync) that *returned* successfully before the cut. A sync covers
//!   only what was written before it began, and promises nothing until it returns. Later writes are
//!   lost — or, in the "extra" mode, each kept with probability 1/2 and a kept one torn to a
//!   512-byte-aligned prefix with probability 1/4 (the page cache may have written back any of
//!   them, partly): also a legal crash state.
//! - **Directory entries** (create, rename, unlink, mkdir, rmdir), two models:
//!   - *strict* (POSIX), for the store's own directories (the data directory, `packs/`): an entry
//!     operation is durable only once an fsync of its directory (both directories for a rename)
//!     that began after it has returned. Others are lost, or in the "extra" mode each kept with
//!     probability 1/2.
//!   - *journaled* (ext4, xfs), for sled's directory (`db/`, whose file names sled manages
//!     without directory fsyncs): metadata operations reach the disk in order, with the journal
//!     commit of the next sync of any file; so every one before the start of the last returned
//!     sync is durable, and in the "extra" mode a random number of the following ones too (a
//!     prefix: a journal keeps order).
//!
//!   Kept operations are replayed in order; one whose parent directory or source is missing does
//!   nothing (a file whose creation was lost is gone, whatever of its data was synced).
//!
//! Strict is harsher than what ext4 does for the store's directories (ext4 commits every earlier
//! metadata change with any fsync), so a store that survives it survives ext4.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::path::Path;

use crate::rng::Rng;

/// One operation, in trace order. Data is a range of [`Trace::bytes`].
#[derive(Debug, Clone)]
pub enum Op {
    Create { fid: u32, path: String },
    Write { fid: u32, offset: u64, data: Range<usize> },
    Trunc { fid: u32, len: u64 },
    SyncBegin { id: u32, fid: u32, dir: bool, path: String },
    SyncEnd { id: u32, errno: u32 },
    Rename { from: String, to: String },
    Unlink { path: String },
    Mkdir { path: String },
    Rmdir { path: String },
    Mark { data: Range<usize> },
}

/// A sync: where it began and, if it returned successfully, where.
#[derive(Debug, Clone)]
pub struct Sync {
    pub begin: usize,
    pub end: Option<usize>,
    pub fid: u32,
    pub dir: bool,
    pub path: String,
}

pub struct Trace {
    pub bytes: Vec<u8>,
    pub ops: Vec<Op>,
    pub syncs: Vec<Sync>,
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Range<usize> {
        let range = self.at..self.at + n;
        assert!(range.end <= self.bytes.len(), "trace cut short at byte {}", self.at);
        self.at += n;
        range
    }
    fn u32(&mut self) -> u32 {
        let r = self.take(4);
        u32::from_le_bytes(self.bytes[r].try_into().unwrap())
    }
    fn u64(&mut self) -> u64 {
        let r = self.take(8);
        u64::from_le_bytes(self.bytes[r].try_into().unwrap())
    }
    fn u8(&mut self) -> u8 {
        let r = self.take(1);
        self.bytes[r.start]
    }
    fn str(&mut self) -> String {
        let n = self.u32() as usize;
        let r = self.take(n);
        String::from_utf8(self.bytes[r].to_vec()).unwrap()
    }
}

impl Trace {
    pub fn read(path: &Path) -> Trace {
        let bytes = std::fs::read(path).unwrap();
        let mut ops = Vec::new();
        let mut r = Reader { bytes: &bytes, at: 0 };
        while r.at < bytes.len() {
            let kind = r.u8();
            let len = r.u32() as usize;
            let end = r.at + len;
            let op = match kind {
                1 => Op::Create { fid: r.u32(), path: r.str() },
                2 => {
                    let (fid, offset) = (r.u32(), r.u64());
                    Op::Write { fid, offset, data: r.take(end - r.at) }
                }
                3 => Op::Trunc { fid: r.u32(), len: r.u64() },
                4 => {
                    let (id, fid, dir, _kind) = (r.u32(), r.u32(), r.u8() != 0, r.u8());
                    Op::SyncBegin { id, fid, dir, path: r.str() }
                }
                5 => Op::SyncEnd { id: r.u32(), errno: r.u32() },
                6 => Op::Rename { from: r.str(), to: r.str() },
                7 => Op::Unlink { path: r.str() },
                8 => Op::Mkdir { path: r.str() },
                9 => Op::Rmdir { path: r.str() },
                10 => Op::Mark { data: r.take(len) },
                other => panic!("unknown trace record {other} at byte {}", r.at),
            };
            assert_eq!(r.at, end, "trace record {kind} has the wrong length");
            ops.push(op);
        }
        let mut syncs: Vec<Sync> = Vec::new();
        let mut open: HashMap<u32, usize> = HashMap::new();
        for (i, op) in ops.iter().enumerate() {
            match op {
                Op::SyncBegin { id, fid, dir, path } => {
                    open.insert(*id, syncs.len());
                    syncs.push(Sync { begin: i, end: None, fid: *fid, dir: *dir, path: path.clone() });
                }
                Op::SyncEnd { id, errno } => {
                    let s = open.remove(id).expect("sync end without a beginning");
                    if *errno == 0 {
                        syncs[s].end = Some(i);
                    }
                }
                _ => {}
            }
        }
        Trace { bytes, ops, syncs }
    }

    /// The workload's marks with the index of the operation that wrote each (one line each).
    pub fn marks(&self) -> Vec<(usize, String)> {
        let mut out = Vec::new();
        let mut pending = String::new();
        for (i, op) in self.ops.iter().enumerate() {
            if let Op::Mark { data } = op {
                pending.push_str(std::str::from_utf8(&self.bytes[data.clone()]).unwrap());
                while let Some(nl) = pending.find('\n') {
                    out.push((i, pending[..nl].to_string()));
                    pending.drain(..=nl);
                }
            }
        }
        out
    }

    /// Bytes of file data the trace holds.
    pub fn data_bytes(&self) -> usize {
        self.ops.iter().map(|op| if let Op::Write { data, .. } = op { data.len() } else { 0 }).sum()
    }

    /// Writes into `out` the directory a power cut after the first `p` operations leaves (see the
    /// module doc); with `extra`, a seeded choice of the writes and entry operations that were not
    /// yet promised durable survives too. `journaled` tells the directories of the journaled model.
    pub fn materialize(&self, p: usize, mut extra: Option<&mut Rng>, journaled: &dyn Fn(&str) -> bool, out: &Path) {
        let done: Vec<&Sync> = self.syncs.iter().filter(|s| s.end.is_some_and(|e| e < p)).collect();
        let mut file_cut: HashMap<u32, usize> = HashMap::new();
        let mut dir_cut: HashMap<&str, usize> = HashMap::new();
        let mut journal_cut = 0;
        for s in &done {
            journal_cut = journal_cut.max(s.begin);
            if s.dir {
                let cut = dir_cut.entry(s.path.as_str()).or_insert(0);
                *cut = (*cut).max(s.begin);
            } else {
                let cut = file_cut.entry(s.fid).or_insert(0);
                *cut = (*cut).max(s.begin);
            }
        }
        // Journaled operations beyond the durable ones that also made it: a prefix of them.
        let journaled_ops: Vec<usize> = (journal_cut..p)
            .filter(|&i| entry_dirs(&self.ops[i]).is_some_and(|dirs| dirs.iter().any(|d| journaled(d))))
            .collect();
        let journal_extra_end = match extra.as_deref_mut() {
            Some(rng) if !journaled_ops.is_empty() => {
                let keep = rng.below(journaled_ops.len() as u64 + 1) as usize;
                if keep == 0 {
                    journal_cut
                } else {
                    journaled_ops[keep - 1] + 1
                }
            }
            _ => journal_cut,
        };
        let mut contents: HashMap<u32, Vec<u8>> = HashMap::new();
        let mut names: BTreeMap<String, Node> = BTreeMap::new();
        names.insert(String::new(), Node::Dir);
        for (i, op) in self.ops[..p].iter().enumerate() {
            if let Some(dirs) = entry_dirs(op) {
                let kept = if dirs.iter().any(|d| journaled(d)) {
                    i < journal_extra_end
                } else {
                    dirs.iter().all(|d| dir_cut.get(d.as_str()).is_some_and(|&c| c > i))
                        || extra.as_deref_mut().is_some_and(|rng| rng.below(2) == 0)
                };
                if kept {
                    apply_entry(&mut names, op);
                }
                continue;
            }
            let (fid, durable) = match op {
                Op::Write { fid, .. } | Op::Trunc { fid, .. } => (*fid, file_cut.get(fid).is_some_and(|&c| c > i)),
                _ => continue,
            };
            let file = contents.entry(fid).or_default();
            match op {
                Op::Write { offset, data, .. } => {
                    let mut len = data.len();
                    if !durable {
                        let Some(rng) = extra.as_deref_mut() else { continue };
                        if rng.below(2) == 0 {
                            continue;
                        }
                        if rng.below(4) == 0 {
                            len = (rng.below(len as u64) as usize) / 512 * 512;
                        }
                    }
                    let (start, end) = (*offset as usize, *offset as usize + len);
                    if file.len() < end {
                        file.resize(end, 0);
                    }
                    file[start..end].copy_from_slice(&self.bytes[data.start..data.start + len]);
                }
                Op::Trunc { len, .. } if durable || extra.as_deref_mut().is_some_and(|rng| rng.below(2) == 0) => {
                    file.resize(*len as usize, 0);
                }
                _ => {}
            }
        }
        std::fs::create_dir_all(out).unwrap();
        for (path, node) in &names {
            let target = out.join(path);
            match node {
                Node::Dir => std::fs::create_dir_all(&target).unwrap(),
                Node::File(fid) => std::fs::write(&target, contents.get(fid).map_or(&[][..], Vec::as_slice)).unwrap(),
            }
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Node {
    Dir,
    File(u32),
}

fn parent(path: &str) -> String {
    path.rsplit_once('/').map_or(String::new(), |(p, _)| p.to_string())
}

/// The directories a directory-entry operation changes; `None` for other operations.
fn entry_dirs(op: &Op) -> Option<Vec<String>> {
    match op {
        Op::Create { path, .. } | Op::Unlink { path } | Op::Mkdir { path } | Op::Rmdir { path } => {
            Some(vec![parent(path)])
        }
        Op::Rename { from, to } => Some(vec![parent(from), parent(to)]),
        _ => None,
    }
}

fn apply_entry(names: &mut BTreeMap<String, Node>, op: &Op) {
    let has_dir = |names: &BTreeMap<String, Node>, path: &str| matches!(names.get(&parent(path)), Some(Node::Dir));
    match op {
        Op::Create { fid, path } if has_dir(names, path) => {
            names.insert(path.clone(), Node::File(*fid));
        }
        Op::Mkdir { path } if has_dir(names, path) => {
            names.insert(path.clone(), Node::Dir);
        }
        Op::Unlink { path } => {
            if let Some(Node::File(_)) = names.get(path) {
                names.remove(path);
            }
        }
        Op::Rmdir { path } => {
            let prefix = format!("{path}/");
            if matches!(names.get(path), Some(Node::Dir)) && !names.keys().any(|k| k.starts_with(&prefix)) {
                names.remove(path);
            }
        }
        Op::Rename { from, to } if names.contains_key(from) && has_dir(names, to) => {
            let prefix = format!("{from}/");
            let moved: Vec<String> = names.keys().filter(|k| *k == from || k.starts_with(&prefix)).cloned().collect();
            for old in moved {
                let node = names.remove(&old).unwrap();
                names.insert(format!("{to}{}", &old[from.len()..]), node);
            }
        }
        _ => {}
    }
}
