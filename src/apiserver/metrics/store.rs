//! The store as `/metrics` shows it, read at scrape time by a collector: gauges from
//! [`Store::stats`] (chunks, bytes, revisions by state, disk use), the resourceVersion, group-commit
//! counts, the store's flushes, collection passes and compactions ([`Store::counts`]), whether a
//! failed sync poisoned it, whether the collection owed since open still runs and, replicated,
//! whether this replica leads (`stowage_leader`).
//!
//! `stats` walks the whole index, so a walk is reused by scrapes within [`STATS_TTL`] of it while
//! nothing was written; concurrent scrapes wait for one walk. A failed walk leaves its gauges out
//! of that scrape (and is logged): the counters and the poisoned gauge still tell what is wrong.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Unit;

use crate::storage::{StorageError, Store, StoreStats};

/// How long one walk of the index serves scrapes while no write happened.
const STATS_TTL: Duration = Duration::from_secs(1);

#[derive(Clone)]
struct Walk {
    resource_version: u64,
    stats: StoreStats,
    taken: Instant,
}

pub struct StoreCollector {
    store: Store,
    last: Mutex<Option<Walk>>,
}

impl std::fmt::Debug for StoreCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreCollector").finish_non_exhaustive()
    }
}

impl StoreCollector {
    pub fn new(store: Store) -> StoreCollector {
        StoreCollector { store, last: Mutex::new(None) }
    }

    /// The current statistics: the last walk while it is fresh and nothing was written since.
    fn walk(&self) -> Result<Walk, StorageError> {
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        let resource_version = self.store.current_resource_version()?;
        if let Some(walk) = last.as_ref() {
            if walk.resource_version == resource_version && walk.taken.elapsed() < STATS_TTL {
                return Ok(walk.clone());
            }
        }
        let walk = Walk { resource_version, stats: self.store.stats()?, taken: Instant::now() };
        *last = Some(walk.clone());
        Ok(walk)
    }
}

/// One unlabelled sample.
fn sample(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    metric: impl EncodeMetric,
) -> std::fmt::Result {
    metric.encode(encoder.encode_descriptor(name, help, unit, metric.metric_type())?)
}

fn gauge(encoder: &mut DescriptorEncoder, name: &str, help: &str, value: u64) -> std::fmt::Result {
    sample(encoder, name, help, None, ConstGauge::new(value))
}

/// `name` without `_total`, which the encoders add to counters.
fn counter(encoder: &mut DescriptorEncoder, name: &str, help: &str, value: u64) -> std::fmt::Result {
    sample(encoder, name, help, None, ConstCounter::new(value))
}

fn write_stats(encoder: &mut DescriptorEncoder, walk: &Walk) -> std::fmt::Result {
    let s = &walk.stats;
    gauge(encoder, "stowage_chunks", "Distinct content chunks stored.", s.chunks)?;
    gauge(encoder, "stowage_chunk_stored_bytes", "Compressed bytes of all stored chunks.", s.chunk_stored_bytes)?;
    gauge(encoder, "stowage_chunk_raw_bytes", "Uncompressed bytes of all stored chunks.", s.chunk_raw_bytes)?;
    let mut revisions =
        encoder.encode_descriptor("stowage_revisions", "Content revisions by state.", None, MetricType::Gauge)?;
    for (state, value) in
        [("committed", s.revisions_committed), ("staging", s.revisions_staging), ("deleting", s.revisions_deleting)]
    {
        ConstGauge::new(value).encode(revisions.encode_family(&[("state", state)])?)?;
    }
    gauge(
        encoder,
        "stowage_revisions_repack_pending",
        "Committed revisions the background repacker has not recompressed yet (embedded store).",
        s.revisions_repack_pending,
    )?;
    gauge(encoder, "stowage_disk_bytes", "Bytes the database takes on disk.", s.disk_bytes)?;
    gauge(encoder, "stowage_resource_version", "Current resourceVersion.", walk.resource_version)
}

impl Collector for StoreCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        match self.walk() {
            Ok(walk) => write_stats(&mut encoder, &walk)?,
            Err(e) => tracing::warn!(error = %e, "reading the store's statistics for /metrics failed"),
        }
        let commits = self.store.commit_counts();
        // How well object writes share their flushes (group commit): writes per flush is their ratio.
        counter(&mut encoder, "stowage_object_writes", "Object writes acknowledged durable.", commits.writes)?;
        counter(&mut encoder, "stowage_object_write_flushes", "Flushes the object writes took.", commits.flushes)?;
        counter(
            &mut encoder,
            "stowage_object_write_batches",
            "Database batches the object writes were applied in (embedded: writes waiting at once share one).",
            commits.batches,
        )?;
        let counts = self.store.counts();
        counter(
            &mut encoder,
            "stowage_store_flushes",
            "Flushes of the store (pack sync, database flush, log fdatasync) by every writer: object writes' group commits, finalized revisions, collection and compaction.",
            counts.flushes,
        )?;
        counter(&mut encoder, "stowage_store_sweeps", "Mark-and-sweep passes over the chunk index.", counts.sweeps)?;
        counter(
            &mut encoder,
            "stowage_store_compactions",
            "Mostly dead pack files rewritten and deleted.",
            counts.packs_compacted,
        )?;
        sample(
            &mut encoder,
            "stowage_store_compacted",
            "Stored bytes of live chunks compaction copied out of the packs it rewrote.",
            Some(&Unit::Bytes),
            ConstCounter::new(counts.compacted_bytes),
        )?;
        if let Some(leader) = self.store.backend_metrics().leader {
            gauge(
                &mut encoder,
                "stowage_leader",
                "1 while this replica leads (runs collection, the reconcile loop and the garbage collector), else 0.",
                u64::from(leader),
            )?;
        }
        gauge(
            &mut encoder,
            "stowage_store_recovering",
            "1 until the collection owed since open (chunks a crash left unreferenced) has finished; the store serves meanwhile.",
            u64::from(self.store.recovering()),
        )?;
        gauge(
            &mut encoder,
            "stowage_store_poisoned",
            "1 when a failed sync made the store refuse writes until stowage restarts.",
            u64::from(self.store.is_poisoned()),
        )
    }
}
