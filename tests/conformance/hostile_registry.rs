//! Registries that stream endless responses where a small one belongs, against the real server:
//! resolving a tag whose HEAD has no `Docker-Content-Digest` (so the manifest is read to hash it)
//! and a token service that never ends its token. The Bundle gets a failed condition naming the
//! limit, the registry gets to send only a bounded amount, and the server's memory stays bounded.
//! Before, both were read whole (by `oci-client`): hundreds of MiB until the registry gave up.
//! And the token flow the bounded client implements, against the real registry behind a token
//! service whose tokens expire after one request.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serde_json::json;

use crate::harness::*;
use crate::hostile_http;
use crate::unpack::{condition, create, wait_reason};

/// What a hostile registry offers before it stops by itself.
const OFFERED: u64 = 512 << 20;
/// Sent bytes a bounded client can have taken (the bound plus socket buffers).
const READ_BOUND: u64 = 64 << 20;
/// Peak RSS of the server: it never held anything near [`OFFERED`].
const PEAK_RSS_BOUND_KIB: u64 = 200 << 10;

#[derive(Clone, Copy)]
enum Misbehaviour {
    /// `HEAD` of a manifest without `Docker-Content-Digest`; `GET` streams forever.
    EndlessManifest,
    /// `/v2/` asks for a token from our own realm, which streams forever.
    EndlessToken,
}

