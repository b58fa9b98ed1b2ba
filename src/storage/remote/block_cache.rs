//! Hot blocks on the replica's own disk: a block read from or written to object storage is kept
//! in `<data-dir>/block-cache/`, so a Bundle that many provisioners pull is read from the bucket at
//! most once per replica (never by the replica that took its upload). Blocks never change once
//! written, so the cache needs no invalidation; it is bounded (`--block-cache-bytes`, least
//! recently used out first) and emptied at every start (it is this replica's scratch, not state).
//!
//! Every file carries the BLAKE3 of the payload it holds and is checked on every read: a file
//! that does not match (a torn write, a bad disk) is deleted and the block read from the bucket
//! again. The chunks in it are verified above this, as every read is. A failure of the cache's own
//! I/O is never an error of the read: the block comes from the bucket.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use super::RemoteMetrics;
use crate::storage::packs::BlockAt;

/// Most blocks remembered, whatever their size (the index costs about 100 bytes each).
const MAX_ENTRIES: usize = 65_536;
const HASH_LEN: usize = 32;

/// A block's payload: its object, where the payload starts in it, and its length.
type Key = (u64, u64, u32);

/// The cache of one replica.
pub struct DiskBlocks {
    dir: PathBuf,
    limit: u64,
    lru: Mutex<Lru>,
    metrics: RemoteMetrics,
    /// Names the partial files, so two readers keeping the same block never write one file.
    writes: AtomicU64,
}

#[derive(Default)]
struct Lru {
    /// Key → (bytes on disk, last use).
    entries: HashMap<Key, (u64, u64)>,
    by_use: BTreeMap<u64, Key>,
    bytes: u64,
    clock: u64,
}

impl Lru {
    fn touch(&mut self, key: Key) -> bool {
        let Some((_, used)) = self.entries.get_mut(&key) else { return false };
        self.by_use.remove(used);
        self.clock += 1;
        *used = self.clock;
        self.by_use.insert(self.clock, key);
        true
    }

    fn remove(&mut self, key: &Key) -> Option<u64> {
        let (bytes, used) = self.entries.remove(key)?;
        self.by_use.remove(&used);
        self.bytes -= bytes;
        Some(bytes)
    }
}

fn file_name(key: &Key) -> String {
    format!("{:016x}-{:x}-{:x}", key.0, key.1, key.2)
}

impl DiskBlocks {
    /// The cache in `dir` (emptied first), holding at most `limit` bytes; `None` for 0 or if the
    /// directory cannot be made (then every read goes to the bucket, as without a cache).
    pub fn open(dir: &Path, limit: u64, metrics: RemoteMetrics) -> Option<DiskBlocks> {
        if limit == 0 {
            return None;
        }
        let _ = std::fs::remove_dir_all(dir);
        if let Err(e) = std::fs::create_dir_all(dir) {
            tracing::warn!(error = %e, dir = %dir.display(), "no block cache: its directory cannot be made");
            return None;
        }
        metrics.block_cache_bytes(0);
        Some(DiskBlocks {
            dir: dir.to_path_buf(),
            limit,
            lru: Mutex::new(Lru::default()),
            metrics,
            writes: AtomicU64::new(0),
        })
    }

