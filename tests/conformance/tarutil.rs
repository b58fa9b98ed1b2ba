//! Trees of files, tars made from them (well-formed, hand-crafted malformed, streamed synthetic
//! ones of any size), and the checks of what the server serves.

use std::collections::{BTreeMap, HashMap};
use std::io::{self, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use sha2::{Digest, Sha256};

// ---------------------------------------------------------------------------------------------
// File trees

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Node {
    File { data: Vec<u8>, exec: bool },
    Symlink(String),
}

/// Path (relative, `/`-separated, no `./`) → node. Directories are implicit.
pub type Tree = BTreeMap<String, Node>;

pub fn file(data: impl Into<Vec<u8>>) -> Node {
    Node::File { data: data.into(), exec: false }
}

/// Regular files and symlinks below `dir` (directories themselves are not content).
pub fn tree_from_dir(dir: &Path) -> Tree {
    fn walk(root: &Path, dir: &Path, out: &mut Tree) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("read_dir {}: {e}", dir.display()))
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for path in entries {
            let rel = path.strip_prefix(root).unwrap().to_str().expect("utf-8 path").to_owned();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            if meta.file_type().is_symlink() {
                let target = std::fs::read_link(&path).unwrap();
                out.insert(rel, Node::Symlink(target.to_str().unwrap().to_owned()));
            } else if meta.is_dir() {
                walk(root, &path, out);
            } else if meta.is_file() {
                let exec = meta.permissions().mode() & 0o100 != 0;
                let data = std::fs::read(&path).unwrap();
                out.insert(rel, Node::File { data, exec });
            } else {
                panic!("unexpected file type in the corpus: {}", path.display());
            }
        }
    }
    let mut out = Tree::new();
    walk(dir, dir, &mut out);
    out
}

pub fn file_count_and_size(tree: &Tree) -> (u64, u64) {
    let size = tree
        .values()
        .map(|n| match n {
            Node::File { data, .. } => data.len() as u64,
            Node::Symlink(_) => 0,
        })
        .sum();
    (tree.len() as u64, size)
}

/// `tar -C dir -cf - .` with the system's GNU tar: what a user does.
pub fn system_tar(dir: &Path) -> Vec<u8> {
    let out = Command::new("tar")
        .arg("-C")
        .arg(dir)
        .args(["-cf", "-", "."])
        .output()
        .expect("run tar (is GNU tar installed?)");
    assert!(out.status.success(), "tar -C {} failed: {}", dir.display(), String::from_utf8_lossy(&out.stderr));
    out.stdout
}

/// A tar of `tree` with metadata a server must normalise away (owner 1000, a real mtime, dir
/// entries, files in reverse order).
pub fn build_tar(tree: &Tree) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    let mut dirs = std::collections::BTreeSet::new();
    for path in tree.keys() {
        let mut p = path.as_str();
        while let Some((d, _)) = p.rsplit_once('/') {
            dirs.insert(d);
            p = d;
        }
    }
    for d in dirs {
        let mut h = header(tar::EntryType::Directory, 0, 0o775);
        b.append_data(&mut h, format!("{d}/"), io::empty()).unwrap();
    }
    for (path, node) in tree.iter().rev() {
        match node {
            Node::File { data, exec } => {
                let mode = if *exec { 0o775 } else { 0o664 };
                let mut h = header(tar::EntryType::Regular, data.len() as u64, mode);
                b.append_data(&mut h, path, &data[..]).unwrap();
            }
            Node::Symlink(target) => {
                let mut h = header(tar::EntryType::Symlink, 0, 0o777);
                b.append_link(&mut h, path, target).unwrap();
            }
        }
    }
    b.into_inner().unwrap()
}

fn header(kind: tar::EntryType, size: u64, mode: u32) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_size(size);
    h.set_mode(mode);
    h.set_uid(1000);
    h.set_gid(1000);
    h.set_mtime(1_700_000_000);
    h
}

pub fn gzip(data: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    enc.write_all(data).unwrap();
    enc.finish().unwrap()
}

pub fn zstd(data: &[u8]) -> Vec<u8> {
    zstd::encode_all(data, 3).unwrap()
}

// ---------------------------------------------------------------------------------------------
// Hand-made (possibly malformed) tar entries, which tar::Builder refuses to write.

