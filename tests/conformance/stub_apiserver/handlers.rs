//! The stub's HTTP side: TLS (HTTP/1.1 and HTTP/2) on 127.0.0.1:0 on a thread of its own, and one
//! handler that counts, authenticates (bearer token), fails on demand and answers each endpoint in the
//! kube-apiserver's JSON.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::{Request, State as AxumState};
use axum::response::Response;
use base64::Engine;
use http::StatusCode;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::{json, Value};
use stowage::auth::UserInfo;
use tokio_util::sync::CancellationToken;

use super::pki::CertifiedKey;
use super::{keys, Endpoint, SarRule, State};

type Shared = Arc<Mutex<State>>;

/// Binds, then serves on a new thread until `shutdown`.
pub(super) fn spawn(
    serving: &CertifiedKey,
    state: Shared,
    shutdown: CancellationToken,
) -> (SocketAddr, std::thread::JoinHandle<()>) {
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(serving.cert_pem.as_bytes()).collect::<Result<_, _>>().expect("stub cert");
    let key = PrivateKeyDer::from_pem_slice(serving.key_pem.as_bytes()).expect("stub key");
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .and_then(|b| b.with_no_client_auth().with_single_cert(certs, key))
        .expect("stub TLS config");
    tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the stub");
    listener.set_nonblocking(true).expect("nonblocking listener");
    let addr = listener.local_addr().expect("stub address");
    let thread = std::thread::spawn(move || {
        let runtime =
            tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("stub runtime");
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
            let app = axum::Router::new().fallback(handle).with_state(state);
            loop {
                let (stream, _) = tokio::select! {
                    _ = shutdown.cancelled() => break,
                    accepted = listener.accept() => match accepted {
                        Ok(accepted) => accepted,
                        Err(_) => continue,
                    },
                };
                let (acceptor, app, shutdown) = (acceptor.clone(), app.clone(), shutdown.clone());
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(stream).await else { return };
                    let builder = auto::Builder::new(TokioExecutor::new());
                    let conn = builder.serve_connection(TokioIo::new(tls), TowerToHyperService::new(app));
                    tokio::select! {
                        _ = conn => {}
                        _ = shutdown.cancelled() => {}
                    }
                });
            }
        });
        // Dropping the runtime drops every connection task.
    });
    (addr, thread)
}

fn json_response(code: u16, body: Value) -> Response {
    Response::builder()
        .status(StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .unwrap_or_default()
}

/// A `metav1.Status` failure.
fn status(code: u16, reason: &str, message: &str) -> Response {
    json_response(
        code,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}),
    )
}

