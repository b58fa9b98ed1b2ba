//! The download spool: what an unpack has already downloaded, kept on the data directory so that
//! an unpack interrupted by a restart (or a failed attempt retried) does not download it again.
//!
//! `DATA_DIR/tmp/downloads/<bundle uid>/<key>` holds one download each: an image layer (the key
//! is its digest) or an http file (a hash of its URL and validator). While the bytes stream from
//! the network into an unpack they are also appended to `<key>.partial`; the source renames it
//! `<key>` once the whole download passed its checks. The next attempt reads a complete one from
//! disk, and a partial one from disk first, then asks the server only for the rest (`Range`).
//! Bytes read from the spool go through the same checks as network bytes (a layer's digest; an
//! http file's sha256 when one is pinned, else `If-Range` has the server vouch that the rest is of
//! the same file), and a resumed download that fails any check is dropped
//! ([`Download::settle`]) and fetched whole next time. A partial file is only ever a prefix of what the server sent, so a crash at any point
//! leaves something that resumes (at worst a few buffered bytes short).
//!
//! A Bundle's spool is removed once its content is committed, when its unpack fails for good,
//! and when the Bundle is gone; at start, spools of Bundles with no unfinished unpack are swept.

use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use super::error::UnpackError;
use super::source::Scratch;

/// Network bytes buffered before they are appended to a partial download.
const WRITE_BUFFER: usize = 256 << 10;
/// The free-space reserve is checked once per this many spooled bytes, for that many: a spool
/// never writes into the reserve, and stops within this much of it.
const ROOM_CHECK_EVERY: u64 = 1 << 20;

/// `DATA_DIR/tmp/downloads`: every Bundle's spool.
#[derive(Clone, Debug)]
pub struct Downloads {
    root: PathBuf,
}

impl Downloads {
    pub fn new(root: PathBuf) -> Downloads {
        Downloads { root }
    }

    /// The spool of the Bundle with this uid.
    pub fn for_bundle(&self, uid: &str) -> Spool {
        Spool { dir: self.root.join(safe_name(uid)) }
    }

    /// Removes the spools of every Bundle whose uid is not in `keep` (what a crash, or a Bundle
    /// deleted while the server was down, left behind). Run at start, before any unpack.
    pub fn sweep(&self, keep: &HashSet<String>) {
        let keep: HashSet<String> = keep.iter().map(|uid| safe_name(uid)).collect();
        let Ok(entries) = fs::read_dir(&self.root) else { return };
        for entry in entries.flatten() {
            if !entry.file_name().to_str().is_some_and(|name| keep.contains(name)) {
                remove(&entry.path());
            }
        }
    }
}

/// One Bundle's spool directory.
#[derive(Clone, Debug)]
pub struct Spool {
    dir: PathBuf,
}

impl Spool {
    /// Removes everything spooled for the Bundle (its content is committed, or will never be).
    pub fn remove(&self) {
        remove(&self.dir);
    }

    /// The download named `key` (`[a-z0-9-]`, e.g. `sha256-<hex>`): what is on disk of it.
    /// `expected_len` is its size when known; a partial file as long or longer is dropped.
    pub fn open(&self, key: &str, expected_len: Option<u64>, scratch: &Scratch) -> Result<Download, UnpackError> {
        let key = safe_name(key);
        fs::create_dir_all(&self.dir).map_err(|e| spool_error(&self.dir, &e))?;
        let complete = self.dir.join(&key);
        let partial = self.dir.join(format!("{key}.partial"));
        let mut download = Download { complete, partial, on_disk: 0, whole: false, scratch: scratch.clone() };
        if let Ok(meta) = fs::metadata(&download.complete) {
            download.on_disk = meta.len();
            download.whole = true;
            return Ok(download);
        }
        if let Ok(meta) = fs::metadata(&download.partial) {
            if expected_len.is_some_and(|len| meta.len() >= len) {
                download.discard();
            } else {
                download.on_disk = meta.len();
            }
        }
        Ok(download)
    }
}