/// One ustar entry: a 512-byte header with exactly these bytes as name and link name, then the
/// data padded to 512 bytes.
pub fn raw_entry(name: &str, typeflag: u8, data: &[u8], linkname: &str) -> Vec<u8> {
    assert!(name.len() <= 100 && linkname.len() <= 100);
    let mut h = [0u8; 512];
    h[..name.len()].copy_from_slice(name.as_bytes());
    let octal = |h: &mut [u8; 512], at: usize, width: usize, v: u64| {
        let s = format!("{v:0w$o}\0", w = width - 1);
        h[at..at + width].copy_from_slice(s.as_bytes());
    };
    octal(&mut h, 100, 8, 0o644); // mode
    octal(&mut h, 108, 8, 0); // uid
    octal(&mut h, 116, 8, 0); // gid
    octal(&mut h, 124, 12, data.len() as u64); // size
    octal(&mut h, 136, 12, 0); // mtime
    h[156] = typeflag;
    h[157..157 + linkname.len()].copy_from_slice(linkname.as_bytes());
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    if typeflag == b'3' || typeflag == b'4' {
        octal(&mut h, 329, 8, 5); // devmajor
        octal(&mut h, 337, 8, 1); // devminor
    }
    h[148..156].copy_from_slice(b"        ");
    let sum: u64 = h.iter().map(|&b| b as u64).sum();
    let s = format!("{sum:06o}\0 ");
    h[148..156].copy_from_slice(s.as_bytes());
    let mut out = h.to_vec();
    out.extend_from_slice(data);
    out.resize(out.len().div_ceil(512) * 512, 0);
    out
}

/// A tar made of `entries` and the end-of-archive marker.
pub fn raw_tar(entries: &[Vec<u8>]) -> Vec<u8> {
    let mut out: Vec<u8> = entries.concat();
    out.extend_from_slice(&[0u8; 1024]);
    out
}

// ---------------------------------------------------------------------------------------------
// What the server serves

/// Parses a tar served by the server into a tree of its files and symlinks (directories are checked,
/// then left out: see [`parse_served_entries`] for the exact tree), asserting that it is the
/// deterministic form: only regular files, symlinks and directories, sorted by path bytes, owner
/// 0:0, mtime 0, permission bits only.
pub fn parse_served_tar(data: &[u8]) -> Tree {
    let mut out = Tree::new();
    let mut previous: Option<Vec<u8>> = None;
    let mut archive = tar::Archive::new(data);
    for entry in archive.entries().expect("served tar readable") {
        let mut entry = entry.expect("served tar entry readable");
        let path_bytes = entry.path_bytes().into_owned();
        let path = String::from_utf8(path_bytes.clone()).expect("utf-8 path");
        let path = path.strip_prefix("./").unwrap_or(&path).to_owned();
        if let Some(prev) = &previous {
            assert!(
                prev < &path_bytes,
                "served tar not sorted by path bytes: {:?} before {path:?}",
                String::from_utf8_lossy(prev)
            );
        }
        previous = Some(path_bytes);
        let h = entry.header();
        let (mode, uid, gid, mtime) =
            (h.mode().unwrap() & 0o7777, h.uid().unwrap(), h.gid().unwrap(), h.mtime().unwrap());
        assert_eq!((uid, gid, mtime), (0, 0, 0), "{path}: owner/mtime not normalised");
        assert!(mode <= 0o777, "{path}: mode {mode:o} has more than permission bits");
        match h.entry_type() {
            tar::EntryType::Directory => assert!(path.ends_with('/'), "{path}: directory without its '/'"),
            tar::EntryType::Regular => {
                let mut data = Vec::new();
                entry.read_to_end(&mut data).unwrap();
                let exec = mode & 0o100 != 0;
                assert!(out.insert(path.clone(), Node::File { data, exec }).is_none(), "{path} twice");
            }
            tar::EntryType::Symlink => {
                let target = entry.link_name().unwrap().expect("symlink target");
                let target = target.to_str().unwrap().to_owned();
                assert!(out.insert(path.clone(), Node::Symlink(target)).is_none(), "{path} twice");
            }
            other => panic!("{path}: served tar holds a {other:?} entry"),
        }
    }
    out
}

