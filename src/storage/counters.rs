//! Counts of the store's durability and housekeeping work since it was opened — flushes,
//! collection passes, packs compacted and the live bytes compaction copied — for `/metrics` and
//! the benchmarks. Plain atomics, bumped where the work happens: how they are exported is the
//! reader's business (the store knows nothing of HTTP or Prometheus).

use std::sync::atomic::{AtomicU64, Ordering};

use super::Store;

#[derive(Default)]
pub(super) struct Counters {
    flushes: AtomicU64,
    sweeps: AtomicU64,
    packs_compacted: AtomicU64,
    compacted_bytes: AtomicU64,
}

impl Counters {
    /// A [`Store::flush`] that made everything written before it durable.
    pub(super) fn flushed(&self) {
        self.flushes.fetch_add(1, Ordering::Relaxed);
    }

    /// A mark-and-sweep pass over the chunk index that finished.
    pub(super) fn swept(&self) {
        self.sweeps.fetch_add(1, Ordering::Relaxed);
    }

    /// A pack rewritten (its `live_bytes` copied elsewhere) and deleted.
    pub(super) fn compacted(&self, live_bytes: u64) {
        self.packs_compacted.fetch_add(1, Ordering::Relaxed);
        self.compacted_bytes.fetch_add(live_bytes, Ordering::Relaxed);
    }
}

/// What the store did since it was opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreCounts {
    /// Flushes (pack sync, database flush, log fdatasync) by every caller: object writes' group
    /// commits, finalized revisions, collection and compaction.
    pub flushes: u64,
    /// Mark-and-sweep passes over the chunk index.
    pub sweeps: u64,
    /// Mostly dead packs rewritten and deleted.
    pub packs_compacted: u64,
    /// Stored bytes of live chunks those packs held, copied into new blocks.
    pub compacted_bytes: u64,
}

impl Store {
    /// Counts since open; atomics only, cheap enough for every scrape.
    pub fn counts(&self) -> StoreCounts {
        let c = &self.inner.counters;
        StoreCounts {
            flushes: c.flushes.load(Ordering::Relaxed),
            sweeps: c.sweeps.load(Ordering::Relaxed),
            packs_compacted: c.packs_compacted.load(Ordering::Relaxed),
            compacted_bytes: c.compacted_bytes.load(Ordering::Relaxed),
        }
    }
}
