//! The sink every source writes into: a new storage revision, under each source's destination,
//! within the Bundle's limits, with the format inspector watching.
//!
//! Limits are enforced while bytes flow (a file is cut off the moment it passes a limit), across
//! all sources of one unpack: total size, entry count (files, symlinks and directories), single-file
//! size, path length and the expansion ratio (unpacked bytes per downloaded or uploaded byte). On
//! any error the caller drops the revision writer, which releases everything written. A tree with
//! no file or symlink at all (nothing, or only directories) is refused unless the Bundle says
//! empty content is intended (`spec.allowEmpty`): an upload or a source gone empty by mistake
//! must not replace what a Bundle serves.
//!
//! Sources are layered in order: a directory two sources share is one directory (the first
//! source's mode wins), a file or link two sources write is refused, naming both sources.

use std::io::Read;
use std::sync::Arc;

use super::error::UnpackError;
use super::format::{FormatReport, Inspector, MAX_INSPECTED_BYTES};
use super::source::{Budget, UnpackLimits};
use super::EntrySink;
use crate::storage::{RangeSpec, RevisionId, RevisionWriter, StorageError, Store, DUPLICATE_PATH};

/// Unpacked bytes below which the expansion ratio is not checked (tiny archives compress well).
const RATIO_FLOOR: u64 = 1 << 20;

pub struct TreeSink<'w> {
    writer: &'w mut RevisionWriter,
    prefix: String,
    /// Each source's prefix so far, in order; the last is the one being written.
    destinations: Vec<String>,
    limits: UnpackLimits,
    budget: Arc<Budget>,
    /// Entries stored (files, symlinks, directories): what `max_files` bounds.
    entries: u64,
    /// Files and symlinks stored: none makes an empty tree.
    files: u64,
    bytes: u64,
    inspector: Inspector,
}

impl<'w> TreeSink<'w> {
    pub fn new(writer: &'w mut RevisionWriter, limits: UnpackLimits, budget: Arc<Budget>) -> Self {
        TreeSink {
            writer,
            prefix: String::new(),
            destinations: Vec::new(),
            limits,
            budget,
            entries: 0,
            files: 0,
            bytes: 0,
            inspector: Inspector::default(),
        }
    }

    /// The next source starts: its files go under `destination` (`spec.sources[i].destination`,
    /// already validated; each call is the next `i`).
    pub fn set_destination(&mut self, destination: &str) {
        self.prefix = prefix_of(destination);
        self.destinations.push(self.prefix.clone());
    }

    /// Validates the format (see [`Inspector::finish`]) after refusing a tree without a single
    /// file or symlink ([`UnpackError::Empty`]) unless `allow_empty` (`spec.allowEmpty`) says empty
    /// content is intended; an empty tree then has no format to detect, only a declared one to fail.
    pub fn finish(
        mut self,
        declared_format: &str,
        strict: bool,
        allow_empty: bool,
    ) -> Result<FormatReport, UnpackError> {
        self.inspector.set_destinations(self.destinations);
        conclude(self.inspector, self.files, declared_format, strict, allow_empty)
    }

    /// A storage refusal of `path`, a file or link of the current source: a duplicate names the
    /// earlier sources that could have written it.
    fn refused(&self, path: &str, err: StorageError) -> UnpackError {
        let duplicate = matches!(&err, StorageError::DuplicatePath { .. });
        let current = self.destinations.len().saturating_sub(1);
        let earlier: Vec<String> = (self.destinations.iter().enumerate().take(current))
            .filter(|(_, prefix)| path.starts_with(prefix.as_str()))
            .map(|(i, _)| format!("spec.sources[{i}]"))
            .collect();
        if !duplicate || earlier.is_empty() {
            return storage_error(err);
        }
        let reason = format!(
            "{DUPLICATE_PATH}: spec.sources[{current}] writes it, and {} already did (give the sources \
             destinations that do not overlap)",
            earlier.join(" or ")
        );
        UnpackError::InvalidEntry { path: path.to_owned(), reason }
    }