/// Asserts two trees are equal, naming the first differences instead of dumping the bytes.
pub fn assert_trees_equal(expected: &Tree, got: &Tree, context: &str) {
    let missing: Vec<&String> = expected.keys().filter(|k| !got.contains_key(*k)).collect();
    let extra: Vec<&String> = got.keys().filter(|k| !expected.contains_key(*k)).collect();
    assert!(missing.is_empty(), "{context}: missing from the download: {missing:?}");
    assert!(extra.is_empty(), "{context}: not in the source: {extra:?}");
    for (path, want) in expected {
        let have = &got[path];
        match (want, have) {
            (Node::File { data: a, exec: ea }, Node::File { data: b, exec: eb }) => {
                assert!(a == b, "{context}: {path}: content differs ({} bytes expected, {} served)", a.len(), b.len());
                assert_eq!(ea, eb, "{context}: {path}: executable bit (mode 0755) differs");
            }
            _ => assert_eq!(want, have, "{context}: {path} differs"),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Exact trees: every file, symlink and directory, with permission bits

/// One entry of an exact tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Entry {
    File { data: Vec<u8>, mode: u32 },
    Dir { mode: u32 },
    Symlink(String),
}

/// Path → entry; a directory's path ends with `/`, as in a tar. Nothing is implicit.
pub type Entries = BTreeMap<String, Entry>;

/// Every file, symlink and directory below `dir` (not `dir` itself), with permission bits.
pub fn entries_from_dir(dir: &Path) -> Entries {
    fn walk(root: &Path, dir: &Path, out: &mut Entries) {
        for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("read_dir {}: {e}", dir.display())) {
            let path = entry.unwrap().path();
            let rel = path.strip_prefix(root).unwrap().to_str().expect("utf-8 path").to_owned();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            let mode = meta.permissions().mode() & 0o7777;
            if meta.file_type().is_symlink() {
                let target = std::fs::read_link(&path).unwrap().to_str().unwrap().to_owned();
                out.insert(rel, Entry::Symlink(target));
            } else if meta.is_dir() {
                out.insert(format!("{rel}/"), Entry::Dir { mode });
                walk(root, &path, out);
            } else {
                out.insert(rel, Entry::File { data: std::fs::read(&path).unwrap(), mode });
            }
        }
    }
    let mut out = Entries::new();
    walk(dir, dir, &mut out);
    out
}

/// Writes `entries` below `dir` (which must exist) with their modes; directories get theirs last,
/// so a read-only one is still filled.
pub fn write_entries(dir: &Path, entries: &Entries) {
    for (path, entry) in entries {
        let at = dir.join(path);
        match entry {
            Entry::Dir { .. } => std::fs::create_dir_all(&at).unwrap(),
            Entry::File { data, mode } => {
                std::fs::create_dir_all(at.parent().unwrap()).unwrap();
                std::fs::write(&at, data).unwrap();
                std::fs::set_permissions(&at, std::fs::Permissions::from_mode(*mode)).unwrap();
            }
            Entry::Symlink(target) => {
                std::fs::create_dir_all(at.parent().unwrap()).unwrap();
                std::os::unix::fs::symlink(target, &at).unwrap();
            }
        }
    }
    for (path, entry) in entries.iter().rev() {
        if let Entry::Dir { mode } = entry {
            std::fs::set_permissions(dir.join(path), std::fs::Permissions::from_mode(*mode)).unwrap();
        }
    }
}

/// A tar of `entries` by `tar::Builder`, with metadata a server must normalise away (owner 1000, a
/// real mtime, user names, entries in reverse order: contents before their directories).
pub fn tar_of_entries(entries: &Entries) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (path, entry) in entries.iter().rev() {
        let (kind, size, mode) = match entry {
            Entry::File { data, mode } => (tar::EntryType::Regular, data.len() as u64, *mode),
            Entry::Dir { mode } => (tar::EntryType::Directory, 0, *mode),
            Entry::Symlink(_) => (tar::EntryType::Symlink, 0, 0o777),
        };
        let mut h = header(kind, size, mode);
        h.set_username("someone").unwrap();
        match entry {
            Entry::File { data, .. } => b.append_data(&mut h, path, &data[..]).unwrap(),
            Entry::Dir { .. } => b.append_data(&mut h, path, io::empty()).unwrap(),
            Entry::Symlink(target) => b.append_link(&mut h, path, target).unwrap(),
        }
    }
    b.into_inner().unwrap()
}

