//! Streaming, validating ingestion of untrusted tar uploads.
//!
//! [`ingest`] reads a request body (plain tar, gzip or zstd; compressed bodies are recognised even
//! without a `Content-Encoding`), validates every entry and hands the accepted ones to an
//! [`EntrySink`]. Everything is streamed: memory grows only with the *number* of entries (for
//! duplicate and conflict detection), never with their size.
//!
//! Defences, in stream order:
//!
//! * the raw body reader is wrapped so its first error is kept and reported untouched as
//!   [`IngestError::Source`] (client went away, body limit hit), distinct from format errors;
//! * decompressed bytes are counted against [`IngestLimits::max_unpacked_bytes`] (gzip/zstd bombs),
//!   and so are file sizes (hard links count as copies);
//! * a lightweight header watcher sees every tar header block before the `tar` crate does, so GNU
//!   long-name/long-link and PAX extension headers (which the crate buffers in memory) are
//!   size-checked first, GNU sparse entries are refused before the crate expands their maps, and
//!   the end-of-archive zero block is detected (the crate treats a plain EOF as the end, which
//!   would silently accept an archive truncated at an entry boundary);
//! * paths are normalised and checked (no absolute paths, `..`, NUL, non-UTF-8, over-long names),
//!   symlinks must stay inside the bundle root, hard links must point at an earlier regular file,
//!   devices/FIFOs/sparse files are refused, and the tree must be consistent (no duplicates, no
//!   path that is both a file and a directory);
//! * each file's data reaches the sink through a reader that yields exactly the entry's bytes and
//!   turns a short read into a "truncated archive" error; unread data is skipped by the crate;
//! * trailing bytes after the end-of-archive marker are drained (still counted), which also makes
//!   the decoders verify their checksums (gzip CRC, zstd frame checksums).
//!
//! On any error the sink may already have received some entries: callers must discard them.

use std::cell::Cell;
use std::collections::HashMap;
use std::io::{self, Read};

use super::EntrySink;

/// Tar block size.
const BLOCK: u64 = 512;
/// Largest PAX extended header (`x`) accepted; the `tar` crate holds it in memory.
const MAX_PAX_HEADER_BYTES: u64 = 1024 * 1024;
/// Longest path quoted in an error message.
const MAX_DISPLAY_CHARS: usize = 512;
const SYMLINK_ESCAPES: &str = "symlink target escapes the bundle root";

/// Limits applied while ingesting one archive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IngestLimits {
    /// Maximum decompressed tar stream size, and maximum total size of the files it unpacks to
    /// (hard links counted as copies). Past it: [`IngestError::TooLarge`].
    pub max_unpacked_bytes: u64,
    /// Maximum number of tar entries (files, links, directories, global headers).
    pub max_entries: u64,
    /// Maximum length in bytes of an entry path or link target, as stored in the archive.
    pub max_path_bytes: usize,
}

impl Default for IngestLimits {
    fn default() -> Self {
        IngestLimits { max_unpacked_bytes: 64 * 1024 * 1024 * 1024, max_entries: 1_000_000, max_path_bytes: 4096 }
    }
}

/// Transfer encoding of the body, from the HTTP `Content-Encoding`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// No declared encoding; gzip and zstd bodies are still recognised by their magic bytes.
    Identity,
    Gzip,
    Zstd,
}

impl Encoding {
    /// Maps a `Content-Encoding` header value (`None`/empty/`identity`, `gzip`/`x-gzip`, `zstd`)
    /// to an [`Encoding`]; `None` for anything unsupported (answer 415).
    pub fn from_content_encoding(value: Option<&str>) -> Option<Encoding> {
        let value = value.map(str::trim).unwrap_or("");
        if value.is_empty() || value.eq_ignore_ascii_case("identity") {
            Some(Encoding::Identity)
        } else if value.eq_ignore_ascii_case("gzip") || value.eq_ignore_ascii_case("x-gzip") {
            Some(Encoding::Gzip)
        } else if value.eq_ignore_ascii_case("zstd") {
            Some(Encoding::Zstd)
        } else {
            None
        }
    }
}

/// What an accepted archive contained.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IngestStats {
    /// Regular files plus hard links (hard links are stored as copies).
    pub files: u64,
    pub symlinks: u64,
    /// Total size of the files (hard links counted again).
    pub bytes: u64,
}

/// Why an archive was not ingested. `E` is the sink's error type.
#[derive(Debug, thiserror::Error)]
pub enum IngestError<E> {
    /// An unsafe or unsupported entry (answer 422, naming the path).
    #[error("invalid archive entry {path:?}: {reason}")]
    InvalidEntry { path: String, reason: String },
    /// Truncated or corrupt archive or compression stream (answer 400).
    #[error("corrupt archive: {0}")]
    Corrupt(String),
    /// Decompressed/unpacked size past `max_unpacked_bytes`, or more than `max_entries` entries;
    /// `limit` is the limit that was exceeded (answer 413).
    #[error("archive too large (limit {limit})")]
    TooLarge { limit: u64 },
    /// The request body reader failed; this is its original error, untouched.
    #[error("reading the request body failed: {0}")]
    Source(#[source] io::Error),
    /// The sink failed.
    #[error("storing the archive content failed: {0}")]
    Sink(#[source] E),
}

/// Reads a tar archive from `body` (decoded per `encoding`, or sniffed when `Identity`), validates
/// it against `limits` and feeds its files and links to `sink`. Synchronous: run it in
/// `spawn_blocking`. On error the sink may hold a partial tree, which the caller must discard.
pub fn ingest<R: Read, S: EntrySink>(
    body: R,
    encoding: Encoding,
    limits: &IngestLimits,
    sink: &mut S,
) -> Result<IngestStats, IngestError<S::Error>> {
    let state = State::default();
    match run(body, encoding, limits, sink, &state) {
        Ok(stats) => Ok(stats),
        Err(Failure::Sink(e)) => Err(IngestError::Sink(e)),
        Err(Failure::Io(e)) => Err(state.classify(Some(e))),
        Err(Failure::Flagged) => Err(state.classify(None)),
    }
}

// ---------------------------------------------------------------------------------------------
// Shared state between the reader layers and the entry loop.

/// A format/limit problem found by one of the reader layers or the entry loop.
#[derive(Debug)]
enum Violation {
    Invalid { path: String, reason: String },
    Corrupt(String),
    TooLarge(u64),
}

impl Violation {
    fn into_error<E>(self) -> IngestError<E> {
        match self {
            Violation::Invalid { path, reason } => IngestError::InvalidEntry { path, reason },
            Violation::Corrupt(msg) => IngestError::Corrupt(msg),
            Violation::TooLarge(limit) => IngestError::TooLarge { limit },
        }
    }
}

#[derive(Default)]
struct State {
    /// The body reader failed (its error is in `source_err` until taken).
    source_failed: Cell<bool>,
    source_err: Cell<Option<io::Error>>,
    /// The body reader reported EOF.
    source_eof: Cell<bool>,
    /// The decoded (tar) stream reported EOF.
    stream_eof: Cell<bool>,
    /// First violation recorded; later ones are ignored.
    violation: Cell<Option<Violation>>,
    /// Stream offset of the next tar header block, when known.
    armed: Cell<Option<u64>>,
    /// Bytes of the armed header block collected so far.
    armed_fill: Cell<usize>,
    /// An end-of-archive zero block was seen where a header was expected.
    end_marker: Cell<bool>,
}

impl State {
    fn flag(&self, v: Violation) {
        let previous = self.violation.take();
        self.violation.set(Some(previous.unwrap_or(v)));
    }

    fn has_violation(&self) -> bool {
        let v = self.violation.take();
        let present = v.is_some();
        self.violation.set(v);
        present
    }

    fn arm(&self, at: Option<u64>) {
        self.armed.set(at);
        self.armed_fill.set(0);
    }

    /// Turns the recorded state (plus the error that surfaced, if any) into the public error.
    fn classify<E>(&self, err: Option<io::Error>) -> IngestError<E> {
        if self.source_failed.get() {
            if let Some(e) = self.source_err.take() {
                return IngestError::Source(e);
            }
        }
        if let Some(v) = self.violation.take() {
            return v.into_error();
        }
        let msg = err.map_or_else(|| "unknown error".to_owned(), |e| e.to_string());
        if self.stream_eof.get() {
            IngestError::Corrupt(format!("truncated archive: {msg}"))
        } else {
            IngestError::Corrupt(format!("invalid tar archive: {msg}"))
        }
    }
}

enum Failure<E> {
    /// An I/O error surfaced; `State` knows where it came from.
    Io(io::Error),
    /// A violation was recorded in `State`.
    Flagged,
    Sink(E),
}

impl<E> From<io::Error> for Failure<E> {
    fn from(e: io::Error) -> Self {
        Failure::Io(e)
    }
}

fn aborted() -> io::Error {
    io::Error::other("archive ingestion aborted")
}

// ---------------------------------------------------------------------------------------------
// Reader layers.

/// Wraps the raw body: keeps its first error for [`IngestError::Source`], retries `Interrupted`.
struct SourceReader<'s, R> {
    inner: R,
    state: &'s State,
}

impl<R: Read> Read for SourceReader<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.state.source_failed.get() {
            return Err(io::Error::other("request body already failed"));
        }
        loop {
            let result = match self.inner.read(buf) {
                Ok(n) if n > buf.len() => {
                    Err(io::Error::other("request body reader returned more bytes than requested"))
                }
                other => other,
            };
            return match result {
                Ok(0) => {
                    if !buf.is_empty() {
                        self.state.source_eof.set(true);
                    }
                    Ok(0)
                }
                Ok(n) => Ok(n),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    let replacement = io::Error::new(e.kind(), format!("request body: {e}"));
                    self.state.source_err.set(Some(e));
                    self.state.source_failed.set(true);
                    Err(replacement)
                }
            };
        }
    }
}

