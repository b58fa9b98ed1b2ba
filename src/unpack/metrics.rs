//! The unpacker's metrics: jobs by result and by the reason they gave the Bundle's `Unpacked`
//! condition, how long they took, how many Bundles wait for a free unpack slot, and the bytes
//! downloaded from each kind of source.
//!
//! The families are registered into the server's one `prometheus_client` registry by `serve`,
//! which hands this struct to the reconcile loop; `/metrics` encodes them with the rest. Clones
//! share the same series.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

use super::error::UnpackError;
use crate::api::Source;

/// Upper bounds (seconds) of the job-duration buckets: a small upload-sized tree to a large image.
const DURATION_BUCKETS: [f64; 14] =
    [0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0];
/// The kinds of source bytes are fetched from (a metric label).
const SOURCES: [&str; 3] = ["image", "git", "http"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct JobLabels {
    result: &'static str,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SourceLabel {
    source: &'static str,
}

/// The unpack families; `Default` gives unregistered ones (tests that run the loop alone).
#[derive(Clone, Debug)]
pub struct UnpackMetrics {
    jobs: Family<JobLabels, Counter>,
    durations: Family<ResultLabel, Histogram, fn() -> Histogram>,
    queue_depth: Gauge,
    fetched_bytes: Family<SourceLabel, Counter>,
}

impl Default for UnpackMetrics {
    fn default() -> Self {
        let fetched_bytes = Family::default();
        // Present from the start, so a rate over them needs no first download.
        for source in SOURCES {
            drop(fetched_bytes.get_or_create(&SourceLabel { source }));
        }
        UnpackMetrics {
            jobs: Family::default(),
            durations: Family::new_with_constructor(|| Histogram::new(DURATION_BUCKETS)),
            queue_depth: Gauge::default(),
            fetched_bytes,
        }
    }
}

/// Keeps one Bundle in the queue-depth gauge until dropped (it got a slot, or gave up waiting).
pub struct Queued(Gauge);

impl Drop for Queued {
    fn drop(&mut self) {
        self.0.dec();
    }
}

impl UnpackMetrics {
    /// New families, registered into `registry`.
    pub fn register(registry: &mut Registry) -> UnpackMetrics {
        let metrics = UnpackMetrics::default();
        // The registry ends each help text with a period.
        registry.register(
            "stowage_unpack_jobs",
            "Unpack jobs that ended, by result (succeeded, failed, superseded) and the reason they gave the Bundle's Unpacked condition (Cancelled for superseded jobs, which write none)",
            metrics.jobs.clone(),
        );
        registry.register_with_unit(
            "stowage_unpack_duration",
            "How long unpack jobs took (resolving, fetching, committing), by result",
            Unit::Seconds,
            metrics.durations.clone(),
        );
        registry.register(
            "stowage_unpack_queue_depth",
            "Bundles whose unpack waits for a free slot (--unpack-concurrency)",
            metrics.queue_depth.clone(),
        );
        registry.register_with_unit(
            "stowage_unpack_fetched",
            "Bytes downloaded from sources (image blobs and manifests, git packs, http bodies), by kind of source",
            Unit::Bytes,
            metrics.fetched_bytes.clone(),
        );
        metrics
    }

    /// A job ended: `Ok(true)` served new content, `Ok(false)` found nothing to do (a recheck
    /// whose sources had not moved: not counted), `Err` failed or was superseded.
    pub fn job_ended(&self, outcome: &Result<bool, UnpackError>, took: Duration) {
        let (result, reason) = match outcome {
            Ok(false) => return,
            Ok(true) => ("succeeded", "Unpacked"),
            Err(e @ UnpackError::Cancelled) => ("superseded", e.reason()),
            Err(e) => ("failed", e.reason()),
        };
        self.jobs.get_or_create(&JobLabels { result, reason }).inc();
        self.durations.get_or_create(&ResultLabel { result }).observe(took.as_secs_f64());
    }

    /// Counts a Bundle as waiting for an unpack slot while the guard lives.
    pub fn queued(&self) -> Queued {
        self.queue_depth.inc();
        Queued(self.queue_depth.clone())
    }

    /// `bytes` were downloaded for `source`.
    pub fn fetched(&self, source: &Source, bytes: u64) {
        // Uploads are not a fetch: only the kinds in SOURCES are counted.
        let Some(source) = source.kinds().into_iter().find(|k| SOURCES.contains(k)) else { return };
        self.fetched_bytes.get_or_create(&SourceLabel { source }).inc_by(bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposes_jobs_durations_queue_and_bytes() {
        let mut registry = Registry::default();
        let metrics = UnpackMetrics::register(&mut registry);
        let queued = metrics.queued();
        metrics.job_ended(&Ok(true), Duration::from_millis(300));
        metrics.job_ended(&Ok(false), Duration::from_millis(1));
        metrics.job_ended(&Err(UnpackError::Fetch("404".into())), Duration::from_secs(2));
        metrics.fetched(&Source { http: Some(Default::default()), ..Default::default() }, 1234);
        let mut text = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut text, &registry).unwrap();
        for line in [
            "stowage_unpack_jobs_total{result=\"succeeded\",reason=\"Unpacked\"} 1",
            "stowage_unpack_jobs_total{result=\"failed\",reason=\"PullFailed\"} 1",
            "stowage_unpack_duration_seconds_bucket{result=\"succeeded\",le=\"0.5\"} 1",
            "stowage_unpack_duration_seconds_count{result=\"failed\"} 1",
            "stowage_unpack_queue_depth 1",
            "# HELP stowage_unpack_queue_depth Bundles whose unpack waits for a free slot (--unpack-concurrency).",
            "stowage_unpack_fetched_bytes_total{source=\"http\"} 1234",
            "stowage_unpack_fetched_bytes_total{source=\"git\"} 0",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
        }
        assert_eq!(text.matches("stowage_unpack_jobs_total{").count(), 2, "{text}");
        drop(queued);
        text.clear();
        prometheus_client::encoding::prometheus_text::encode(&mut text, &registry).unwrap();
        assert!(text.lines().any(|l| l == "stowage_unpack_queue_depth 0"), "{text}");
    }
}