/// Where the rest of a download comes from once the bytes on disk are used up.
pub enum Rest<'a> {
    /// The server sent exactly the bytes from the offset asked for (`206`, or nothing left).
    From(Box<dyn Read + 'a>),
    /// The server sent the whole download from its first byte (it ignored `Range`): the bytes
    /// already on disk are skipped (the digest check still covers them).
    Whole(Box<dyn Read + 'a>),
}

/// Opens the network rest of a download from the given offset (`0`: the whole download).
pub type OpenRest<'a> = Box<dyn FnOnce(u64) -> Result<Rest<'a>, UnpackError> + 'a>;

/// One spooled download: where its files are and how much of it is on disk.
pub struct Download {
    complete: PathBuf,
    partial: PathBuf,
    on_disk: u64,
    whole: bool,
    scratch: Scratch,
}

impl Download {
    /// Bytes already on disk, read before anything is asked of the network.
    pub fn on_disk(&self) -> u64 {
        self.on_disk
    }

    /// Whether the whole download is on disk (verified when it was spooled).
    pub fn is_whole(&self) -> bool {
        self.whole
    }

    /// The download's bytes from the first: those on disk, then (unless the whole download is
    /// on disk) the network rest from `open_rest`, appended to the partial file as they pass.
    pub fn reader<'a>(&self, open_rest: OpenRest<'a>) -> Result<SpoolReader<'a>, UnpackError> {
        if self.whole {
            let file = File::open(&self.complete).map_err(|e| spool_error(&self.complete, &e))?;
            return Ok(SpoolReader::new(Some(file.take(self.on_disk)), None, None, self.scratch.clone()));
        }
        let disk = match self.on_disk {
            0 => None,
            n => Some(File::open(&self.partial).map_err(|e| spool_error(&self.partial, &e))?.take(n)),
        };
        let out = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.partial)
            .map_err(|e| spool_error(&self.partial, &e))?;
        Ok(SpoolReader::new(
            disk,
            Some(BufWriter::with_capacity(WRITE_BUFFER, out)),
            Some(open_rest),
            self.scratch.clone(),
        ))
    }

    /// The download matched its digest: keep it as complete for a later attempt.
    pub fn complete(&self) {
        if self.whole {
            return;
        }
        if let Err(e) = fs::rename(&self.partial, &self.complete) {
            tracing::warn!(path = %self.partial.display(), error = %e, "keeping a finished download failed");
        }
    }

    /// Keeps the download once `result` says it was verified; drops it when it failed its
    /// digest check. A download resumed from disk that failed any check of its content is
    /// dropped too, and the failure becomes transient: the bytes on disk may be what was wrong,
    /// so the next attempt downloads it whole before anything is concluded.
    pub fn settle<T>(&self, result: Result<T, UnpackError>) -> Result<T, UnpackError> {
        match result {
            Ok(value) => {
                self.complete();
                Ok(value)
            }
            Err(e @ UnpackError::DigestMismatch { .. }) if self.on_disk == 0 => {
                self.discard();
                Err(e)
            }
            Err(e) if self.on_disk > 0 && !e.is_transient() && !matches!(e, UnpackError::Cancelled) => {
                self.discard();
                Err(UnpackError::Fetch(format!(
                    "{e} (it was resumed from what an earlier attempt downloaded, which is dropped: the next attempt downloads it again)"
                )))
            }
            Err(e) => Err(e),
        }
    }

    /// Drops what is spooled of this download (it failed its digest check).
    pub fn discard(&self) {
        for path in [&self.complete, &self.partial] {
            if let Err(e) = fs::remove_file(path) {
                if e.kind() != io::ErrorKind::NotFound {
                    tracing::warn!(path = %path.display(), error = %e, "removing a spooled download failed");
                }
            }
        }
    }
}

