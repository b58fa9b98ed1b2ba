//! Content traffic: bytes of content downloads sent and of uploads received, by `Content-Encoding`
//! (`identity`, `zstd`, `gzip`: what the wire carried, counted as the body streams), the download
//! streams open now, and (read at scrape time) the chunked upload sessions open.
//!
//! [`count`] is a middleware on the `content` route only, outside its compression layer, so what
//! it counts is what the client sent and received.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, Method};
use axum::middleware::Next;
use axum::response::Response;
use hyper::body::{Body as HttpBody, Frame, SizeHint};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::registry::{Registry, Unit};

use super::Metrics;
use crate::storage::sessions::UploadSessions;

/// The encodings counted (any other one is refused by the handlers, and not counted).
const ENCODINGS: [&str; 3] = ["identity", "zstd", "gzip"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EncodingLabel {
    encoding: &'static str,
}

/// The content families; part of [`Metrics`].
pub struct ContentMetrics {
    sent: Family<EncodingLabel, Counter>,
    received: Family<EncodingLabel, Counter>,
    downloads_open: Gauge,
}

impl ContentMetrics {
    pub fn register(registry: &mut Registry) -> ContentMetrics {
        let metrics =
            ContentMetrics { sent: Family::default(), received: Family::default(), downloads_open: Gauge::default() };
        // Present from the start, so a rate needs no first download.
        for encoding in ENCODINGS {
            drop(metrics.sent.get_or_create(&EncodingLabel { encoding }));
            drop(metrics.received.get_or_create(&EncodingLabel { encoding }));
        }
        registry.register_with_unit(
            "stowage_content_sent",
            "Bytes of content downloads sent, as on the wire, by Content-Encoding (identity, zstd, gzip)",
            Unit::Bytes,
            metrics.sent.clone(),
        );
        registry.register_with_unit(
            "stowage_content_received",
            "Bytes of content uploads received, as on the wire, by the request's Content-Encoding (identity, zstd, gzip)",
            Unit::Bytes,
            metrics.received.clone(),
        );
        registry.register(
            "stowage_content_download_streams_open",
            "Content downloads whose body is being sent now",
            metrics.downloads_open.clone(),
        );
        metrics
    }
}

/// The label of a `Content-Encoding` header (absent: identity); `None` for one not counted.
fn encoding_of(headers: &HeaderMap) -> Option<&'static str> {
    match headers.get(header::CONTENT_ENCODING).map(|v| v.to_str().map(str::trim)) {
        None => Some("identity"),
        Some(Ok(value)) => ENCODINGS.into_iter().find(|e| value.eq_ignore_ascii_case(e)),
        Some(Err(_)) => None,
    }
}

/// Keeps a download in the open-streams gauge until its body is dropped.
struct Open(Gauge);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// A body whose data frames are added to a counter as they pass; sizes and ends as the body's.
struct Counted {
    inner: Body,
    bytes: Counter,
    _open: Option<Open>,
}

impl HttpBody for Counted {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled {
            if let Some(data) = frame.data_ref() {
                this.bytes.inc_by(data.len() as u64);
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Middleware of the `content` route: counts upload bodies as they are read and download bodies
/// (successful GETs) as they are sent, and keeps downloads in the open-streams gauge.
pub async fn count(State(metrics): State<Arc<Metrics>>, request: Request, next: Next) -> Response {
    let content = &metrics.content;
    let download = request.method() == Method::GET;
    let request = match encoding_of(request.headers()) {
        Some(encoding) if !download && request.method() != Method::DELETE => {
            let bytes = content.received.get_or_create_owned(&EncodingLabel { encoding });
            request.map(|inner| Body::new(Counted { inner, bytes, _open: None }))
        }
        _ => request,
    };
    let response = next.run(request).await;
    if !download || !response.status().is_success() {
        return response;
    }
    let Some(encoding) = encoding_of(response.headers()) else { return response };
    let bytes = content.sent.get_or_create_owned(&EncodingLabel { encoding });
    content.downloads_open.inc();
    let open = Open(content.downloads_open.clone());
    response.map(|inner| Body::new(Counted { inner, bytes, _open: Some(open) }))
}

/// `stowage_upload_sessions_open`, counted in the spool at scrape time.
pub struct UploadSessionsCollector(pub Arc<UploadSessions>);

impl std::fmt::Debug for UploadSessionsCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UploadSessionsCollector").finish_non_exhaustive()
    }
}

impl Collector for UploadSessionsCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        match self.0.open_sessions() {
            Ok(open) => {
                let metric = ConstGauge::new(open);
                metric.encode(encoder.encode_descriptor(
                    "stowage_upload_sessions_open",
                    "Chunked upload sessions started and neither committed, deleted nor expired (replicated: of every replica)",
                    None,
                    metric.metric_type(),
                )?)
            }
            Err(e) => {
                tracing::warn!(error = %e, "counting upload sessions for /metrics failed");
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodings_are_a_fixed_set() {
        let with = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(header::CONTENT_ENCODING, value.parse().unwrap());
            encoding_of(&headers)
        };
        assert_eq!(encoding_of(&HeaderMap::new()), Some("identity"));
        assert_eq!(with("zstd"), Some("zstd"));
        assert_eq!(with("GZIP"), Some("gzip"));
        assert_eq!(with("br"), None);
        assert_eq!(with("x-attacker-chosen"), None);
    }
}
