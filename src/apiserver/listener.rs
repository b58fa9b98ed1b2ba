//! The TLS accept loop: terminates TLS, attaches what the client certificate proves
//! ([`PeerCertificate`]) to every request, and serves the axum router over HTTP/1.1 or HTTP/2 until
//! shutdown.
//!
//! axum's own `serve` cannot do this, since it neither terminates TLS nor exposes the peer
//! certificate. Connections end with a bounded lingering close ([`lingering`]), so an early
//! refusal reaches a client still sending its body. Nothing on the per-connection path may panic
//! or end the loop: a misbehaving client costs one connection, never the server.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt as _;

use self::lingering::Lingering;
use super::connection_activity::ConnectionActivity;
use super::stall::{Abandons, ConnectionCut};
use crate::auth::tls::TlsSetup;
use crate::auth::trust::ClientTrust;

pub(crate) mod lingering;

/// Bounds how long a client may hold a socket without completing TLS (slowloris on the handshake);
/// never longer than the request-header timeout.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long open connections may keep running after shutdown begins.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// Pause after a failed accept; errors like EMFILE persist until connections close, and retrying at
/// once would spin.
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(100);
/// Largest request head (request line and headers) on HTTP/1 and header list on HTTP/2; 431
/// beyond. Generous for bearer tokens and front-proxy headers, small enough that thousands of
/// connections cannot make the server hold much. On HTTP/1 it is the read buffer's ceiling (hyper's
/// default is ~400 KiB per connection), which bounds the head; bodies stream through it.
const MAX_HEADER_BYTES: usize = 64 << 10;
/// HTTP/2 pings on a connection that has been quiet this long; a peer that does not answer within
/// [`HTTP2_PING_TIMEOUT`] is gone, and its streams (watches) end instead of lingering.
const HTTP2_PING_INTERVAL: Duration = Duration::from_secs(30);
const HTTP2_PING_TIMEOUT: Duration = Duration::from_secs(20);
/// HTTP/2 flow-control windows, per stream and per connection: the most body bytes a client may
/// send before the server reads them (the same 4 MiB an upload reads ahead).
const HTTP2_WINDOW_BYTES: u32 = 4 << 20;
/// How often a refused connection is logged at most.
const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// What the listener allows each client; `stowage serve` flags set them.
#[derive(Clone, Debug)]
pub struct ListenerLimits {
    /// Open connections at most; a connection past it is closed as soon as it is accepted, before
    /// any TLS work.
    pub max_connections: usize,
    /// How long a new connection may take to send its first request's headers once TLS is done (the
    /// handshake itself gets at most 10 s), and an HTTP/1 request its headers (hyper starts that clock as soon as the previous response is
    /// sent, so it also ends idle HTTP/1 keep-alive connections).
    pub request_header_timeout: Duration,
    /// How long a connection may stay open with no request in flight. A watch or a download is in
    /// flight until its response ends, so it is never cut for idleness (a stalled client is cut
    /// through [`ConnectionCut`]).
    pub idle_timeout: Duration,
    /// Concurrent streams on one HTTP/2 connection (kube-apiserver's
    /// `--http2-max-streams-per-connection`); more are refused by the protocol and clients queue.
    pub http2_max_streams: u32,
}

impl Default for ListenerLimits {
    fn default() -> Self {
        ListenerLimits {
            max_connections: 10_000,
            request_header_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(90),
            http2_max_streams: 1000,
        }
    }
}

/// Serves `app` over TLS on `listener` until `shutdown` resolves, then stops accepting and lets open
/// connections finish (bounded by a grace period, e.g. 10 s).
pub async fn serve_tls(
    listener: TcpListener,
    tls: TlsSetup,
    app: axum::Router,
    limits: ListenerLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let acceptor = TlsAcceptor::from(tls.config);
    let trust = tls.trust;
    let builder = Arc::new(protocol_builder(&limits));
    let limits = Arc::new(limits);
    let open_connections = Arc::new(Semaphore::new(limits.max_connections));
    let mut last_refusal_logged: Option<Instant> = None;

    // Every connection task holds a receiver: the value flipping to `true` asks it to wind down,
    // and the sender's `closed()` resolves once the last task has dropped its receiver.
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    tokio::pin!(shutdown);

    loop {
        let (stream, peer) = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(err) => {
                    tracing::warn!(error = %err, "accepting a connection failed; retrying");
                    tokio::time::sleep(ACCEPT_ERROR_BACKOFF).await;
                    continue;
                }
            },
        };
        // Refusing by closing at once costs a socket for a moment; leaving the connection in the
        // backlog would let handshakes pile up behind the ones holding the limit.
        let Ok(permit) = open_connections.clone().try_acquire_owned() else {
            drop(stream);
            if last_refusal_logged.is_none_or(|at| at.elapsed() >= REFUSAL_LOG_INTERVAL) {
                last_refusal_logged = Some(Instant::now());
                tracing::warn!(%peer, max = limits.max_connections, "connection limit reached; closing new connections");
            }
            continue;
        };
        let connection = Connection {
            acceptor: acceptor.clone(),
            trust: trust.clone(),
            builder: builder.clone(),
            limits: limits.clone(),
            _permit: permit,
        };
        tokio::spawn(serve_connection(stream, connection, app.clone(), shutdown_rx.clone()));
        tracing::trace!(%peer, "accepted connection");
    }

    drop(listener);
    drop(shutdown_rx);
    let _ = shutdown_tx.send(true);
    if tokio::time::timeout(SHUTDOWN_GRACE, shutdown_tx.closed()).await.is_err() {
        tracing::info!(
            open = shutdown_tx.receiver_count(),
            "shutdown grace period elapsed; abandoning open connections"
        );
    }
    Ok(())
}