/// A registry on 127.0.0.1 misbehaving as told; returns `HOST:PORT` and the count of bytes it
/// sent in endless bodies.
fn hostile_registry(how: Misbehaviour) -> (String, Arc<AtomicU64>) {
    let sent = Arc::new(AtomicU64::new(0));
    let counter = sent.clone();
    // The token realm names the server itself, whose address is known only once it listens.
    let realm = Arc::new(std::sync::OnceLock::<String>::new());
    let own = realm.clone();
    let host = hostile_http::serve(move |request, stream| {
        let reply = |stream: &mut std::net::TcpStream, status: &str, headers: &str, body: &str| {
            let _ = write!(
                stream,
                "HTTP/1.1 {status}\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        };
        let endless = |stream: &mut std::net::TcpStream, content_type: &str, start: &str| {
            let head = format!("HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nConnection: close\r\n\r\n{start}");
            hostile_http::endless(stream, &head, b'a', OFFERED, &counter);
        };
        let manifest_type = "application/vnd.oci.image.manifest.v1+json";
        let (method, path) = (request.method.as_str(), request.path.as_str());
        match how {
            Misbehaviour::EndlessManifest if path == "/v2/" => reply(stream, "200 OK", "", "{}"),
            Misbehaviour::EndlessManifest if path.contains("/manifests/") && method == "HEAD" => {
                // A HEAD answer: headers only, and no digest among them.
                let _ = write!(
                    stream,
                    "HTTP/1.1 200 OK\r\nContent-Type: {manifest_type}\r\nContent-Length: 1000\r\n\
                     Connection: close\r\n\r\n"
                );
            }
            Misbehaviour::EndlessManifest if path.contains("/manifests/") => {
                endless(stream, manifest_type, "{\"schemaVersion\": 2, \"x\": \"")
            }
            Misbehaviour::EndlessToken if path.starts_with("/token") => {
                endless(stream, "application/json", "{\"token\": \"")
            }
            Misbehaviour::EndlessToken => {
                let realm = own.get().map(String::as_str).unwrap_or_default();
                let challenge = format!("WWW-Authenticate: Bearer realm=\"{realm}\",service=\"hostile\"\r\n");
                reply(stream, "401 Unauthorized", &challenge, "{}")
            }
            _ => reply(stream, "404 Not Found", "", "{}"),
        }
    });
    let _ = realm.set(format!("http://{host}/token"));
    (host, sent)
}

async fn fails_within_bounds(how: Misbehaviour, reason: &str, mentions: &str) {
    let (host, sent) = hostile_registry(how);
    let server = Server::start_temp(&["--insecure-registry", &host]);
    create(&server, "hostile", json!({"sources": [{"image": {"ref": format!("{host}/evil/app:v1")}}]})).await;
    let b = wait_reason(&server, "hostile", reason).await;
    let message = condition(&b, "Unpacked")["message"].as_str().unwrap_or_default().to_owned();
    let (read, peak) = (sent.load(Ordering::Relaxed), server.peak_rss_kib());
    assert!(read < READ_BOUND, "the registry got to send {read} bytes of an endless body (peak RSS {peak} KiB)");
    assert!(peak < PEAK_RSS_BOUND_KIB, "peak RSS {peak} KiB while refusing an endless body");
    assert!(message.contains(mentions), "the condition says what was too large: {message}");
    report(&format!("endless {mentions}: {reason}, {read} bytes sent, peak RSS {peak} KiB: {message}"));
    // The server still serves.
    server.get_json(&bundle("unpack", "hostile")).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn resolving_a_tag_reads_an_endless_manifest_only_up_to_the_limit() {
    fails_within_bounds(Misbehaviour::EndlessManifest, "LimitExceeded", "manifest larger than").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_endless_token_response_is_refused_at_its_limit() {
    fails_within_bounds(Misbehaviour::EndlessToken, "PullFailed", "token response is larger than").await;
}

/// A registry behind a token service, as Docker Hub, GHCR or Harbor are: a front on 127.0.0.1
/// that answers 401 with a `Bearer` challenge unless the request carries a current token, hands
/// out tokens at `/token` (each good for one request, so every pull outlives its tokens), and
/// passes the rest to the real registry.
struct TokenFront {
    host: String,
    issued: Arc<AtomicU64>,
    _task: tokio::task::JoinHandle<()>,
}

async fn token_front(upstream: String) -> TokenFront {
    use axum::extract::{Request, State};
    use axum::http::{HeaderMap, StatusCode};
    use axum::response::{IntoResponse, Response};
    use std::collections::HashSet;
    use std::sync::Mutex;

    struct Front {
        upstream: String,
        realm: String,
        issued: Arc<AtomicU64>,
        valid: Mutex<HashSet<String>>,
        http: reqwest::Client,
    }
    async fn handle(State(front): State<Arc<Front>>, request: Request) -> Response {
        let path = request.uri().path_and_query().map(|p| p.as_str().to_owned()).unwrap_or_default();
        if path.starts_with("/token") {
            assert!(path.contains("scope=repository%3Ateam%2Fapp%3Apull"), "asks for a pull token: {path}");
            let token = format!("token-{}", front.issued.fetch_add(1, Ordering::Relaxed));
            front.valid.lock().unwrap().insert(token.clone());
            return axum::Json(json!({"token": token})).into_response();
        }
        let presented = request.headers().get("authorization").and_then(|v| v.to_str().ok()).unwrap_or("");
        let token = presented.strip_prefix("Bearer ").unwrap_or("").to_owned();
        if path == "/v2/" || !front.valid.lock().unwrap().remove(&token) {
            let challenge = format!("Bearer realm=\"{}\",service=\"front\"", front.realm);
            return (StatusCode::UNAUTHORIZED, [("www-authenticate", challenge)], "{}").into_response();
        }
        let mut upstream = front.http.request(request.method().clone(), format!("{}{path}", front.upstream));
        if let Some(accept) = request.headers().get("accept") {
            upstream = upstream.header("accept", accept);
        }
        let answer = upstream.send().await.unwrap();
        let mut headers = HeaderMap::new();
        for name in ["content-type", "content-length", "docker-content-digest"] {
            if let Some(v) = answer.headers().get(name) {
                headers.insert(name, v.clone());
            }
        }
        let status = answer.status();
        (status, headers, answer.bytes().await.unwrap()).into_response()
    }

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let host = listener.local_addr().unwrap().to_string();
    let issued = Arc::new(AtomicU64::new(0));
    let front = Arc::new(Front {
        upstream,
        realm: format!("http://{host}/token"),
        issued: issued.clone(),
        valid: Mutex::new(HashSet::new()),
        http: reqwest::Client::new(),
    });
    let app = axum::Router::new().fallback(handle).with_state(front);
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    TokenFront { host, issued, _task: task }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_registry_behind_a_token_service_serves_its_image_as_tokens_expire() {
    use crate::registry::{Layer, Registry};
    use crate::tarutil::assert_trees_equal;
    use crate::unpack::{corpus_tree, served};

    let registry = Registry::start().await;
    let tree = corpus_tree("rukpak-testdata/registry/valid");
    registry.push_image("team/app", "v1", &[Layer::gzip_tree(&tree)], "linux/amd64").await;
    let front = token_front(format!("http://{}", registry.host())).await;
    let server = Server::start_temp(&["--insecure-registry", &front.host]);
    create(&server, "tokens", json!({"sources": [{"image": {"ref": format!("{}/team/app:v1", front.host)}}]})).await;
    let b = wait_reason(&server, "tokens", "Unpacked").await;
    assert_unpacked(&b);
    assert_trees_equal(&tree, &served(&server, "tokens").await, "the image behind a token service");
    let issued = front.issued.load(Ordering::Relaxed);
    assert!(issued >= 3, "a token for the resolve, one for the pull, and new ones as they expired: {issued}");
}
