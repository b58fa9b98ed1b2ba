//! HTTP/2 abuse (issue 7): a client that opens streams and resets them at once, as fast as it can
//! (the "rapid reset" attack). The server bounds the work (h2 ends such a connection with GOAWAY
//! once too many streams were reset before it accepted them; stowage cuts one whose requests are
//! abandoned, before or right after their answer) and keeps serving others. And the flow-control
//! window: what a client may send before the server reads it.

use std::time::Duration;

use crate::harness::*;
use crate::raw_client::*;
use crate::slow_clients::{BYSTANDER_BOUND, SHORT_LIMITS};

/// More than the socket buffers hold (a HEADERS and a RST_STREAM frame are ~60 bytes), so a client
/// cannot queue them all while a busy server has not read a frame yet.
const STREAMS: usize = 200_000;

#[tokio::test(flavor = "multi_thread")]
async fn rapid_reset_is_bounded_and_others_are_served() {
    let server = Server::start_temp(SHORT_LIMITS);
    let raw = RawTls::with_alpn(&server, b"h2");
    let probe = BystanderProbe::start(&server, "/readyz", Duration::from_millis(100));
    let rss_before = rss_kib(server.pid());

    let tls = raw.connect().await.expect("TLS connection");
    let (mut client, connection) = h2::client::handshake(tls).await.expect("HTTP/2 handshake");
    let driver = tokio::spawn(connection);
    // A watch: a request that would run until the client goes away, so each one left unreset would
    // cost the server a stream and a task.
    let uri = format!("https://localhost{}?watch=true", bundles("reset"));
    let mut sent = 0;
    for _ in 0..STREAMS {
        let ready = match tokio::time::timeout(Duration::from_secs(5), client.clone().ready()).await {
            Ok(Ok(ready)) => ready,
            _ => break,
        };
        client = ready;
        let request = http::Request::get(&uri).body(()).expect("request");
        let Ok((_response, mut stream)) = client.send_request(request, true) else { break };
        stream.send_reset(h2::Reason::CANCEL);
        sent += 1;
    }
    drop(client);
    let ended = tokio::time::timeout(Duration::from_secs(10), driver).await;
    let rss_after = rss_kib(server.pid());
    report(&format!(
        "rapid reset: {sent} streams opened and reset; connection ended with {ended:?}; RSS {rss_before} -> {rss_after} KiB"
    ));
    assert!(sent < STREAMS, "the server let one connection open and reset {sent} streams");
    assert!(ended.is_ok(), "the attacking connection was still open 10 s after the attack");
    assert!(rss_after < rss_before + 32 * 1024, "RSS grew from {rss_before} to {rss_after} KiB");
    probe.finish("rapid reset", BYSTANDER_BOUND).await;
}

/// An HTTP/2 client may have 4 MiB of a body in flight before the server reads it (the window
/// curl's uploads need not to wait on window updates), and no more: what one connection can make
/// the server hold unread is bounded.
#[tokio::test(flavor = "multi_thread")]
async fn an_http2_body_has_4_mib_in_flight_and_no_more() {
    let server = Server::start_temp(&[]);
    let raw = RawTls::with_alpn(&server, b"h2");
    let tls = raw.connect().await.expect("TLS connection");
    // h2 lets a stream claim no more than its send buffer (400 KiB unless told).
    let handshake = h2::client::Builder::new().max_send_buffer_size(16 << 20).handshake::<_, bytes::Bytes>(tls);
    let (client, connection) = handshake.await.expect("HTTP/2 handshake");
    tokio::spawn(connection);
    let mut client = client.ready().await.expect("ready");
    // A create: the server reads its body before answering, so the stream stays open.
    let request = http::Request::post(format!("https://localhost{}", bundles("window")))
        .header("content-type", "application/json")
        .body(())
        .expect("request");
    let (_response, mut body) = client.send_request(request, false).expect("send");
    body.reserve_capacity(16 << 20);
    let mut capacity = 0;
    // The capacity grows as the server's SETTINGS and connection WINDOW_UPDATE arrive.
    while let Ok(Some(Ok(now))) =
        tokio::time::timeout(Duration::from_secs(2), std::future::poll_fn(|cx| body.poll_capacity(cx))).await
    {
        capacity = now;
    }
    report(&format!("HTTP/2: {capacity} bytes of a body may be sent before the server reads"));
    assert_eq!(capacity, 4 << 20, "the body's window");
}