    /// The final path of a file or symlink, counted and shown to the inspector.
    fn place(&mut self, path: &str) -> Result<String, UnpackError> {
        let placed = self.place_entry(path)?;
        self.files += 1;
        self.inspector.saw(&placed);
        Ok(placed)
    }

    /// The final path of any entry, within the path and entry limits.
    fn place_entry(&mut self, path: &str) -> Result<String, UnpackError> {
        let placed = format!("{}{path}", self.prefix);
        if placed.len() > self.limits.max_path_bytes {
            return Err(UnpackError::TooLarge(format!(
                "path {:?}… is {} bytes long, over the limit of {}",
                placed.chars().take(64).collect::<String>(),
                placed.len(),
                self.limits.max_path_bytes
            )));
        }
        self.entries += 1;
        if self.entries > self.limits.max_files {
            return Err(UnpackError::TooLarge(format!(
                "more than {} files (directories included)",
                self.limits.max_files
            )));
        }
        Ok(placed)
    }
}

impl EntrySink for TreeSink<'_> {
    type Error = UnpackError;

    fn file(&mut self, path: &str, mode: u32, size: u64, data: &mut dyn Read) -> Result<(), UnpackError> {
        let path = self.place(path)?;
        let mut counted =
            Counted { inner: data, size: 0, before: self.bytes, limits: self.limits, budget: &self.budget };
        let result = if Inspector::wants(&path) {
            // Object and metadata files are small: read one whole, look at it, then store it.
            let mut buffer = Vec::new();
            let read = (&mut counted).take(MAX_INSPECTED_BYTES + 1).read_to_end(&mut buffer);
            match read {
                Err(e) => Err(StorageError::Io(e)),
                Ok(_) => {
                    if buffer.len() as u64 > MAX_INSPECTED_BYTES {
                        self.inspector.too_large(&path);
                    } else {
                        self.inspector.observe(&path, &buffer);
                    }
                    self.writer.add_file(&path, mode, size, &mut buffer.as_slice().chain(&mut counted))
                }
            }
        } else {
            self.writer.add_file(&path, mode, size, &mut counted)
        };
        self.bytes += counted.size;
        result.map_err(|e| self.refused(&path, e))
    }

    fn dir(&mut self, path: &str, mode: u32) -> Result<(), UnpackError> {
        let path = self.place_entry(path)?;
        match self.writer.add_dir(&path, mode) {
            // A directory an earlier source made (a directory's key is never a file's).
            Err(StorageError::DuplicatePath { .. }) if self.destinations.len() > 1 => {
                self.entries -= 1;
                Ok(())
            }
            other => other.map_err(storage_error),
        }
    }

    fn symlink(&mut self, path: &str, target: &str) -> Result<(), UnpackError> {
        let path = self.place(path)?;
        self.writer.add_symlink(&path, target).map_err(|e| self.refused(&path, e))
    }

    fn hardlink(&mut self, path: &str, target: &str) -> Result<(), UnpackError> {
        let path = self.place(path)?;
        let target = format!("{}{target}", self.prefix);
        // Stored as a copy: its bytes count again.
        let size = self.writer.add_hardlink(&path, &target).map_err(|e| self.refused(&path, e))?;
        self.bytes += size;
        if self.bytes > self.limits.max_total_bytes {
            return Err(total_too_large(&self.limits));
        }
        Ok(())
    }
}

/// [`TreeSink::finish`] for a tree of `files` files and symlinks the `inspector` saw.
fn conclude(
    inspector: Inspector,
    files: u64,
    declared_format: &str,
    strict: bool,
    allow_empty: bool,
) -> Result<FormatReport, UnpackError> {
    if files == 0 {
        if !allow_empty {
            return Err(UnpackError::Empty);
        }
        if declared_format.is_empty() {
            return Ok(FormatReport::default());
        }
    }
    inspector.finish(declared_format, strict)
}

/// `dir/` for a destination `dir` (empty: the root).
fn prefix_of(destination: &str) -> String {
    let destination = destination.trim_matches('/');
    if destination.is_empty() {
        String::new()
    } else {
        format!("{destination}/")
    }
}

