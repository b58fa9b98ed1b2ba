//! Free space on the data directory's filesystem, and the two thresholds that keep the store
//! writable-again after the disk fills.
//!
//! sled 0.34 poisons itself on the first failed log write (`ENOSPC` included): every later write
//! returns the same error until the process restarts. So the store must never let sled hit a full
//! disk. Two thresholds, checked with `statvfs` before work that takes space:
//!
//! - **the reserve** (`--min-free-bytes`): below it, new *content* is refused — uploads, unpacks,
//!   spooled pieces, creating or changing objects through the API. Writers check it before every
//!   block they append, so an upload that crosses it aborts cleanly, at most one block later.
//! - **the floor** (a quarter of the reserve): below it, *every* write is refused, including the
//!   small metadata writes that stay allowed in the reserve (deletes, garbage collection, the
//!   reconciler's status updates) — those are what frees space and reports the problem, so they
//!   get the reserve to work in, but never the last bytes sled needs.
//!
//! Reads never check anything: a full disk keeps serving what is stored.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use super::{Result, StorageError};

/// Default reserve: an order of magnitude above what concurrent writers can overshoot it by (one
/// 1 MiB block per writer between checks, plus sled's 512 KiB log segments), and negligible on
/// any real volume.
pub const DEFAULT_MIN_FREE_BYTES: u64 = 64 << 20;

/// What a write is about to need.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteKind {
    /// New content or objects: refused below the reserve.
    Content,
    /// Small metadata changes that free space or record state: refused below the floor only.
    Metadata,
}

/// Bytes available to unprivileged writers on the filesystem holding `dir`.
pub fn free_bytes(dir: &Path) -> std::io::Result<u64> {
    let path = CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "path contains a NUL byte"))?;
    // SAFETY: `path` is a valid NUL-terminated string and `stat` a plain-old-data out parameter.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(path.as_ptr(), &mut stat) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((stat.f_bavail as u64).saturating_mul(stat.f_frsize as u64))
}

/// Whether an I/O error means the filesystem (or the user's quota) is full. By kind too, not only
/// by errno: sled hands out *copies* of the error that poisoned it, rebuilt from the kind and the
/// message, without the OS code.
pub fn is_out_of_space(err: &std::io::Error) -> bool {
    matches!(err.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
        || matches!(err.kind(), std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded)
}

/// The free-space policy of one data directory.
#[derive(Clone, Debug)]
pub struct SpaceGuard {
    dir: std::path::PathBuf,
    reserve: u64,
}

impl SpaceGuard {
    pub fn new(dir: &Path, reserve: u64) -> SpaceGuard {
        SpaceGuard { dir: dir.to_path_buf(), reserve }
    }

    /// Bytes that must stay free for a write of this kind to start.
    fn threshold(&self, kind: WriteKind) -> u64 {
        match kind {
            WriteKind::Content => self.reserve,
            WriteKind::Metadata => self.reserve / 4,
        }
    }

    /// `Err(InsufficientStorage)` when the filesystem is below the threshold for `kind`.
    pub fn check(&self, kind: WriteKind) -> Result<()> {
        self.check_room_for(kind, 0)
    }

    /// Like [`SpaceGuard::check`], for a write of `bytes` that must leave the threshold free.
    pub fn check_room_for(&self, kind: WriteKind, bytes: u64) -> Result<()> {
        let free = free_bytes(&self.dir)?;
        let needed = self.threshold(kind).saturating_add(bytes);
        if free < needed {
            return Err(StorageError::InsufficientStorage(format!(
                "the data directory {} is out of space: {} free, {} must stay free (--min-free-bytes {})",
                self.dir.display(),
                human(free),
                human(needed),
                self.reserve
            )));
        }
        Ok(())
    }
}

fn human(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 => format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64),
        b if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64),
        b => format!("{b} bytes"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thresholds_refuse_content_before_metadata() {
        let dir = tempfile::tempdir().unwrap();
        let free = free_bytes(dir.path()).unwrap();
        assert!(free > 0);
        // A reserve just above what is free: content refused, metadata (a quarter) allowed.
        let guard = SpaceGuard::new(dir.path(), free + (1 << 30));
        let err = guard.check(WriteKind::Content).unwrap_err();
        assert!(matches!(&err, StorageError::InsufficientStorage(m) if m.contains("out of space")), "{err}");
        if free > (free + (1 << 30)) / 4 {
            guard.check(WriteKind::Metadata).unwrap();
        }
        SpaceGuard::new(dir.path(), 0).check(WriteKind::Content).unwrap();
        assert!(SpaceGuard::new(dir.path(), u64::MAX).check(WriteKind::Metadata).is_err());
    }

    /// A write that failed (an unpack stopped by the reserve) must give its bytes back at once:
    /// on a full disk nothing else would ever roll the active pack over. A file in path order is
    /// laid out as it arrives, so all but the last few blocks of it are in the active pack, past
    /// the dead bytes that make a collection roll it (`gc::ROLL_ACTIVE_DEAD_BYTES`).
    #[test]
    fn an_abandoned_write_gives_its_bytes_back_without_a_restart() {
        use crate::storage::tests::noise;
        use crate::storage::{ObjectKey, ObjectWrite, Precondition, Store, StoreOptions};
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), StoreOptions { min_free_bytes: 0, ..StoreOptions::default() }).unwrap();
        let mut kept = store.begin_revision().unwrap();
        kept.add_file("kept.bin", 0o644, 500_000, &mut &noise(1, 500_000)[..]).unwrap();
        let mut pending = kept.finalize().unwrap();
        let (key, id) = (ObjectKey::new("bundlecontents", "ns", "kept"), pending.record().id);
        let put = ObjectWrite::Put {
            key,
            object: serde_json::json!({}),
            precondition: Precondition::None,
            revision: Some(id),
        };
        pending.commit(vec![put]).unwrap();
        let mut abandoned = store.begin_revision().unwrap();
        abandoned.add_file("big.bin", 0o644, 12_000_000, &mut &noise(2, 12_000_000)[..]).unwrap();
        drop(abandoned);
        store.collect().unwrap();
        let disk = store.stats().unwrap().disk_bytes;
        let packs: u64 =
            std::fs::read_dir(dir.path().join("packs")).unwrap().map(|e| e.unwrap().metadata().unwrap().len()).sum();
        assert!(packs < 1_500_000, "pack bytes {packs} (store {disk}): the abandoned 12 MB were not given back");
    }

    #[test]
    fn out_of_space_errors_are_recognised() {
        assert!(is_out_of_space(&std::io::Error::from_raw_os_error(libc::ENOSPC)));
        assert!(is_out_of_space(&std::io::Error::from_raw_os_error(libc::EDQUOT)));
        assert!(!is_out_of_space(&std::io::Error::from_raw_os_error(libc::EIO)));
        let classified: StorageError = std::io::Error::from_raw_os_error(libc::ENOSPC).into();
        assert!(matches!(classified, StorageError::InsufficientStorage(_)), "{classified}");
        let sled_full: StorageError = sled::Error::Io(std::io::Error::from_raw_os_error(libc::ENOSPC)).into();
        assert!(matches!(sled_full, StorageError::InsufficientStorage(_)), "{sled_full}");
        // What sled returns once poisoned: a clone, kind kept, OS code lost (seen on a full tmpfs).
        let poisoned = sled::Error::Io(std::io::Error::from_raw_os_error(libc::ENOSPC)).clone();
        let poisoned: StorageError = poisoned.into();
        assert!(matches!(poisoned, StorageError::InsufficientStorage(_)), "{poisoned}");
    }
}