/// Parses a served tar into its exact tree, asserting the deterministic form (sorted by path
/// bytes, owner 0:0, mtime 0, no user names, permission bits only, symlinks 0777).
pub fn parse_served_entries(data: &[u8]) -> Entries {
    let mut out = Entries::new();
    let mut previous: Option<String> = None;
    let mut archive = tar::Archive::new(data);
    for entry in archive.entries().expect("served tar readable") {
        let mut entry = entry.expect("served tar entry readable");
        let path = String::from_utf8(entry.path_bytes().into_owned()).expect("utf-8 path");
        if let Some(prev) = &previous {
            assert!(prev.as_bytes() < path.as_bytes(), "served tar not sorted by path bytes: {prev:?} before {path:?}");
        }
        previous = Some(path.clone());
        let h = entry.header();
        let mode = h.mode().unwrap();
        assert_eq!((h.uid().unwrap(), h.gid().unwrap(), h.mtime().unwrap()), (0, 0, 0), "{path}: owner/mtime");
        assert_eq!(h.username_bytes().unwrap_or_default(), b"", "{path}: user name");
        assert!(mode <= 0o777, "{path}: mode {mode:o} has more than permission bits");
        let node = match h.entry_type() {
            tar::EntryType::Regular => {
                let mut data = Vec::new();
                entry.read_to_end(&mut data).unwrap();
                Entry::File { data, mode }
            }
            tar::EntryType::Directory => {
                assert!(path.ends_with('/'), "{path}: a directory's path ends with '/'");
                Entry::Dir { mode }
            }
            tar::EntryType::Symlink => {
                assert_eq!(mode, 0o777, "{path}: symlink mode");
                Entry::Symlink(entry.link_name().unwrap().expect("symlink target").to_str().unwrap().to_owned())
            }
            other => panic!("{path}: served tar holds a {other:?} entry"),
        };
        assert!(out.insert(path.clone(), node).is_none(), "{path} twice");
    }
    out
}

/// Asserts two exact trees are equal, naming the differences (kind, mode, content) per path.
pub fn assert_entries_equal(expected: &Entries, got: &Entries, context: &str) {
    let missing: Vec<&String> = expected.keys().filter(|k| !got.contains_key(*k)).collect();
    let extra: Vec<&String> = got.keys().filter(|k| !expected.contains_key(*k)).collect();
    assert!(missing.is_empty() && extra.is_empty(), "{context}: missing {missing:?}, not in the source {extra:?}");
    for (path, want) in expected {
        match (want, &got[path]) {
            (Entry::File { data: a, mode: ma }, Entry::File { data: b, mode: mb }) => {
                assert!(a == b, "{context}: {path}: content differs ({} bytes expected, {} got)", a.len(), b.len());
                assert_eq!(ma, mb, "{context}: {path}: mode {ma:o} expected, {mb:o} got");
            }
            (want, have) => assert_eq!(want, have, "{context}: {path} differs"),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Pseudo-random, non-repeating data (xorshift64*), reproducible from a seed

pub fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// `len` bytes of the stream for `seed`.
pub struct XorReader {
    state: u64,
    remaining: u64,
    left: [u8; 8],
    left_len: usize,
}

impl XorReader {
    pub fn new(seed: u64, len: u64) -> XorReader {
        XorReader { state: splitmix64(seed) | 1, remaining: len, left: [0; 8], left_len: 0 }
    }

    fn next_word(&mut self) -> [u8; 8] {
        let mut x = self.state;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.state = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes()
    }
}

impl Read for XorReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let want = (buf.len() as u64).min(self.remaining) as usize;
        let mut i = 0;
        while i < want && self.left_len > 0 {
            buf[i] = self.left[8 - self.left_len];
            self.left_len -= 1;
            i += 1;
        }
        while want - i >= 8 {
            let w = self.next_word();
            buf[i..i + 8].copy_from_slice(&w);
            i += 8;
        }
        if i < want {
            let w = self.next_word();
            let k = want - i;
            buf[i..want].copy_from_slice(&w[..k]);
            self.left = w;
            self.left_len = 8 - k;
        }
        self.remaining -= want as u64;
        Ok(want)
    }
}

pub fn random_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len);
    XorReader::new(seed, len as u64).read_to_end(&mut v).unwrap();
    v
}

/// One file of a synthetic bundle; its bytes are `XorReader::new(seed, size)`.
#[derive(Clone, Debug)]
pub struct SynthFile {
    pub path: String,
    pub size: u64,
    pub seed: u64,
    pub exec: bool,
}

