//! The replicated store's requests in `/metrics`: etcd requests as kube-apiserver reports its own
//! (`etcd_request_duration_seconds{operation,type}` with kube's buckets, and
//! `etcd_request_errors_total{operation,type}`), object storage requests
//! (`stowage_object_storage_request_duration_seconds{operation}`,
//! `stowage_object_storage_request_errors_total{operation}`), and the lease's renewals
//! (`stowage_etcd_lease_renewals_total{result}`), and the object cache
//! (`stowage_object_cache_bytes`, `stowage_object_cache_active`,
//! `stowage_object_cache_reads_total{source}`: reads answered by the cache or, past its bound or
//! while it is behind, by etcd), and the block cache on the replica's disk
//! (`stowage_block_cache_bytes`, `stowage_block_cache_reads_total{result}`: hit or miss).
//!
//! Plain `prometheus-client` families, carried in [`super::RemoteOptions`]: `serve` registers them
//! into the server's registry, the store only records (it knows nothing of how they are exported);
//! `Default` gives unregistered ones. Every label value is one of the fixed strings below.

use std::future::Future;
use std::time::Instant;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

/// kube-apiserver's buckets for `etcd_request_duration_seconds`, used for object storage too.
const BUCKETS: [f64; 23] = [
    0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 15.0, 20.0, 30.0,
    45.0, 60.0,
];

/// etcd operations (`operation` label).
pub mod op {
    pub const GET: &str = "get";
    pub const LIST: &str = "list";
    pub const TXN: &str = "txn";
    pub const PUT: &str = "put";
    pub const DELETE: &str = "delete";
    pub const GRANT: &str = "grant";
    pub const KEEPALIVE: &str = "keepalive";
    pub const REVOKE: &str = "revoke";
    pub const HEAD: &str = "head";
}

/// What the keys of an etcd request hold (`type` label).
pub mod kind {
    /// The store's map: objects, the change log, revisions, the chunk index, pins.
    pub const STORE: &str = "store";
    /// This replica's lease.
    pub const LEASE: &str = "lease";
    /// The leader key.
    pub const LEADER: &str = "leader";
    /// Presence keys (readiness, live replicas).
    pub const REPLICAS: &str = "replicas";
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EtcdLabels {
    operation: &'static str,
    r#type: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabel {
    operation: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SourceLabel {
    source: &'static str,
}

/// The families; clones share the same series.
#[derive(Clone)]
pub struct RemoteMetrics {
    etcd_durations: Family<EtcdLabels, Histogram, fn() -> Histogram>,
    etcd_errors: Family<EtcdLabels, Counter>,
    object_durations: Family<OperationLabel, Histogram, fn() -> Histogram>,
    object_errors: Family<OperationLabel, Counter>,
    lease_renewals: Family<ResultLabel, Counter>,
    cache_bytes: Gauge,
    cache_active: Gauge,
    cache_reads: Family<SourceLabel, Counter>,
    block_cache_bytes: Gauge,
    block_cache_reads: Family<ResultLabel, Counter>,
}

impl std::fmt::Debug for RemoteMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteMetrics").finish_non_exhaustive()
    }
}

impl Default for RemoteMetrics {
    fn default() -> Self {
        let lease_renewals = Family::default();
        for result in ["renewed", "failed"] {
            drop(lease_renewals.get_or_create(&ResultLabel { result }));
        }
        let cache_reads = Family::default();
        for source in ["cache", "etcd"] {
            drop(cache_reads.get_or_create(&SourceLabel { source }));
        }
        let block_cache_reads = Family::default();
        for result in ["hit", "miss"] {
            drop(block_cache_reads.get_or_create(&ResultLabel { result }));
        }
        RemoteMetrics {
            block_cache_bytes: Gauge::default(),
            block_cache_reads,
            cache_bytes: Gauge::default(),
            cache_active: Gauge::default(),
            cache_reads,
            etcd_durations: Family::new_with_constructor(|| Histogram::new(BUCKETS)),
            etcd_errors: Family::default(),
            object_durations: Family::new_with_constructor(|| Histogram::new(BUCKETS)),
            object_errors: Family::default(),
            lease_renewals,
        }
    }
}