/// The decoded tar stream: counts bytes against the limit, attributes decoder errors, records
/// EOF, and watches tar header blocks (see the module docs).
struct TarStream<'s, R> {
    inner: R,
    state: &'s State,
    codec: &'static str,
    limit: u64,
    max_long_name: u64,
    pos: u64,
    header: [u8; BLOCK as usize],
}

impl<R: Read> Read for TarStream<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.state.has_violation() || self.state.source_failed.get() {
            return Err(aborted());
        }
        let n = match self.inner.read(buf) {
            Ok(n) if n <= buf.len() => n,
            Ok(_) => {
                self.state
                    .flag(Violation::Corrupt(format!("{} decoder returned more bytes than requested", self.codec)));
                return Err(aborted());
            }
            Err(e) => {
                if !self.state.source_failed.get() && e.kind() != io::ErrorKind::Interrupted {
                    // Not from the body: the decoder rejected its input.
                    let msg = if self.state.source_eof.get() {
                        format!("truncated archive: {} stream ended early ({e})", self.codec)
                    } else {
                        format!("invalid {} stream: {e}", self.codec)
                    };
                    self.state.flag(Violation::Corrupt(msg));
                }
                return Err(e);
            }
        };
        if n == 0 {
            if !buf.is_empty() {
                self.state.stream_eof.set(true);
            }
            return Ok(0);
        }
        let start = self.pos;
        self.pos = self.pos.saturating_add(n as u64);
        if self.pos > self.limit {
            self.state.flag(Violation::TooLarge(self.limit));
            return Err(aborted());
        }
        if let Some(data) = buf.get(..n) {
            if let Err(v) = self.watch(start, data) {
                self.state.flag(v);
                return Err(aborted());
            }
        }
        Ok(n)
    }
}

impl<R> TarStream<'_, R> {
    /// Collects the armed header block out of `data` (stream bytes starting at `start`) and
    /// inspects it once complete, following chains of extension headers.
    fn watch(&mut self, start: u64, data: &[u8]) -> Result<(), Violation> {
        let end = start.saturating_add(data.len() as u64);
        while let Some(at) = self.state.armed.get() {
            let fill = self.state.armed_fill.get() as u64;
            let want = at.saturating_add(fill);
            if want >= end {
                return Ok(());
            }
            if want < start {
                // We missed bytes of this block: our bookkeeping disagrees with the reader's.
                self.state.arm(None);
                return Ok(());
            }
            let take = (BLOCK - fill).min(end - want);
            let src = data.get((want - start) as usize..(want - start + take) as usize);
            let dst = self.header.get_mut(fill as usize..(fill + take) as usize);
            match (src, dst) {
                (Some(src), Some(dst)) => dst.copy_from_slice(src),
                _ => {
                    self.state.arm(None);
                    return Ok(());
                }
            }
            let fill = fill + take;
            self.state.armed_fill.set(fill as usize);
            if fill == BLOCK {
                let next = self.inspect_header(at)?;
                self.state.arm(next);
            }
        }
        Ok(())
    }

    /// Looks at a complete header block at offset `at`; returns where the next header is, if
    /// this one is an extension header the `tar` crate will consume internally.
    fn inspect_header(&self, at: u64) -> Result<Option<u64>, Violation> {
        if self.header.iter().all(|b| *b == 0) {
            self.state.end_marker.set(true);
            return Ok(None);
        }
        let mut header = tar::Header::new_old();
        header.as_mut_bytes().copy_from_slice(&self.header);
        // Leave headers with a bad checksum to the tar crate, which reports them.
        let sum: u32 = self
            .header
            .iter()
            .enumerate()
            .map(|(i, b)| if (148..156).contains(&i) { u32::from(b' ') } else { u32::from(*b) })
            .sum();
        if header.cksum().ok() != Some(sum) {
            return Ok(None);
        }
        let entry_type = header.entry_type();
        let limit = if entry_type.is_gnu_longname() || entry_type.is_gnu_longlink() {
            self.max_long_name
        } else if entry_type.is_pax_local_extensions() {
            MAX_PAX_HEADER_BYTES
        } else if entry_type.is_gnu_sparse() {
            return Err(Violation::Invalid {
                path: display_path(&header.path_bytes()),
                reason: "GNU sparse files are unsupported".to_owned(),
            });
        } else {
            // A real entry: the entry loop re-arms the watcher once the crate has parsed it.
            return Ok(None);
        };
        let Ok(size) = header.entry_size() else {
            return Ok(None);
        };
        if size > limit {
            let what = if entry_type.is_pax_local_extensions() { "PAX extended header" } else { "GNU long name/link" };
            let name = header.path_bytes();
            return Err(Violation::Invalid {
                path: if name.is_empty() { format!("({what})") } else { display_path(&name) },
                reason: format!("{what} of {size} bytes exceeds the {limit}-byte limit"),
            });
        }
        Ok(block_align(size).and_then(|s| at.checked_add(BLOCK)?.checked_add(s)))
    }
}

fn block_align(size: u64) -> Option<u64> {
    Some(size.checked_add(BLOCK - 1)? & !(BLOCK - 1))
}

/// Hands a file's data to the sink: exactly `remaining` bytes, a short stream is an error.
struct EntryData<'a, 's, R> {
    inner: R,
    remaining: u64,
    path: &'a str,
    state: &'s State,
    failed: Option<io::Error>,
}