impl SynthFile {
    pub fn reader(&self) -> XorReader {
        XorReader::new(self.seed, self.size)
    }
}

/// `big` files of `big_size` bytes plus `small` files of 0..16 KiB, all distinct data.
pub fn synth_files(seed: u64, big: usize, big_size: u64, small: usize) -> Vec<SynthFile> {
    let mut files = Vec::new();
    for i in 0..big {
        files.push(SynthFile {
            path: format!("big/blob-{i:02}.bin"),
            size: big_size,
            seed: splitmix64(seed ^ (i as u64).wrapping_mul(0x1000_0001)),
            exec: false,
        });
    }
    for i in 0..small {
        let r = splitmix64(seed.wrapping_add(0xABCD_0000 + i as u64));
        files.push(SynthFile {
            path: format!("small/d{:03}/file-{i:05}.yaml", i / 100),
            size: r % (16 << 10),
            seed: r,
            exec: i % 97 == 0,
        });
    }
    files
}

pub fn synth_total_size(files: &[SynthFile]) -> u64 {
    files.iter().map(|f| f.size).sum()
}

struct HashWriter<'a>(&'a mut Sha256);

impl Write for HashWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Reads through, hashing what passes.
struct HashingReader<R> {
    inner: R,
    hasher: Sha256,
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

/// A `Write` that hands 1 MiB chunks to an async request body; counts bytes handed over.
pub struct ChanWriter {
    tx: tokio::sync::mpsc::Sender<Bytes>,
    buf: Vec<u8>,
    sent: Arc<AtomicU64>,
}

const CHUNK: usize = 1 << 20;

impl ChanWriter {
    fn send_buf(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = Bytes::from(std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK)));
        let n = chunk.len() as u64;
        self.tx.blocking_send(chunk).map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "request body dropped"))?;
        self.sent.fetch_add(n, Ordering::Relaxed);
        Ok(())
    }
}

impl Write for ChanWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= CHUNK {
            self.send_buf()?;
        }
        Ok(data.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        self.send_buf()
    }
}

/// A synthetic tar being generated on a thread while it is sent: never held in memory.
pub struct TarStream {
    /// The request body.
    pub body: reqwest::Body,
    /// Bytes handed to the body so far.
    pub sent: Arc<AtomicU64>,
    /// Ends with path → sha256 hex of every file, once the whole tar was handed over.
    pub done: std::thread::JoinHandle<io::Result<HashMap<String, String>>>,
}

pub fn stream_tar(files: Vec<SynthFile>) -> TarStream {
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(4);
    let sent = Arc::new(AtomicU64::new(0));
    let writer = ChanWriter { tx, buf: Vec::with_capacity(CHUNK), sent: sent.clone() };
    let done = std::thread::spawn(move || {
        let mut b = tar::Builder::new(writer);
        let mut hashes = HashMap::new();
        for f in &files {
            let mode = if f.exec { 0o755 } else { 0o644 };
            let mut h = header(tar::EntryType::Regular, f.size, mode);
            let mut reader = HashingReader { inner: f.reader(), hasher: Sha256::new() };
            b.append_data(&mut h, &f.path, &mut reader)?;
            hashes.insert(f.path.clone(), hex::encode(reader.hasher.finalize()));
        }
        let mut writer = b.into_inner()?;
        writer.flush()?;
        Ok(hashes)
    });
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|chunk| (Ok::<Bytes, io::Error>(chunk), rx))
    });
    TarStream { body: reqwest::Body::wrap_stream(stream), sent, done }
}

/// A `Read` over chunks arriving on a channel (to parse a tar while it downloads).
pub struct ChanReader {
    rx: std::sync::mpsc::Receiver<Bytes>,
    cur: Bytes,
}

impl ChanReader {
    pub fn new(rx: std::sync::mpsc::Receiver<Bytes>) -> ChanReader {
        ChanReader { rx, cur: Bytes::new() }
    }
}

impl Read for ChanReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.cur.is_empty() {
            match self.rx.recv() {
                Ok(b) => self.cur = b,
                Err(_) => return Ok(0),
            }
        }
        let n = buf.len().min(self.cur.len());
        buf[..n].copy_from_slice(&self.cur[..n]);
        let _ = self.cur.split_to(n);
        Ok(n)
    }
}

