//! The TLS accept loop: terminates TLS, attaches what the client certificate proves
//! ([`PeerCertificate`]) to every request, and serves the axum router over HTTP/1.1 or HTTP/2 until
//! shutdown.
//!
//! axum's own `serve` cannot do this, since it neither terminates TLS nor exposes the peer
//! certificate. Nothing on the per-connection path may panic or end the loop: a misbehaving client
//! costs one connection, never the server.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt as _;

use crate::auth::tls::TlsSetup;
use crate::auth::trust::ClientTrust;

/// Bounds how long a client may hold a socket without completing TLS (slowloris on the handshake).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Bounds how long an HTTP/1 client may take to send request headers.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// How long open connections may keep running after shutdown begins.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// Pause after a failed accept; errors like EMFILE persist until connections close, and retrying at
/// once would spin.
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(100);

/// Serves `app` over TLS on `listener` until `shutdown` resolves, then stops accepting and lets open
/// connections finish (bounded by a grace period, e.g. 10 s).
pub async fn serve_tls(
    listener: TcpListener,
    tls: TlsSetup,
    app: axum::Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let acceptor = TlsAcceptor::from(tls.config);
    let trust = tls.trust;
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).header_read_timeout(HEADER_READ_TIMEOUT);
    builder.http2().timer(TokioTimer::new());
    let builder = Arc::new(builder);

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
        let connection = Connection { acceptor: acceptor.clone(), trust: trust.clone(), builder: builder.clone() };
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

/// What every connection shares.
struct Connection {
    acceptor: TlsAcceptor,
    trust: Arc<ClientTrust>,
    builder: Arc<auto::Builder<TokioExecutor>>,
}

/// Handshakes, identifies the peer and serves one connection; every outcome is logged, never raised.
async fn serve_connection(
    stream: TcpStream,
    connection: Connection,
    app: axum::Router,
    mut shutdown: watch::Receiver<bool>,
) {
    let Connection { acceptor, trust, builder } = connection;
    let peer = stream.peer_addr().ok();
    // Small request/response exchanges (kubectl, watches) suffer badly from Nagle's delay.
    let _ = stream.set_nodelay(true);

    let handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream));
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

    let service = app.map_request(move |mut request: http::Request<Incoming>| {
        request.extensions_mut().insert(peer_certificate.clone());
        request
    });
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(tls), TowerToHyperService::new(service));
    tokio::pin!(conn);

    let result = tokio::select! {
        result = conn.as_mut() => result,
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
        let server = tokio::spawn(serve_tls(listener, config, app, async {
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