/// The checks [`TreeSink::finish`] makes, made again on a committed revision: whether the content
/// a Bundle serves is valid for its changed spec (`spec.format`, `spec.allowEmpty`), its sources
/// placed under `destinations`. Reads only the files the inspector looks at, each at most
/// [`MAX_INSPECTED_BYTES`]. `strict` as for [`TreeSink::finish`]. Blocking.
pub fn recheck(
    store: &Store,
    revision: RevisionId,
    destinations: &[String],
    (declared_format, strict, allow_empty): (&str, bool, bool),
) -> Result<FormatReport, UnpackError> {
    let mut inspector = Inspector::default();
    inspector.set_destinations(destinations.iter().map(|d| prefix_of(d)).collect());
    let mut files = 0u64;
    for entry in store.files(revision, "") {
        let entry = entry?;
        if entry.is_dir() {
            continue;
        }
        files += 1;
        inspector.saw(&entry.path);
        if entry.is_symlink() || !Inspector::wants(&entry.path) {
            continue;
        }
        if entry.size > MAX_INSPECTED_BYTES {
            inspector.too_large(&entry.path);
            continue;
        }
        let mut bytes = Vec::new();
        let whole = RangeSpec { start: 0, end: entry.size };
        store.read_file(revision, &entry, whole, &mut |chunk| {
            bytes.extend_from_slice(chunk);
            Ok(())
        })?;
        inspector.observe(&entry.path, &bytes);
    }
    conclude(inspector, files, declared_format, strict, allow_empty)
}

/// A file's bytes on their way into the store, checked against the limits as they pass.
struct Counted<'a> {
    inner: &'a mut dyn Read,
    size: u64,
    /// Bytes of the tree before this file.
    before: u64,
    limits: UnpackLimits,
    budget: &'a Budget,
}

impl Read for Counted<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.size += n as u64;
        let total = self.before + self.size;
        let limits = &self.limits;
        let error = if self.size > limits.max_file_bytes {
            Some(UnpackError::TooLarge(format!("a file is larger than the limit of {} bytes", limits.max_file_bytes)))
        } else if total > limits.max_total_bytes {
            Some(total_too_large(limits))
        } else {
            ratio_exceeded(limits, self.budget, total)
        };
        match error {
            Some(e) => Err(e.into_io()),
            None => Ok(n),
        }
    }
}

fn total_too_large(limits: &UnpackLimits) -> UnpackError {
    UnpackError::TooLarge(format!("content is larger than the limit of {} bytes", limits.max_total_bytes))
}

fn ratio_exceeded(limits: &UnpackLimits, budget: &Budget, unpacked: u64) -> Option<UnpackError> {
    let downloaded = budget.downloaded();
    let exceeded = downloaded > 0 && unpacked > RATIO_FLOOR && unpacked / downloaded >= limits.max_expansion_ratio;
    exceeded.then(|| {
        UnpackError::TooLarge(format!(
            "content expands more than {}x ({unpacked} bytes from {downloaded} compressed bytes received): refusing \
             a likely compression bomb (--max-expansion-ratio)",
            limits.max_expansion_ratio
        ))
    })
}

/// Storage errors keep their meaning: a limit hit inside a reader comes back as that limit, an
/// invalid entry as an invalid entry; the rest is a (transient) storage failure.
fn storage_error(err: StorageError) -> UnpackError {
    match err {
        StorageError::Io(io) => match io.get_ref().is_some_and(|inner| inner.is::<UnpackError>()) {
            true => UnpackError::from_io("", io),
            false => UnpackError::Storage(StorageError::Io(io)),
        },
        StorageError::InvalidEntry { path, reason } => UnpackError::InvalidEntry { path, reason },
        StorageError::DuplicatePath { path } => UnpackError::InvalidEntry { path, reason: DUPLICATE_PATH.into() },
        other => UnpackError::Storage(other),
    }
}

#[cfg(test)]
mod tests;
