//! The admission state ([`Fairness`]) at scrape time, under kube-apiserver's names:
//! `apiserver_current_inflight_requests` and `apiserver_current_inqueue_requests` by
//! `request_kind`, and `stowage_rejected_requests_total` (429s) by kind and reason.

use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;

use crate::apiserver::fairness::Fairness;

pub struct AdmissionCollector(pub Arc<Fairness>);

impl std::fmt::Debug for AdmissionCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdmissionCollector").finish_non_exhaustive()
    }
}

impl Collector for AdmissionCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let classes = self.0.counts();
        let mut inflight = encoder.encode_descriptor(
            "apiserver_current_inflight_requests",
            "Requests holding a seat, by kind (content: downloads and uploads).",
            None,
            MetricType::Gauge,
        )?;
        for (kind, counts) in &classes {
            ConstGauge::new(counts.inflight).encode(inflight.encode_family(&[("request_kind", *kind)])?)?;
        }
        let mut queued = encoder.encode_descriptor(
            "apiserver_current_inqueue_requests",
            "Requests waiting for a seat, by kind.",
            None,
            MetricType::Gauge,
        )?;
        for (kind, counts) in &classes {
            ConstGauge::new(counts.waiting).encode(queued.encode_family(&[("request_kind", *kind)])?)?;
        }
        let mut rejected = encoder.encode_descriptor(
            "stowage_rejected_requests",
            "Requests answered 429, by kind and reason (queue-full, time-out).",
            None,
            MetricType::Counter,
        )?;
        for (kind, counts) in &classes {
            for (reason, n) in counts.rejected {
                let labels = [("request_kind", *kind), ("reason", reason)];
                ConstCounter::new(n).encode(rejected.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}