impl RemoteMetrics {
    /// New families, registered into `registry`.
    pub fn register(registry: &mut Registry) -> RemoteMetrics {
        let metrics = RemoteMetrics::default();
        registry.register_with_unit(
            "etcd_request_duration",
            "Etcd request latency in seconds for each operation and object type",
            Unit::Seconds,
            metrics.etcd_durations.clone(),
        );
        registry.register(
            "etcd_request_errors",
            "Etcd failed request counts for each operation and object type",
            metrics.etcd_errors.clone(),
        );
        registry.register_with_unit(
            "stowage_object_storage_request_duration",
            "Object storage request latency in seconds for each operation (put, get, head, list, delete)",
            Unit::Seconds,
            metrics.object_durations.clone(),
        );
        registry.register(
            "stowage_object_storage_request_errors",
            "Object storage failed request counts for each operation",
            metrics.object_errors.clone(),
        );
        registry.register(
            "stowage_etcd_lease_renewals",
            "Renewals of this replica's etcd lease, by result (renewed, failed)",
            metrics.lease_renewals.clone(),
        );
        registry.register(
            "stowage_object_cache_bytes",
            "Bytes of API objects and change log this replica's object cache holds",
            metrics.cache_bytes.clone(),
        );
        registry.register(
            "stowage_object_cache_active",
            "1 while this replica's object cache answers reads; 0 while every read goes to etcd",
            metrics.cache_active.clone(),
        );
        registry.register(
            "stowage_object_cache_reads",
            "Consistent reads of API objects, by what answered them (cache, etcd)",
            metrics.cache_reads.clone(),
        );
        registry.register(
            "stowage_block_cache_bytes",
            "Bytes of blocks this replica keeps on its disk (--block-cache-bytes)",
            metrics.block_cache_bytes.clone(),
        );
        registry.register(
            "stowage_block_cache_reads",
            "Block reads by whether this replica's disk had the block (hit) or the bucket was asked (miss)",
            metrics.block_cache_reads.clone(),
        );
        metrics
    }

    /// Times an etcd request; counts it as an error when it fails.
    pub async fn etcd<T, E>(
        &self,
        operation: &'static str,
        r#type: &'static str,
        request: impl Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        let started = Instant::now();
        let answer = request.await;
        let labels = EtcdLabels { operation, r#type };
        self.etcd_durations.get_or_create(&labels).observe(started.elapsed().as_secs_f64());
        if answer.is_err() {
            self.etcd_errors.get_or_create(&labels).inc();
        }
        answer
    }

    /// Times an object storage request; counts it as an error when it fails.
    pub async fn object_storage<T, E>(
        &self,
        operation: &'static str,
        request: impl Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        let started = Instant::now();
        let answer = request.await;
        let labels = OperationLabel { operation };
        self.object_durations.get_or_create(&labels).observe(started.elapsed().as_secs_f64());
        if answer.is_err() {
            self.object_errors.get_or_create(&labels).inc();
        }
        answer
    }

    /// A consistent read was answered by the object cache, or by etcd.
    pub fn object_cache_read(&self, from_cache: bool) {
        let source = if from_cache { "cache" } else { "etcd" };
        self.cache_reads.get_or_create(&SourceLabel { source }).inc();
    }

    /// The object cache's state after a change.
    pub fn object_cache_state(&self, active: bool, bytes: u64) {
        self.cache_active.set(i64::from(active));
        self.cache_bytes.set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }

    /// A block read found the block on this replica's disk, or did not.
    pub fn block_cache_read(&self, hit: bool) {
        let result = if hit { "hit" } else { "miss" };
        self.block_cache_reads.get_or_create(&ResultLabel { result }).inc();
    }

    /// Tests: block reads the block cache answered, and those it did not.
    #[cfg(test)]
    pub fn block_cache_counts(&self) -> (u64, u64) {
        let count = |result| self.block_cache_reads.get_or_create(&ResultLabel { result }).get();
        (count("hit"), count("miss"))
    }

    /// Bytes the block cache now holds.
    pub fn block_cache_bytes(&self, bytes: u64) {
        self.block_cache_bytes.set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }

    /// A lease renewal round ended.
    pub fn lease_renewal(&self, renewed: bool) {
        let result = if renewed { "renewed" } else { "failed" };
        self.lease_renewals.get_or_create(&ResultLabel { result }).inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kube_shaped_series() {
        let mut registry = Registry::default();
        let metrics = RemoteMetrics::register(&mut registry);
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        runtime.block_on(async {
            metrics.etcd(op::GET, kind::STORE, async { Ok::<_, ()>(()) }).await.unwrap();
            metrics.etcd(op::TXN, kind::STORE, async { Err::<(), _>(()) }).await.unwrap_err();
            metrics.object_storage(op::PUT, async { Err::<(), _>(()) }).await.unwrap_err();
        });
        metrics.lease_renewal(true);
        let mut text = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut text, &registry).unwrap();
        for line in [
            "etcd_request_duration_seconds_count{operation=\"get\",type=\"store\"} 1",
            "etcd_request_duration_seconds_bucket{operation=\"txn\",type=\"store\",le=\"60\"} 1",
            "etcd_request_errors_total{operation=\"txn\",type=\"store\"} 1",
            "stowage_object_storage_request_duration_seconds_count{operation=\"put\"} 1",
            "stowage_object_storage_request_errors_total{operation=\"put\"} 1",
            "stowage_etcd_lease_renewals_total{result=\"renewed\"} 1",
            "stowage_etcd_lease_renewals_total{result=\"failed\"} 0",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
        }
        assert!(!text.contains("etcd_request_errors_total{operation=\"get\""), "{text}");
    }
}
