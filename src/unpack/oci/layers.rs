//! Flattening image layers with OCI whiteouts, streaming and without a scratch directory.
//!
//! Layers are read top-down (the last layer of the manifest first). [`LayerSink`] forwards an
//! entry to the real sink only when no upper layer already decided that path: provided it (a
//! file or symlink there wins), provided a non-directory at an ancestor (a file or symlink
//! replaces the whole subtree below it), provided a directory there (a directory hides a lower
//! file of the same name; a directory entry, a lower directory entry: the upper one's mode wins),
//! deleted it or an ancestor with a `.wh.NAME` whiteout (directories included), or made an
//! ancestor opaque with `.wh..wh..opq`. Whiteout files themselves are never forwarded. Memory
//! grows with the number of paths, never with their content.

use std::collections::{HashMap, HashSet};
use std::io::Read;

use crate::unpack::error::UnpackError;
use crate::unpack::source::Sink;
use crate::unpack::EntrySink;

const WHITEOUT_PREFIX: &str = ".wh.";
const OPAQUE_MARKER: &str = ".wh..wh..opq";

// What upper layers decided about a path (bit flags).
const NON_DIR: u8 = 1;
const DIR: u8 = 2;
const DELETED: u8 = 4;
const OPAQUE: u8 = 8;
/// A directory entry of this path was forwarded (an upper layer's mode wins).
const DIR_ENTRY: u8 = 16;

/// Wraps the real sink while one image's layers are ingested, topmost first; call
/// [`LayerSink::finish_layer`] after each layer.
pub struct LayerSink<'s, 'a> {
    inner: &'s mut Sink<'a>,
    /// Decisions of the layers finished so far, plus the files and directories of the current one.
    marks: HashMap<String, u8>,
    /// Whiteouts and opaque markers of the current layer: they only affect lower layers.
    pending: Vec<(String, u8)>,
    /// Files of the current layer that were forwarded: the only valid hard link targets.
    layer_files: HashSet<String>,
}

impl<'s, 'a> LayerSink<'s, 'a> {
    pub fn new(inner: &'s mut Sink<'a>) -> Self {
        LayerSink { inner, marks: HashMap::new(), pending: Vec::new(), layer_files: HashSet::new() }
    }

    /// Ends the current layer: its whiteouts and opaque directories now hide lower layers.
    pub fn finish_layer(&mut self) {
        for (path, flag) in self.pending.drain(..) {
            *self.marks.entry(path).or_default() |= flag;
        }
        self.layer_files.clear();
    }

    fn mark(&self, path: &str) -> u8 {
        self.marks.get(path).copied().unwrap_or(0)
    }

    /// Whether upper layers hide a lower entry at `path`.
    fn hidden(&self, path: &str) -> bool {
        if self.mark(path) & (NON_DIR | DIR | DELETED) != 0 {
            return true;
        }
        ancestors(path).any(|a| self.mark(a) & (NON_DIR | DELETED | OPAQUE) != 0)
    }

    /// Records a forwarded non-directory at `path` and the directories it implies.
    fn provide(&mut self, path: &str) {
        for a in ancestors(path) {
            *self.marks.entry(a.to_owned()).or_default() |= DIR;
        }
        *self.marks.entry(path.to_owned()).or_default() |= NON_DIR;
    }

