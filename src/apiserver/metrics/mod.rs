//! Prometheus `/metrics`: requests as kube-apiserver reports them — `apiserver_request_total`,
//! the `apiserver_request_duration_seconds` histogram (long-running requests left out, as kube
//! does) and the `apiserver_longrunning_requests` gauge — recorded by a middleware around every
//! route, plus gauges of the store.
//!
//! The hot path takes a shared (read) lock on a series map and bumps atomics; the write lock is
//! taken only the first time a label combination is seen, and label values come from a fixed set
//! ([`request_labels`]), so the maps stay small.

mod request_labels;

use std::collections::HashMap;
use std::fmt::{self, Write as _};
use std::hash::Hash;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt as _;

use super::fairness::Fairness;
use super::status::{ApiError, ApiResult};
use crate::storage::{CommitCounts, StorageError, Store, StoreStats};
use request_labels::RequestLabels;

/// kube-apiserver's buckets for `apiserver_request_duration_seconds`.
const DURATION_BUCKETS: [f64; 23] = [
    0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 15.0, 20.0, 30.0,
    45.0, 60.0,
];
/// `store.stats()` walks the whole index; scrapes within this long of the last walk, with no write
/// in between, reuse its result.
const STORE_STATS_TTL: Duration = Duration::from_secs(1);

#[derive(Default)]
struct Histogram {
    /// Observations per bucket (not cumulative); the last slot is +Inf.
    buckets: [AtomicU64; DURATION_BUCKETS.len() + 1],
    sum_nanos: AtomicU64,
}

impl Histogram {
    fn observe(&self, elapsed: Duration) {
        let seconds = elapsed.as_secs_f64();
        let slot = DURATION_BUCKETS.iter().position(|le| seconds <= *le).unwrap_or(DURATION_BUCKETS.len());
        if let Some(bucket) = self.buckets.get(slot) {
            bucket.fetch_add(1, Ordering::Relaxed);
        }
        let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        self.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }
}

#[derive(Clone)]
struct StoreGauges {
    resource_version: u64,
    stats: StoreStats,
    taken: Instant,
}

/// The request series and the store they describe.
pub struct Metrics {
    requests: RwLock<HashMap<(RequestLabels, u16), AtomicU64>>,
    durations: RwLock<HashMap<RequestLabels, Histogram>>,
    long_running: RwLock<HashMap<RequestLabels, AtomicI64>>,
    store: Store,
    store_gauges: tokio::sync::Mutex<Option<StoreGauges>>,
    fairness: Arc<Fairness>,
}

/// Runs `update` on the series of `key`, creating it (under the write lock) the first time.
fn with_series<K: Eq + Hash, V: Default>(map: &RwLock<HashMap<K, V>>, key: K, update: impl Fn(&V)) {
    if let Some(series) = map.read().unwrap_or_else(PoisonError::into_inner).get(&key) {
        return update(series);
    }
    let mut series = map.write().unwrap_or_else(PoisonError::into_inner);
    update(series.entry(key).or_default());
}

/// A copy of every series of a map, sorted so the exposition is stable.
fn snapshot<K: Ord + Copy, V, T>(map: &RwLock<HashMap<K, V>>, read: impl Fn(&V) -> T) -> Vec<(K, T)> {
    let map = map.read().unwrap_or_else(PoisonError::into_inner);
    let mut out: Vec<(K, T)> = map.iter().map(|(k, v)| (*k, read(v))).collect();
    out.sort_by_key(|(key, _)| *key);
    out
}

/// Keeps a long-running request in the gauge until its response body is dropped.
struct LongRunning {
    metrics: Arc<Metrics>,
    labels: RequestLabels,
}

impl Drop for LongRunning {
    fn drop(&mut self) {
        with_series(&self.metrics.long_running, self.labels, |g| {
            g.fetch_sub(1, Ordering::Relaxed);
        });
    }
}

