//! `/metrics` beyond the request series (those are in `discovery.rs`): the unpacker's jobs by result
//! and reason, their durations, the queue of Bundles waiting for a slot and the bytes fetched from
//! sources; the store's flushes, sweeps and compactions.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::json;

use crate::harness::*;
use crate::http_server::{HttpAuth, HttpServer};
use crate::tarutil::{build_tar, file, random_bytes, Tree};
use crate::unpack::{corpus_tree, create, wait_reason};

const NS: &str = "unpack";
const WAIT: Duration = Duration::from_secs(60);

fn value(m: &HashMap<String, f64>, key: &str) -> f64 {
    m.get(key).copied().unwrap_or_else(|| panic!("no {key} in /metrics: {m:?}"))
}

/// Waits until `check` holds for a scrape, and returns that scrape.
async fn scrape_until(
    server: &Server,
    what: &str,
    check: impl Fn(&HashMap<String, f64>) -> bool,
) -> HashMap<String, f64> {
    eventually(WAIT, what, || async {
        let m = server.metrics().await;
        if check(&m) {
            Ok(m)
        } else {
            Err(format!("{m:?}"))
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn unpack_jobs_queue_and_fetched_bytes() {
    let web = HttpServer::start(HttpAuth::None);
    let plain = build_tar(&corpus_tree("rukpak-testdata/plain-v0/valid"));
    web.put("plain.tar", &plain);
    let mut broken = Tree::new();
    broken.insert("manifests/broken.yaml".into(), file("apiVersion: v1\nkind: [unclosed\n"));
    let bad = build_tar(&broken);
    web.put("bad.tar", &bad);
    // A host that accepts connections (the kernel's backlog) and never answers: an unpack from it
    // holds its slot until cancelled.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_host = silent.local_addr().unwrap().to_string();
    let server = Server::start_temp(&[
        "--unpack-concurrency",
        "1",
        "--insecure-source-host",
        &web.host_port(),
        "--insecure-source-host",
        &silent_host,
    ]);
    let jobs =
        |result: &str, reason: &str| format!("stowage_unpack_jobs_total{{result=\"{result}\",reason=\"{reason}\"}}");
    let (queue, fetched) = ("stowage_unpack_queue_depth", "stowage_unpack_fetched_bytes_total{source=\"http\"}");

    let m = server.metrics().await;
    assert_eq!((value(&m, queue), value(&m, fetched)), (0.0, 0.0));

    // The only slot is taken by a source that never answers; the next Bundle waits for it.
    create(&server, "stuck", json!({"sources": [{"http": {"url": format!("http://{silent_host}/never.tar")}}]})).await;
    wait_reason(&server, "stuck", "Unpacking").await;
    create(&server, "good", json!({"sources": [{"http": {"url": web.url("plain.tar")}}]})).await;
    scrape_until(&server, "one Bundle queued", |m| m.get(queue) == Some(&1.0)).await;
    // Deleting the stuck Bundle cancels its job (superseded) and frees the slot.
    let resp = server.delete(&bundle(NS, "stuck")).await;
    assert!(resp.status().is_success(), "{}", resp.status());
    wait_reason(&server, "good", "Unpacked").await;
    let m =
        scrape_until(&server, "the good job counted", |m| m.get(&jobs("succeeded", "Unpacked")) == Some(&1.0)).await;
    assert_eq!(value(&m, queue), 0.0);
    assert_eq!(value(&m, &jobs("superseded", "Cancelled")), 1.0, "{m:?}");
    assert_eq!(value(&m, "stowage_unpack_duration_seconds_count{result=\"succeeded\"}"), 1.0);
    assert_eq!(value(&m, "stowage_unpack_duration_seconds_bucket{result=\"succeeded\",le=\"+Inf\"}"), 1.0);
    assert_eq!(value(&m, fetched), plain.len() as f64, "the whole file was downloaded once");

    // Failing sources count with the reason their Bundle's Unpacked condition gives.
    create(&server, "bad", json!({"sources": [{"http": {"url": web.url("bad.tar")}}]})).await;
    wait_reason(&server, "bad", "InvalidFormat").await;
    create(&server, "missing", json!({"sources": [{"http": {"url": web.url("missing.tar")}}]})).await;
    wait_reason(&server, "missing", "SourceNotFound").await;
    let m = scrape_until(&server, "the failures counted", |m| {
        m.get(&jobs("failed", "InvalidFormat")) == Some(&1.0) && m.get(&jobs("failed", "SourceNotFound")) == Some(&1.0)
    })
    .await;
    let after_bad = value(&m, fetched);
    assert!(after_bad > plain.len() as f64 && after_bad <= (plain.len() + bad.len()) as f64, "{after_bad}");
    assert_eq!(value(&m, &jobs("succeeded", "Unpacked")), 1.0);
    drop(silent);
}

#[tokio::test(flavor = "multi_thread")]
async fn store_flushes_sweeps_and_compactions() {
    let server = Server::start_temp(&[]);
    let flushes = |m: &HashMap<String, f64>| value(m, "stowage_store_flushes_total");
    let start = server.metrics().await;
    assert_eq!(value(&start, "stowage_store_compactions_total"), 0.0);

    // Every acknowledged write was flushed.
    server.create_bundle("m", "small").await;
    let created = server.metrics().await;
    assert!(flushes(&created) > flushes(&start), "{created:?}");
    let mut small = Tree::new();
    small.insert("small.bin".into(), file(random_bytes(1, 200_000)));
    server.upload_ok("m", "small", build_tar(&small), None).await;
    server.create_bundle("m", "big").await;
    let mut big = Tree::new();
    big.insert("big.bin".into(), file(random_bytes(2, 6 << 20)));
    server.upload_ok("m", "big", build_tar(&big), None).await;
    let uploaded = server.metrics().await;
    assert!(flushes(&uploaded) > flushes(&created), "{uploaded:?}");

    // Deleting the big one leaves the pack both went to mostly dead: a sweep, then compaction copies
    // the small one's chunks out of it.
    let resp = server.delete(&bundle("m", "big")).await;
    assert!(resp.status().is_success(), "{}", resp.status());
    let m = scrape_until(&server, "the pack compacted", |m| {
        m.get("stowage_store_compactions_total").is_some_and(|n| *n >= 1.0)
    })
    .await;
    assert!(value(&m, "stowage_store_sweeps_total") > value(&uploaded, "stowage_store_sweeps_total"), "{m:?}");
    assert!(value(&m, "stowage_store_compacted_bytes_total") >= 150_000.0, "{m:?}");
    let tar = server.download(&bundle_content("m", "small")).await;
    assert!(!tar.is_empty(), "the small bundle still serves");
}