    /// Handles a whiteout entry; `Ok(true)` when `path` was one (and must not be forwarded).
    fn whiteout(&mut self, path: &str) -> Result<bool, UnpackError> {
        let (dir, name) = match path.rsplit_once('/') {
            Some((dir, name)) => (Some(dir), name),
            None => (None, path),
        };
        if let Some(dir) = dir {
            if dir.split('/').any(|c| c.starts_with(WHITEOUT_PREFIX)) {
                return Err(invalid(path, "a whiteout cannot be a directory"));
            }
        }
        if !name.starts_with(WHITEOUT_PREFIX) {
            return Ok(false);
        }
        // A whiteout under a path an upper layer already decided changes nothing.
        if self.mark("") & OPAQUE != 0 || self.hidden(path) {
            return Ok(true);
        }
        // The whiteout's directory exists in this layer: it hides lower non-directories there.
        for a in ancestors(path) {
            *self.marks.entry(a.to_owned()).or_default() |= DIR;
        }
        if name == OPAQUE_MARKER {
            // The root directory cannot be opaque with respect to anything but lower layers'
            // entries, which is what an opaque root means: hide them all.
            self.pending.push((dir.unwrap_or_default().to_owned(), OPAQUE));
            return Ok(true);
        }
        let deleted = name.get(WHITEOUT_PREFIX.len()..).unwrap_or_default();
        if deleted.is_empty() || deleted == "." || deleted == ".." || deleted.starts_with(WHITEOUT_PREFIX) {
            return Err(invalid(path, "malformed whiteout"));
        }
        let target = match dir {
            Some(dir) => format!("{dir}/{deleted}"),
            None => deleted.to_owned(),
        };
        self.pending.push((target, DELETED));
        Ok(true)
    }

    /// Whether upper layers hide a lower directory entry at `path`: one replaced, deleted or
    /// already gave it (a directory only implied by upper files does not: its mode comes from
    /// the lowest layer that names it).
    fn dir_hidden(&self, path: &str) -> bool {
        if self.mark("") & OPAQUE != 0 || self.mark(path) & (NON_DIR | DELETED | DIR_ENTRY) != 0 {
            return true;
        }
        ancestors(path).any(|a| self.mark(a) & (NON_DIR | DELETED | OPAQUE) != 0)
    }

    /// Common checks for every entry: `Ok(true)` when it should reach the inner sink.
    fn admit(&mut self, path: &str) -> Result<bool, UnpackError> {
        if self.whiteout(path)? {
            return Ok(false);
        }
        // An opaque root (`.wh..wh..opq` at the top) hides every lower entry.
        if self.mark("") & OPAQUE != 0 || self.hidden(path) {
            return Ok(false);
        }
        self.provide(path);
        Ok(true)
    }
}

impl EntrySink for LayerSink<'_, '_> {
    type Error = UnpackError;

    fn file(&mut self, path: &str, mode: u32, size: u64, data: &mut dyn Read) -> Result<(), UnpackError> {
        if !self.admit(path)? {
            // Unread data is skipped by the archive reader.
            return Ok(());
        }
        self.layer_files.insert(path.to_owned());
        self.inner.file(path, mode, size, data)
    }

    fn dir(&mut self, path: &str, mode: u32) -> Result<(), UnpackError> {
        if path.split('/').any(|c| c.starts_with(WHITEOUT_PREFIX)) {
            return Err(invalid(path, "a whiteout cannot be a directory"));
        }
        if self.dir_hidden(path) {
            return Ok(());
        }
        for a in ancestors(path) {
            *self.marks.entry(a.to_owned()).or_default() |= DIR;
        }
        *self.marks.entry(path.to_owned()).or_default() |= DIR | DIR_ENTRY;
        self.inner.dir(path, mode)
    }

    fn symlink(&mut self, path: &str, target: &str) -> Result<(), UnpackError> {
        if !self.admit(path)? {
            return Ok(());
        }
        self.inner.symlink(path, target)
    }

    fn hardlink(&mut self, path: &str, target: &str) -> Result<(), UnpackError> {
        if !self.admit(path)? {
            return Ok(());
        }
        // The archive reader checked that `target` is an earlier file of this layer; if an upper
        // layer replaced it, its bytes were never stored and the link cannot be made a copy.
        if !self.layer_files.contains(target) {
            return Err(invalid(path, &format!("hard link to {target:?}, which is not a file written by this layer")));
        }
        self.layer_files.insert(path.to_owned());
        self.inner.hardlink(path, target)
    }
}

/// The proper ancestors of a normalised relative path, nearest last: `a/b/c` → `a`, `a/b`.
fn ancestors(path: &str) -> impl Iterator<Item = &str> {
    path.match_indices('/').filter_map(move |(i, _)| path.get(..i))
}

fn invalid(path: &str, reason: &str) -> UnpackError {
    UnpackError::InvalidEntry { path: path.to_owned(), reason: reason.to_owned() }
}

#[cfg(test)]
#[path = "layers_tests.rs"]
mod tests;
