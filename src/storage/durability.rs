//! What makes writes durable besides file syncs: directory syncs, and the store's poisoned state.
//!
//! **Directories.** A new file, a rename or a removal is only on disk once its directory is
//! fsynced (POSIX; ext4 happens to commit it with the next journal commit, other filesystems need
//! not). The store syncs its directories once they hold what it created ([`sync_dir`]), and
//! sled's directory whenever sled changed the names in it (snapshots are written by rename), which
//! sled itself never syncs ([`SledDir`]).
//!
//! **Poison.** After a failed fsync the kernel may have dropped the dirty pages it could not write
//! and marks them clean: a second fsync "succeeds" without the data ever reaching the disk
//! (PostgreSQL's "fsyncgate"). Nothing written since the last successful sync can be trusted to
//! be durable, so the first failed sync or flush *poisons* the store: every later write is refused
//! with [`StorageError::Poisoned`] (reads keep working) until the process restarts and recovery
//! takes the store back to what is on disk. It is logged once.

use std::collections::HashMap;
use std::ffi::OsString;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use super::{Result, StorageError};

/// Set once the store failed to make a write durable; see the module doc.
#[derive(Default)]
pub(super) struct Poison {
    reason: OnceLock<String>,
}

impl Poison {
    /// Poisons the store because `what` failed with `err`; returns the error to report. Only the
    /// first failure is kept (and logged).
    pub(super) fn poison(&self, what: &str, err: impl std::fmt::Display) -> StorageError {
        let mut first = false;
        let reason = self.reason.get_or_init(|| {
            first = true;
            format!("{what} failed: {err}")
        });
        if first {
            tracing::error!(
                reason = %reason,
                "the store could not make a write durable; writes are refused until stowage restarts"
            );
        }
        StorageError::Poisoned(reason.clone())
    }

    /// `Err(Poisoned)` once poisoned.
    pub(super) fn check(&self) -> Result<()> {
        match self.reason.get() {
            Some(reason) => Err(StorageError::Poisoned(reason.clone())),
            None => Ok(()),
        }
    }

    pub(super) fn is_poisoned(&self) -> bool {
        self.reason.get().is_some()
    }
}

/// Makes the entries of directory `dir` (files created, renamed or removed in it) durable.
pub(super) fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

/// What sled writes outside its log and never syncs: the names in its directory (snapshots are
/// written by rename), and blob files (values over a quarter of a log segment, written with no
/// fsync). [`SledFiles::sync`] makes them durable; a listing of a few names is far cheaper than a
/// directory fsync on every flush, so it syncs only what changed.
///
/// It runs after sled's flush returned: by then every blob of a log message that flush covered is
/// whole (sled writes a blob while its message's reservation is held, and a flush waits for those).
/// A blob of a later message may still be being written; it is synced with the length it has, and
/// again at a later flush once it grew. A blob whose message is durable but which is not would make
/// sled cut its log there on recovery, taking every later (acknowledged) write with it.
pub(super) struct SledFiles {
    dir: PathBuf,
    synced: Mutex<Synced>,
}

#[derive(Default)]
struct Synced {
    names: Vec<OsString>,
    /// Blob files and the length they were synced at.
    blobs: HashMap<OsString, u64>,
}

impl SledFiles {
    /// Syncs what sled created while opening, and its configuration file (written once, never
    /// synced by sled: lost, sled would not open).
    pub(super) fn open(dir: &Path) -> std::io::Result<SledFiles> {
        File::open(dir.join("conf"))?.sync_all()?;
        let files = SledFiles { dir: dir.to_path_buf(), synced: Mutex::new(Synced::default()) };
        files.sync()?;
        Ok(files)
    }

