//! The cache of fresh zstd frames, and the thread that recompresses them smaller.
//!
//! A zstd download compresses the stretches of a revision's tar that no stored block holds
//! ([`super::frames`]) while its client waits, so it uses the store's fast level. The frame goes
//! into this cache, keyed by revision and tar stretch (a revision is immutable), and the next
//! downloads of that stretch send it as they send stored frames. Since those downloads pay only for
//! the frame's bytes, a background *upgrader* recompresses each newly cached frame at
//! [`UPGRADE_LEVEL`] and swaps it in if it came out smaller: the first download keeps its speed,
//! the later ones get fewer bytes (on the corpus, 3.42 MB on the wire at level 3 against 2.92 MB at
//! level 9; nginx's level-3 `.tar.zst` is 3.16 MB).
//!
//! The frames of a stretch are found by where it starts ([`FrameCache::get_from`]), whatever its
//! end: besides the frames downloads make, the warmer ([`super::frames`]) caches *long frames*, a
//! revision's tar in stretches of [`LONG_FRAME`] at [`UPGRADE_LEVEL`], which take a third fewer
//! bytes than the stored blocks' frames (1 MiB at the store's level): a frame's window is its
//! stretch. One frame is kept per start, the one reaching further.
//!
//! Bounds: the frames held (`limit`, oldest dropped first), the upgrader's queue
//! ([`UPGRADE_QUEUE`] keys; a frame arriving while it is full is left as it is), and one upgrader
//! thread holding one frame's bytes and one compression context at a time. The upgrader starts
//! with the first cached frame and ends with the cache.
//!
//! Integrity: a cached frame is checked against the BLAKE3 taken when it was cached before it is
//! sent or upgraded; an upgraded frame must decode to exactly as many bytes as its stretch holds
//! (it is made from the verified old frame's content).

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::{Arc, Mutex, Weak};

use super::chunks::Hash;
use super::RevisionId;

/// A revision and a stretch `[start, end)` of its tar.
pub(super) type FrameKey = (RevisionId, u64, u64);
/// A revision and where a stretch of its tar starts: how frames are held.
type StartKey = (RevisionId, u64);

/// The tar a long frame holds, at most: RFC 9659's limit on the window of `Content-Encoding: zstd`
/// (8 MB), which a frame of a known size no longer than this never exceeds.
pub(super) const LONG_FRAME: u64 = 8 << 20;

/// The level cached frames are recompressed at, off any download's path (and warmed frames made
/// at, [`super::frames`]).
pub(super) const UPGRADE_LEVEL: i32 = 9;
/// Cached frames waiting for the upgrader, at most.
const UPGRADE_QUEUE: usize = 64;

/// Recently compressed fresh frames, oldest dropped first once they hold more than the bound.
pub(super) struct FrameCache {
    inner: Arc<Shared>,
    /// The upgrader's queue, once it runs.
    upgrades: Mutex<Option<SyncSender<FrameKey>>>,
}

struct Shared {
    limit: u64,
    state: Mutex<State>,
    /// Frames queued for the upgrader or being upgraded.
    pending: AtomicUsize,
}

#[derive(Default)]
struct State {
    frames: HashMap<StartKey, CachedFrame>,
    order: VecDeque<StartKey>,
    bytes: u64,
}

/// A fresh frame of a stretch of a revision's tar (from its key's start to `end`), with its BLAKE3.
struct CachedFrame {
    end: u64,
    frame: Arc<Vec<u8>>,
    hash: Hash,
}

impl FrameCache {
    pub fn new(limit: u64) -> FrameCache {
        let shared = Shared { limit, state: Mutex::new(State::default()), pending: AtomicUsize::new(0) };
        FrameCache { inner: Arc::new(shared), upgrades: Mutex::new(None) }
    }

    /// The frame cached for the stretch of `rev`'s tar that starts at `start` and ends at or
    /// before `end`, if any, checked against its hash: (its end, the frame).
    pub fn get_from(&self, rev: RevisionId, start: u64, end: u64) -> Option<(u64, Arc<Vec<u8>>)> {
        let (stretch_end, frame, hash) = {
            let state = self.inner.lock();
            let cached = state.frames.get(&(rev, start)).filter(|c| c.end <= end)?;
            (cached.end, cached.frame.clone(), cached.hash)
        };
        (blake3::hash(&frame).as_bytes() == &hash).then_some((stretch_end, frame))
    }

