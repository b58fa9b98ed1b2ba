use axum::http::{HeaderValue, Method};

use super::*;
use crate::apiserver::fairness::FairnessLimits;
use crate::storage::StoreOptions;

fn labels(method: Method, uri: &str) -> RequestLabels {
    RequestLabels::of(&Request::builder().method(method).uri(uri).body(Body::empty()).unwrap())
}

/// A registry as the server builds it, on an empty store, and its request families.
fn exposition(dir: &std::path::Path) -> (Arc<Metrics>, Arc<Exposition>) {
    let store = Store::open(&dir.join("store"), StoreOptions::default()).unwrap();
    // The collection owed since open runs in the background: its gauge reads 0 once it ends.
    assert!(store.wait_recovered(std::time::Duration::from_secs(20)), "the store did not finish recovering");
    let spool = Arc::new(UploadSessions::local(&dir.join("uploads"), std::time::Duration::from_secs(60)).unwrap());
    install(Registry::default(), store, Fairness::new(FairnessLimits::default()), spool)
}

fn has_line(text: &str, line: &str) {
    assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
}

#[test]
fn keeps_kube_apiserver_names_labels_and_buckets() {
    let dir = tempfile::tempdir().unwrap();
    let (metrics, exposition) = exposition(dir.path());
    let list = labels(Method::GET, "/apis/content.stowage.dev/v1alpha1/namespaces/a/bundles");
    metrics.requests.get_or_create(&(Code { code: 200 }, list)).inc();
    metrics.durations.get_or_create(&list).observe(0.9);
    let watch = labels(Method::GET, "/apis/content.stowage.dev/v1alpha1/namespaces/a/bundles?watch=1");
    metrics.long_running.get_or_create(&watch).inc();
    let (text, content_type) = Format::Prometheus.encode(&exposition.registry).unwrap();
    assert_eq!(content_type, "text/plain; version=0.0.4; charset=utf-8");
    let series = "component=\"apiserver\",group=\"content.stowage.dev\",resource=\"bundles\",scope=\"namespace\",subresource=\"\"";
    has_line(&text, &format!("apiserver_request_total{{code=\"200\",{series},verb=\"LIST\",version=\"v1alpha1\"}} 1"));
    // kube's bucket bounds, written as Go writes them (`1`, not `1.0`).
    has_line(
        &text,
        &format!(
            "apiserver_request_duration_seconds_bucket{{{series},verb=\"LIST\",version=\"v1alpha1\",le=\"0.8\"}} 0"
        ),
    );
    has_line(
        &text,
        &format!("apiserver_request_duration_seconds_bucket{{{series},verb=\"LIST\",version=\"v1alpha1\",le=\"1\"}} 1"),
    );
    has_line(
        &text,
        &format!(
            "apiserver_request_duration_seconds_bucket{{{series},verb=\"LIST\",version=\"v1alpha1\",le=\"+Inf\"}} 1"
        ),
    );
    has_line(
        &text,
        &format!("apiserver_request_duration_seconds_count{{{series},verb=\"LIST\",version=\"v1alpha1\"}} 1"),
    );
    assert_eq!(text.matches("apiserver_request_duration_seconds_bucket{").count(), DURATION_BUCKETS.len() + 1);
    has_line(&text, &format!("apiserver_longrunning_requests{{{series},verb=\"WATCH\",version=\"v1alpha1\"}} 1"));
    has_line(&text, "# TYPE apiserver_request_duration_seconds histogram");
    has_line(&text, "# HELP apiserver_request_total Counter of apiserver requests broken out for each verb, group, version, resource, scope, component, and HTTP response code.");
    // The store's gauges and counters, and the admission state, from their collectors.
    for line in [
        "stowage_chunks 0",
        "stowage_revisions{state=\"committed\"} 0",
        "stowage_revisions{state=\"deleting\"} 0",
        "stowage_revisions_repack_pending 0",
        "stowage_object_writes_total 0",
        "stowage_store_poisoned 0",
        "stowage_store_recovering 0",
        "stowage_store_compactions_total 0",
        "stowage_store_compacted_bytes_total 0",
        "apiserver_current_inflight_requests{request_kind=\"readOnly\"} 0",
        "stowage_rejected_requests_total{request_kind=\"content\",reason=\"time-out\"} 0",
    ] {
        has_line(&text, line);
    }
    let flushes = text.lines().find_map(|l| l.strip_prefix("stowage_store_flushes_total ")).unwrap();
    assert!(flushes.parse::<u64>().unwrap() >= 1, "opening the store flushes: {text}");
    assert!(!text.contains("# EOF"), "{text}");
}

#[test]
fn openmetrics_when_asked_for() {
    let accept = |value: &'static str| {
        let mut headers = HeaderMap::new();
        headers.insert(header::ACCEPT, HeaderValue::from_static(value));
        Format::negotiate(&headers)
    };
    assert_eq!(Format::negotiate(&HeaderMap::new()), Format::Prometheus);
    assert_eq!(accept("*/*"), Format::Prometheus);
    assert_eq!(accept("application/json"), Format::Prometheus);
    assert_eq!(accept("application/openmetrics-text; version=1.0.0"), Format::OpenMetrics);
    // What Prometheus sends: OpenMetrics first.
    let prometheus = "application/openmetrics-text;version=1.0.0;q=0.5,application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2";
    assert_eq!(accept(prometheus), Format::OpenMetrics);
    assert_eq!(accept("text/plain;version=0.0.4,application/openmetrics-text;q=0.5"), Format::Prometheus);

    let dir = tempfile::tempdir().unwrap();
    let (_, exposition) = exposition(dir.path());
    let (text, content_type) = Format::OpenMetrics.encode(&exposition.registry).unwrap();
    assert_eq!(content_type, "application/openmetrics-text; version=1.0.0; charset=utf-8");
    assert!(text.ends_with("# EOF\n"), "{text}");
    has_line(&text, "stowage_chunks 0");
    has_line(&text, "# TYPE stowage_object_writes counter");
    has_line(&text, "stowage_object_writes_total 0");
}
