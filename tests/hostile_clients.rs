//! One user attacks, another keeps working (issue 13): a thousand slow readers of a big download
//! and two hundred slow uploaders, all from one user, plus watches with hostile parameters, while
//! another user's gets, lists, discovery and small downloads are timed. The victim must see no
//! failure and a p99 under 100 ms, the attacker must get 429s, and the server's memory and threads
//! must stay bounded.
//!
//! A test binary of its own: cargo runs test binaries one after another, so nothing else competes
//! with the attack for the machine's cores while the victim is timed.

// Tests state their expectations with unwrap, indexing and panics.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

// harness.rs's corpus() is the generated fixtures.
#[allow(dead_code)]
#[path = "conformance/fixtures/mod.rs"]
mod fixtures;
#[allow(dead_code)]
#[path = "conformance/harness.rs"]
mod harness;
#[allow(dead_code)]
#[path = "conformance/raw_client.rs"]
mod raw_client;
#[allow(dead_code)]
#[path = "conformance/tarutil.rs"]
mod tarutil;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use harness::*;
use reqwest::{Client, StatusCode};
use tarutil::*;

const NS: &str = "team";
const SLOW_READERS: usize = 1000;
const SLOW_UPLOADERS: usize = 200;
/// How long the victim is timed while the attack runs.
const ATTACK: Duration = Duration::from_secs(15);

const TOKENS: &str = "attacker-token,attacker,2001,\"\"\nvictim-token,victim,2002,\"\"\n";
const POLICY: &str = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: bundle-user}
rules:
- apiGroups: [content.stowage.dev]
  resources: [bundles, bundles/content, bundlecontents, bundlecontents/content]
  verbs: [get, list, watch, create, update, patch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: bundle-users}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: bundle-user}
