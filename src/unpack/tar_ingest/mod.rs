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

mod decode_ahead;
mod paths;
mod stream;
#[cfg(test)]
mod tests;
mod walker;

use std::cell::Cell;
use std::io::{self, Read};

use self::decode_ahead::DecodeAhead;
use self::stream::{block_align, SourceReader, TarStream};
use self::walker::Walker;
use super::EntrySink;

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
    /// Directories the archive names (each once).
    pub dirs: u64,
    /// Total size of the files (hard links counted again).
    pub bytes: u64,
}

/// Why an archive was not ingested. `E` is the sink's error type.
#[derive(Debug, thiserror::Error)]
pub enum IngestError<E> {
    /// An unsafe or unsupported entry (answer 422, naming the path).
    #[error("invalid archive entry {path:?}: {reason}")]
    InvalidEntry { path: String, reason: String },
    /// Truncated or corrupt archive or compression stream, or not an archive at all (answer 400).
    /// The message is complete and plain: it names the entry and the rule, never quotes the
    /// data or a library's wording.
    #[error("{0}")]
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
pub fn ingest<R: Read, S: EntrySink + ?Sized>(
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
    /// Entry headers seen so far (extension headers not counted): the number of the current entry.
    entries: Cell<u64>,
    /// The number and path of the last entry whose path was read, for messages.
    last: Cell<Option<(u64, String)>>,
    /// What the tar stream was decoded from: `tar` (nothing), `gzip` or `zstd`.
    codec: Cell<&'static str>,
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

    /// Names entry `n` for a message: `entry 3 ("a/b.yaml")` once its path is known, else
    /// `entry 3 (after "a/a.yaml")`, or `entry 1`.
    fn entry(&self, n: u64) -> String {
        let last = self.last.take();
        let label = match &last {
            Some((m, path)) if *m == n => format!("entry {n} ({path:?})"),
            Some((_, path)) => format!("entry {n} (after {path:?})"),
            None => format!("entry {n}"),
        };
        self.last.set(last);
        label
    }

    /// The message for a stream the `tar` crate refused without one of our checks saying why
    /// (its own wording is never shown: it can quote the data).
    fn unexplained(&self) -> String {
        let codec = self.codec.get();
        let fill = self.armed_fill.get();
        let entry = self.entry(self.entries.get().max(1));
        if !self.stream_eof.get() {
            return format!("corrupt archive: {entry}: the tar header is malformed");
        }
        match self.armed.get() {
            Some(0) if codec == "tar" => {
                format!("not a tar archive (plain, gzip or zstd): {fill} bytes, shorter than one 512-byte tar header")
            }
            Some(0) => format!(
                "not a tar archive: the {codec} data decompresses to {fill} bytes, shorter than one 512-byte tar header"
            ),
            Some(_) if fill > 0 => {
                format!("truncated archive: the data ends inside the header of {}", self.entry(self.entries.get() + 1))
            }
            _ => format!("truncated archive: the data ends inside {entry}"),
        }
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
        // The error surfaced from the tar crate (or a reader under it) without a recorded cause.
        if let Some(e) = err {
            tracing::debug!(error = %e, "tar stream refused");
        }
        IngestError::Corrupt(self.unexplained())
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
// The entry loop.

fn run<R: Read, S: EntrySink + ?Sized>(
    body: R,
    encoding: Encoding,
    limits: &IngestLimits,
    sink: &mut S,
    state: &State,
) -> Result<IngestStats, Failure<S::Error>> {
    let mut source = SourceReader::new(body, state);
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

fn run_decoded<R: Read, S: EntrySink + ?Sized>(
    raw: R,
    encoding: Encoding,
    limits: &IngestLimits,
    sink: &mut S,
    state: &State,
) -> Result<IngestStats, Failure<S::Error>> {
    let started = match encoding {
        Encoding::Identity => Ok((Box::new(raw) as Box<dyn Read + '_>, "tar")),
        Encoding::Gzip => DecodeAhead::start(raw, state, |handed| Ok(flate2::read::MultiGzDecoder::new(handed)))
            .map(|d| (Box::new(d) as Box<dyn Read + '_>, "gzip")),
        Encoding::Zstd => DecodeAhead::start(raw, state, zstd::stream::read::Decoder::new)
            .map(|d| (Box::new(d) as Box<dyn Read + '_>, "zstd")),
    };
    let (decoded, codec) = match started {
        Ok(started) => started,
        Err(e) => {
            tracing::warn!(error = %e, "starting a decoder thread failed");
            state.flag(Violation::Corrupt("the decoder could not be started".to_owned()));
            return Err(Failure::Flagged);
        }
    };
    state.codec.set(codec);
    state.arm(Some(0));
    let stream = TarStream::new(decoded, state, codec, limits);
    let mut archive = tar::Archive::new(stream);
    let mut walker = Walker::new(limits);
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
                let entry = state.entry(state.entries.get());
                state.flag(Violation::Corrupt(format!("corrupt archive: {entry}: the size field is out of range")));
                return Err(Failure::Flagged);
            }
            state.arm(next_header);
            walker.entry(&mut entry, sink, state)?;
        }
    }
    if !state.end_marker.get() {
        let msg = match (archive.into_inner().position(), state.entries.get()) {
            (0, _) if codec == "tar" => "empty archive: there is no data".to_owned(),
            (0, _) => format!("empty archive: the {codec} data decompresses to nothing"),
            (_, n) => format!(
                "truncated archive: the data ends after {} without the end-of-archive marker",
                state.entry(n.max(1))
            ),
        };
        state.flag(Violation::Corrupt(msg));
        return Err(Failure::Flagged);
    }
    // Drain trailing padding/garbage (still counted), so decoders verify their checksums.
    let mut stream = archive.into_inner();
    state.arm(None);
    io::copy(&mut stream, &mut io::sink())?;
    walker.finish(state)
}