    /// Syncs blob files new or grown since the last sync, then sled's directories if names in
    /// them changed. Call after sled's flush.
    pub(super) fn sync(&self) -> std::io::Result<()> {
        let mut synced = self.synced.lock().unwrap_or_else(|e| e.into_inner());
        let blob_dir = self.dir.join("blobs");
        let mut blobs = HashMap::new();
        for entry in read_dir_or_empty(&blob_dir)? {
            let entry = entry?;
            let len = match entry.metadata() {
                Ok(meta) => meta.len(),
                // Removed since the listing: sled reclaimed it.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            if synced.blobs.get(&entry.file_name()) != Some(&len) {
                match File::open(entry.path()) {
                    Ok(file) => file.sync_data()?,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(e),
                }
            }
            blobs.insert(entry.file_name(), len);
        }
        if blobs.len() != synced.blobs.len() || blobs.keys().any(|name| !synced.blobs.contains_key(name)) {
            sync_dir(&blob_dir)?;
        }
        synced.blobs = blobs;
        let now = names(&self.dir)?;
        if now != synced.names {
            sync_dir(&self.dir)?;
            synced.names = now;
        }
        Ok(())
    }
}

/// Removes the snapshot a crash interrupted from sled's directory `dir`, before sled opens it.
/// sled writes a snapshot as `snap.<lsn>.generating`, fsyncs it, then renames it; but it reads the
/// newest `snap.*` file, `.generating` ones included, and refuses to open on a torn one ("Read
/// corrupted data"). Until the rename the previous snapshot is still there, so removing it loses
/// nothing.
pub(super) fn remove_interrupted_snapshots(dir: &Path) -> std::io::Result<()> {
    if !nobody_has_it_open(&dir.join("db"))? {
        // Another process runs on this store (sled then refuses to open): its snapshot may be
        // being written.
        return Ok(());
    }
    let mut removed = false;
    for name in names(dir)? {
        let Some(name) = name.to_str() else { continue };
        if name.starts_with("snap.") && name.ends_with(".generating") {
            tracing::info!(file = name, "removing a database snapshot a crash interrupted");
            std::fs::remove_file(dir.join(name))?;
            removed = true;
        }
    }
    if removed {
        sync_dir(dir)?;
    }
    Ok(())
}

/// Whether no process holds sled's lock on its log file `log` (sled takes an exclusive `flock`
/// on it while open). Released again at once: sled takes it when it opens.
fn nobody_has_it_open(log: &Path) -> std::io::Result<bool> {
    use std::os::fd::AsRawFd;
    let file = match File::open(log) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(true),
        Err(e) => return Err(e),
    };
    // SAFETY: flock on a descriptor this function owns; the lock goes with the descriptor when
    // `file` is dropped.
    let locked = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0;
    Ok(locked)
}

/// The entries of `dir` (none if it does not exist).
fn read_dir_or_empty(dir: &Path) -> std::io::Result<Vec<std::io::Result<std::fs::DirEntry>>> {
    match std::fs::read_dir(dir) {
        Ok(entries) => Ok(entries.collect()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

/// The sorted names in `dir` (none if it does not exist).
fn names(dir: &Path) -> std::io::Result<Vec<OsString>> {
    let mut names =
        read_dir_or_empty(dir)?.into_iter().map(|e| e.map(|e| e.file_name())).collect::<std::io::Result<Vec<_>>>()?;
    names.sort_unstable();
    Ok(names)
}

#[cfg(test)]
mod tests {
    use crate::storage::{ObjectKey, ObjectWrite, Precondition};

    #[test]
    fn a_snapshot_a_crash_cut_short_does_not_keep_the_store_from_opening() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::storage::tests::open(dir.path());
        let write = ObjectWrite::Put {
            key: ObjectKey::new("bundles", "ns", "kept"),
            object: serde_json::json!({"metadata": {"name": "kept"}}),
            precondition: Precondition::MustNotExist,
            revision: None,
        };
        store.write_objects(vec![write]).unwrap();
        drop(store);
        // What a power cut leaves while sled writes a snapshot: the newest `snap.*` name, torn.
        std::fs::write(dir.path().join("db/snap.FFFFFFFFFFFFFFFF.generating"), b"torn").unwrap();
        let store = crate::storage::tests::open(dir.path());
        assert!(store.get_object(&ObjectKey::new("bundles", "ns", "kept")).unwrap().is_some());
    }
}