impl<R: Read> Read for EntryData<'_, '_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.failed.is_some() {
            return Err(aborted());
        }
        if self.remaining == 0 || buf.is_empty() {
            return Ok(0);
        }
        let want = usize::try_from(self.remaining).unwrap_or(usize::MAX).min(buf.len());
        let Some(buf) = buf.get_mut(..want) else {
            return Ok(0);
        };
        match self.inner.read(buf) {
            Ok(0) => {
                self.state.flag(Violation::Corrupt(format!(
                    "truncated archive: {:?} ends {} bytes early",
                    self.path, self.remaining
                )));
                self.failed = Some(aborted());
                Err(io::Error::new(io::ErrorKind::UnexpectedEof, "truncated archive"))
            }
            Ok(n) => {
                self.remaining = self.remaining.saturating_sub(n as u64);
                Ok(n)
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Err(e),
            Err(e) => {
                let copy = io::Error::new(e.kind(), e.to_string());
                self.failed = Some(e);
                Err(copy)
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The entry loop.

fn run<R: Read, S: EntrySink>(
    body: R,
    encoding: Encoding,
    limits: &IngestLimits,
    sink: &mut S,
    state: &State,
) -> Result<IngestStats, Failure<S::Error>> {
    let mut source = SourceReader { inner: body, state };
    if encoding != Encoding::Identity {
        return run_decoded(source, encoding, limits, sink, state);
    }
    // No declared encoding: sniff gzip/zstd magic (people upload .tar.gz without a header).
    let mut magic = [0u8; 4];
    let mut got = 0;
    while let Some(rest) = magic.get_mut(got..).filter(|rest| !rest.is_empty()) {
        match source.read(rest)? {
            0 => break,
            n => got += n,
        }
    }
    let magic = magic.get(..got).unwrap_or_default();
    let sniffed = if magic.starts_with(&[0x1f, 0x8b]) {
        Encoding::Gzip
    } else if magic.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        Encoding::Zstd
    } else {
        Encoding::Identity
    };
    let prefixed = io::Cursor::new(magic.to_vec()).chain(source);
    run_decoded(prefixed, sniffed, limits, sink, state)
}

fn run_decoded<R: Read, S: EntrySink>(
    raw: R,
    encoding: Encoding,
    limits: &IngestLimits,
    sink: &mut S,
    state: &State,
) -> Result<IngestStats, Failure<S::Error>> {
    let (decoded, codec): (Box<dyn Read + '_>, &'static str) = match encoding {
        Encoding::Identity => (Box::new(raw), "tar"),
        Encoding::Gzip => (Box::new(flate2::read::MultiGzDecoder::new(raw)), "gzip"),
        Encoding::Zstd => match zstd::stream::read::Decoder::new(raw) {
            Ok(d) => (Box::new(d), "zstd"),
            Err(e) => {
                state.flag(Violation::Corrupt(format!("zstd decoder: {e}")));
                return Err(Failure::Flagged);
            }
        },
    };
    state.arm(Some(0));
    let stream = TarStream {
        inner: decoded,
        state,
        codec,
        limit: limits.max_unpacked_bytes,
        max_long_name: u64::try_from(limits.max_path_bytes).unwrap_or(u64::MAX).saturating_add(1),
        pos: 0,
        header: [0; BLOCK as usize],
    };
    let mut archive = tar::Archive::new(stream);
    let mut walker =
        Walker { limits, tree: Tree::new(), stats: IngestStats::default(), entries: 0, deferred_symlinks: Vec::new() };
    {
        let mut entries = archive.entries()?;
        loop {
            let mut entry = match entries.next() {
                None => break,
                Some(Ok(entry)) => entry,
                Some(Err(e)) => return Err(Failure::Io(e)),
            };
            let next_header = block_align(entry.size()).and_then(|s| entry.raw_file_position().checked_add(s));
            if next_header.is_none() {
                state.flag(Violation::Corrupt("entry size overflows".to_owned()));
                return Err(Failure::Flagged);
            }
            state.arm(next_header);
            walker.entry(&mut entry, sink, state)?;
        }
    }
    if !state.end_marker.get() {
        let msg = if archive.into_inner().pos == 0 {
            "empty archive".to_owned()
        } else {
            "truncated archive: stream ended without the end-of-archive marker".to_owned()
        };
        state.flag(Violation::Corrupt(msg));
        return Err(Failure::Flagged);
    }
    // Drain trailing padding/garbage (still counted), so decoders verify their checksums.
    let mut stream = archive.into_inner();
    state.arm(None);
    io::copy(&mut stream, &mut io::sink())?;
    walker.check_deferred_symlinks(state)?;
    Ok(walker.stats)
}

/// Where a path points in the tree being built.
enum Kind {
    Dir(HashMap<Box<str>, usize>),
    File {
        size: u64,
    },
    /// A hard link, resolved to the regular file it copies.
    Hardlink {
        size: u64,
        origin: Box<str>,
    },
    Symlink,
}

/// All paths seen so far, as a tree of components (memory ~ total distinct path components).
struct Tree {
    nodes: Vec<Kind>,
}

impl Tree {
    fn new() -> Tree {
        Tree { nodes: vec![Kind::Dir(HashMap::new())] }
    }

    fn child(&self, node: usize, name: &str) -> Option<usize> {
        match self.nodes.get(node) {
            Some(Kind::Dir(children)) => children.get(name).copied(),
            _ => None,
        }
    }

    fn lookup(&self, path: &str) -> Option<&Kind> {
        let mut node = 0;
        for comp in path.split('/') {
            node = self.child(node, comp)?;
        }
        self.nodes.get(node)
    }

    fn is_dir(&self, node: usize) -> bool {
        matches!(self.nodes.get(node), Some(Kind::Dir(_)))
    }

    fn add_child(&mut self, parent: usize, name: &str, kind: Kind) -> usize {
        let id = self.nodes.len();
        self.nodes.push(kind);
        if let Some(Kind::Dir(children)) = self.nodes.get_mut(parent) {
            children.insert(name.into(), id);
        }
        id
    }

    /// Records `path` (normalised, non-empty) as `kind`; the error is the rejection reason.
    fn insert(&mut self, path: &str, kind: Kind) -> Result<(), &'static str> {
        let new_is_dir = matches!(kind, Kind::Dir(_));
        let mut comps = path.split('/').peekable();
        let mut node = 0;
        while let Some(comp) = comps.next() {
            let last = comps.peek().is_none();
            match self.child(node, comp) {
                Some(existing) if !last => {
                    if !self.is_dir(existing) {
                        return Err("a parent path is a file or link in another entry");
                    }
                    node = existing;
                }
                Some(existing) => {
                    return match (self.is_dir(existing), new_is_dir) {
                        (true, true) => Ok(()), // repeated directory entries are harmless
                        (true, false) => Err("conflicts with a directory of the same path"),
                        (false, true) => Err("conflicts with a file or link of the same path"),
                        (false, false) => Err("duplicate path"),
                    };
                }
                None if !last => node = self.add_child(node, comp, Kind::Dir(HashMap::new())),
                None => {
                    self.add_child(node, comp, kind);
                    return Ok(());
                }
            }
        }
        Ok(())
    }
}

struct Walker<'l> {
    limits: &'l IngestLimits,
    tree: Tree,
    stats: IngestStats,
    entries: u64,
    /// (link path, target) of symlinks whose target has `..` after a normal component: checked
    /// against the complete tree at the end.
    deferred_symlinks: Vec<(String, String)>,
}

fn invalid<E>(state: &State, path: impl Into<String>, reason: impl Into<String>) -> Failure<E> {
    state.flag(Violation::Invalid { path: path.into(), reason: reason.into() });
    Failure::Flagged
}

