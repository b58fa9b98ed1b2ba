//! Where a git fetch keeps its files and how it is stopped: a private temporary directory under
//! the scratch directory (`DATA_DIR/tmp/git`, emptied at start), removed whatever happens, and
//! gix's interrupt flag, set when the unpack is cancelled.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::unpack::error::UnpackError;
use crate::unpack::source::{Scratch, SourceContext};

/// Empties the scratch directory of git fetches (what a crash left behind) and creates it.
pub fn clean_scratch(dir: &Path) {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!(path = %dir.display(), error = %e, "emptying the git scratch directory failed"),
    }
    if let Err(e) = std::fs::create_dir_all(dir) {
        tracing::warn!(path = %dir.display(), error = %e, "creating the git scratch directory failed");
    }
}

/// A private temporary directory under the scratch directory, removed (with its content) when
/// dropped, whatever happened.
pub(super) struct TempDir(PathBuf);

impl TempDir {
    pub fn new(scratch: &Scratch) -> Result<TempDir, UnpackError> {
        let path = scratch.dir.join(format!("fetch-{}", uuid::Uuid::new_v4()));
        let _ = std::fs::create_dir_all(&scratch.dir);
        std::fs::create_dir(&path)
            .map_err(|e| UnpackError::Fetch(format!("creating a temporary directory {}: {e}", path.display())))?;
        Ok(TempDir(path))
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.0) {
            tracing::warn!(path = %self.0.display(), error = %e, "removing a temporary git repository failed");
        }
    }
}

/// gix's fetch stops when a flag is set; this sets it when the context is cancelled.
pub(super) struct Interrupt {
    pub flag: Arc<AtomicBool>,
    watcher: tokio::task::JoinHandle<()>,
}

impl Interrupt {
    pub fn watch(ctx: &SourceContext) -> Interrupt {
        let flag = Arc::new(AtomicBool::new(ctx.cancel.is_cancelled()));
        let (set, cancel) = (flag.clone(), ctx.cancel.clone());
        let watcher = ctx.runtime.spawn(async move {
            cancel.cancelled().await;
            set.store(true, Ordering::Relaxed);
        });
        Interrupt { flag, watcher }
    }
}

impl Drop for Interrupt {
    fn drop(&mut self) {
        self.watcher.abort();
    }
}