/// Summary of one served tar entry, for tars too big to hold.
#[derive(Debug)]
pub struct EntrySummary {
    pub size: u64,
    pub sha256: String,
    pub exec: bool,
}

/// Reads a served tar from `r`, checking the deterministic form as `parse_served_tar` does,
/// and returns path → summary.
pub fn summarize_served_tar(mut r: impl Read) -> io::Result<BTreeMap<String, EntrySummary>> {
    let mut out = BTreeMap::new();
    let mut previous: Option<Vec<u8>> = None;
    let mut archive = tar::Archive::new(&mut r);
    for entry in archive.entries()? {
        let mut entry = entry?;
        let path_bytes = entry.path_bytes().into_owned();
        if let Some(prev) = &previous {
            assert!(prev < &path_bytes, "served tar not sorted by path bytes");
        }
        previous = Some(path_bytes.clone());
        let path = String::from_utf8(path_bytes).expect("utf-8 path");
        let path = path.strip_prefix("./").unwrap_or(&path).to_owned();
        let h = entry.header();
        let mode = h.mode()? & 0o7777;
        assert!(mode <= 0o777, "{path}: mode {mode:o}");
        assert_eq!((h.uid()?, h.gid()?, h.mtime()?), (0, 0, 0), "{path}: owner/mtime");
        if h.entry_type() == tar::EntryType::Directory {
            continue;
        }
        assert_eq!(h.entry_type(), tar::EntryType::Regular, "{path}: not a regular file");
        let mut hasher = Sha256::new();
        let size = io::copy(&mut entry, &mut HashWriter(&mut hasher))?;
        let summary = EntrySummary { size, sha256: hex::encode(hasher.finalize()), exec: mode & 0o100 != 0 };
        out.insert(path, summary);
    }
    // The tar crate stops at the first end-of-archive block; read the rest (the second zero block)
    // so the sender never finds the reader gone, and check it is only zeros.
    let mut rest = Vec::new();
    r.read_to_end(&mut rest)?;
    assert!(rest.iter().all(|b| *b == 0), "{} non-zero bytes after the end-of-archive block", rest.len());
    Ok(out)
}

#[test]
fn xor_reader_does_not_depend_on_read_sizes() {
    let whole = random_bytes(7, 1000);
    let mut r = XorReader::new(7, 1000);
    let mut pieces = Vec::new();
    for n in [1usize, 3, 8, 13, 64, 5, 1000].iter().cycle() {
        let mut buf = vec![0; *n];
        let k = r.read(&mut buf).unwrap();
        if k == 0 {
            break;
        }
        pieces.extend_from_slice(&buf[..k]);
    }
    assert_eq!(whole, pieces);
    assert_ne!(random_bytes(7, 64), random_bytes(8, 64));
}

#[test]
fn raw_entries_are_readable_tar() {
    let t = raw_tar(&[raw_entry("dir/a.txt", b'0', b"hello", "")]);
    let tree = parse_served_tar(&t);
    assert_eq!(tree["dir/a.txt"], file(b"hello".to_vec()));
}

#[tokio::test(flavor = "multi_thread")]
async fn stream_tar_is_a_tar_of_the_synthetic_files() {
    use http_body_util::BodyExt;
    let files = synth_files(5, 2, 3 << 20, 50);
    let stream = stream_tar(files.clone());
    let started = std::time::Instant::now();
    let body = stream.body.collect().await.unwrap().to_bytes();
    let hashes = stream.done.join().unwrap().unwrap();
    assert_eq!(stream.sent.load(Ordering::Relaxed), body.len() as u64);
    let mut archive = tar::Archive::new(&body[..]);
    let mut n = 0;
    for (entry, f) in archive.entries().unwrap().zip(&files) {
        let mut entry = entry.unwrap();
        assert_eq!(entry.path().unwrap().to_str().unwrap(), f.path);
        let mut data = Vec::new();
        entry.read_to_end(&mut data).unwrap();
        let mut again = Vec::new();
        f.reader().read_to_end(&mut again).unwrap();
        assert!(data == again, "{}", f.path);
        assert_eq!(hashes[&f.path], hex::encode(Sha256::digest(&data)));
        n += 1;
    }
    assert_eq!(n, files.len());
    eprintln!("{} bytes in {:?}", body.len(), started.elapsed());
}
