//! One `stowage serve` per data directory: an exclusive lock on `DATA/serve.lock`, taken before
//! anything in the directory is read or written, holding the owner's pid so a second server can
//! say who has it (instead of sled's raw "could not acquire lock … WouldBlock" later).

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

/// Held for the life of the server; the lock goes with the process (also on kill -9).
pub struct DataDirLock {
    _file: File,
}

impl DataDirLock {
    pub fn acquire(data_dir: &Path) -> anyhow::Result<DataDirLock> {
        let path = data_dir.join("serve.lock");
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| anyhow::anyhow!("opening {}: {e}", path.display()))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let mut owner = String::new();
                let _ = file.read_to_string(&mut owner);
                let owner = owner.trim();
                let who = if owner.is_empty() { String::new() } else { format!(" (pid {owner})") };
                anyhow::bail!(
                    "the data directory {} is in use by another stowage process{who}: stop it first, or give \
                     this one its own --data-dir",
                    data_dir.display()
                );
            }
            Err(TryLockError::Error(e)) => anyhow::bail!("locking {}: {e}", path.display()),
        }
        // Best effort: the pid only improves the message a second server prints.
        let _ = file.set_len(0).and_then(|()| file.seek(SeekFrom::Start(0))).and_then(|_| {
            file.write_all(format!("{}\n", std::process::id()).as_bytes())?;
            file.flush()
        });
        Ok(DataDirLock { _file: file })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_is_told_who_has_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        let first = DataDirLock::acquire(dir.path()).unwrap();
        let second = DataDirLock::acquire(dir.path()).err().unwrap().to_string();
        assert!(second.contains("is in use by another stowage process"), "{second}");
        assert!(second.contains(&format!("(pid {})", std::process::id())), "{second}");
        drop(first);
        DataDirLock::acquire(dir.path()).unwrap();
    }
}
