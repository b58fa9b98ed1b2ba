//! The http source against a real nginx: tar / tar.gz / tar.zst of corpus bundles, sha256 pins,
//! basic and bearer auth, conditional re-checks, plain-http policy and a malicious archive. Calls
//! `stowage::unpack::http::{resolve, fetch}` directly with a recording sink.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use stowage::unpack::error::UnpackError;
use stowage::unpack::http;
use stowage::unpack::source::HttpSource;
use stowage::unpack::{Credentials, ResolvedSource, SourceContext};

use crate::harness::{corpus, eventually_every, sha256_hex};
use crate::http_server::{HttpAuth, HttpServer};
use crate::source_git::{context, RecordingSink};
use crate::tarutil::{assert_trees_equal, gzip, raw_entry, raw_tar, system_tar, tree_from_dir, zstd, Tree};

fn spec(url: &str, sha256: &str) -> HttpSource {
    HttpSource { url: url.to_owned(), sha256: sha256.to_owned(), ..Default::default() }
}

async fn fetch(
    spec: &HttpSource,
    ctx: &SourceContext,
    pinned: &ResolvedSource,
) -> Result<(ResolvedSource, Tree), UnpackError> {
    let (spec, ctx, pinned) = (spec.clone(), ctx.clone(), pinned.clone());
    tokio::task::spawn_blocking(move || {
        let mut sink = RecordingSink::default();
        http::fetch(&spec, &ctx, &pinned, &mut sink).map(|r| (r, sink.tree))
    })
    .await
    .unwrap()
}

