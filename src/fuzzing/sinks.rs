//! What the archive targets write into: a real revision of a store shared by the whole process
//! (in `/dev/shm` when there is one: fsyncs there cost nothing), behind [`CheckedSink`], which
//! asserts what every sink is promised about the entries it receives.

use std::collections::HashSet;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::OnceLock;

use super::Outcome;
use crate::storage::{Store, StoreOptions};
use crate::unpack::sink::TreeSink;
use crate::unpack::source::{Sink, UnpackLimits};
use crate::unpack::{EntrySink, UnpackError};

const STORE_DIR_PREFIX: &str = "stowage-fuzz-";

fn store() -> &'static Store {
    static STORE: OnceLock<Store> = OnceLock::new();
    STORE.get_or_init(|| {
        let base = PathBuf::from("/dev/shm");
        let base = if base.is_dir() { base } else { std::env::temp_dir() };
        remove_stale_stores(&base);
        let dir = base.join(format!("{STORE_DIR_PREFIX}{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let options = StoreOptions { cache_bytes: 4 << 20, ..StoreOptions::default() };
        Store::open(&dir, options).unwrap_or_else(|e| panic!("opening the fuzzing store in {}: {e}", dir.display()))
    })
}

/// Stores of processes that are gone (a fuzzer never exits cleanly).
fn remove_stale_stores(base: &std::path::Path) {
    let Ok(entries) = std::fs::read_dir(base) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.strip_prefix(STORE_DIR_PREFIX)) else { continue };
        if !PathBuf::from("/proc").join(pid).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// Runs `fill` on a `TreeSink` over a new revision, then checks the format (`declared`, as an
/// upload does) and finalizes; the revision is released at the end either way. Bad input may
/// only fail as a client error: an entry, format, size or archive problem.
pub(super) fn with_revision(
    limits: UnpackLimits,
    fill: impl FnOnce(&mut TreeSink<'_>) -> Result<(), UnpackError>,
    declared: &str,
) -> Outcome {
    let mut writer = store().begin_revision().unwrap_or_else(|e| panic!("begin_revision: {e}"));
    let mut sink = TreeSink::new(&mut writer, limits, Default::default());
    let filled = fill(&mut sink).and_then(|()| sink.finish(declared, false, false).map(drop));
    if let Err(err) = filled {
        let client_error = matches!(
            err,
            UnpackError::InvalidEntry { .. }
                | UnpackError::InvalidFormat { .. }
                | UnpackError::TooLarge(_)
                | UnpackError::CorruptArchive(_)
                | UnpackError::Empty
        );
        assert!(client_error, "bad input failed as a server error: {err:?}");
        return Err(err.to_string());
    }
    writer.finalize().map(drop).map_err(|e| panic!("finalizing an accepted tree: {e}"))
}

/// Forwards entries to `inner` after asserting the [`EntrySink`] contract: normalised relative
/// paths, each once, never both a file and a directory; permission bits only; symlinks that stay
/// inside the tree; hard links to an earlier regular file; after OCI layers, no whiteout names.
pub(super) struct CheckedSink<'s, 'a> {
    inner: &'s mut Sink<'a>,
    after_layers: bool,
    /// Files and symlinks.
    leaves: HashSet<String>,
    regular_files: HashSet<String>,
    /// Directories implied by a path or named by a directory entry.
    dirs: HashSet<String>,
    /// Directories named by a directory entry.
    named_dirs: HashSet<String>,
}

impl<'s, 'a> CheckedSink<'s, 'a> {
    pub(super) fn new(inner: &'s mut Sink<'a>, after_layers: bool) -> Self {
        CheckedSink {
            inner,
            after_layers,
            leaves: HashSet::new(),
            regular_files: HashSet::new(),
            dirs: HashSet::new(),
            named_dirs: HashSet::new(),
        }
    }

    /// Checks a path and records its ancestors as directories.
    fn check_path_shape(&mut self, path: &str) {
        assert!(
            !path.is_empty() && path.split('/').all(|c| !c.is_empty() && c != "." && c != ".."),
            "sink received an unnormalised path {path:?}"
        );
        assert!(!path.contains('\0'), "sink received a path with NUL: {path:?}");
        if self.after_layers {
            assert!(!path.split('/').any(|c| c.starts_with(".wh.")), "a whiteout reached the tree: {path:?}");
        }
        let mut ancestor = String::new();
        for comp in path.split('/').take(path.split('/').count() - 1) {
            if !ancestor.is_empty() {
                ancestor.push('/');
            }
            ancestor.push_str(comp);
            assert!(!self.leaves.contains(&ancestor), "{path:?} is below the file or link {ancestor:?}");
            self.dirs.insert(ancestor.clone());
        }
    }

    /// Checks the path of a file or link, received once and never where a directory is.
    fn check_path(&mut self, path: &str) {
        assert!(!self.leaves.contains(path) && !self.dirs.contains(path), "sink received {path:?} twice");
        self.check_path_shape(path);
        self.leaves.insert(path.to_owned());
    }
}

impl EntrySink for CheckedSink<'_, '_> {
    type Error = UnpackError;

    fn file(&mut self, path: &str, mode: u32, size: u64, data: &mut dyn Read) -> Result<(), UnpackError> {
        assert!(mode <= 0o777, "{path:?}: mode {mode:o} has more than permission bits");
        self.check_path(path);
        self.regular_files.insert(path.to_owned());
        self.inner.file(path, mode, size, data)
    }

    fn dir(&mut self, path: &str, mode: u32) -> Result<(), UnpackError> {
        assert!(mode <= 0o777, "{path:?}: mode {mode:o} has more than permission bits");
        assert!(!self.leaves.contains(path), "directory {path:?} is also a file or link");
        assert!(self.named_dirs.insert(path.to_owned()), "directory {path:?} received twice");
        self.check_path_shape(path);
        self.dirs.insert(path.to_owned());
        self.inner.dir(path, mode)
    }

    fn symlink(&mut self, path: &str, target: &str) -> Result<(), UnpackError> {
        self.check_path(path);
        assert!(symlink_stays_inside(path, target), "symlink {path:?} -> {target:?} escapes the tree");
        self.inner.symlink(path, target)
    }

    fn hardlink(&mut self, path: &str, target: &str) -> Result<(), UnpackError> {
        assert!(self.regular_files.contains(target), "hard link {path:?} to {target:?}, not an earlier file");
        self.check_path(path);
        self.regular_files.insert(path.to_owned());
        self.inner.hardlink(path, target)
    }
}

/// Whether `target`, resolved lexically from the directory of the link at `path`, stays at or
/// below the root.
fn symlink_stays_inside(path: &str, target: &str) -> bool {
    if target.is_empty() || target.starts_with('/') {
        return false;
    }
    let mut depth = path.split('/').count() - 1;
    for comp in target.split('/') {
        match comp {
            "" | "." => {}
            ".." => match depth.checked_sub(1) {
                Some(d) => depth = d,
                None => return false,
            },
            _ => depth += 1,
        }
    }
    true
}

pub(super) fn gzip(data: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(data).and_then(|()| encoder.finish()).unwrap_or_default()
}

pub(super) fn zstd(data: &[u8]) -> Vec<u8> {
    zstd::encode_all(data, 1).unwrap_or_default()
}
