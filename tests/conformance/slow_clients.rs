//! Slow and malicious clients (issue 7): headers sent a byte at a time, bodies that trickle, huge
//! headers. Each attack is bounded by a timeout or a limit, and normal clients keep being served
//! while it runs. Thousands of idle connections are in `idle_connections.rs`.

use std::time::Duration;

use futures_util::future::join_all;
use futures_util::StreamExt as _;
use tokio::io::AsyncWriteExt;

use crate::harness::*;
use crate::raw_client::*;
use crate::tarutil::*;

/// Short limits, so that each attack ends within seconds.
pub const SHORT_LIMITS: &[&str] =
    &["--request-header-timeout", "2s", "--idle-connection-timeout", "3s", "--request-body-timeout", "2s"];
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a normal request may take while an attack runs (a loaded 2-core CI machine).
pub const BYSTANDER_BOUND: Duration = Duration::from_secs(3);

#[tokio::test(flavor = "multi_thread")]
async fn slowloris_headers_are_cut_by_the_header_timeout() {
    let server = Server::start_temp(SHORT_LIMITS);
    let raw = RawTls::new(&server);
    let probe = BystanderProbe::start(&server, "/readyz", Duration::from_millis(100));

    // 200 connections, each sending a request's headers one byte every 100 ms: 60 bytes take 6 s,
    // three times the header timeout.
    let head = b"GET /readyz HTTP/1.1\r\nHost: localhost\r\nX-Slow: aaaaaaaaaaaa\r\n\r\n";
    let attacks = (0..200).map(|_| async {
        let mut tls = raw.connect().await.expect("TLS connection");
        let started = std::time::Instant::now();
        let _ = trickle(&mut tls, head, 1, Duration::from_millis(100)).await;
        let (answer, _) = read_until_closed(&mut tls, Duration::from_secs(10)).await.expect("closed in the end");
        (started.elapsed(), answer)
    });
    let outcomes = join_all(attacks).await;

    let slowest = outcomes.iter().map(|(took, _)| *took).max().unwrap_or_default();
    report(&format!("slowloris: 200 connections closed, the last after {slowest:?}"));
    for (took, answer) in &outcomes {
        // Closed by the header timeout: writing fails from then on, and no request was served.
        assert!(*took < HEADER_TIMEOUT + Duration::from_secs(3), "a slowloris connection lasted {took:?}");
        assert_ne!(http1_status(answer), Some(200), "a request trickled past the header timeout was served");
    }
    probe.finish("slowloris", BYSTANDER_BOUND).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_trickling_upload_ends_with_408_and_stores_nothing() {
    let server = Server::start_temp(SHORT_LIMITS);
    server.create_bundle("slow", "app").await;
    let raw = RawTls::new(&server);
    let probe = BystanderProbe::start(&server, "/readyz", Duration::from_millis(100));

    let session = server.client().post(server.url(&format!("{}?uploads", bundle_content("slow", "app"))));
    let session = parse_json(&session.send().await.expect("start session").bytes().await.expect("body"), "session");
    let upload_id = str_at(&session, "/uploadID").to_owned();
    let single = format!("PUT {} HTTP/1.1\r\n", bundle_content("slow", "app"));
    let piece = format!("PATCH {}?upload={upload_id} HTTP/1.1\r\n", bundle_content("slow", "app"));

    // A whole-body PUT and a chunked-upload piece, each declaring 100 kB and sending 4 bytes every
    // 100 ms: far below the minimum rate.
    let trickles = [single, piece].map(|request_line| async {
        let mut tls = raw.connect().await.expect("TLS connection");
        let head = format!(
            "{request_line}Host: localhost\r\nContent-Type: application/x-tar\r\nContent-Length: 100000\r\n\r\n"
        );
        tls.write_all(head.as_bytes()).await.expect("send headers");
        tls.flush().await.expect("send headers");
        let started = std::time::Instant::now();
        let body = build_tar(&Tree::from([("a".to_string(), file(vec![b'a'; 99_000]))]));
        let sending = trickle(&mut tls, &body, 4, Duration::from_millis(100));
        let _ = tokio::time::timeout(Duration::from_secs(8), sending).await;
        let (answer, _) = read_until_closed(&mut tls, Duration::from_secs(5)).await.expect("closed in the end");
        (request_line, started.elapsed(), answer)
    });
    for (request_line, took, answer) in join_all(trickles).await {
        let text = String::from_utf8_lossy(&answer);
        report(&format!("trickled body {}: answered {:?} after {took:?}", request_line.trim(), http1_status(&answer)));
        assert_eq!(http1_status(&answer), Some(408), "{request_line}: {text}");
        assert!(text.contains(r#""reason":"Timeout""#), "{request_line}: 408 is a Status: {text}");
    }

    // Nothing stored: the Bundle never got content, no revision is left staging, the session has
    // no bytes.
    let bundle = server.get_json(&bundle("slow", "app")).await;
    assert!(bundle.pointer("/status/contentName").is_none(), "a trickled upload was committed: {bundle:#}");
    let metrics = server.metrics().await;
    assert_eq!(metrics.get(r#"stowage_revisions{state="staging"}"#), Some(&0.0), "a staging revision leaked");
    let offset = server.get(&format!("{}?upload={upload_id}", bundle_content("slow", "app"))).await;
    assert_eq!(header(offset.headers(), "upload-offset"), Some("0"), "the trickled piece was kept");
    probe.finish("trickled body", BYSTANDER_BOUND).await;
}

/// The minimum rate cuts trickles, not slow uploads: one that keeps delivering 16 KiB per
/// second for three times the body timeout succeeds.
#[tokio::test(flavor = "multi_thread")]
async fn a_slow_upload_that_keeps_progressing_is_not_cut() {
    let server = Server::start_temp(SHORT_LIMITS);
    server.create_bundle("slow", "steady").await;
    let data = random_bytes(7, 128 << 10);
    let tar = build_tar(&Tree::from([("data.bin".to_string(), file(data.clone()))]));
    let pieces: Vec<Result<Vec<u8>, std::io::Error>> = tar.chunks(16 << 10).map(|c| Ok(c.to_vec())).collect();
    let stream = futures_util::stream::iter(pieces).then(|piece| async {
        tokio::time::sleep(Duration::from_millis(900)).await;
        piece
    });
    let started = std::time::Instant::now();
    server.upload_ok("slow", "steady", reqwest::Body::wrap_stream(stream), None).await;
    let took = started.elapsed();
    report(&format!("steady slow upload of {} bytes took {took:?}", tar.len()));
    assert!(took > HEADER_TIMEOUT * 3, "the upload was not slow enough to test anything ({took:?})");
    let served = server.download(&with_path(&bundle_content("slow", "steady"), "data.bin")).await;
    assert!(served == data, "the slowly uploaded file differs");
}

#[tokio::test(flavor = "multi_thread")]
async fn huge_headers_are_refused_without_memory_growth() {
    let server = Server::start_temp(SHORT_LIMITS);
    let raw = RawTls::new(&server);
    let probe = BystanderProbe::start(&server, "/readyz", Duration::from_millis(100));
    let rss_before = rss_kib(server.pid());

    // 50 connections at once, each with one 1 MB header, and 50 with 5000 small header fields.
    let one_huge = format!("X-Huge: {}\r\n", "a".repeat(1 << 20));
    let thousands: String = (0..5000).map(|i| format!("X-Field-{i}: {i}\r\n")).collect();
    let attacks = (0..100).map(|i| {
        let headers = if i % 2 == 0 { &one_huge } else { &thousands };
        let raw = &raw;
        async move {
            let mut tls = raw.connect().await.expect("TLS connection");
            let request = format!("GET /readyz HTTP/1.1\r\nHost: localhost\r\n{headers}\r\n");
            // The server may close before everything is written.
            let _ = tls.write_all(request.as_bytes()).await;
            let _ = tls.flush().await;
            let (answer, _) = read_until_closed(&mut tls, Duration::from_secs(10)).await.expect("closed");
            http1_status(&answer)
        }
    });
    let statuses = join_all(attacks).await;
    for status in &statuses {
        assert!(matches!(status, None | Some(431)), "huge headers answered {status:?}");
    }
    let answered = statuses.iter().filter(|s| **s == Some(431)).count();

    // HTTP/2: a 1 MB header list is refused too (431 or a reset stream), never served.
    let h2 = server.second_client();
    let refused = h2.get(server.url("/readyz")).header("x-huge", "a".repeat(1 << 20)).send().await;
    if let Ok(resp) = &refused {
        assert_eq!(resp.status(), 431, "HTTP/2 huge header list");
    }
    let rss_after = rss_kib(server.pid());
    report(&format!(
        "huge headers: {answered}/100 HTTP/1 answered 431 (others closed), HTTP/2 {:?}; RSS {rss_before} -> {rss_after} KiB",
        refused.as_ref().map(|r| r.status())
    ));
    // 100 MB of headers were sent; keeping even a tenth would show.
    assert!(rss_after < rss_before + 32 * 1024, "RSS grew from {rss_before} to {rss_after} KiB");
    probe.finish("huge headers", BYSTANDER_BOUND).await;
}