fn sha_of(r: &ResolvedSource) -> &str {
    match r {
        ResolvedSource::Http { sha256, .. } => sha256,
        other => panic!("not an http identity: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_tar_gzip_and_zstd_of_a_corpus_bundle() {
    let server = HttpServer::start(HttpAuth::None);
    let dir = corpus().join("operator-registry/prometheus");
    let tar = system_tar(&dir);
    let expected = tree_from_dir(&dir);
    let ctx = context(&[server.host_port()], None);
    for (name, body) in [("b.tar", tar.clone()), ("b.tar.gz", gzip(&tar)), ("b.tar.zst", zstd(&tar))] {
        server.put(name, &body);
        let s = spec(&server.url(name), "");
        let resolved = http::resolve(&s, &ctx, None).await.unwrap();
        let ResolvedSource::Http { sha256, etag, last_modified, .. } = &resolved else { panic!("{resolved:?}") };
        assert!(sha256.is_empty() && !etag.is_empty() && !last_modified.is_empty(), "{resolved:?}");
        let (pinned, tree) = fetch(&s, &ctx, &resolved).await.unwrap();
        assert_eq!(sha_of(&pinned), sha256_hex(&body), "{name}: sha256 of the downloaded file");
        let mut want = resolved.clone();
        if let ResolvedSource::Http { sha256, .. } = &mut want {
            *sha256 = sha256_hex(&body);
        }
        assert_eq!(pinned, want, "{name}: the GET's validators");
        assert_trees_equal(&expected, &tree, name);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_sha256_pins_the_content() {
    let server = HttpServer::start(HttpAuth::None);
    let dir = corpus().join("operator-registry/etcd");
    let body = gzip(&system_tar(&dir));
    server.put("etcd.tgz", &body);
    let ctx = context(&[server.host_port()], None);
    let right = spec(&server.url("etcd.tgz"), &sha256_hex(&body).to_uppercase());

    let resolved = http::resolve(&right, &ctx, None).await.unwrap();
    assert_eq!(sha_of(&resolved), sha256_hex(&body), "pinned: no network needed, normalised hex");
    let (pinned, tree) = fetch(&right, &ctx, &resolved).await.unwrap();
    assert_eq!(sha_of(&pinned), sha256_hex(&body));
    assert_trees_equal(&tree_from_dir(&dir), &tree, "pinned fetch");
    assert_eq!(http::resolve(&right, &ctx, Some(&pinned)).await.unwrap(), pinned, "unchanged pin = previous");

    let wrong = spec(&server.url("etcd.tgz"), &"0".repeat(64));
    let resolved = http::resolve(&wrong, &ctx, None).await.unwrap();
    let err = fetch(&wrong, &ctx, &resolved).await.unwrap_err();
    match err {
        UnpackError::DigestMismatch { expected, actual, .. } => {
            assert_eq!(expected, "0".repeat(64));
            assert_eq!(actual, sha256_hex(&body));
        }
        other => panic!("expected a digest mismatch, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_pinned_sha256_resolves_without_the_server() {
    let server = HttpServer::start(HttpAuth::None);
    let (url, host) = (server.url("gone.tar"), server.host_port());
    drop(server);
    let s = spec(&url, &"ab".repeat(32));
    let resolved = http::resolve(&s, &context(&[host], None), None).await.unwrap();
    assert_eq!(sha_of(&resolved), "ab".repeat(32));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_basic_auth() {
    let server = HttpServer::start(HttpAuth::Basic { user: "bob".into(), pass: "hunter2-pw".into() });
    let body = system_tar(&corpus().join("operator-registry/aqua"));
    server.put("a.tar", &body);
    let s = spec(&server.url("a.tar"), "");

    let err = http::resolve(&s, &context(&[server.host_port()], None), None).await.unwrap_err();
    assert!(
        matches!(err, UnpackError::Denied(ref m) if m.contains("401") && m.contains(&server.url("a.tar"))),
        "{err:?}"
    );
    let wrong = Credentials::Basic { username: "bob".into(), password: "nope-pw".into() };
    let ctx = context(&[server.host_port()], Some(wrong));
    let pinned = ResolvedSource::http(&s.url, String::new(), String::new(), String::new());
    let err = fetch(&s, &ctx, &pinned).await.unwrap_err();
    assert!(matches!(err, UnpackError::Denied(_)) && !err.to_string().contains("nope-pw"), "{err:?}");

    let right = Credentials::Basic { username: "bob".into(), password: "hunter2-pw".into() };
    let ctx = context(&[server.host_port()], Some(right));
    let resolved = http::resolve(&s, &ctx, None).await.unwrap();
    let (pinned, _) = fetch(&s, &ctx, &resolved).await.unwrap();
    assert_eq!(sha_of(&pinned), sha256_hex(&body));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_bearer_auth() {
    let server = HttpServer::start(HttpAuth::Bearer("tok-123".into()));
    let body = system_tar(&corpus().join("operator-registry/aqua"));
    server.put("a.tar", &body);
    let s = spec(&server.url("a.tar"), "");
    let err = http::resolve(&s, &context(&[server.host_port()], None), None).await.unwrap_err();
    assert!(matches!(err, UnpackError::Denied(_)), "{err:?}");
    let ctx = context(&[server.host_port()], Some(Credentials::Bearer("tok-123".into())));
    let resolved = http::resolve(&s, &ctx, None).await.unwrap();
    let (pinned, _) = fetch(&s, &ctx, &resolved).await.unwrap();
    assert_eq!(sha_of(&pinned), sha256_hex(&body));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_conditional_recheck() {
    let server = HttpServer::start(HttpAuth::None);
    let first = system_tar(&corpus().join("operator-registry/aqua"));
    server.put("b.tar", &first);
    let ctx = context(&[server.host_port()], None);
    let s = spec(&server.url("b.tar"), "");
    let resolved = http::resolve(&s, &ctx, None).await.unwrap();
    let (fetched, _) = fetch(&s, &ctx, &resolved).await.unwrap();
    assert_eq!(http::resolve(&s, &ctx, Some(&fetched)).await.unwrap(), fetched, "unchanged: equal to previous");

    // Replaced by a different file (different size, so nginx's ETag differs even within a second).
    let second = system_tar(&corpus().join("operator-registry/etcd"));
    assert_ne!(first.len(), second.len());
    server.put("b.tar", &second);
    let again = http::resolve(&s, &ctx, Some(&fetched)).await.unwrap();
    assert_ne!(again, fetched, "a replaced file is a change");
    let (refetched, _) = fetch(&s, &ctx, &again).await.unwrap();
    assert_eq!(sha_of(&refetched), sha256_hex(&second));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_plain_http_needs_the_insecure_host_flag() {
    let server = HttpServer::start(HttpAuth::None);
    server.put("b.tar", &system_tar(&corpus().join("operator-registry/aqua")));
    let s = spec(&server.url("b.tar"), "");
    let ctx = context(&[], None);
    let err = http::resolve(&s, &ctx, None).await.unwrap_err();
    let flag = format!("--insecure-source-host {}", server.host_port());
    assert!(matches!(err, UnpackError::Unsupported(ref m) if m.contains(&flag)), "{err:?}");
    let pinned = ResolvedSource::http(&s.url, String::new(), String::new(), String::new());
    let err = fetch(&s, &ctx, &pinned).await.unwrap_err();
    assert!(matches!(err, UnpackError::Unsupported(_)), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_limits_and_cancellation() {
    let server = HttpServer::start(HttpAuth::None);
    server.put("b.tar.zst", &zstd(&system_tar(&corpus().join("operator-registry/prometheus"))));
    let s = spec(&server.url("b.tar.zst"), "");
    let pinned = ResolvedSource::http(&s.url, String::new(), String::new(), String::new());
    let mut ctx = context(&[server.host_port()], None);
    ctx.limits.max_total_bytes = 64 * 1024;
    let err = fetch(&s, &ctx, &pinned).await.unwrap_err();
    assert!(matches!(err, UnpackError::TooLarge(_)), "{err:?}");

    let ctx = context(&[server.host_port()], None);
    ctx.cancel.cancel();
    let err = fetch(&s, &ctx, &pinned).await.unwrap_err();
    assert!(matches!(err, UnpackError::Cancelled), "{err:?}");
    let err = http::resolve(&s, &ctx, None).await.unwrap_err();
    assert!(matches!(err, UnpackError::Cancelled), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_traversal_tarball_is_refused() {
    let server = HttpServer::start(HttpAuth::None);
    let evil = raw_tar(&[raw_entry("ok.txt", b'0', b"fine", ""), raw_entry("../../etc/evil", b'0', b"x", "")]);
    server.put("evil.tar.gz", &gzip(&evil));
    let ctx = context(&[server.host_port()], None);
    let s = spec(&server.url("evil.tar.gz"), "");
    let resolved = http::resolve(&s, &ctx, None).await.unwrap();
    let err = fetch(&s, &ctx, &resolved).await.unwrap_err();
    assert!(matches!(err, UnpackError::InvalidEntry { .. }), "{err:?}");

    let err = fetch(&spec(&server.url("not-there.tar"), ""), &ctx, &resolved).await.unwrap_err();
    assert!(matches!(err, UnpackError::NotFound(ref m) if m.contains("404")), "{err:?}");
}

/// A server that sends the first bytes of a file and then nothing: cancelling the unpack (a spec
/// change, the Bundle deleted, shutdown) ends the download at once, not when the server gives up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_download_ends_as_soon_as_it_is_cancelled() {
    let entry = raw_entry("big.yaml", b'0', &vec![b'x'; 200_000], "");
    let stalled = Arc::new(AtomicBool::new(false));
    let said = stalled.clone();
    let host = crate::hostile_http::serve(move |_request, stream| {
        use std::io::Write;
        let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", entry.len());
        let _ = stream.write_all(head.as_bytes()).and_then(|()| stream.write_all(&entry[..4096]));
        let _ = stream.flush();
        said.store(true, Ordering::SeqCst);
        // The stall: nothing more is sent, the connection stays open until the client hangs up.
        let _ = std::io::copy(stream, &mut std::io::sink());
    });
    let s = spec(&format!("http://{host}/big.tar"), "");
    let pinned = ResolvedSource::http(&s.url, String::new(), String::new(), String::new());
    let ctx = context(std::slice::from_ref(&host), None);
    let fetching = tokio::spawn({
        let ctx = ctx.clone();
        async move { fetch(&s, &ctx, &pinned).await }
    });
    eventually_every(Duration::from_secs(10), Duration::from_millis(20), "the first bytes were sent", || async {
        match stalled.load(Ordering::SeqCst) {
            true => Ok(()),
            false => Err("nothing sent yet".to_owned()),
        }
    })
    .await;
    assert!(!fetching.is_finished(), "the download waits for the server");
    let cancelled = Instant::now();
    ctx.cancel.cancel();
    let result = tokio::time::timeout(Duration::from_secs(10), fetching).await.expect("ends once cancelled").unwrap();
    assert!(matches!(result, Err(UnpackError::Cancelled)), "{result:?}");
    assert!(cancelled.elapsed() < Duration::from_secs(2), "ended {:?} after the cancel", cancelled.elapsed());
}