/// The body bytes a response declares (none for a HEAD, 204 or 304 answer), if it declares them.
fn owed_bytes<B>(head: bool, response: &http::Response<B>) -> Option<u64> {
    let status = response.status();
    if head || status == http::StatusCode::NO_CONTENT || status == http::StatusCode::NOT_MODIFIED {
        return Some(0);
    }
    response.headers().get(http::header::CONTENT_LENGTH)?.to_str().ok()?.parse().ok()
}

/// HTTP/1.1 and HTTP/2 with the header, buffer and stream limits.
fn protocol_builder(limits: &ListenerLimits) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.request_header_timeout)
        .max_buf_size(MAX_HEADER_BYTES)
        // A response's head and body in one buffer: one TLS record and one write for a small
        // answer instead of two records (rustls encrypts each slice of a vectored write apart).
        .writev(false);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(MAX_HEADER_BYTES as u32)
        .max_concurrent_streams(limits.http2_max_streams)
        .keep_alive_interval(HTTP2_PING_INTERVAL)
        .keep_alive_timeout(HTTP2_PING_TIMEOUT)
        // With hyper's 1 MiB windows, curl uploading over HTTP/2 waited for a window update every
        // 512 KiB and spent a third more CPU per GiB.
        .initial_stream_window_size(HTTP2_WINDOW_BYTES)
        .initial_connection_window_size(HTTP2_WINDOW_BYTES);
    builder
}

/// What every connection shares, and the connection's place under the limit.
struct Connection {
    acceptor: TlsAcceptor,
    trust: Arc<ClientTrust>,
    builder: Arc<auto::Builder<TokioExecutor>>,
    limits: Arc<ListenerLimits>,
    _permit: OwnedSemaphorePermit,
}

