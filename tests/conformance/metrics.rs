//! `/metrics` beyond the request series (those are in `discovery.rs`): the unpacker's jobs by result
//! and reason, their durations, the queue of Bundles waiting for a slot and the bytes fetched from
//! sources; the store's flushes, sweeps and compactions; the process and build series, content
//! bytes by encoding, download streams and upload sessions open.

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

/// The value of the one series of `name` whose labels contain every one of `labels`.
fn labelled(m: &HashMap<String, f64>, name: &str, labels: &[&str]) -> f64 {
    let found: Vec<(&String, &f64)> =
        m.iter().filter(|(k, _)| k.starts_with(&format!("{name}{{")) && labels.iter().all(|l| k.contains(l))).collect();
    assert_eq!(found.len(), 1, "one {name} series with {labels:?}: {found:?}");
    *found[0].1
}

/// `VmRSS` of `/proc/PID/status`, in bytes.
fn vm_rss(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).expect("VmRSS line");
    let kib: f64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024.0
}

#[tokio::test(flavor = "multi_thread")]
async fn process_build_and_content_series() {
    let server = Server::start_temp(&[]);
    // Compressible text (zstd-encoded when asked) and a bundle too big to sit in socket buffers.
    let mut text = Tree::new();
    let words: String = (0..40_000).map(|i| format!("line {i} of a manifest\n")).collect();
    text.insert("manifests/list.yaml".into(), file(words.into_bytes()));
    let text_tar = build_tar(&text);
    server.create_bundle("m", "text").await;
    server.upload_ok("m", "text", text_tar.clone(), None).await;
    let mut big = Tree::new();
    big.insert("big.bin".into(), file(random_bytes(7, 24 << 20)));
    server.create_bundle("m", "big").await;
    let big_tar = zstd::stream::encode_all(&build_tar(&big)[..], 1).unwrap();
    server.upload_ok("m", "big", big_tar.clone(), Some("zstd")).await;

    let m = server.metrics().await;
    let rss = vm_rss(server.pid());
    // The process, against what the kernel says of it.
    let fds = value(&m, "process_open_fds");
    assert!(fds > 0.0 && value(&m, "process_max_fds") >= fds, "{m:?}");
    let resident = value(&m, "process_resident_memory_bytes");
    assert!(resident > rss / 2.0 && resident < rss * 2.0, "RSS {resident} against VmRSS {rss}");
    assert!(value(&m, "process_virtual_memory_bytes") >= resident, "{m:?}");
    assert!(value(&m, "process_cpu_seconds_total") > 0.0, "{m:?}");
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    let started = value(&m, "process_start_time_seconds");
    assert!(started <= now + 1.0 && started > now - 3600.0, "start {started}, now {now}");
    let version = format!("version=\"{}\"", env!("CARGO_PKG_VERSION"));
    // (parse_metrics drops the blanks of label values: `rustc 1.89.0 (…)` reads `rustc1.89.0(…)`.)
    assert_eq!(labelled(&m, "stowage_build_info", &[&version, "rust_version=\"rustc1.", "git_commit=\""]), 1.0);
    // Uploads by the encoding they came in.
    assert!(labelled(&m, "stowage_content_received_bytes_total", &["identity"]) >= text_tar.len() as f64, "{m:?}");
    assert_eq!(labelled(&m, "stowage_content_received_bytes_total", &["zstd"]), big_tar.len() as f64);
    assert_eq!(labelled(&m, "stowage_content_received_bytes_total", &["gzip"]), 0.0);

    // Downloads, counted as sent on the wire by encoding.
    let sent = |m: &HashMap<String, f64>, encoding: &str| {
        labelled(m, "stowage_content_sent_bytes_total", &[&format!("encoding=\"{encoding}\"")])
    };
    let identity = server.download(&bundle_content("m", "text")).await;
    let after_identity = server.metrics().await;
    assert_eq!(sent(&after_identity, "identity") - sent(&m, "identity"), identity.len() as f64);
    let url = server.url(&bundle_content("m", "text"));
    let resp = server.client().get(&url).header("accept-encoding", "zstd").send().await.unwrap();
    assert_eq!(header(resp.headers(), "content-encoding"), Some("zstd"));
    let compressed = resp.bytes().await.unwrap();
    assert!(compressed.len() < identity.len() / 2, "{} of {}", compressed.len(), identity.len());
    let after_zstd = server.metrics().await;
    assert_eq!(sent(&after_zstd, "zstd") - sent(&after_identity, "zstd"), compressed.len() as f64);
    assert_eq!(sent(&after_zstd, "identity"), sent(&after_identity, "identity"));

    // A download is an open stream while its body is being sent, and no longer once dropped.
    assert_eq!(value(&after_zstd, "stowage_content_download_streams_open"), 0.0);
    let held = server.client().get(server.url(&bundle_content("m", "big"))).send().await.unwrap();
    assert_eq!(held.status(), 200);
    let open = server.metrics().await;
    assert_eq!(value(&open, "stowage_content_download_streams_open"), 1.0);
    drop(held);
    scrape_until(&server, "the dropped download's stream closed", |m| {
        m.get("stowage_content_download_streams_open") == Some(&0.0)
    })
    .await;

    // A chunked upload session is open from its start to its removal.
    assert_eq!(value(&open, "stowage_upload_sessions_open"), 0.0);
    let started = server.client().post(server.url(&format!("{}?uploads", bundle_content("m", "text")))).send().await;
    let started = started.unwrap();
    assert_eq!(started.status(), 202);
    let id = str_at(&parse_json(&started.bytes().await.unwrap(), "upload session"), "/uploadID").to_owned();
    assert_eq!(value(&server.metrics().await, "stowage_upload_sessions_open"), 1.0);
    let url = server.url(&format!("{}?upload={id}", bundle_content("m", "text")));
    let removed = server.client().delete(url).send().await.unwrap();
    assert!(removed.status().is_success(), "{}", removed.status());
    assert_eq!(value(&server.metrics().await, "stowage_upload_sessions_open"), 0.0);

    // Standalone: no replicated or delegated series.
    let text = String::from_utf8(server.download("/metrics").await).unwrap();
    for absent in ["stowage_leader", "etcd_request_duration_seconds", "apiserver_delegated_authn_request_total"] {
        assert!(!text.contains(absent), "{absent} in a standalone server's /metrics");
    }
}
