//! Delegated authentication and authorization in `/metrics`, under the names k8s.io/apiserver's
//! delegating authenticator and authorizer use: `apiserver_delegated_authn_request_total` and
//! `apiserver_delegated_authn_request_duration_seconds` (TokenReviews), and the `authz` pair
//! (SubjectAccessReviews), by the HTTP status code of the answer (`<error>` when none came), with
//! kube's buckets; and `stowage_delegated_auth_cache_lookups_total{kind,result}`, how often an
//! answer came from the caches (`kind` authn or authz, `result` hit or miss).
//!
//! `serve` registers the families and hands them to the reviewer and authorizer; `Default` gives
//! unregistered ones. Clones share the same series. Label values are a fixed set: status codes
//! are three digits.

use std::time::Instant;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

/// k8s.io/apiserver's buckets for both request histograms.
const BUCKETS: [f64; 8] = [0.25, 0.5, 0.7, 1.0, 1.5, 3.0, 5.0, 10.0];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CodeLabel {
    code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CacheLabels {
    kind: &'static str,
    result: &'static str,
}

/// Which review a measurement is of.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Review {
    /// TokenReview.
    Authn,
    /// SubjectAccessReview.
    Authz,
}

#[derive(Clone, Debug)]
pub struct DelegatedMetrics {
    authn_requests: Family<CodeLabel, Counter>,
    authn_durations: Family<CodeLabel, Histogram, fn() -> Histogram>,
    authz_requests: Family<CodeLabel, Counter>,
    authz_durations: Family<CodeLabel, Histogram, fn() -> Histogram>,
    cache: Family<CacheLabels, Counter>,
}

impl Default for DelegatedMetrics {
    fn default() -> Self {
        let cache = Family::default();
        for kind in ["authn", "authz"] {
            for result in ["hit", "miss"] {
                drop(cache.get_or_create(&CacheLabels { kind, result }));
            }
        }
        DelegatedMetrics {
            authn_requests: Family::default(),
            authn_durations: Family::new_with_constructor(|| Histogram::new(BUCKETS)),
            authz_requests: Family::default(),
            authz_durations: Family::new_with_constructor(|| Histogram::new(BUCKETS)),
            cache,
        }
    }
}

impl DelegatedMetrics {
    /// New families, registered into `registry` (kube's help texts; the registry adds the period).
    pub fn register(registry: &mut Registry) -> DelegatedMetrics {
        let metrics = DelegatedMetrics::default();
        registry.register(
            "apiserver_delegated_authn_request",
            "Number of HTTP requests partitioned by status code",
            metrics.authn_requests.clone(),
        );
        registry.register_with_unit(
            "apiserver_delegated_authn_request_duration",
            "Request latency in seconds. Broken down by status code",
            Unit::Seconds,
            metrics.authn_durations.clone(),
        );
        registry.register(
            "apiserver_delegated_authz_request",
            "Number of HTTP requests partitioned by status code",
            metrics.authz_requests.clone(),
        );
        registry.register_with_unit(
            "apiserver_delegated_authz_request_duration",
            "Request latency in seconds. Broken down by status code",
            Unit::Seconds,
            metrics.authz_durations.clone(),
        );
        registry.register(
            "stowage_delegated_auth_cache_lookups",
            "Lookups in the TokenReview (authn) and SubjectAccessReview (authz) caches, by result (hit, miss)",
            metrics.cache.clone(),
        );
        metrics
    }

    /// A lookup in the `review`'s cache found an answer (`hit`) or not.
    pub fn cache_lookup(&self, review: Review, hit: bool) {
        let kind = match review {
            Review::Authn => "authn",
            Review::Authz => "authz",
        };
        self.cache.get_or_create(&CacheLabels { kind, result: if hit { "hit" } else { "miss" } }).inc();
    }

    /// A review request that began at `started` was answered `Ok` (201 Created) or failed.
    pub fn request<T>(&self, review: Review, started: Instant, answer: &Result<T, kube::Error>) {
        let code = match answer {
            Ok(_) => "201".to_owned(),
            Err(kube::Error::Api(status)) if (100..600).contains(&status.code) => status.code.to_string(),
            Err(_) => "<error>".to_owned(),
        };
        let (requests, durations) = match review {
            Review::Authn => (&self.authn_requests, &self.authn_durations),
            Review::Authz => (&self.authz_requests, &self.authz_durations),
        };
        let label = CodeLabel { code };
        requests.get_or_create(&label).inc();
        durations.get_or_create(&label).observe(started.elapsed().as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kube_names_and_a_fixed_label_set() {
        let mut registry = Registry::default();
        let metrics = DelegatedMetrics::register(&mut registry);
        let started = Instant::now();
        metrics.request(Review::Authn, started, &Ok(()));
        metrics.request::<()>(Review::Authz, started, &Err(kube::Error::LinesCodecMaxLineLengthExceeded));
        metrics.cache_lookup(Review::Authn, true);
        let mut text = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut text, &registry).unwrap();
        for line in [
            "apiserver_delegated_authn_request_total{code=\"201\"} 1",
            "apiserver_delegated_authn_request_duration_seconds_count{code=\"201\"} 1",
            "apiserver_delegated_authn_request_duration_seconds_bucket{code=\"201\",le=\"0.25\"} 1",
            "apiserver_delegated_authz_request_total{code=\"<error>\"} 1",
            "stowage_delegated_auth_cache_lookups_total{kind=\"authn\",result=\"hit\"} 1",
            "stowage_delegated_auth_cache_lookups_total{kind=\"authz\",result=\"miss\"} 0",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
        }
    }
}
