//! The load suite (issue 7): 200 concurrent clients, each on its own connections (HTTP/2 and
//! HTTP/1.1 alike), mix content downloads (whole tar, one file, ranges, conditional GETs), gets,
//! paged lists, creates, updates and uploads for a bounded time (`STOWAGE_LOAD_SECONDS`, default
//! 20) while watchers follow the Bundles. Every response must be the expected one, every watcher
//! must see every acknowledged write in its scope in resourceVersion order, and the server's
//! memory must level off after warm-up.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::harness::*;
use crate::load_workers::*;
use crate::raw_client::rss_kib;
use crate::tarutil::*;

const CLIENTS: usize = 200;
/// Watchers among the clients: half watch one namespace, half all of them.
const WATCHERS: usize = 16;
/// Changes the server's watch cache keeps decoded (`watch_cache.rs`).
const WATCH_RING_EVENTS: u64 = 4096;
/// How long watchers get to deliver the last acknowledged writes once the load stops.
const CATCH_UP: Duration = Duration::from_secs(30);

fn load_duration() -> Duration {
    let seconds = std::env::var("STOWAGE_LOAD_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(20.0);
    Duration::from_secs_f64(seconds)
}

/// Uploads the Bundle every worker downloads: 40 files of 4 KiB.
async fn upload_fixture(server: &Server) -> Fixture {
    let (namespace, name) = ("load-fixture".to_string(), "fixture".to_string());
    server.create_bundle(&namespace, &name).await;
    let tree: Tree = (0..40).map(|i| (format!("manifests/f{i:02}.yaml"), file(random_bytes(i, 4096)))).collect();
    let tar = build_tar(&tree);
    let uploaded = server.upload_ok(&namespace, &name, tar, None).await;
    // The served tar is the deterministic form of the tree, not the uploaded bytes.
    let served = server.download(&bundle_content(&namespace, &name)).await;
    Fixture {
        etag: format!("\"{}\"", str_at(&uploaded, "/status/digest")),
        tar_len: served.len(),
        file_path: "manifests/f07.yaml".into(),
        file_body: random_bytes(7, 4096),
        namespace,
        name,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn two_hundred_clients_mixing_reads_writes_and_watches() {
    let server = Server::start_temp(&[]);
    let fixture = Arc::new(upload_fixture(&server).await);
    let start_rv = str_at(&server.get_json(&format!("{API}/bundles")).await, "/metadata/resourceVersion").to_owned();

    // Watchers first, from the version before any worker write.
    let (stop_watchers, stop) = tokio::sync::watch::channel(false);
    let mut watchers = Vec::new();
    for w in 0..WATCHERS {
        let scope = (w % 2 == 0).then(|| namespace(w / 2));
        let path = match &scope {
            Some(ns) => bundles(ns),
            None => format!("{API}/bundles"),
        };
        let url = server.url(&format!("{path}?watch=true&resourceVersion={start_rv}&allowWatchBookmarks=true"));
        let client = if w % 4 < 2 { server.second_client() } else { server.http1_client() };
        let (progress, seen) = tokio::sync::watch::channel(0u64);
        watchers.push((scope, seen, tokio::spawn(watch(client, url, progress, stop.clone()))));
    }

    let duration = load_duration();
    let started = Instant::now();
    let deadline = started + duration;
    let workers: Vec<_> = (0..CLIENTS - WATCHERS)
        .map(|id| {
            let client = if id % 2 == 0 { server.second_client() } else { server.http1_client() };
            let worker = Worker { id, client, base_url: server.url.clone(), fixture: fixture.clone() };
            tokio::spawn(worker.run(deadline))
        })
        .collect();

    // Memory every 2 s; the first half of the run is warm-up.
    let pid = server.pid();
    let sampler = tokio::spawn(async move {
        let mut samples = Vec::new();
        while Instant::now() < deadline {
            samples.push(rss_kib(pid) / 1024);
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        samples
    });
    tokio::time::sleep(duration / 2).await;
    let rss_warm = rss_kib(server.pid());
    let rv_warm = store_version(&server).await;
    let mut reports = Vec::new();
    for worker in workers {
        reports.push(worker.await.expect("worker task"));
    }
    let elapsed = started.elapsed();
    let rss_end = rss_kib(server.pid());
    let changes_since_warm = store_version(&server).await - rv_warm;
    report(&format!("load: RSS MiB every 2 s: {:?}", sampler.await.expect("sampler")));

    let mut latencies: BTreeMap<Kind, Vec<Duration>> = BTreeMap::new();
    let (mut errors, mut acks) = (Vec::new(), Vec::new());
    for report in reports {
        for (kind, mut l) in report.latencies {
            latencies.entry(kind).or_default().append(&mut l);
        }
        errors.extend(report.errors);
        acks.extend(report.acks);
    }
    report_latencies(&latencies, elapsed);
    assert!(
        errors.is_empty(),
        "{} error responses under load, e.g.:\n{}",
        errors.len(),
        errors[..errors.len().min(10)].join("\n")
    );

    // Every watcher sees every acknowledged write of its scope, in order.
    let start_rv: u64 = start_rv.parse().expect("numeric resourceVersion");
    let in_scope = |scope: &Option<String>, ack: &Ack| {
        ack.resource_version > start_rv && scope.as_ref().is_none_or(|ns| *ns == ack.namespace)
    };
    for (scope, seen, _) in &mut watchers {
        let newest = acks.iter().filter(|a| in_scope(scope, a)).map(|a| a.resource_version).max().unwrap_or(0);
        let _ = tokio::time::timeout(CATCH_UP, seen.wait_for(|rv| *rv >= newest)).await;
    }
    let _ = stop_watchers.send(true);
    let mut watched_events = 0;
    for (scope, _, task) in watchers {
        let log = task.await.expect("watcher task");
        assert!(log.errors.is_empty(), "watcher of {scope:?}: {:?}", &log.errors[..log.errors.len().min(10)]);
        let expected: Vec<&Ack> = acks.iter().filter(|a| in_scope(&scope, a)).collect();
        let missing: Vec<&&Ack> = expected.iter().filter(|a| !log.seen.contains(**a)).collect();
        assert!(
            missing.is_empty(),
            "watcher of {scope:?} missed {} of {} acknowledged writes, e.g. {:?}",
            missing.len(),
            expected.len(),
            &missing[..missing.len().min(5)]
        );
        watched_events += log.events;
    }
    report(&format!("load: {} acknowledged writes; watchers saw {watched_events} events, none missing", acks.len()));

    // After warm-up the per-connection state is in place (200 connections' TLS and HTTP buffers,
    // the block cache of 16 × 256 KiB); what may still fill are the bounded caches: sled's (32 MiB)
    // and the watch cache's ring, which keeps the last 4096 changes decoded (the object and its
    // previous state: ~20 KiB each for these Bundles as measured without watchers, 32 KiB
    // allowed), plus 32 MiB for the allocator. Over a 60 s run RSS levels off once both are full
    // (at ~290 MiB here); anything kept per request (~10 k) or per connection beyond that fails.
    let ring_fill_kib = changes_since_warm.min(WATCH_RING_EVENTS) * 32;
    let allowed_growth_kib = 32 * 1024 + ring_fill_kib + 32 * 1024;
    report(&format!(
        "load: server RSS {rss_warm} KiB after warm-up (half time), {rss_end} KiB at the end, \
         {changes_since_warm} changes since (allowed growth {allowed_growth_kib} KiB)"
    ));
    assert!(rss_end <= rss_warm + allowed_growth_kib, "server RSS grew from {rss_warm} to {rss_end} KiB");
}

/// The store's current resourceVersion (of every resource: the change log is shared).
async fn store_version(server: &Server) -> u64 {
    let list = server.get_json(&format!("{API}/bundles?limit=1")).await;
    str_at(&list, "/metadata/resourceVersion").parse().expect("numeric resourceVersion")
}

fn report_latencies(latencies: &BTreeMap<Kind, Vec<Duration>>, elapsed: Duration) {
    let total: usize = latencies.values().map(Vec::len).sum();
    report(&format!(
        "load: {total} requests in {elapsed:.1?} by {} workers: {:.0} requests/s",
        CLIENTS - WATCHERS,
        total as f64 / elapsed.as_secs_f64()
    ));
    for (kind, l) in latencies {
        let mut sorted = l.clone();
        sorted.sort();
        let at = |q: f64| sorted[((sorted.len() - 1) as f64 * q) as usize];
        report(&format!("load:   {kind:?}: {} requests, p50 {:.1?}, p99 {:.1?}", sorted.len(), at(0.5), at(0.99)));
    }
}