subjects: [{kind: User, name: attacker}, {kind: User, name: victim}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: discovery}
rules:
- nonResourceURLs: [/api, /api/*, /apis, /apis/*, /version, /openapi, /openapi/*]
  verbs: [get]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: discovery}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: discovery}
subjects: [{kind: Group, name: "system:authenticated"}]
"#;

fn start(extra: &[&str]) -> (tempfile::TempDir, Server) {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.csv");
    let policy = dir.path().join("policy.yaml");
    std::fs::write(&tokens, TOKENS).unwrap();
    std::fs::write(&policy, POLICY).unwrap();
    let mut args =
        vec!["--token-auth-file", tokens.to_str().unwrap(), "--authorization-policy-file", policy.to_str().unwrap()];
    args.extend_from_slice(extra);
    let server = Server::start_temp(&args);
    (dir, server)
}

/// `big`: 48 MiB that does not compress, so no slow reader's download fits in socket buffers.
async fn upload_big(server: &Server) {
    server.create_bundle(NS, "big").await;
    let tree: Tree = (0..6).map(|i| (format!("blob{i}"), file(random_bytes(i, 8 << 20)))).collect();
    server.upload_ok(NS, "big", build_tar(&tree), None).await;
    server.create_bundle(NS, "small").await;
    let tree: Tree = [("Chart.yaml".to_string(), file(b"name: small\n".to_vec()))].into_iter().collect();
    server.upload_ok(NS, "small", build_tar(&tree), None).await;
}

fn status_line(key: &str, value: &str) -> Option<u64> {
    value.lines().find_map(|l| l.strip_prefix(key)).and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// Resident memory (KiB) and threads of the server.
fn rss_and_threads(server: &Server) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{}/status", server.pid())).unwrap();
    (status_line("VmRSS:", &status).unwrap(), status_line("Threads:", &status).unwrap())
}

/// Counts of the attacker's answers.
#[derive(Default)]
struct Tally {
    admitted: AtomicU64,
    throttled: AtomicU64,
    other: AtomicU64,
    /// Signalled on every answer counted.
    answered: tokio::sync::Notify,
}

impl Tally {
    fn count(&self, status: Option<StatusCode>) {
        match status {
            Some(s) if s.is_success() => self.admitted.fetch_add(1, Ordering::Relaxed),
            Some(StatusCode::TOO_MANY_REQUESTS) => self.throttled.fetch_add(1, Ordering::Relaxed),
            _ => self.other.fetch_add(1, Ordering::Relaxed),
        };
        self.answered.notify_one();
    }

    /// Waits until the attacker has been answered 429 once: its seats are all taken.
    async fn throttled_once(&self) {
        // notify_one keeps a permit when no one waits, so an answer between the check and the
        // wait is not missed.
        while self.throttled.load(Ordering::Relaxed) == 0 {
            self.answered.notified().await;
        }
    }
}

/// A slow reader: asks for the big download and then takes nothing, holding the response (and its
/// stream or connection) until the attack ends; throttled, it retries after `Retry-After`.
async fn slow_reader(client: Client, url: String, tally: Arc<Tally>, until: Instant) {
    while Instant::now() < until {
        let left = until.saturating_duration_since(Instant::now());
        let sent = tokio::time::timeout(left, client.get(&url).bearer_auth("attacker-token").send()).await;
        let Ok(sent) = sent else { return };
        tally.count(sent.as_ref().ok().map(|r| r.status()));
        match sent {
            Ok(response) if response.status().is_success() => {
                tokio::time::sleep_until(until.into()).await;
                drop(response);
                return;
            }
            _ => tokio::time::sleep(Duration::from_secs(1).min(left)).await,
        }
    }
}

/// A slow uploader: a PUT whose body trickles one byte a second.
async fn slow_uploader(client: Client, url: String, tally: Arc<Tally>, until: Instant) {
    let left = until.saturating_duration_since(Instant::now());
    let trickle = futures_util::stream::unfold((), |()| async {
        tokio::time::sleep(Duration::from_secs(1)).await;
        Some((Ok::<_, std::io::Error>(bytes::Bytes::from_static(b"\0")), ()))
    });
    let request = client.put(&url).bearer_auth("attacker-token").body(reqwest::Body::wrap_stream(trickle)).send();
    if let Ok(sent) = tokio::time::timeout(left, request).await {
        tally.count(sent.as_ref().ok().map(|r| r.status()));
    }
}

/// The victim's requests, each timed; `None` for one that failed.
async fn victim(server: &Server, until: Instant) -> Vec<(&'static str, Option<Duration>)> {
    let client = server.anonymous_client();
    let paths = [
        ("get", bundle(NS, "small")),
        ("list", bundles(NS)),
        ("discovery", "/apis".to_string()),
        ("discovery", API.to_string()),
        ("download", bundle_content(NS, "small")),
    ];
    let mut timings = Vec::new();
    let mut turn = 0usize;
    while Instant::now() < until {
        let (what, path) = &paths[turn % paths.len()];
        turn += 1;
        let started = Instant::now();
        let request = client.get(server.url(path)).bearer_auth("victim-token").timeout(Duration::from_secs(20));
        let ok = match request.send().await {
            Ok(response) => {
                let status = response.status();
                let body = response.bytes().await;
                if status != StatusCode::OK || body.is_err() {
                    eprintln!(
                        "victim {what}: {status} {:?}",
                        body.as_ref().map(|b| String::from_utf8_lossy(b).chars().take(300).collect::<String>())
                    );
                }
                status == StatusCode::OK && body.is_ok()
            }
            Err(e) => {
                eprintln!("victim {what}: {e}");
                false
            }
        };
        timings.push((*what, ok.then(|| started.elapsed())));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    timings
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[index]
}

/// The tests of this binary take turns: each measures the server under its own load only.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread")]
async fn one_user_attacking_does_not_stall_another() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let (_dir, server) = start(&[]);
    upload_big(&server).await;
    let (idle_rss, idle_threads) = rss_and_threads(&server);

    let until = Instant::now() + ATTACK + Duration::from_secs(3);
    let tally = Arc::new(Tally::default());
    let download = server.url(&bundle_content(NS, "big"));
    // HTTP/2 readers share a few connections (one connection may carry 1000 streams); HTTP/1.1
    // readers each hold a connection of their own.
    let h2: Vec<Client> = (0..4).map(|_| server.anonymous_client()).collect();
    let h1 = reqwest::Client::builder()
        .http1_only()
        .tls_certs_only(
            reqwest::Certificate::from_pem_bundle(&std::fs::read(server.data_dir().join("pki/ca.crt")).unwrap())
                .unwrap(),
        )
        .no_proxy()
        .build()
        .unwrap();
    let mut attack = Vec::new();
    for i in 0..SLOW_READERS {
        let client = if i % 5 == 0 { h1.clone() } else { h2[i % h2.len()].clone() };
        attack.push(tokio::spawn(slow_reader(client, download.clone(), tally.clone(), until)));
    }
    let upload = server.url(&bundle_content(NS, "small"));
    for i in 0..SLOW_UPLOADERS {
        attack.push(tokio::spawn(slow_uploader(h2[i % h2.len()].clone(), upload.clone(), tally.clone(), until)));
    }
    // The attack has taken hold once the attacker's seats are all taken (its first 429); then time
    // the victim while it lasts.
    tokio::time::timeout(ATTACK, tally.throttled_once()).await.expect("the attacker was never answered 429");
    let sampler = {
        let pid = server.pid();
        tokio::spawn(async move {
            let mut peak = (0u64, 0u64);
            while Instant::now() < until {
                if let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
                    peak.0 = peak.0.max(status_line("VmRSS:", &status).unwrap_or(0));
                    peak.1 = peak.1.max(status_line("Threads:", &status).unwrap_or(0));
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            peak
        })
    };
    let timings = victim(&server, until).await;
    let (peak_rss, peak_threads) = sampler.await.unwrap();
    for task in attack {
        task.await.unwrap();
    }

    let failed: Vec<_> = timings.iter().filter(|(_, t)| t.is_none()).map(|(what, _)| *what).collect();
    let mut latencies: Vec<Duration> = timings.iter().filter_map(|(_, t)| *t).collect();
    latencies.sort();
    let (p50, p99, max) = (percentile(&latencies, 0.5), percentile(&latencies, 0.99), latencies[latencies.len() - 1]);
    let (admitted, throttled, other) = (
        tally.admitted.load(Ordering::Relaxed),
        tally.throttled.load(Ordering::Relaxed),
        tally.other.load(Ordering::Relaxed),
    );
    report(&format!(
        "victim under attack: {} requests, {} failed, p50 {p50:?}, p99 {p99:?}, max {max:?}; attacker: {admitted} \
         admitted, {throttled} throttled (429), {other} other; server RSS {} MiB idle, {} MiB peak; threads {idle_threads} \
         idle, {peak_threads} peak",
        timings.len(),
        failed.len(),
        idle_rss / 1024,
        peak_rss / 1024,
    ));
    assert!(failed.is_empty(), "the victim's requests failed during the attack: {failed:?}");
    assert!(p99 < Duration::from_millis(100), "the victim's p99 was {p99:?} during the attack");
    assert!(throttled > 0, "the attacker was never answered 429");
    assert!(peak_rss < idle_rss + 300 * 1024, "RSS grew from {idle_rss} KiB to {peak_rss} KiB under attack");
    assert!(peak_threads < 128, "the server ran {peak_threads} threads under attack");

    // Watches with hostile parameters, while the attack's streams may still be draining: answered (or refused) with a Status, never a dropped stream.
    let hostile_watches = [
        format!("{}?watch=1&timeoutSeconds=18446744073709551615", bundles(NS)),
        format!("{}?watch=1&resourceVersion=18446744073709551615", bundles(NS)),
        format!("{}?watch=1&timeoutSeconds=-1", bundles(NS)),
    ];
    for path in &hostile_watches {
        let response = server
            .anonymous_client()
            .get(server.url(path))
            .bearer_auth("attacker-token")
            .timeout(Duration::from_secs(30))
            .send()
            .await
            .unwrap_or_else(|e| panic!("{path}: no answer: {e}"));
        let status = response.status();
        assert!(!status.is_server_error() || status == StatusCode::GATEWAY_TIMEOUT, "{path}: {status}");
        if !status.is_success() {
            let body = response.bytes().await.unwrap();
            assert_eq!(str_at(&parse_json(&body, path), "/kind"), "Status", "{path}");
        }
    }

    let metrics = server.metrics().await;
    let rejected: f64 =
        metrics.iter().filter(|(k, _)| k.starts_with("stowage_rejected_requests_total")).map(|(_, v)| v).sum();
    assert!(rejected >= throttled as f64, "/metrics counts {rejected} rejections, the attacker saw {throttled}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_download_that_stalls_is_cut_and_its_seat_freed() {
    let _turn = ONE_AT_A_TIME.lock().await;
    // The stall limit leaves a loaded machine seconds between the two requests below.
    let (_dir, server) = start(&["--stream-stall-timeout", "5s", "--max-content-streams-per-user", "1"]);
    upload_big(&server).await;
    let client = server.anonymous_client();
    let url = server.url(&bundle_content(NS, "big"));
    let stalled = client.get(&url).bearer_auth("attacker-token").send().await.unwrap();
    assert_eq!(stalled.status(), StatusCode::OK);
    // The attacker's one content seat is taken while the download is held. Asked on a connection
    // of its own: the cut of the stalled one must not take this answer with it.
    let second = server.anonymous_client().get(&url).bearer_auth("attacker-token").send().await.unwrap();
    let status = expect_status(second, 429, "TooManyRequests").await;
    assert_eq!(u64_at(&status, "/details/retryAfterSeconds"), 1);

    // Once the stall timeout (5 s) cuts it, its seat is free again.
    let again = eventually(Duration::from_secs(25), "the stalled download's seat is freed", || {
        let (client, url) = (client.clone(), url.clone());
        async move {
            let response = client.get(&url).bearer_auth("attacker-token").send().await.map_err(|e| e.to_string())?;
            match response.status() {
                StatusCode::OK => Ok(response),
                other => Err(format!("answered {other}")),
            }
        }
    })
    .await;
    // Freed because it was cut: what its client reads now ends in an error, short of the whole tar.
    let read = stalled.bytes().await;
    assert!(read.is_err(), "a stalled download was not cut (read {:?} bytes)", read.map(|b| b.len()));
    let body = again.bytes().await.unwrap();
    assert!(body.len() > 48 << 20);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_watch_whose_client_takes_nothing_is_cut_a_quiet_one_is_not() {
    use raw_client::{read_until_closed, RawTls};
    use tokio::io::AsyncWriteExt as _;
    let _turn = ONE_AT_A_TIME.lock().await;
    let (_dir, server) = start(&["--stream-stall-timeout", "2s"]);
    server.create_bundle("quiet", "first").await;
    // A watch with nothing to send, and one whose client sends its request and never reads.
    let mut quiet = server.client().get(server.url(&format!("{}?watch=1", bundles("quiet")))).send().await.unwrap();
    assert_eq!(quiet.status(), StatusCode::OK);
    let mut stalled = RawTls::new(&server).connect().await.unwrap();
    let request = format!("GET {}?watch=1 HTTP/1.1\r\nHost: localhost\r\n\r\n", bundles(NS));
    stalled.write_all(request.as_bytes()).await.unwrap();
    // 25 MB of events: more than the socket buffers and the watch's channel hold.
    let filler = "x".repeat(250_000);
    for i in 0..100 {
        let mut object = upload_bundle(NS, &format!("b{i}"));
        object["metadata"]["annotations"] = serde_json::json!({"filler": filler});
        let created = server.post_json(&bundles(NS), &object).await;
        assert_eq!(created.status(), StatusCode::CREATED);
    }
    // Not read from until the stall timeout (2 s) has cut it (reading would unstall it): until
    // only the quiet watch is open.
    eventually(Duration::from_secs(20), "the stalled watch cut", || async {
        let m = server.metrics().await;
        let open: f64 = m
            .iter()
            .filter(|(k, _)| k.starts_with("apiserver_longrunning_requests{") && k.contains(r#"verb="WATCH""#))
            .map(|(_, v)| v)
            .sum();
        if open == 1.0 {
            Ok(())
        } else {
            Err(format!("{open} watches open"))
        }
    })
    .await;
    let closed = read_until_closed(&mut stalled, Duration::from_secs(20)).await;
    assert!(closed.is_some(), "the watch whose client took nothing is still open");
    // The quiet watch outlived the stall timeout and still delivers.
    server.create_bundle("quiet", "second").await;
    let event = tokio::time::timeout(Duration::from_secs(10), async {
        let mut seen = Vec::new();
        while let Some(chunk) = quiet.chunk().await.unwrap() {
            seen.extend_from_slice(&chunk);
            if String::from_utf8_lossy(&seen).contains("\"second\"") {
                return seen;
            }
        }
        panic!("the quiet watch ended");
    })
    .await
    .expect("the quiet watch delivered no event");
    assert!(String::from_utf8_lossy(&event).contains("ADDED"));
}