impl Metrics {
    pub fn new(store: Store, fairness: Arc<Fairness>) -> Metrics {
        Metrics {
            requests: RwLock::default(),
            durations: RwLock::default(),
            long_running: RwLock::default(),
            store,
            store_gauges: tokio::sync::Mutex::new(None),
            fairness,
        }
    }

    /// The store's gauges, walked on the blocking pool at most once per [`STORE_STATS_TTL`] while
    /// nothing is written; concurrent scrapes wait for one walk.
    async fn store_gauges(&self) -> ApiResult<StoreGauges> {
        let mut cached = self.store_gauges.lock().await;
        let previous = cached.clone();
        let store = self.store.clone();
        let fresh = tokio::task::spawn_blocking(move || -> Result<StoreGauges, StorageError> {
            let resource_version = store.current_resource_version()?;
            let reusable =
                previous.filter(|p| p.resource_version == resource_version && p.taken.elapsed() < STORE_STATS_TTL);
            match reusable {
                Some(previous) => Ok(previous),
                None => Ok(StoreGauges { resource_version, stats: store.stats()?, taken: Instant::now() }),
            }
        })
        .await
        .map_err(|e| ApiError::internal(format!("store statistics task failed: {e}")))??;
        *cached = Some(fresh.clone());
        Ok(fresh)
    }

    fn write_requests(&self, out: &mut String) -> fmt::Result {
        let labels = |l: &RequestLabels| {
            format!(
                "component=\"apiserver\",group=\"{}\",resource=\"{}\",scope=\"{}\",subresource=\"{}\",verb=\"{}\",version=\"{}\"",
                l.group(),
                l.resource,
                l.scope,
                l.subresource,
                l.verb,
                l.version()
            )
        };
        writeln!(out, "# HELP apiserver_request_total Counter of apiserver requests broken out for each verb, group, version, resource, scope, component, and HTTP response code.")?;
        writeln!(out, "# TYPE apiserver_request_total counter")?;
        for ((l, code), count) in snapshot(&self.requests, |c| c.load(Ordering::Relaxed)) {
            writeln!(out, "apiserver_request_total{{code=\"{code}\",{}}} {count}", labels(&l))?;
        }
        writeln!(out, "# HELP apiserver_request_duration_seconds Response latency distribution in seconds for each verb, group, version, resource, subresource, scope and component.")?;
        writeln!(out, "# TYPE apiserver_request_duration_seconds histogram")?;
        let histograms = snapshot(&self.durations, |h| {
            let counts: Vec<u64> = h.buckets.iter().map(|b| b.load(Ordering::Relaxed)).collect();
            (counts, h.sum_nanos.load(Ordering::Relaxed))
        });
        for (l, (counts, sum_nanos)) in histograms {
            let l = labels(&l);
            let mut cumulative = 0;
            for (le, count) in DURATION_BUCKETS.iter().zip(&counts) {
                cumulative += count;
                writeln!(out, "apiserver_request_duration_seconds_bucket{{{l},le=\"{le}\"}} {cumulative}")?;
            }
            let total: u64 = counts.iter().sum();
            writeln!(out, "apiserver_request_duration_seconds_bucket{{{l},le=\"+Inf\"}} {total}")?;
            writeln!(out, "apiserver_request_duration_seconds_sum{{{l}}} {}", sum_nanos as f64 / 1e9)?;
            writeln!(out, "apiserver_request_duration_seconds_count{{{l}}} {total}")?;
        }
        writeln!(out, "# HELP apiserver_longrunning_requests Gauge of all active long-running apiserver requests broken out by verb, group, version, resource, scope and component.")?;
        writeln!(out, "# TYPE apiserver_longrunning_requests gauge")?;
        for (l, open) in snapshot(&self.long_running, |g| g.load(Ordering::Relaxed)) {
            writeln!(out, "apiserver_longrunning_requests{{{}}} {open}", labels(&l))?;
        }
        Ok(())
    }
}