/// Handshakes, identifies the peer and serves one connection; every outcome is logged, never raised.
async fn serve_connection(
    stream: TcpStream,
    connection: Connection,
    app: axum::Router,
    mut shutdown: watch::Receiver<bool>,
) {
    let Connection { acceptor, trust, builder, limits, _permit } = connection;
    let peer = stream.peer_addr().ok();
    // Small request/response exchanges (kubectl, watches) suffer badly from Nagle's delay.
    let _ = stream.set_nodelay(true);

    let handshake_timeout = HANDSHAKE_TIMEOUT.min(limits.request_header_timeout);
    let handshake = tokio::time::timeout(handshake_timeout, acceptor.accept(stream));
    let tls = tokio::select! {
        result = handshake => match result {
            Ok(Ok(tls)) => tls,
            Ok(Err(err)) => {
                tracing::debug!(?peer, error = %err, "TLS handshake failed");
                return;
            }
            Err(_) => {
                tracing::debug!(?peer, "TLS handshake timed out");
                return;
            }
        },
        // A half-open handshake is not worth delaying shutdown for.
        _ = shutdown.changed() => return,
    };

    // rustls only exposes peer certificates that the client verifier accepted; `classify` says
    // which anchor vouched for it, and so what it proves.
    let peer_certificate = tls.get_ref().1.peer_certificates().map(|chain| trust.classify(chain)).unwrap_or_default();

    let activity = ConnectionActivity::new();
    // A download whose client stopped taking bytes closes the connection through this.
    let cut = ConnectionCut::default();
    let abandons = Abandons::new(cut.clone());
    let service = {
        let activity = activity.clone();
        let cut = cut.clone();
        tower::service_fn(move |mut request: http::Request<Incoming>| {
            let in_flight = activity.begin();
            let answering = abandons.begin();
            request.extensions_mut().insert(peer_certificate.clone());
            request.extensions_mut().insert(cut.clone());
            // Only for the access line, and only while it is written.
            if let Some(peer) = peer.filter(|_| super::access_log::enabled()) {
                request.extensions_mut().insert(super::access_log::RemoteAddr(peer));
            }
            let app = app.clone();
            let head = request.method() == http::Method::HEAD;
            async move {
                let response = app.oneshot(request).await?;
                let owed = owed_bytes(head, &response);
                // A stream reset before this point abandoned the request (its handler was dropped),
                // and so did one whose answer is dropped unfinished right away (stall.rs).
                // The request stays in flight until its body is sent or dropped.
                Ok::<_, Infallible>(response.map(|body| {
                    let body = Body::new(body.map_frame(move |frame| {
                        let _in_flight = &in_flight;
                        frame
                    }));
                    Body::new(answering.answered(body, owed))
                }))
            }
        })
    };
    // Closing lingers (see [`lingering`]): an early answer (404, 413, 401) to a request whose
    // body was not read reaches the client instead of being lost to a TCP reset.
    let io = TokioIo::new(Lingering::new(tls));
    let conn = builder.serve_connection_with_upgrades(io, TowerToHyperService::new(service));
    tokio::pin!(conn);

    // The first request gets the whole header timeout after the handshake, not what is left of it:
    // a server slowed by a burst of handshakes must not count its own delay against the client.
    let result = tokio::select! {
        result = conn.as_mut() => result,
        () = cut.0.cancelled() => {
            tracing::debug!(?peer, "closing a connection whose download stalled");
            Ok(())
        }
        () = activity.idle_for(limits.request_header_timeout, limits.idle_timeout) => {
            tracing::debug!(?peer, "closing an idle connection");
            // Closes at once on HTTP/1; GOAWAY on HTTP/2, so a request racing it is not lost. A
            // peer that then sends nothing more is cut after one more header timeout.
            conn.as_mut().graceful_shutdown();
            tokio::select! {
                result = conn.as_mut() => result,
                () = activity.idle_for(limits.request_header_timeout, limits.request_header_timeout) => Ok(()),
            }
        }
        _ = shutdown.changed() => {
            // Finish in-flight requests, refuse new ones (GOAWAY on HTTP/2, close after the
            // current response on HTTP/1).
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(err) = result {
        tracing::debug!(?peer, error = %err, "connection ended with an error");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::trust::PeerCertificate;
    use crate::auth::{pki, tls};
    use axum::routing::get;
    use axum::Extension;

    async fn whoami(Extension(peer): Extension<PeerCertificate>) -> String {
        match peer {
            PeerCertificate::User(user) => format!("{} {:?}", user.name, user.groups),
            other => format!("{other:?}"),
        }
    }

    fn client(pki: &pki::StandalonePki, with_cert: bool) -> reqwest::Client {
        let ca = reqwest::Certificate::from_pem(&std::fs::read(&pki.ca_cert).unwrap()).unwrap();
        let mut builder = reqwest::Client::builder().tls_certs_only([ca]).tls_backend_rustls();
        if with_cert {
            let mut pem = std::fs::read(&pki.admin_cert).unwrap();
            pem.extend(std::fs::read(&pki.admin_key).unwrap());
            builder = builder.identity(reqwest::Identity::from_pem(&pem).unwrap());
        }
        builder.build().unwrap()
    }

    #[tokio::test]
    async fn serves_identity_and_shuts_down() {
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let dir = tempfile::tempdir().unwrap();
        let pki = pki::ensure_standalone(dir.path()).unwrap();
        let anchors = crate::auth::trust::TrustAnchors {
            client_ca_pem: Some(std::fs::read(&pki.ca_cert).unwrap()),
            ..Default::default()
        };
        let config = tls::setup(&pki.serving_cert, &pki.serving_key, &anchors).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = axum::Router::new().route("/whoami", get(whoami));
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve_tls(listener, config, app, ListenerLimits::default(), async {
            let _ = stop_rx.await;
        }));

        // A client that never finishes TLS must not disturb anyone else.
        let _idle = TcpStream::connect(addr).await.unwrap();

        let url = format!("https://localhost:{}/whoami", addr.port());
        let admin = client(&pki, true);
        let body = admin.get(&url).send().await.unwrap().text().await.unwrap();
        assert_eq!(body, r#"stowage-admin ["system:masters"]"#);
        let anonymous = client(&pki, false).get(&url).send().await.unwrap();
        assert_eq!(anonymous.version(), http::Version::HTTP_2);
        assert_eq!(anonymous.text().await.unwrap(), "None");

        // `admin` keeps its idle HTTP/2 connection open across shutdown: graceful shutdown must
        // close it (GOAWAY) rather than wait out the grace period.

        stop_tx.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(5), server).await.expect("server stops promptly").unwrap().unwrap();
        assert!(TcpStream::connect(addr).await.is_err());
    }
}