impl Walker<'_> {
    fn entry<R: Read, S: EntrySink>(
        &mut self,
        entry: &mut tar::Entry<'_, R>,
        sink: &mut S,
        state: &State,
    ) -> Result<(), Failure<S::Error>> {
        self.entries += 1;
        if self.entries > self.limits.max_entries {
            state.flag(Violation::TooLarge(self.limits.max_entries));
            return Err(Failure::Flagged);
        }
        let header = entry.header();
        let entry_type = header.entry_type();
        let type_byte = header.as_old().linkflag.first().copied().unwrap_or(0);
        let mode = header.mode();
        if entry_type.is_pax_global_extensions() {
            return Ok(()); // global PAX defaults (e.g. git archive's comment): nothing for us
        }
        let raw_path = entry.path_bytes().into_owned();
        let shown = display_path(&raw_path);
        let norm = match normalize(&raw_path, self.limits.max_path_bytes) {
            Ok(norm) => norm,
            Err(reason) => return Err(invalid(state, shown, reason)),
        };
        if let Some(reason) = sparse_pax_marker(entry) {
            return Err(invalid(state, shown, reason));
        }
        let size = entry.size();
        let is_dir =
            entry_type.is_dir() || (entry_type.is_file() && type_byte != b'7' && norm.trailing_slash && size == 0);
        if is_dir {
            if norm.path.is_empty() {
                return Ok(()); // the root itself (`./`)
            }
            return self
                .tree
                .insert(&norm.path, Kind::Dir(HashMap::new()))
                .map_err(|reason| invalid(state, norm.path.clone(), reason));
        }
        if norm.path.is_empty() {
            return Err(invalid(state, shown, "empty path"));
        }
        if norm.trailing_slash {
            return Err(invalid(state, shown, "non-directory entry with a trailing '/'"));
        }
        let path = norm.path;

        if entry_type.is_file() || entry_type.is_contiguous() {
            let mode = match mode {
                Ok(mode) => mode,
                Err(e) => {
                    state.flag(Violation::Corrupt(format!("{path:?}: {e}")));
                    return Err(Failure::Flagged);
                }
            };
            self.add_bytes(size, state)?;
            self.tree.insert(&path, Kind::File { size }).map_err(|reason| invalid(state, path.clone(), reason))?;
            let mut data = EntryData { inner: &mut *entry, remaining: size, path: &path, state, failed: None };
            let result = sink.file(&path, mode & 0o111 != 0, &mut data);
            if let Some(e) = data.failed.take() {
                // The sink saw a read error: that error, not the sink's reaction to it, counts.
                return Err(Failure::Io(e));
            }
            result.map_err(Failure::Sink)?;
            self.stats.files += 1;
            Ok(())
        } else if entry_type.is_symlink() {
            let Some(target) = entry.link_name_bytes() else {
                return Err(invalid(state, path, "symlink without a target"));
            };
            let depth = path.split('/').count().saturating_sub(1);
            let (target, deferred) = match check_symlink_target(&target, depth, self.limits.max_path_bytes) {
                Ok(ok) => ok,
                Err(reason) => return Err(invalid(state, path, reason)),
            };
            self.tree.insert(&path, Kind::Symlink).map_err(|reason| invalid(state, path.clone(), reason))?;
            sink.symlink(&path, &target).map_err(Failure::Sink)?;
            if deferred {
                self.deferred_symlinks.push((path, target));
            }
            self.stats.symlinks += 1;
            Ok(())
        } else if entry_type.is_hard_link() {
            let Some(target) = entry.link_name_bytes() else {
                return Err(invalid(state, path, "hard link without a target"));
            };
            let target = match normalize(&target, self.limits.max_path_bytes) {
                Ok(t) if !t.path.is_empty() && !t.trailing_slash => t.path,
                Ok(_) => return Err(invalid(state, path, "hard link target is not a file")),
                Err(reason) => return Err(invalid(state, path, format!("hard link target: {reason}"))),
            };
            let (size, origin) = match self.tree.lookup(&target) {
                Some(Kind::File { size }) => (*size, target.into_boxed_str()),
                Some(Kind::Hardlink { size, origin }) => (*size, origin.clone()),
                _ => {
                    return Err(invalid(
                        state,
                        path,
                        format!("hard link target {target:?} is not an earlier regular file"),
                    ))
                }
            };
            self.add_bytes(size, state)?;
            self.tree
                .insert(&path, Kind::Hardlink { size, origin: origin.clone() })
                .map_err(|reason| invalid(state, path.clone(), reason))?;
            sink.hardlink(&path, &origin).map_err(Failure::Sink)?;
            self.stats.files += 1;
            Ok(())
        } else {
            let reason = if entry_type.is_character_special() || entry_type.is_block_special() {
                "device files are not allowed".to_owned()
            } else if entry_type.is_fifo() {
                "FIFOs are not allowed".to_owned()
            } else if entry_type.is_gnu_sparse() {
                "GNU sparse files are unsupported".to_owned()
            } else {
                format!("unsupported entry type {:?}", char::from(type_byte))
            };
            Err(invalid(state, path, reason))
        }
    }

    fn add_bytes<E>(&mut self, size: u64, state: &State) -> Result<(), Failure<E>> {
        match self.stats.bytes.checked_add(size) {
            Some(total) if total <= self.limits.max_unpacked_bytes => {
                self.stats.bytes = total;
                Ok(())
            }
            _ => {
                state.flag(Violation::TooLarge(self.limits.max_unpacked_bytes));
                Err(Failure::Flagged)
            }
        }
    }

    /// Symlink targets like `a/../b` are only safe if `a` is a real directory (if it were a
    /// symlink, `..` would leave from wherever it points); checked once the whole tree is known.
    fn check_deferred_symlinks<E>(&self, state: &State) -> Result<(), Failure<E>> {
        for (link, target) in &self.deferred_symlinks {
            // (node if it exists, pushed by the target rather than by the link's own directory)
            let mut stack: Vec<(Option<usize>, bool)> = Vec::new();
            let mut current = Some(0);
            let parent_dirs = link.rsplit_once('/').map_or("", |(dir, _)| dir);
            for comp in parent_dirs.split('/').filter(|c| !c.is_empty()) {
                stack.push((current, false));
                current = current.and_then(|n| self.tree.child(n, comp));
            }
            for comp in target.split('/') {
                match comp {
                    "" | "." => {}
                    ".." => {
                        let leaving = current;
                        let Some((parent, from_target)) = stack.pop() else {
                            return Err(invalid(state, link.clone(), SYMLINK_ESCAPES));
                        };
                        // Leaving one of the link's own directories is always fine; leaving a
                        // component named by the target is only fine if it is a real directory.
                        if from_target && !leaving.is_some_and(|n| self.tree.is_dir(n)) {
                            return Err(invalid(state, link.clone(), SYMLINK_ESCAPES));
                        }
                        current = parent;
                    }
                    name => {
                        stack.push((current, true));
                        current = current.and_then(|n| self.tree.child(n, name));
                    }
                }
            }
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Path checks.

#[derive(Debug, PartialEq, Eq)]
struct Normalized {
    /// `a/b/c`; empty for the root (`.`, `./`).
    path: String,
    trailing_slash: bool,
}

/// Normalises an archive path: strips leading `./`, collapses `//` and `/./`, removes a trailing
/// `/`; rejects NUL, non-UTF-8, over-long, absolute and `..` paths.
fn normalize(raw: &[u8], max_bytes: usize) -> Result<Normalized, String> {
    if raw.contains(&0) {
        return Err("path contains a NUL byte".to_owned());
    }
    if raw.len() > max_bytes {
        return Err(format!("path longer than {max_bytes} bytes"));
    }
    let Ok(text) = std::str::from_utf8(raw) else {
        return Err("path is not valid UTF-8".to_owned());
    };
    if text.is_empty() {
        return Err("empty path".to_owned());
    }
    if text.starts_with('/') {
        return Err("absolute path".to_owned());
    }
    let mut path = String::with_capacity(text.len());
    for comp in text.split('/') {
        match comp {
            "" | "." => {}
            ".." => return Err("path contains a '..' component".to_owned()),
            name => {
                if !path.is_empty() {
                    path.push('/');
                }
                path.push_str(name);
            }
        }
    }
    Ok(Normalized { path, trailing_slash: text.ends_with('/') })
}

/// Validates a symlink target for a link `depth` directories below the root. Returns the target
/// (unchanged) and whether it needs the deferred whole-tree check (a `..` after a normal
/// component).
fn check_symlink_target(raw: &[u8], depth: usize, max_bytes: usize) -> Result<(String, bool), String> {
    if raw.is_empty() {
        return Err("empty symlink target".to_owned());
    }
    if raw.contains(&0) {
        return Err("symlink target contains a NUL byte".to_owned());
    }
    if raw.len() > max_bytes {
        return Err(format!("symlink target longer than {max_bytes} bytes"));
    }
    let Ok(target) = std::str::from_utf8(raw) else {
        return Err("symlink target is not valid UTF-8".to_owned());
    };
    if target.starts_with('/') {
        return Err("symlink target escapes the bundle root (absolute target)".to_owned());
    }
    let mut level = depth;
    let mut seen_name = false;
    let mut deferred = false;
    for comp in target.split('/') {
        match comp {
            "" | "." => {}
            ".." => {
                level = level.checked_sub(1).ok_or_else(|| "symlink target escapes the bundle root".to_owned())?;
                deferred |= seen_name;
            }
            _ => {
                level += 1;
                seen_name = true;
            }
        }
    }
    Ok((target.to_owned(), deferred))
}

/// PAX sparse formats (GNU.sparse.*) would hand the sink the sparse map as data: refuse them.
fn sparse_pax_marker<R: Read>(entry: &mut tar::Entry<'_, R>) -> Option<&'static str> {
    let extensions = entry.pax_extensions().ok()??;
    for ext in extensions.flatten() {
        if ext.key_bytes().starts_with(b"GNU.sparse.") {
            return Some("GNU sparse files are unsupported");
        }
    }
    None
}

/// A path for error messages: lossy UTF-8, control characters replaced, length capped.
fn display_path(raw: &[u8]) -> String {
    let text = String::from_utf8_lossy(raw);
    let mut out = String::new();
    for (i, c) in text.chars().enumerate() {
        if i >= MAX_DISPLAY_CHARS {
            out.push('…');
            break;
        }
        out.push(if c.is_control() { '\u{fffd}' } else { c });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[derive(Debug, Clone, PartialEq, Eq)]
    enum Event {
        File(String, bool, Vec<u8>),
        Symlink(String, String),
        Hardlink(String, String),
    }

    #[derive(Debug, thiserror::Error)]
    #[error("sink failed: {0}")]
    struct SinkError(String);

    #[derive(Default)]
    struct VecSink {
        events: Vec<Event>,
        /// Read at most this many bytes of each file.
        read_limit: Option<usize>,
        /// Fail when asked to store this path.
        fail_on: Option<String>,
        /// Pretend read errors did not happen (store what was read).
        swallow_read_errors: bool,
    }

    impl EntrySink for VecSink {
        type Error = SinkError;
        fn file(&mut self, path: &str, executable: bool, data: &mut dyn Read) -> Result<(), SinkError> {
            if self.fail_on.as_deref() == Some(path) {
                return Err(SinkError("disk full".into()));
            }
            let mut buf = Vec::new();
            let read = match self.read_limit {
                Some(n) => data.take(n as u64).read_to_end(&mut buf),
                None => data.read_to_end(&mut buf),
            };
            if !self.swallow_read_errors {
                read.map_err(|e| SinkError(e.to_string()))?;
            }
            self.events.push(Event::File(path.into(), executable, buf));
            Ok(())
        }
        fn symlink(&mut self, path: &str, target: &str) -> Result<(), SinkError> {
            self.events.push(Event::Symlink(path.into(), target.into()));
            Ok(())
        }
        fn hardlink(&mut self, path: &str, target: &str) -> Result<(), SinkError> {
            self.events.push(Event::Hardlink(path.into(), target.into()));
            Ok(())
        }
    }

    fn run_with(
        body: &[u8],
        encoding: Encoding,
        limits: &IngestLimits,
    ) -> (Result<IngestStats, IngestError<SinkError>>, Vec<Event>) {
        let mut sink = VecSink::default();
        let result = ingest(body, encoding, limits, &mut sink);
        (result, sink.events)
    }

    fn run_ok(body: &[u8]) -> (IngestStats, Vec<Event>) {
        let (result, events) = run_with(body, Encoding::Identity, &IngestLimits::default());
        match result {
            Ok(stats) => (stats, events),
            Err(e) => panic!("expected success, got {e:?}"),
        }
    }

    fn run_err(body: &[u8]) -> IngestError<SinkError> {
        run_with(body, Encoding::Identity, &IngestLimits::default()).0.expect_err("expected an error")
    }

    #[track_caller]
    fn assert_invalid(err: IngestError<SinkError>, want_path: &str, reason_part: &str) {
        match err {
            IngestError::InvalidEntry { path, reason } => {
                assert_eq!(path, want_path, "reason was {reason:?}");
                assert!(reason.contains(reason_part), "reason {reason:?} lacks {reason_part:?}");
            }
            other => panic!("expected InvalidEntry({want_path}), got {other:?}"),
        }
    }

    #[track_caller]
    fn assert_corrupt(err: IngestError<SinkError>, part: &str) {
        match err {
            IngestError::Corrupt(msg) => assert!(msg.contains(part), "{msg:?} lacks {part:?}"),
            other => panic!("expected Corrupt, got {other:?}"),
        }
    }

    fn builder() -> tar::Builder<Vec<u8>> {
        tar::Builder::new(Vec::new())
    }

    fn add_file(b: &mut tar::Builder<Vec<u8>>, path: &str, mode: u32, data: &[u8]) {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(mode);
        h.set_entry_type(tar::EntryType::Regular);
        b.append_data(&mut h, path, data).unwrap();
    }

    fn add_dir(b: &mut tar::Builder<Vec<u8>>, path: &str) {
        let mut h = tar::Header::new_gnu();
        h.set_size(0);
        h.set_mode(0o755);
        h.set_entry_type(tar::EntryType::Directory);
        b.append_data(&mut h, path, io::empty()).unwrap();
    }

    fn add_link(b: &mut tar::Builder<Vec<u8>>, kind: tar::EntryType, path: &str, target: &str) {
        let mut h = tar::Header::new_gnu();
        h.set_size(0);
        h.set_mode(0o777);
        h.set_entry_type(kind);
        b.append_link(&mut h, path, target).unwrap();
    }

    /// A raw header with arbitrary name/link bytes (bypassing the builder's path checks).
    fn raw_entry(name: &[u8], kind: u8, link: &[u8], data: &[u8]) -> Vec<u8> {
        let mut h = tar::Header::new_gnu();
        h.as_old_mut().name[..name.len()].copy_from_slice(name);
        h.as_old_mut().linkname[..link.len()].copy_from_slice(link);
        h.as_old_mut().linkflag = [kind];
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        let mut out = h.as_bytes().to_vec();
        out.extend_from_slice(data);
        out.resize(out.len().div_ceil(512) * 512, 0);
        out
    }

    fn raw_archive(entries: &[Vec<u8>]) -> Vec<u8> {
        let mut out: Vec<u8> = entries.concat();
        out.extend_from_slice(&[0; 1024]);
        out
    }

    fn good_tar() -> Vec<u8> {
        let long = format!("deep/{}/file.txt", "x".repeat(150));
        let mut b = builder();
        add_dir(&mut b, "./");
        add_dir(&mut b, "./bin/");
        add_file(&mut b, "./bin/run.sh", 0o755, b"#!/bin/sh\necho hi\n");
        add_file(&mut b, "data//nested/./a.txt", 0o644, b"hello");
        add_file(&mut b, &long, 0o600, &[7u8; 1000]);
        add_link(&mut b, tar::EntryType::Symlink, "bin/latest", "../data/nested/a.txt");
        add_link(&mut b, tar::EntryType::Link, "copy.txt", "./data/nested/a.txt");
        add_link(&mut b, tar::EntryType::Link, "copy2.txt", "copy.txt");
        add_file(&mut b, "empty", 0o644, b"");
        b.into_inner().unwrap()
    }

    fn good_events() -> Vec<Event> {
        let long = format!("deep/{}/file.txt", "x".repeat(150));
        vec![
            Event::File("bin/run.sh".into(), true, b"#!/bin/sh\necho hi\n".to_vec()),
            Event::File("data/nested/a.txt".into(), false, b"hello".to_vec()),
            Event::File(long, false, vec![7u8; 1000]),
            Event::Symlink("bin/latest".into(), "../data/nested/a.txt".into()),
            Event::Hardlink("copy.txt".into(), "data/nested/a.txt".into()),
            Event::Hardlink("copy2.txt".into(), "data/nested/a.txt".into()),
            Event::File("empty".into(), false, Vec::new()),
        ]
    }

    const GOOD_STATS: IngestStats = IngestStats { files: 6, symlinks: 1, bytes: 18 + 5 + 1000 + 5 + 5 };

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        enc.write_all(data).unwrap();
        enc.finish().unwrap()
    }

    #[test]
    fn good_tar_round_trips() {
        let (stats, events) = run_ok(&good_tar());
        assert_eq!(events, good_events());
        assert_eq!(stats, GOOD_STATS);
    }

    #[test]
    fn pax_long_path_and_link() {
        let path = format!("pax/{}/f", "p".repeat(200));
        let target = format!("../{}", "t".repeat(150));
        let mut b = builder();
        b.append_pax_extensions([("path", path.as_bytes())]).unwrap();
        let mut h = tar::Header::new_ustar();
        h.set_path("short-name").unwrap();
        h.set_size(3);
        h.set_mode(0o644);
        h.set_cksum();
        b.append(&h, &b"abc"[..]).unwrap();
        b.append_pax_extensions([("linkpath", target.as_bytes())]).unwrap();
        let mut h = tar::Header::new_ustar();
        h.set_path("pax/link").unwrap();
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_size(0);
        h.set_cksum();
        b.append(&h, io::empty()).unwrap();
        // A global header is ignored.
        let mut g = tar::Header::new_ustar();
        g.set_path("pax_global_header").unwrap();
        g.set_entry_type(tar::EntryType::XGlobalHeader);
        g.set_size(20);
        g.set_cksum();
        b.append(&g, &b"20 comment=abcdefgh\n"[..]).unwrap();
        let (stats, events) = run_ok(&b.into_inner().unwrap());
        assert_eq!(events, vec![Event::File(path, false, b"abc".to_vec()), Event::Symlink("pax/link".into(), target)]);
        assert_eq!(stats.files, 1);
    }

    #[test]
    fn gzip_and_zstd_declared_and_sniffed() {
        let tar = good_tar();
        let gz = gzip(&tar);
        let zst = zstd::encode_all(&tar[..], 3).unwrap();
        let limits = IngestLimits::default();
        for (body, enc) in
            [(&gz, Encoding::Gzip), (&gz, Encoding::Identity), (&zst, Encoding::Zstd), (&zst, Encoding::Identity)]
        {
            let (result, events) = run_with(body, enc, &limits);
            assert_eq!(result.unwrap(), GOOD_STATS, "{enc:?}");
            assert_eq!(events, good_events());
        }
        // Concatenated gzip members decode as one stream.
        let mut two = gzip(&tar[..700]);
        two.extend(gzip(&tar[700..]));
        assert_eq!(run_with(&two, Encoding::Gzip, &limits).0.unwrap(), GOOD_STATS);
        // Declared gzip that is not gzip.
        assert_corrupt(run_with(&tar, Encoding::Gzip, &limits).0.unwrap_err(), "gzip");
        assert_corrupt(run_with(&tar, Encoding::Zstd, &limits).0.unwrap_err(), "zstd");
    }

    #[test]
    fn corrupt_and_truncated_compression() {
        let gz = gzip(&good_tar());
        let limits = IngestLimits::default();
        let err = run_with(&gz[..gz.len() / 2], Encoding::Gzip, &limits).0.unwrap_err();
        assert_corrupt(err, "truncated");
        let mut bad = gz.clone();
        let n = bad.len();
        bad[n - 6] ^= 0xff; // CRC
        assert_corrupt(run_with(&bad, Encoding::Gzip, &limits).0.unwrap_err(), "gzip");
        let zst = zstd::encode_all(&good_tar()[..], 3).unwrap();
        let err = run_with(&zst[..zst.len() - 3], Encoding::Zstd, &limits).0.unwrap_err();
        assert_corrupt(err, "truncated");
    }

    #[test]
    fn trailing_bytes_after_end_marker_are_ignored() {
        let mut tar = good_tar();
        tar.extend_from_slice(&[0u8; 10240]);
        tar.extend_from_slice(b"trailing garbage");
        let (stats, events) = run_ok(&tar);
        assert_eq!(events, good_events());
        assert_eq!(stats, GOOD_STATS);
        // A single zero block also ends the archive.
        let mut one = raw_entry(b"a", b'0', b"", b"x");
        one.extend_from_slice(&[0; 512]);
        assert_eq!(run_ok(&one).0.files, 1);
    }

    #[test]
    fn partial_reads_by_the_sink_do_not_desync() {
        let mut sink = VecSink { read_limit: Some(2), ..Default::default() };
        let stats = ingest(&good_tar()[..], Encoding::Identity, &IngestLimits::default(), &mut sink).unwrap();
        assert_eq!(stats, GOOD_STATS);
        let files: Vec<_> = sink
            .events
            .iter()
            .filter_map(|e| match e {
                Event::File(p, _, d) => Some((p.as_str(), d.clone())),
                _ => None,
            })
            .collect();
        assert_eq!(files[0], ("bin/run.sh", b"#!".to_vec()));
        assert_eq!(files[2].1, vec![7u8; 2]);
        assert_eq!(files.len(), 4);
    }

    #[test]
    fn sink_error_is_passed_through() {
        let mut sink = VecSink { fail_on: Some("data/nested/a.txt".into()), ..Default::default() };
        let err = ingest(&good_tar()[..], Encoding::Identity, &IngestLimits::default(), &mut sink);
        assert!(matches!(err, Err(IngestError::Sink(SinkError(m))) if m == "disk full"));
    }

    #[test]
    fn rejects_dotdot_and_absolute_paths() {
        let a = raw_archive(&[raw_entry(b"a/../../etc/passwd", b'0', b"", b"x")]);
        assert_invalid(run_err(&a), "a/../../etc/passwd", "..");
        let a = raw_archive(&[raw_entry(b"/etc/passwd", b'0', b"", b"x")]);
        assert_invalid(run_err(&a), "/etc/passwd", "absolute");
        let a = raw_archive(&[raw_entry(b"bad\xffname", b'0', b"", b"x")]);
        assert_invalid(run_err(&a), "bad\u{fffd}name", "UTF-8");
        let a = raw_archive(&[raw_entry(b"./", b'0', b"", b"x")]);
        assert_invalid(run_err(&a), "./", "empty path");
        let a = raw_archive(&[raw_entry(b"dir/", b'2', b"x", b"")]);
        assert_invalid(run_err(&a), "dir/", "trailing");
        // Path length limit.
        let limits = IngestLimits { max_path_bytes: 10, ..Default::default() };
        let a = raw_archive(&[raw_entry(b"0123456789a", b'0', b"", b"x")]);
        let (r, _) = run_with(&a, Encoding::Identity, &limits);
        assert_invalid(r.unwrap_err(), "0123456789a", "longer than 10");
        // A GNU long name past the limit is refused before it is buffered.
        let mut b = builder();
        add_file(&mut b, &"n".repeat(300), 0o644, b"x");
        let (r, _) = run_with(&b.into_inner().unwrap(), Encoding::Identity, &limits);
        assert_invalid(r.unwrap_err(), "././@LongLink", "GNU long name");
    }

    #[test]
    fn rejects_nul_in_pax_path() {
        let mut b = builder();
        b.append_pax_extensions([("path", &b"a\0b"[..])]).unwrap();
        let mut h = tar::Header::new_ustar();
        h.set_path("x").unwrap();
        h.set_size(0);
        h.set_cksum();
        b.append(&h, io::empty()).unwrap();
        assert_invalid(run_err(&b.into_inner().unwrap()), "a\u{fffd}b", "NUL");
    }

    #[test]
    fn rejects_escaping_symlinks() {
        let a = raw_archive(&[raw_entry(b"a/link", b'2', b"../../etc", b"")]);
        assert_invalid(run_err(&a), "a/link", "escapes the bundle root");
        let a = raw_archive(&[raw_entry(b"link", b'2', b"/etc/passwd", b"")]);
        assert_invalid(run_err(&a), "link", "escapes the bundle root");
        let a = raw_archive(&[raw_entry(b"link", b'2', b"a/../..", b"")]);
        assert_invalid(run_err(&a), "link", "escapes the bundle root");
        let a = raw_archive(&[raw_entry(b"link", b'2', b"", b"")]);
        assert_invalid(run_err(&a), "link", "without a target");
        // `d/up -> ..` is fine, but `l -> d/up/..` would leave the root through it.
        let a = raw_archive(&[raw_entry(b"d/up", b'2', b"..", b""), raw_entry(b"l", b'2', b"d/up/..", b"")]);
        assert_invalid(run_err(&a), "l", "escapes the bundle root");
        // ... whereas `..` after a real directory is fine, even when the directory comes later.
        let a = raw_archive(&[
            raw_entry(b"l", b'2', b"d/../f", b""),
            raw_entry(b"d/g", b'0', b"", b"x"),
            raw_entry(b"f", b'0', b"", b"y"),
        ]);
        assert_eq!(run_ok(&a).0.symlinks, 1);
        // Entries below a symlink are refused (the symlink is not a directory).
        let a = raw_archive(&[raw_entry(b"s", b'2', b"d", b""), raw_entry(b"s/f", b'0', b"", b"x")]);
        assert_invalid(run_err(&a), "s/f", "parent");
    }

    #[test]
    fn rejects_bad_hardlinks() {
        let a = raw_archive(&[raw_entry(b"h", b'1', b"missing", b"")]);
        assert_invalid(run_err(&a), "h", "not an earlier regular file");
        let a = raw_archive(&[raw_entry(b"h", b'1', b"../x", b"")]);
        assert_invalid(run_err(&a), "h", "hard link target");
        let a = raw_archive(&[raw_entry(b"s", b'2', b"f", b""), raw_entry(b"h", b'1', b"s", b"")]);
        assert_invalid(run_err(&a), "h", "not an earlier regular file");
        let a = raw_archive(&[raw_entry(b"d/", b'5', b"", b""), raw_entry(b"h", b'1', b"d", b"")]);
        assert_invalid(run_err(&a), "h", "not an earlier regular file");
        // Forward reference.
        let a = raw_archive(&[raw_entry(b"h", b'1', b"f", b""), raw_entry(b"f", b'0', b"", b"x")]);
        assert_invalid(run_err(&a), "h", "not an earlier regular file");
    }

    #[test]
    fn rejects_special_files() {
        let a = raw_archive(&[raw_entry(b"dev/null", b'3', b"", b"")]);
        assert_invalid(run_err(&a), "dev/null", "device files are not allowed");
        let a = raw_archive(&[raw_entry(b"dev/sda", b'4', b"", b"")]);
        assert_invalid(run_err(&a), "dev/sda", "device files are not allowed");
        let a = raw_archive(&[raw_entry(b"pipe", b'6', b"", b"")]);
        assert_invalid(run_err(&a), "pipe", "FIFO");
        let a = raw_archive(&[raw_entry(b"weird", b'Z', b"", b"")]);
        assert_invalid(run_err(&a), "weird", "unsupported entry type");
        let a = raw_archive(&[raw_entry(b"sparse", b'S', b"", b"")]);
        assert_invalid(run_err(&a), "sparse", "sparse");
    }

    #[test]
    fn rejects_duplicates_and_conflicts() {
        let f = |name: &[u8]| raw_entry(name, b'0', b"", b"x");
        let d = |name: &[u8]| raw_entry(name, b'5', b"", b"");
        assert_invalid(run_err(&raw_archive(&[f(b"a"), f(b"./a")])), "a", "duplicate path");
        // file, then explicit directory / implicit directory
        assert_invalid(run_err(&raw_archive(&[f(b"a"), d(b"a/")])), "a", "conflicts");
        assert_invalid(run_err(&raw_archive(&[f(b"a"), f(b"a/b")])), "a/b", "parent");
        // explicit / implicit directory, then file
        assert_invalid(run_err(&raw_archive(&[d(b"a/"), f(b"a")])), "a", "conflicts with a directory");
        assert_invalid(run_err(&raw_archive(&[f(b"a/b"), f(b"a")])), "a", "conflicts with a directory");
        // symlink vs directory
        let s = raw_entry(b"a", b'2', b"b", b"");
        assert_invalid(run_err(&raw_archive(&[f(b"a/b"), s])), "a", "conflicts with a directory");
        // repeated directories are fine
        let (stats, _) = run_ok(&raw_archive(&[d(b"a/"), f(b"a/b"), d(b"a")]));
        assert_eq!(stats.files, 1);
    }

    #[test]
    fn truncated_archives() {
        let tar = good_tar();
        // Mid-file: the 1000-byte entry starts somewhere after byte 2048.
        let cut = tar.len() - 3000;
        assert_corrupt(run_err(&tar[..cut]), "truncated archive");
        // Mid-file with a sink that reads everything: the sink must not see a short file.
        let a = raw_archive(&[raw_entry(b"f", b'0', b"", &[1u8; 2000])]);
        let (r, events) = run_with(&a[..1500], Encoding::Identity, &IngestLimits::default());
        assert_corrupt(r.unwrap_err(), "truncated archive");
        assert!(events.is_empty());
        // At an entry boundary: no zero blocks at all.
        let a = raw_archive(&[raw_entry(b"f", b'0', b"", b"x")]);
        let (r, events) = run_with(&a[..1024], Encoding::Identity, &IngestLimits::default());
        assert_corrupt(r.unwrap_err(), "truncated archive");
        assert_eq!(events.len(), 1); // the sink saw it, but the caller discards
                                     // Missing padding of the last entry.
        assert_corrupt(run_err(&a[..600]), "truncated archive");
        // Mid-header.
        assert_corrupt(run_err(&a[..1100]), "truncated archive");
        // Gzip of a truncated tar.
        let (r, _) = run_with(&gzip(&a[..1024]), Encoding::Gzip, &IngestLimits::default());
        assert_corrupt(r.unwrap_err(), "truncated archive");
    }

    #[test]
    fn empty_and_garbage_bodies() {
        assert_corrupt(run_err(b""), "empty");
        assert_corrupt(run_err(&[0x1f]), "");
        assert_corrupt(run_err(b"this is not a tar archive at all"), "");
        assert_corrupt(run_err(&[b'x'; 4096]), "");
        let (r, _) = run_with(b"", Encoding::Gzip, &IngestLimits::default());
        assert!(matches!(r, Err(IngestError::Corrupt(_))), "{r:?}");
        // An empty but well-formed tar is accepted.
        assert_eq!(run_ok(&[0u8; 1024]).0, IngestStats::default());
    }

    #[test]
    fn gzip_bomb_is_too_large() {
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        {
            let mut b = tar::Builder::new(&mut enc);
            let mut h = tar::Header::new_gnu();
            h.set_size(50 << 20);
            h.set_mode(0o644);
            b.append_data(&mut h, "zeros", io::repeat(0).take(50 << 20)).unwrap();
            b.finish().unwrap();
        }
        let gz = enc.finish().unwrap();
        assert!(gz.len() < 1 << 20);
        let limits = IngestLimits { max_unpacked_bytes: 10 << 20, ..Default::default() };
        let (r, _) = run_with(&gz, Encoding::Identity, &limits);
        assert!(matches!(r, Err(IngestError::TooLarge { limit }) if limit == 10 << 20), "{r:?}");
        // Hard links count as copies.
        let a = raw_archive(&[
            raw_entry(b"f", b'0', b"", &[1u8; 600]),
            raw_entry(b"h1", b'1', b"f", b""),
            raw_entry(b"h2", b'1', b"f", b""),
        ]);
        let limits = IngestLimits { max_unpacked_bytes: 1500, ..Default::default() };
        let (r, _) = run_with(&a, Encoding::Identity, &limits);
        assert!(matches!(r, Err(IngestError::TooLarge { limit: 1500 })), "{r:?}");
    }

    #[test]
    fn too_many_entries() {
        let entries: Vec<_> = (0..5).map(|i| raw_entry(format!("f{i}").as_bytes(), b'0', b"", b"")).collect();
        let limits = IngestLimits { max_entries: 4, ..Default::default() };
        let (r, _) = run_with(&raw_archive(&entries), Encoding::Identity, &limits);
        assert!(matches!(r, Err(IngestError::TooLarge { limit: 4 })), "{r:?}");
    }

    /// Yields `data`, then fails with a recognisable error.
    struct FailingReader {
        data: io::Cursor<Vec<u8>>,
    }

    impl Read for FailingReader {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            match self.data.read(buf)? {
                0 => Err(io::Error::new(io::ErrorKind::ConnectionReset, "client went away")),
                n => Ok(n),
            }
        }
    }

    #[track_caller]
    fn assert_source(r: Result<IngestStats, IngestError<SinkError>>) {
        match r {
            Err(IngestError::Source(e)) => {
                assert_eq!(e.kind(), io::ErrorKind::ConnectionReset);
                assert_eq!(e.to_string(), "client went away");
            }
            other => panic!("expected Source, got {other:?}"),
        }
    }

    #[test]
    fn source_errors_pass_through() {
        let tar = good_tar();
        let limits = IngestLimits::default();
        // Mid-header, mid-file (inside the sink's read), and in the compressed stream.
        for cut in [0, 700, 3000] {
            let mut sink = VecSink::default();
            let body = FailingReader { data: io::Cursor::new(tar[..cut].to_vec()) };
            assert_source(ingest(body, Encoding::Identity, &limits, &mut sink));
        }
        let gz = gzip(&tar);
        for enc in [Encoding::Gzip, Encoding::Identity] {
            let mut sink = VecSink::default();
            let body = FailingReader { data: io::Cursor::new(gz[..gz.len() / 2].to_vec()) };
            assert_source(ingest(body, enc, &limits, &mut sink));
        }
        // Even after a complete archive (while draining).
        let mut sink = VecSink::default();
        let body = FailingReader { data: io::Cursor::new(tar) };
        assert_source(ingest(body, Encoding::Identity, &limits, &mut sink));
    }

    #[test]
    fn oversized_pax_header_and_pax_sparse_are_refused() {
        let mut b = builder();
        let big = vec![b'v'; 2 << 20];
        b.append_pax_extensions([("comment", &big[..])]).unwrap();
        add_file(&mut b, "f", 0o644, b"x");
        let err = run_err(&b.into_inner().unwrap());
        assert_invalid(err, "(PAX extended header)", "exceeds the 1048576-byte limit");
        let mut b = builder();
        b.append_pax_extensions([("GNU.sparse.major", &b"1"[..]), ("GNU.sparse.minor", b"0")]).unwrap();
        add_file(&mut b, "s", 0o644, b"map-and-data");
        assert_invalid(run_err(&b.into_inner().unwrap()), "s", "sparse");
    }

    #[test]
    fn v7_directories_and_contiguous_files() {
        let a = raw_archive(&[
            raw_entry(b"dir/", 0, b"", b""),
            raw_entry(b"dir/f", 0, b"", b"old"),
            raw_entry(b"c", b'7', b"", b"contig"),
        ]);
        let (stats, events) = run_ok(&a);
        assert_eq!(stats.files, 2);
        assert_eq!(events[0], Event::File("dir/f".into(), false, b"old".to_vec()));
        assert_eq!(events[1], Event::File("c".into(), false, b"contig".to_vec()));
        let a = raw_archive(&[raw_entry(b"dir", 0, b"", b"x"), raw_entry(b"dir/", 0, b"", b"")]);
        assert_invalid(run_err(&a), "dir", "conflicts");
    }

    #[test]
    fn read_errors_win_over_sink_reactions() {
        let a = raw_archive(&[raw_entry(b"f", b'0', b"", &[1u8; 2000])]);
        // A sink that swallows the truncation error still gets Corrupt back.
        let mut sink = VecSink { swallow_read_errors: true, ..Default::default() };
        let r = ingest(&a[..1500], Encoding::Identity, &IngestLimits::default(), &mut sink);
        assert_corrupt(r.unwrap_err(), "truncated archive");
        // The body failing inside the sink's read is Source, not Sink.
        for swallow in [false, true] {
            let mut sink = VecSink { swallow_read_errors: swallow, ..Default::default() };
            let body = FailingReader { data: io::Cursor::new(a[..1000].to_vec()) };
            assert_source(ingest(body, Encoding::Identity, &IngestLimits::default(), &mut sink));
        }
        // The bomb limit hit inside the sink's read is TooLarge.
        let limits = IngestLimits { max_unpacked_bytes: 4096, ..Default::default() };
        let big = raw_archive(&[raw_entry(b"f", b'0', b"", &[1u8; 2000]), raw_entry(b"g", b'0', b"", &[2u8; 2000])]);
        let (r, events) = run_with(&big, Encoding::Identity, &limits);
        assert!(matches!(r, Err(IngestError::TooLarge { limit: 4096 })), "{r:?}");
        assert_eq!(events.len(), 1); // `g` failed inside the sink's read
    }

    #[test]
    fn sink_that_reads_nothing() {
        let mut sink = VecSink { read_limit: Some(0), ..Default::default() };
        let gz = gzip(&good_tar());
        let stats = ingest(&gz[..], Encoding::Gzip, &IngestLimits::default(), &mut sink).unwrap();
        assert_eq!(stats, GOOD_STATS);
        assert_eq!(sink.events.len(), good_events().len());
    }

    #[test]
    fn normalize_paths() {
        let n = |p: &str| normalize(p.as_bytes(), 4096).map(|n| n.path);
        assert_eq!(n("./a//b/./c/").unwrap(), "a/b/c");
        assert_eq!(n("././a").unwrap(), "a");
        assert_eq!(n(".").unwrap(), "");
        assert!(n("").is_err());
        assert!(n("a/..").is_err());
        assert!(n("//a").is_err());
        assert!(normalize(b"a/b/", 4096).unwrap().trailing_slash);
    }
}