    /// Caches a freshly compressed frame, and queues it for the upgrader.
    pub fn put(&self, key: FrameKey, frame: Vec<u8>) {
        if !self.inner.insert(key, frame) {
            return;
        }
        let mut upgrades = self.upgrades.lock().unwrap_or_else(|e| e.into_inner());
        let sender = match upgrades.as_ref() {
            Some(sender) => sender,
            None => match spawn_upgrader(Arc::downgrade(&self.inner)) {
                Some(sender) => upgrades.insert(sender),
                None => return,
            },
        };
        self.inner.pending.fetch_add(1, Ordering::SeqCst);
        // A full queue leaves the frame as it is.
        if sender.try_send(key).is_err() {
            self.inner.pending.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Caches a frame already made at [`UPGRADE_LEVEL`]: nothing for the upgrader to do.
    pub fn put_upgraded(&self, key: FrameKey, frame: Vec<u8>) {
        self.inner.insert(key, frame);
    }

    /// The frame cached for exactly `key`'s stretch (tests).
    #[cfg(test)]
    pub fn get(&self, key: &FrameKey) -> Option<Arc<Vec<u8>>> {
        self.inner.get(key)
    }

    /// The bytes of the frames held (tests).
    #[cfg(test)]
    pub fn bytes(&self) -> u64 {
        self.inner.lock().bytes
    }

    /// The bound on the bytes held.
    pub fn limit(&self) -> u64 {
        self.inner.limit
    }

    /// Waits until the upgrader has nothing left to do (tests).
    #[cfg(test)]
    pub fn wait_for_upgrades(&self) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while self.inner.pending.load(Ordering::SeqCst) > 0 {
            assert!(std::time::Instant::now() < deadline, "the upgrader did not finish in 60 s");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn get(&self, key: &FrameKey) -> Option<Arc<Vec<u8>>> {
        let (frame, hash) = {
            let state = self.lock();
            let cached = state.frames.get(&(key.0, key.1)).filter(|c| c.end == key.2)?;
            (cached.frame.clone(), cached.hash)
        };
        // Memory is checked like a disk (outside the lock: hashing takes a while).
        (blake3::hash(&frame).as_bytes() == &hash).then_some(frame)
    }

    /// Adds a frame unless one reaching as far from the same start is cached; whether it was.
    fn insert(&self, key: FrameKey, frame: Vec<u8>) -> bool {
        let len = frame.len() as u64;
        if len > self.limit / 4 {
            return false;
        }
        let hash = *blake3::hash(&frame).as_bytes();
        let cached = CachedFrame { end: key.2, frame: Arc::new(frame), hash };
        let mut state = self.lock();
        match state.frames.entry((key.0, key.1)) {
            Entry::Occupied(slot) if slot.get().end >= key.2 => return false,
            // A longer stretch from the same start: it takes the shorter one's place (and age).
            Entry::Occupied(mut slot) => {
                let shorter = std::mem::replace(slot.get_mut(), cached);
                state.bytes = state.bytes - shorter.frame.len() as u64 + len;
            }
            Entry::Vacant(slot) => {
                slot.insert(cached);
                state.order.push_back((key.0, key.1));
                state.bytes += len;
            }
        };
        while state.bytes > self.limit {
            let Some(old) = state.order.pop_front() else { break };
            if let Some(gone) = state.frames.remove(&old) {
                state.bytes -= gone.frame.len() as u64;
            }
        }
        true
    }

    /// Replaces `old` by `better` if `key` still holds `old`.
    fn replace(&self, key: &FrameKey, old: &Arc<Vec<u8>>, better: Vec<u8>) {
        let hash = *blake3::hash(&better).as_bytes();
        let mut state = self.lock();
        let State { frames, bytes, .. } = &mut *state;
        let Some(cached) = frames.get_mut(&(key.0, key.1)).filter(|c| Arc::ptr_eq(&c.frame, old)) else { return };
        *bytes = *bytes - old.len() as u64 + better.len() as u64;
        *cached = CachedFrame { end: key.2, frame: Arc::new(better), hash };
    }

    /// Recompresses the frame cached for `key` at [`UPGRADE_LEVEL`]; keeps it if smaller.
    fn upgrade(&self, key: &FrameKey, compressor: &mut zstd::bulk::Compressor<'static>) {
        let Some(old) = self.get(key) else { return };
        let Ok(len) = usize::try_from(key.2.saturating_sub(key.1)) else { return };
        let identity = match zstd::bulk::decompress(&old, len) {
            Ok(identity) if identity.len() == len => identity,
            _ => {
                tracing::warn!(revision = key.0, start = key.1, "a cached zstd frame does not decode to its stretch");
                return;
            }
        };
        match compressor.compress(&identity) {
            Ok(better) if better.len() < old.len() => self.replace(key, &old, better),
            Ok(_) => {}
            Err(e) => tracing::debug!(error = %e, "recompressing a cached zstd frame failed"),
        }
    }
}

/// Starts the upgrader; `None` if no thread could be started (frames then stay as they are).
fn spawn_upgrader(shared: Weak<Shared>) -> Option<SyncSender<FrameKey>> {
    let (tx, rx) = sync_channel::<FrameKey>(UPGRADE_QUEUE);
    let spawned = std::thread::Builder::new().name("stowage-frame-upgrade".into()).spawn(move || {
        let mut compressor = None;
        // Ends when the cache (the only sender) is dropped.
        for key in rx {
            let Some(shared) = shared.upgrade() else { return };
            if compressor.is_none() {
                compressor = zstd::bulk::Compressor::new(UPGRADE_LEVEL).ok();
            }
            if let Some(compressor) = compressor.as_mut() {
                shared.upgrade(&key, compressor);
            }
            // Idle: the context's tables (some MiB at this level) go back.
            if shared.pending.fetch_sub(1, Ordering::SeqCst) == 1 {
                compressor = None;
            }
        }
    });
    match spawned {
        Ok(_) => Some(tx),
        Err(e) => {
            tracing::warn!(error = %e, "could not start the zstd frame upgrader");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// YAML-like lines, varied enough that zstd's levels differ on them.
    fn yaml(lines: usize) -> Vec<u8> {
        let mut x = 0x9E3779B97F4A7C15u64;
        let mut out = Vec::new();
        for _ in 0..lines {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            out.extend_from_slice(format!("  key{}: value-{} # {}\n", x % 997, (x >> 20) % 89, x % 13).as_bytes());
        }
        out
    }

    fn frame(identity: &[u8], level: i32) -> Vec<u8> {
        zstd::bulk::compress(identity, level).unwrap()
    }

    #[test]
    fn a_cached_frame_is_recompressed_smaller_and_still_decodes_to_its_stretch() {
        let cache = FrameCache::new(64 << 20);
        let identity = yaml(100_000);
        let key = (7, 1000, 1000 + identity.len() as u64);
        let fast = frame(&identity, 1);
        cache.put(key, fast.clone());
        cache.wait_for_upgrades();
        let upgraded = cache.get(&key).expect("still cached");
        assert!(upgraded.len() < fast.len(), "{} against {}", upgraded.len(), fast.len());
        assert_eq!(zstd::bulk::decompress(&upgraded, identity.len()).unwrap(), identity);
        assert_eq!(cache.inner.lock().bytes, upgraded.len() as u64, "the bound counts the new size");
    }

    #[test]
    fn a_frame_that_does_not_decode_to_its_stretch_is_left_alone() {
        let cache = FrameCache::new(64 << 20);
        let identity = yaml(10_000);
        // Keyed as one byte longer than its content: the upgrader must not trust it.
        let key = (7, 0, identity.len() as u64 + 1);
        let fast = frame(&identity, 1);
        cache.put(key, fast.clone());
        cache.wait_for_upgrades();
        assert_eq!(*cache.get(&key).unwrap(), fast);
    }

    #[test]
    fn a_frame_dropped_from_the_cache_is_not_brought_back_by_its_upgrade() {
        let identity = yaml(50_000);
        let first = frame(&identity, 1);
        // Room for one frame: the second pushes the first out, maybe before its upgrade.
        let cache = FrameCache::new(first.len() as u64 * 4);
        let key = (1, 0, identity.len() as u64);
        cache.put(key, first.clone());
        let other = yaml(60_000);
        let second = frame(&other, 1);
        cache.put((2, 0, other.len() as u64), second);
        cache.wait_for_upgrades();
        let state = cache.inner.lock();
        assert!(state.bytes <= first.len() as u64 * 4);
        assert_eq!(state.bytes, state.frames.values().map(|c| c.frame.len() as u64).sum::<u64>());
    }

    #[test]
    fn a_damaged_cached_frame_is_not_sent() {
        let cache = FrameCache::new(64 << 20);
        let identity = yaml(1_000);
        let key = (3, 0, identity.len() as u64);
        cache.inner.insert(key, frame(&identity, 3));
        let mut state = cache.inner.lock();
        let cached = state.frames.get_mut(&(key.0, key.1)).unwrap();
        let mut bytes = (*cached.frame).clone();
        bytes[5] ^= 1;
        cached.frame = Arc::new(bytes);
        drop(state);
        assert!(cache.get(&key).is_none());
    }
}