async fn handle(AxumState(shared): AxumState<Shared>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let endpoint = match (parts.method.as_str(), parts.uri.path()) {
        ("POST", "/apis/authentication.k8s.io/v1/tokenreviews") => Endpoint::TokenReview,
        ("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews") => Endpoint::SubjectAccessReview,
        ("GET", "/api/v1/namespaces/kube-system/configmaps/extension-apiserver-authentication") => {
            Endpoint::AuthenticationConfigMap
        }
        ("GET", "/.well-known/openid-configuration") => Endpoint::OpenIdConfiguration,
        ("GET", "/openid/v1/jwks") => Endpoint::Jwks,
        ("GET", path) if secret_key(path).is_some() => Endpoint::Secret,
        ("POST" | "PATCH", path) if path.starts_with("/apis/events.k8s.io/v1/namespaces/") => Endpoint::Event,
        _ => Endpoint::Other,
    };
    let body = axum::body::to_bytes(body, 1 << 20).await.unwrap_or_default();
    let mut state = shared.lock().unwrap_or_else(|e| e.into_inner());
    *state.counts.entry(endpoint).or_default() += 1;
    if let Some(code) = state.failure {
        return status(code, "InternalError", "the stub kube-apiserver is failing on purpose");
    }
    let authorization = parts.headers.get(http::header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    if authorization != Some(format!("Bearer {}", state.bearer_token).as_str()) {
        return status(401, "Unauthorized", "Unauthorized");
    }
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    match endpoint {
        Endpoint::TokenReview => token_review(&mut state, body),
        Endpoint::SubjectAccessReview => subject_access_review(&mut state, body),
        Endpoint::AuthenticationConfigMap => match &state.config_map {
            None => status(404, "NotFound", r#"configmaps "extension-apiserver-authentication" not found"#),
            Some(data) => json_response(
                200,
                json!({"kind": "ConfigMap", "apiVersion": "v1",
                    "metadata": {"name": "extension-apiserver-authentication", "namespace": "kube-system",
                        "uid": "7b7d0f4e-0000-4000-8000-000000000001",
                        "resourceVersion": state.config_map_version.to_string(),
                        "creationTimestamp": "2025-01-01T00:00:00Z"},
                    "data": data}),
            ),
        },
        Endpoint::OpenIdConfiguration => json_response(
            200,
            json!({"issuer": state.issuer, "jwks_uri": format!("{}/openid/v1/jwks", state.url),
                "response_types_supported": ["id_token"], "subject_types_supported": ["public"],
                "id_token_signing_alg_values_supported": ["ES256", "RS256"]}),
        ),
        Endpoint::Jwks => {
            let published: Vec<&jsonwebtoken::jwk::Jwk> =
                state.keys.iter().filter(|k| k.published).map(|k| &k.jwk).collect();
            json_response(200, json!({"keys": published}))
        }
        Endpoint::Secret => {
            let key = secret_key(parts.uri.path()).unwrap_or_default();
            match state.secrets.get(&key) {
                None => status(404, "NotFound", &format!("secrets {:?} not found", key.1)),
                Some((type_, data)) => {
                    let engine = base64::engine::general_purpose::STANDARD;
                    let data: serde_json::Map<String, Value> =
                        data.iter().map(|(k, v)| (k.clone(), Value::String(engine.encode(v)))).collect();
                    json_response(
                        200,
                        json!({"kind": "Secret", "apiVersion": "v1", "type": type_, "data": data,
                            "metadata": {"name": key.1, "namespace": key.0, "resourceVersion": "1",
                                "uid": "7b7d0f4e-0000-4000-8000-000000000002"}}),
                    )
                }
            }
        }
        Endpoint::Event => event(&mut state, parts.method.as_str(), parts.uri.path(), &parts.headers, body),
        Endpoint::Other => status(404, "NotFound", "the server could not find the requested resource"),
    }
}

/// `POST …/namespaces/NS/events` (checked as kube-apiserver's events.k8s.io/v1 validation does)
/// and `PATCH …/events/NAME` (a JSON merge patch).
fn event(state: &mut State, method: &str, path: &str, headers: &http::HeaderMap, body: Value) -> Response {
    let rest = path.trim_start_matches("/apis/events.k8s.io/v1/namespaces/");
    let parts: Vec<&str> = rest.split('/').collect();
    match (method, parts.as_slice()) {
        ("POST", [namespace, "events"]) => {
            for field in ["eventTime", "reportingController", "reportingInstance", "action", "reason", "regarding"] {
                if body.get(field).is_none_or(|v| v.is_null() || v == "") {
                    return status(422, "Invalid", &format!("Event.events.k8s.io is invalid: {field}: Required value"));
                }
            }
            if body.pointer("/metadata/namespace").and_then(Value::as_str) != Some(namespace) {
                return status(
                    400,
                    "BadRequest",
                    "the namespace of the object does not match the namespace on the request",
                );
            }
            if body["apiVersion"] != "events.k8s.io/v1" || body["kind"] != "Event" {
                return status(400, "BadRequest", "not an events.k8s.io/v1 Event");
            }
            let mut event = body;
            event["metadata"]["uid"] = Value::String(format!("event-{}", state.events.len()));
            event["metadata"]["resourceVersion"] = Value::String("1".into());
            state.events.push(event.clone());
            json_response(201, event)
        }
        ("PATCH", [_, "events", name]) => {
            let merge = headers.get(http::header::CONTENT_TYPE).and_then(|v| v.to_str().ok())
                == Some("application/merge-patch+json");
            if !merge {
                return status(415, "UnsupportedMediaType", "the stub takes merge patches of Events only");
            }
            let Some(event) = state.events.iter_mut().find(|e| e["metadata"]["name"] == *name) else {
                return status(404, "NotFound", &format!("events.events.k8s.io {name:?} not found"));
            };
            // As kube-apiserver validates events.k8s.io/v1 updates: only the series may change.
            let changed: Vec<&String> = body
                .as_object()
                .map(|patch| patch.keys().filter(|k| *k != "series" && event.get(*k) != patch.get(*k)).collect())
                .unwrap_or_default();
            if let Some(field) = changed.first() {
                return status(
                    422,
                    "Invalid",
                    &format!("Event.events.k8s.io {name:?} is invalid: {field}: field is immutable"),
                );
            }
            if let Some(series) = body.get("series") {
                event["series"] = series.clone();
            }
            json_response(200, event.clone())
        }
        _ => status(404, "NotFound", "the server could not find the requested resource"),
    }
}

/// `(namespace, name)` of `/api/v1/namespaces/NS/secrets/NAME`.
fn secret_key(path: &str) -> Option<(String, String)> {
    let rest = path.strip_prefix("/api/v1/namespaces/")?;
    let (namespace, rest) = rest.split_once('/')?;
    let name = rest.strip_prefix("secrets/")?;
    (!name.is_empty() && !name.contains('/')).then(|| (namespace.to_string(), name.to_string()))
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array().map(|a| a.iter().filter_map(|s| s.as_str().map(str::to_owned)).collect()).unwrap_or_default()
}

fn user_json(user: &UserInfo) -> Value {
    let mut v = json!({"username": user.name, "groups": user.groups});
    if !user.uid.is_empty() {
        v["uid"] = json!(user.uid);
    }
    if !user.extra.is_empty() {
        v["extra"] = json!(user.extra);
    }
    v
}

fn token_review(state: &mut State, body: Value) -> Response {
    let token = body["spec"]["token"].as_str().unwrap_or_default().to_owned();
    let requested = strings(&body["spec"]["audiences"]);
    let mut logged = body.clone();
    if let Some(spec) = logged.get_mut("spec").and_then(Value::as_object_mut) {
        spec.remove("token");
    }
    state.reviews.push((Endpoint::TokenReview, logged));
    let wanted = if requested.is_empty() { state.api_audiences.clone() } else { requested };
    let result = match state.tokens.get(&token) {
        Some(known) => match &known.audiences {
            None => Some((known.user.clone(), wanted.clone())),
            Some(audiences) => {
                let granted: Vec<String> = wanted.iter().filter(|a| audiences.contains(a)).cloned().collect();
                (!granted.is_empty()).then(|| (known.user.clone(), granted))
            }
        },
        None => keys::review(&token, &state.keys, &state.issuer, &wanted).filter(|(_, granted)| !granted.is_empty()),
    };
    let status = match result {
        Some((user, audiences)) => json!({"authenticated": true, "user": user_json(&user), "audiences": audiences}),
        None => json!({"user": {}, "error": "[invalid bearer token, token lookup failed]"}),
    };
    json_response(
        201,
        json!({"kind": "TokenReview", "apiVersion": "authentication.k8s.io/v1",
            "metadata": {"creationTimestamp": null}, "spec": body["spec"], "status": status}),
    )
}

fn glob(pattern: &str, value: &str) -> bool {
    pattern == "*" || pattern == value
}

fn rule_matches(rule: &SarRule, spec: &Value) -> bool {
    let user = spec["user"].as_str().unwrap_or_default();
    let groups = strings(&spec["groups"]);
    let subject = rule.subject == "*"
        || rule.subject == user
        || rule.subject.strip_prefix("group:").is_some_and(|g| groups.iter().any(|x| x == g));
    if !subject {
        return false;
    }
    let field = |v: &Value, key: &str| v[key].as_str().unwrap_or_default().to_owned();
    if let Some(r) = spec.get("resourceAttributes").filter(|_| rule.path.is_empty()) {
        let mut resource = field(r, "resource");
        let subresource = field(r, "subresource");
        if !subresource.is_empty() {
            resource = format!("{resource}/{subresource}");
        }
        glob(&rule.verb, &field(r, "verb"))
            && glob(&rule.group, &field(r, "group"))
            && glob(&rule.resource, &resource)
            && glob(&rule.namespace, &field(r, "namespace"))
            && glob(&rule.name, &field(r, "name"))
    } else if let Some(n) = spec.get("nonResourceAttributes").filter(|_| !rule.path.is_empty()) {
        let path = field(n, "path");
        let path_matches = match rule.path.strip_suffix('*') {
            Some(prefix) => path.starts_with(prefix),
            None => rule.path == path,
        };
        glob(&rule.verb, &field(n, "verb")) && path_matches
    } else {
        false
    }
}

fn subject_access_review(state: &mut State, body: Value) -> Response {
    state.reviews.push((Endpoint::SubjectAccessReview, body.clone()));
    let spec = &body["spec"];
    let deny = state.rules.iter().find(|r| !r.allow && rule_matches(r, spec));
    let allow = state.rules.iter().find(|r| r.allow && rule_matches(r, spec));
    let status = match (deny, allow) {
        (Some(rule), _) => json!({"allowed": false, "denied": true, "reason": rule.reason}),
        (None, Some(rule)) => json!({"allowed": true, "reason": rule.reason}),
        (None, None) => {
            let mut status = json!({"allowed": false});
            let (reason, error) = &state.no_opinion;
            if !reason.is_empty() {
                status["reason"] = json!(reason);
            }
            if !error.is_empty() {
                status["evaluationError"] = json!(error);
            }
            status
        }
    };
    json_response(
        201,
        json!({"kind": "SubjectAccessReview", "apiVersion": "authorization.k8s.io/v1",
            "metadata": {"creationTimestamp": null}, "spec": spec, "status": status}),
    )
}