/// See [`Download::reader`].
pub struct SpoolReader<'a> {
    disk: Option<io::Take<File>>,
    out: Option<BufWriter<File>>,
    open_rest: Option<OpenRest<'a>>,
    net: Option<Box<dyn Read + 'a>>,
    delivered: u64,
    unchecked: u64,
    scratch: Scratch,
}

impl<'a> SpoolReader<'a> {
    fn new(
        disk: Option<io::Take<File>>,
        out: Option<BufWriter<File>>,
        open_rest: Option<OpenRest<'a>>,
        scratch: Scratch,
    ) -> Self {
        SpoolReader { disk, out, open_rest, net: None, delivered: 0, unchecked: ROOM_CHECK_EVERY, scratch }
    }

    /// Opens the network rest after the bytes on disk, skipping what a whole answer repeats.
    fn open_network(&mut self, open: OpenRest<'a>) -> io::Result<()> {
        let net = match open(self.delivered).map_err(UnpackError::into_io)? {
            Rest::From(net) => net,
            Rest::Whole(mut net) => {
                let skipped = io::copy(&mut (&mut net).take(self.delivered), &mut io::sink())?;
                if skipped < self.delivered {
                    return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the download ended early"));
                }
                net
            }
        };
        self.net = Some(net);
        Ok(())
    }

    /// Appends network bytes to the partial file, within the data directory's free-space reserve.
    fn spool(&mut self, data: &[u8]) -> io::Result<()> {
        let Some(out) = self.out.as_mut() else { return Ok(()) };
        if self.unchecked >= ROOM_CHECK_EVERY {
            self.scratch.check_room_for(ROOM_CHECK_EVERY).map_err(UnpackError::into_io)?;
            self.unchecked = 0;
        }
        self.unchecked = self.unchecked.saturating_add(data.len() as u64);
        out.write_all(data)
    }
}

impl Read for SpoolReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if let Some(disk) = self.disk.as_mut() {
            let n = disk.read(buf)?;
            if n > 0 {
                self.delivered = self.delivered.saturating_add(n as u64);
                return Ok(n);
            }
            self.disk = None;
        }
        if let Some(open) = self.open_rest.take() {
            self.open_network(open)?;
        }
        let Some(net) = self.net.as_mut() else { return Ok(0) };
        let n = net.read(buf)?;
        if n == 0 {
            if let Some(out) = self.out.as_mut() {
                out.flush()?;
            }
            return Ok(0);
        }
        self.spool(buf.get(..n).unwrap_or_default())?;
        self.delivered = self.delivered.saturating_add(n as u64);
        Ok(n)
    }
}

/// `START` of a `Content-Range: bytes START-END/TOTAL` header: where a `206` body begins.
pub fn content_range_start(headers: &reqwest::header::HeaderMap) -> Option<u64> {
    let value = headers.get(reqwest::header::CONTENT_RANGE)?.to_str().ok()?;
    value.trim().strip_prefix("bytes ")?.split('-').next()?.trim().parse().ok()
}

/// A uid or key as a file name: kept when it is plain (`[A-Za-z0-9_-]`), else its hash.
fn safe_name(name: &str) -> String {
    let plain = !name.is_empty() && name.len() <= 128;
    if plain && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
        return name.to_owned();
    }
    hex::encode(<sha2::Sha256 as sha2::Digest>::digest(name.as_bytes()))
}

fn remove(path: &Path) {
    let result = if path.is_dir() { fs::remove_dir_all(path) } else { fs::remove_file(path) };
    if let Err(e) = result {
        if e.kind() != io::ErrorKind::NotFound {
            tracing::warn!(path = %path.display(), error = %e, "removing spooled downloads failed");
        }
    }
}

fn spool_error(path: &Path, e: &io::Error) -> UnpackError {
    UnpackError::Fetch(format!("the download spool {}: {e}", path.display()))
}

#[cfg(test)]
#[path = "download_spool_tests.rs"]
mod tests;
