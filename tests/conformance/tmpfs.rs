//! A small tmpfs mounted on a temporary directory, to run a server on a disk that really fills
//! up; plus free-space probes and a filler file to take space away and give it back.
//!
//! Needs root (tests run as root here and in CI). A failed mount fails the test with the reason:
//! it never skips.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

pub struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    pub fn mount(size_bytes: u64) -> Tmpfs {
        let dir = tempfile::Builder::new().prefix("stowage-tmpfs-").tempdir().expect("create mount point");
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size_bytes}"), "tmpfs"])
            .arg(dir.path())
            .output()
            .expect("running mount(8)");
        assert!(
            out.status.success(),
            "mounting a {size_bytes}-byte tmpfs on {} failed (the full-disk tests need root): {}",
            dir.path().display(),
            String::from_utf8_lossy(&out.stderr)
        );
        Tmpfs { dir }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Bytes an unprivileged writer may still use.
    pub fn free(&self) -> u64 {
        free_bytes(self.path())
    }

    /// A file outside the server's data directory, on the same filesystem.
    pub fn filler(&self) -> Filler {
        Filler { path: self.path().join("filler") }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // Lazy: a server killed a moment ago may still hold files open.
        let _ = Command::new("umount").arg("-l").arg(self.dir.path()).status();
    }
}

pub fn free_bytes(path: &Path) -> u64 {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).expect("path without NUL");
    // SAFETY: valid C string, plain-old-data out parameter.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut stat) }, 0, "statvfs {}", path.display());
    stat.f_bavail as u64 * stat.f_frsize as u64
}

/// A file that takes space on the tmpfs.
pub struct Filler {
    path: PathBuf,
}

impl Filler {
    /// Grows (or shrinks) the filler until the filesystem has about `free` bytes left.
    pub fn leave_free(&self, tmpfs: &Tmpfs, free: u64) {
        let current = std::fs::metadata(&self.path).map(|m| m.len()).unwrap_or(0);
        let target = (current + tmpfs.free()).saturating_sub(free);
        let mut file = std::fs::OpenOptions::new().create(true).write(true).truncate(true).open(&self.path).unwrap();
        let block = vec![0x5au8; 1 << 20];
        let mut left = target;
        while left > 0 {
            let n = left.min(block.len() as u64) as usize;
            file.write_all(&block[..n]).unwrap_or_else(|e| panic!("writing the filler: {e}"));
            left -= n as u64;
        }
        file.sync_all().unwrap();
    }

    pub fn remove(&self) {
        let _ = std::fs::remove_file(&self.path);
    }
}
