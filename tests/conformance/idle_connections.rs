//! Thousands of idle connections (issue 7): TCP connections that never send, TLS connections that
//! never make a request, keep-alive connections left idle after one. The server keeps serving
//! others, closes every idle one after its timeout, holds bounded memory meanwhile, and refuses
//! connections past `--max-connections` at once instead of piling them up.

use std::time::{Duration, Instant};

use futures_util::future::join_all;
use futures_util::StreamExt as _;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::harness::*;
use crate::raw_client::*;
use crate::slow_clients::BYSTANDER_BOUND;

/// Opens `count` connections with `open`, at most 64 at a time.
async fn open_many<T, F, Fut>(count: usize, open: F) -> Vec<T>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = T>,
{
    futures_util::stream::iter(0..count).map(|_| open()).buffer_unordered(64).collect().await
}

#[tokio::test(flavor = "multi_thread")]
async fn thousands_of_idle_connections_are_closed_while_others_are_served() {
    let files = raise_open_file_limit();
    assert!(files > 4000, "the open-file limit ({files}) is too low for this test");
    let header_timeout = Duration::from_secs(10);
    let idle_timeout = Duration::from_secs(5);
    let server = Server::start_temp(&["--request-header-timeout", "10s", "--idle-connection-timeout", "5s"]);
    let raw = RawTls::new(&server);
    let pid = server.pid();
    let (sockets_before, rss_before) = (open_sockets(pid), rss_kib(pid));
    let probe = BystanderProbe::start(&server, "/readyz", Duration::from_millis(100));

    let started = Instant::now();
    let tcp = open_many(1500, || async { TcpStream::connect(raw.addr).await.expect("TCP connect") }).await;
    let silent_tls = open_many(1000, || async { raw.connect().await.expect("TLS connection") }).await;
    let kept_alive = open_many(500, || async {
        let mut tls = raw.connect().await.expect("TLS connection");
        tls.write_all(b"GET /readyz HTTP/1.1\r\nHost: localhost\r\n\r\n").await.expect("send request");
        tls.flush().await.expect("send request");
        let mut first = [0u8; 12];
        tokio::io::AsyncReadExt::read_exact(&mut tls, &mut first).await.expect("read the response");
        assert_eq!(http1_status(&first), Some(200));
        tls
    })
    .await;
    let opened_in = started.elapsed();
    let (sockets_held, rss_held) = (open_sockets(pid), rss_kib(pid));
    report(&format!(
        "idle connections: 3000 opened in {opened_in:?}; server sockets {sockets_before} -> {sockets_held}, \
         RSS {rss_before} -> {rss_held} KiB"
    ));
    // Nothing was refused while it held thousands of connections, and it held them in bounded memory:
    // at most 64 KiB each (TLS and HTTP buffers), most far less.
    assert!(sockets_held >= sockets_before + 2500, "the server held only {sockets_held} sockets");
    assert!(rss_held < rss_before + 3000 * 64, "RSS grew from {rss_before} to {rss_held} KiB");

    // Every one of them is closed by the server: never-TLS at the handshake timeout, never-a-request
    // at the header timeout, kept-alive ones at the idle timeout (all counted from when they opened).
    let limit = header_timeout + opened_in + Duration::from_secs(10);
    let closing = tcp
        .into_iter()
        .map(|mut s| tokio::spawn(async move { read_until_closed(&mut s, limit).await.map(|(_, t)| t) }))
        .chain(
            silent_tls
                .into_iter()
                .map(|mut s| tokio::spawn(async move { read_until_closed(&mut s, limit).await.map(|(_, t)| t) })),
        )
        .chain(
            kept_alive
                .into_iter()
                .map(|mut s| tokio::spawn(async move { read_until_closed(&mut s, limit).await.map(|(_, t)| t) })),
        );
    let closed: Vec<Option<Duration>> = join_all(closing).await.into_iter().map(|r| r.expect("task")).collect();
    let still_open = closed.iter().filter(|c| c.is_none()).count();
    assert_eq!(still_open, 0, "{still_open} idle connections were still open after {limit:?}");
    let kept_alive_closed = closed[2500..].iter().flatten().max().copied().unwrap_or_default();
    assert!(
        kept_alive_closed < idle_timeout + Duration::from_secs(5),
        "an idle keep-alive connection lasted {kept_alive_closed:?} (idle timeout {idle_timeout:?})"
    );
    let sockets_after = open_sockets(pid);
    report(&format!(
        "idle connections: all closed {:?} after opening; server sockets now {sockets_after}, RSS {} KiB",
        started.elapsed() - opened_in,
        rss_kib(pid)
    ));
    assert!(sockets_after < sockets_before + 20, "the server still holds {sockets_after} sockets");
    probe.finish("idle connections", BYSTANDER_BOUND).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn connections_past_the_limit_are_closed_at_once() {
    let server = Server::start_temp(&["--max-connections", "64", "--request-header-timeout", "3s"]);
    let raw = RawTls::new(&server);
    let held = open_many(64, || async { raw.connect().await.expect("TLS connection") }).await;

    // The 65th is closed before TLS, at once, rather than left waiting behind the others.
    let started = Instant::now();
    let refused = tokio::time::timeout(Duration::from_secs(5), fresh_connection_get(&raw, "/readyz")).await;
    let took = started.elapsed();
    assert!(matches!(refused, Ok(Err(_)) | Ok(Ok(None))), "a connection past the limit was served: {refused:?}");
    assert!(took < Duration::from_secs(1), "refusing took {took:?}");

    // Once the held connections time out (no request within the header timeout), clients are
    // served again.
    let served = eventually(Duration::from_secs(10), "a client is served after the idle ones closed", || async {
        match fresh_connection_get(&raw, "/readyz").await {
            Ok(Some(200)) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });
    served.await;
    report(&format!("connection limit: the 65th connection was refused in {took:?}"));
    drop(held);
}

/// Idle and header timeouts never cut a watch, however long it goes without events, on HTTP/1.1 or
/// HTTP/2.
#[tokio::test(flavor = "multi_thread")]
async fn a_quiet_watch_outlives_the_idle_and_header_timeouts() {
    let server = Server::start_temp(crate::slow_clients::SHORT_LIMITS);
    let url = server.url(&format!("{}?watch=true&resourceVersion=0", bundles("quiet")));
    let mut streams = Vec::new();
    for client in [server.http1_client(), server.second_client()] {
        let response = client.get(&url).send().await.expect("start the watch");
        assert_eq!(response.status(), 200);
        streams.push((response.version(), response.bytes_stream()));
    }
    let streams_versions: Vec<_> = streams.iter().map(|(version, _)| *version).collect();
    // Three idle timeouts (--idle-connection-timeout 3s) without a single event: neither watch
    // ends (a cut would show at once) nor sends anything.
    let next = futures_util::future::select_all(streams.iter_mut().map(|(_, stream)| stream.next()));
    if let Ok((item, i, _)) = tokio::time::timeout(Duration::from_secs(9), next).await {
        panic!("the {:?} watch did not stay quiet and open: {item:?}", streams_versions[i]);
    }
    server.create_bundle("quiet", "late").await;
    for (version, stream) in &mut streams {
        let event = tokio::time::timeout(Duration::from_secs(10), stream.next()).await;
        let Ok(Some(Ok(bytes))) = event else { panic!("the {version:?} watch was cut: {event:?}") };
        let text = String::from_utf8_lossy(&bytes);
        assert!(text.contains(r#""type":"ADDED""#) && text.contains("late"), "{version:?}: {text}");
    }
}