fn write_store_gauges(out: &mut String, gauges: &StoreGauges) -> fmt::Result {
    let s = &gauges.stats;
    let mut gauge = |name: &str, help: &str, samples: &[(&str, u64)]| -> fmt::Result {
        writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge")?;
        samples.iter().try_for_each(|(labels, value)| writeln!(out, "{name}{labels} {value}"))
    };
    gauge("stowage_chunks", "Distinct content chunks stored.", &[("", s.chunks)])?;
    gauge("stowage_chunk_stored_bytes", "Compressed bytes of all stored chunks.", &[("", s.chunk_stored_bytes)])?;
    gauge("stowage_chunk_raw_bytes", "Uncompressed bytes of all stored chunks.", &[("", s.chunk_raw_bytes)])?;
    gauge(
        "stowage_revisions",
        "Content revisions by state.",
        &[
            ("{state=\"committed\"}", s.revisions_committed),
            ("{state=\"staging\"}", s.revisions_staging),
            ("{state=\"deleting\"}", s.revisions_deleting),
        ],
    )?;
    gauge("stowage_disk_bytes", "Bytes the database takes on disk.", &[("", s.disk_bytes)])?;
    gauge("stowage_resource_version", "Current resourceVersion.", &[("", gauges.resource_version)])
}

/// How well object writes share their flushes (group commit): writes per flush is their ratio.
fn write_commit_counters(out: &mut String, counts: CommitCounts) -> fmt::Result {
    let mut counter = |name: &str, help: &str, value: u64| {
        writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}")
    };
    counter("stowage_object_writes_total", "Object writes acknowledged durable.", counts.writes)?;
    counter("stowage_object_write_flushes_total", "Flushes the object writes took.", counts.flushes)
}

/// 1 once a failed sync poisoned the store (writes refused until a restart), else 0.
fn write_poisoned(out: &mut String, poisoned: bool) -> fmt::Result {
    let name = "stowage_store_poisoned";
    writeln!(out, "# HELP {name} 1 when a failed sync made the store refuse writes until stowage restarts.")?;
    writeln!(out, "# TYPE {name} gauge\n{name} {}", u8::from(poisoned))
}

/// Middleware: counts every request by its labels and status code; times the others, keeps
/// long-running ones in the gauge until their body ends.
pub async fn record_request(State(metrics): State<Arc<Metrics>>, request: Request, next: Next) -> Response {
    let labels = RequestLabels::of(&request);
    let started = Instant::now();
    let open = labels.is_long_running().then(|| {
        with_series(&metrics.long_running, labels, |g| {
            g.fetch_add(1, Ordering::Relaxed);
        });
        LongRunning { metrics: metrics.clone(), labels }
    });
    let response = next.run(request).await;
    with_series(&metrics.requests, (labels, response.status().as_u16()), |c| {
        c.fetch_add(1, Ordering::Relaxed);
    });
    match open {
        None => {
            with_series(&metrics.durations, labels, |h| h.observe(started.elapsed()));
            response
        }
        Some(guard) => response.map(|body| {
            Body::new(body.map_frame(move |frame| {
                let _open = &guard;
                frame
            }))
        }),
    }
}

/// `GET /metrics`.
pub async fn serve(State(metrics): State<Arc<Metrics>>) -> ApiResult<Response> {
    let gauges = metrics.store_gauges().await?;
    let mut text = String::with_capacity(16 << 10);
    metrics
        .write_requests(&mut text)
        .and_then(|()| write_store_gauges(&mut text, &gauges))
        .and_then(|()| write_commit_counters(&mut text, metrics.store.commit_counts()))
        .and_then(|()| write_poisoned(&mut text, metrics.store.is_poisoned()))
        .and_then(|()| metrics.fairness.write_metrics(&mut text))
        .map_err(|_| ApiError::internal("formatting metrics failed"))?;
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response())
}
