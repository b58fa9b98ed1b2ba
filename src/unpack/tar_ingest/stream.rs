//! Reader plumbing: the layers between the request body and the `tar` crate.
//!
//! [`SourceReader`] wraps the raw body, [`TarStream`] sits on the decoded stream (byte limit,
//! decoder error attribution, header watching), and [`EntryData`] hands one file's bytes to the
//! sink. All of them report problems through the shared [`State`].

use std::io::{self, Read};

use super::paths::display_path;
use super::{aborted, IngestLimits, State, Violation};

/// Tar block size.
const BLOCK: u64 = 512;
/// Largest PAX extended header (`x`) accepted; the `tar` crate holds it in memory.
const MAX_PAX_HEADER_BYTES: u64 = 1024 * 1024;
/// What a body whose first block is no tar header is told.
const NOT_TAR: &str = "not a tar archive (plain, gzip or zstd): the first 512 bytes are not a tar header";

/// Wraps the raw body: keeps its first error for [`IngestError::Source`](super::IngestError::Source),
/// retries `Interrupted`.
pub(super) struct SourceReader<'s, R> {
    inner: R,
    state: &'s State,
}

impl<'s, R> SourceReader<'s, R> {
    pub(super) fn new(inner: R, state: &'s State) -> Self {
        SourceReader { inner, state }
    }
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
/// EOF, and watches tar header blocks (see the [parent module docs](super)).
pub(super) struct TarStream<'s, R> {
    inner: R,
    state: &'s State,
    codec: &'static str,
    limit: u64,
    max_long_name: u64,
    pos: u64,
    header: [u8; BLOCK as usize],
}

impl<'s, R> TarStream<'s, R> {
    /// `inner` is the decoded stream, `codec` names its decoder in error messages.
    pub(super) fn new(inner: R, state: &'s State, codec: &'static str, limits: &IngestLimits) -> Self {
        TarStream {
            inner,
            state,
            codec,
            limit: limits.max_unpacked_bytes,
            max_long_name: u64::try_from(limits.max_path_bytes).unwrap_or(u64::MAX).saturating_add(1),
            pos: 0,
            header: [0; BLOCK as usize],
        }
    }

    /// Decoded bytes read so far.
    pub(super) fn position(&self) -> u64 {
        self.pos
    }
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
                    // Not from the body: the decoder rejected its input. Its wording is logged,
                    // not shown: what it says is about its internals, not the user's file.
                    tracing::debug!(codec = self.codec, error = %e, "decoder refused its input");
                    let (codec, pos) = (self.codec, self.pos);
                    let msg = if self.state.source_eof.get() {
                        format!("truncated archive: the {codec} data ends early, after {pos} decompressed bytes")
                    } else if pos == 0 {
                        format!("not valid {codec} data: nothing could be decompressed")
                    } else {
                        format!("corrupt archive: the {codec} data is invalid after {pos} decompressed bytes")
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
        // The tar crate checks the same sum, but its message quotes the field's bytes.
        let sum: u32 = self
            .header
            .iter()
            .enumerate()
            .map(|(i, b)| if (148..156).contains(&i) { u32::from(b' ') } else { u32::from(*b) })
            .sum();
        if header.cksum().ok() != Some(sum) {
            return Err(Violation::Corrupt(match (at, self.codec) {
                (0, "tar") => NOT_TAR.to_owned(),
                (0, codec) => format!(
                    "not a tar archive: the {codec} data holds no tar header (its first 512 bytes, decompressed, are \
                     not one)"
                ),
                _ => format!(
                    "corrupt archive: {}: the header checksum does not match",
                    self.state.entry(self.state.entries.get() + 1)
                ),
            }));
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
            self.state.entries.set(self.state.entries.get() + 1);
            if header.entry_size().is_err() {
                let entry = self.state.entry(self.state.entries.get());
                return Err(Violation::Corrupt(format!("corrupt archive: {entry}: the size field is not a number")));
            }
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

/// Rounds `size` up to a whole number of blocks; `None` on overflow.
pub(super) fn block_align(size: u64) -> Option<u64> {
    Some(size.checked_add(BLOCK - 1)? & !(BLOCK - 1))
}

/// Hands a file's data to the sink: exactly `remaining` bytes, a short stream is an error.
pub(super) struct EntryData<'a, 's, R> {
    inner: R,
    remaining: u64,
    /// The entry's number and path, for messages.
    entry: u64,
    path: &'a str,
    state: &'s State,
    failed: Option<io::Error>,
}

impl<'a, 's, R> EntryData<'a, 's, R> {
    pub(super) fn new(inner: R, remaining: u64, entry: u64, path: &'a str, state: &'s State) -> Self {
        EntryData { inner, remaining, entry, path, state, failed: None }
    }

    /// The read error the sink saw, if any (taken, so it is reported once).
    pub(super) fn take_failure(&mut self) -> Option<io::Error> {
        self.failed.take()
    }
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
                    "truncated archive: entry {} ({:?}) ends {} bytes early",
                    self.entry, self.path, self.remaining
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
