//! Prometheus `/metrics`, with `prometheus-client`: requests as kube-apiserver reports them —
//! `apiserver_request_total`, the `apiserver_request_duration_seconds` histogram (long-running
//! requests left out, as kube does) and the `apiserver_longrunning_requests` gauge — recorded by a
//! middleware around every route; the admission state ([`admission`]); the store's gauges and
//! counters, read at scrape time ([`store`]); content bytes by encoding, download streams and
//! upload sessions open ([`content`]); the process and build ([`process`]); and whatever else
//! `serve` registered (the unpacker's, delegated authentication's and the replicated store's
//! families) in the same registry.
//!
//! Label values come from a fixed set ([`request_labels`]), so the families stay small. The
//! exposition is the Prometheus text format (0.0.4, kube-apiserver's) unless the scraper asks for
//! OpenMetrics in `Accept`.

mod admission;
pub mod content;
mod process;
mod request_labels;
mod store;

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt as _;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

use super::fairness::Fairness;
use super::negotiation;
use super::status::{ApiError, ApiResult};
use crate::storage::sessions::UploadSessions;
use crate::storage::Store;
use request_labels::RequestLabels;

/// kube-apiserver's buckets for `apiserver_request_duration_seconds`.
const DURATION_BUCKETS: [f64; 23] = [
    0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 15.0, 20.0, 30.0,
    45.0, 60.0,
];
const OPENMETRICS: &str = "application/openmetrics-text";
const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The response code, the first label of `apiserver_request_total` (as kube orders them).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Code {
    code: u16,
}

/// The request families, recorded by [`record_request`].
pub struct Metrics {
    requests: Family<(Code, RequestLabels), Counter>,
    durations: Family<RequestLabels, Histogram, fn() -> Histogram>,
    long_running: Family<RequestLabels, Gauge>,
    content: content::ContentMetrics,
}

/// What `GET /metrics` encodes: every family and collector, registered once at start.
pub struct Exposition {
    registry: Registry,
}

/// Registers the request and content families and the store, admission, upload-session and
/// process collectors into `registry`, which becomes the one `/metrics` serves.
pub fn install(
    mut registry: Registry,
    store: Store,
    fairness: Arc<Fairness>,
    uploads: Arc<UploadSessions>,
) -> (Arc<Metrics>, Arc<Exposition>) {
    let content = content::ContentMetrics::register(&mut registry);
    let metrics = Metrics {
        requests: Family::default(),
        durations: Family::new_with_constructor(|| Histogram::new(DURATION_BUCKETS)),
        long_running: Family::default(),
        content,
    };
    // kube-apiserver's help texts; the registry ends each with a period.
    registry.register(
        "apiserver_request",
        "Counter of apiserver requests broken out for each verb, group, version, resource, scope, component, and HTTP response code",
        metrics.requests.clone(),
    );
    registry.register_with_unit(
        "apiserver_request_duration",
        "Response latency distribution in seconds for each verb, group, version, resource, subresource, scope and component",
        Unit::Seconds,
        metrics.durations.clone(),
    );
    registry.register(
        "apiserver_longrunning_requests",
        "Gauge of all active long-running apiserver requests broken out by verb, group, version, resource, scope and component",
        metrics.long_running.clone(),
    );
    registry.register_collector(Box::new(admission::AdmissionCollector(fairness)));
    registry.register_collector(Box::new(store::StoreCollector::new(store)));
    registry.register_collector(Box::new(content::UploadSessionsCollector(uploads)));
    registry.register_collector(Box::new(process::ProcessCollector));
    (Arc::new(metrics), Arc::new(Exposition { registry }))
}

/// Middleware: counts every request by its labels and status code; times the others, keeps
/// long-running ones in the gauge until their body ends.
pub async fn record_request(State(metrics): State<Arc<Metrics>>, request: Request, next: Next) -> Response {
    let labels = RequestLabels::of(&request);
    let started = Instant::now();
    // Out of the gauge when the guard (moved into the body) drops.
    let open = labels.is_long_running().then(|| {
        let gauge = metrics.long_running.get_or_create_owned(&labels);
        gauge.inc();
        LongRunning(gauge)
    });
    let response = next.run(request).await;
    metrics.requests.get_or_create(&(Code { code: response.status().as_u16() }, labels)).inc();
    match open {
        None => {
            metrics.durations.get_or_create(&labels).observe(started.elapsed().as_secs_f64());
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

/// Keeps a long-running request in its gauge until its response body is dropped.
struct LongRunning(Gauge);

impl Drop for LongRunning {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// The two text formats `prometheus-client` encodes.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Format {
    /// Prometheus text 0.0.4: what kube-apiserver serves by default.
    Prometheus,
    OpenMetrics,
}

impl Format {
    /// OpenMetrics when the most preferred range the client names that fits either format fits
    /// only OpenMetrics (`application/openmetrics-text`), else the Prometheus text format (also
    /// for an `Accept` naming neither, as promhttp does).
    fn negotiate(headers: &HeaderMap) -> Format {
        let preferred =
            negotiation::accepted(headers).into_iter().find(|r| r.accepts("text/plain") || r.accepts(OPENMETRICS));
        match preferred {
            Some(range) if !range.accepts("text/plain") => Format::OpenMetrics,
            _ => Format::Prometheus,
        }
    }

    fn encode(self, registry: &Registry) -> Result<(String, &'static str), std::fmt::Error> {
        let mut text = String::with_capacity(16 << 10);
        match self {
            Format::Prometheus => {
                prometheus_client::encoding::prometheus_text::encode(&mut text, registry)?;
                Ok((text, prometheus_client::encoding::prometheus_text::CONTENT_TYPE))
            }
            Format::OpenMetrics => {
                prometheus_client::encoding::text::encode(&mut text, registry)?;
                Ok((text, OPENMETRICS_CONTENT_TYPE))
            }
        }
    }
}

/// `GET /metrics`. Encoded on the blocking pool: the store collector may walk the store's index.
pub async fn serve(State(exposition): State<Arc<Exposition>>, headers: HeaderMap) -> ApiResult<Response> {
    let format = Format::negotiate(&headers);
    let (text, content_type) = tokio::task::spawn_blocking(move || format.encode(&exposition.registry))
        .await
        .map_err(super::panic_status::task_failed)?
        .map_err(|_| ApiError::internal("formatting metrics failed"))?;
    Ok(([(header::CONTENT_TYPE, content_type)], text).into_response())
}

#[cfg(test)]
mod tests;