    fn key(at: &BlockAt) -> Key {
        (at.pack, at.payload_offset, at.stored_len)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Lru> {
        self.lru.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The payload if this replica has it and it is intact.
    pub fn get(&self, at: &BlockAt) -> Option<Vec<u8>> {
        let key = Self::key(at);
        if !self.lock().touch(key) {
            self.metrics.block_cache_read(false);
            return None;
        }
        let path = self.dir.join(file_name(&key));
        let intact = std::fs::read(&path).ok().and_then(|mut bytes| {
            let payload = bytes.split_off(HASH_LEN.min(bytes.len()));
            (payload.len() == at.stored_len as usize && blake3::hash(&payload).as_bytes()[..] == bytes[..])
                .then_some(payload)
        });
        if intact.is_none() {
            tracing::warn!(file = %path.display(), "a cached block did not match its hash; reading it from the bucket");
            self.forget(&key);
        }
        self.metrics.block_cache_read(intact.is_some());
        intact
    }

    /// Keeps a payload just read from or written to the bucket, making room by dropping the least
    /// recently used.
    pub fn put(&self, at: &BlockAt, payload: &[u8]) {
        let key = Self::key(at);
        let bytes = (payload.len() + HASH_LEN) as u64;
        if bytes > self.limit / 4 || self.lock().entries.contains_key(&key) {
            return;
        }
        let name = file_name(&key);
        let write = self.writes.fetch_add(1, Ordering::Relaxed);
        let (path, partial) = (self.dir.join(&name), self.dir.join(format!("{name}.{write}.part")));
        let written = std::fs::File::create(&partial).and_then(|mut file| {
            file.write_all(blake3::hash(payload).as_bytes())?;
            file.write_all(payload)
        });
        if let Err(e) = written.and_then(|()| std::fs::rename(&partial, &path)) {
            tracing::debug!(error = %e, "could not keep a block in the block cache");
            let _ = std::fs::remove_file(&partial);
            return;
        }
        let mut lru = self.lock();
        lru.clock += 1;
        let used = lru.clock;
        lru.entries.insert(key, (bytes, used));
        lru.by_use.insert(used, key);
        lru.bytes += bytes;
        let mut evicted = Vec::new();
        while lru.bytes > self.limit || lru.entries.len() > MAX_ENTRIES {
            let Some((_, oldest)) = lru.by_use.pop_first() else { break };
            if let Some((size, _)) = lru.entries.remove(&oldest) {
                lru.bytes -= size;
                evicted.push(oldest);
            }
        }
        let total = lru.bytes;
        drop(lru);
        for key in evicted {
            let _ = std::fs::remove_file(self.dir.join(file_name(&key)));
        }
        self.metrics.block_cache_bytes(total);
    }

    /// Drops every payload of block object `pack` (it was deleted from the bucket).
    pub fn forget_block(&self, pack: u64) {
        let keys: Vec<Key> = self.lock().entries.keys().filter(|k| k.0 == pack).copied().collect();
        for key in keys {
            self.forget(&key);
        }
    }

    fn forget(&self, key: &Key) {
        let mut lru = self.lock();
        lru.remove(key);
        let total = lru.bytes;
        drop(lru);
        let _ = std::fs::remove_file(self.dir.join(file_name(key)));
        self.metrics.block_cache_bytes(total);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(pack: u64, len: usize) -> BlockAt {
        BlockAt { pack, payload_offset: 40, stored_len: len as u32, codec: 1, raw_len: len as u32 }
    }

    #[test]
    fn keeps_the_most_recently_used_within_its_bound() {
        let dir = tempfile::tempdir().unwrap();
        let cache =
            DiskBlocks::open(&dir.path().join("c"), 4 * (1000 + HASH_LEN as u64), RemoteMetrics::default()).unwrap();
        for pack in 0..4 {
            cache.put(&at(pack, 1000), &vec![pack as u8; 1000]);
        }
        // Block 0 is used again, so block 1 is the oldest when block 4 comes.
        assert_eq!(cache.get(&at(0, 1000)), Some(vec![0; 1000]));
        cache.put(&at(4, 1000), &[4; 1000]);
        assert_eq!(cache.get(&at(1, 1000)), None);
        for pack in [0, 2, 3, 4] {
            assert_eq!(cache.get(&at(pack, 1000)), Some(vec![pack as u8; 1000]), "block {pack}");
        }
        let files = std::fs::read_dir(dir.path().join("c")).unwrap().count();
        assert_eq!(files, 4, "an evicted block's file stayed on disk");
    }

    #[test]
    fn a_damaged_file_is_a_miss_and_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let cache = DiskBlocks::open(&dir.path().join("c"), 1 << 20, RemoteMetrics::default()).unwrap();
        cache.put(&at(7, 100), &[7; 100]);
        let path = dir.path().join("c").join(file_name(&DiskBlocks::key(&at(7, 100))));
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[HASH_LEN + 10] ^= 1;
        std::fs::write(&path, bytes).unwrap();
        assert_eq!(cache.get(&at(7, 100)), None, "a damaged block was served");
        assert!(!path.exists());
        // Kept again once read from the bucket.
        cache.put(&at(7, 100), &[7; 100]);
        assert_eq!(cache.get(&at(7, 100)), Some(vec![7; 100]));
        cache.forget_block(7);
        assert_eq!(cache.get(&at(7, 100)), None);
    }
}
