//! The Kubernetes API surface of `content.stowage.dev/v1alpha1` over axum: discovery, the generic
//! verbs, the `content` and `status` subresources, health, version and metrics; standalone, the
//! self reviews of `authentication.k8s.io` and `authorization.k8s.io` (`kubectl auth`).
//!
//! Handlers are thin: they parse the request, call the store (blocking work runs in
//! `spawn_blocking`) and convert every failure into a Kubernetes `Status` ([`status::ApiError`]).
//! This module knows nothing of sled; the store knows nothing of HTTP.

mod access;
pub(crate) mod access_log;
mod body_rate;
mod connection_activity;
pub mod content;
mod discovery;
mod disk_space;
mod events;
pub mod fairness;
mod fieldmanager;
#[doc(hidden)]
pub(crate) mod fuzz_access;
pub mod garbage_collector;
mod handlers;
mod health;
mod held_body;
mod lifecycle;
pub mod listener;
mod metrics;
mod negotiation;
mod openapi;
mod panic_status;
mod patch;
pub(crate) mod range;
mod registry;
pub mod request_info;
mod reviews;
mod schema;
mod selectors;
pub mod stall;
pub mod status;
mod table;
mod watch;
mod watch_cache;

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, Request};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use crate::storage::{StorageError, Store};
use status::{ApiError, ApiResult};

pub use crate::api::{API_VERSION, GROUP, VERSION};

/// Request-size limits.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Largest content upload body (compressed bytes on the wire).
    pub max_body_bytes: u64,
    /// Largest object (Bundle) body.
    pub max_object_bytes: usize,
    /// What one Bundle's content may unpack to (uploads and pulled sources alike).
    pub unpack: crate::unpack::UnpackLimits,
    /// How long a chunked upload session may sit idle before it is removed.
    pub upload_session_timeout: std::time::Duration,
    /// A request body must deliver [`body_rate::MIN_BYTES_PER_WINDOW`] within this much waiting.
    pub request_body_timeout: std::time::Duration,
    /// Requests and content streams at once, in total and per user.
    pub fairness: fairness::FairnessLimits,
    /// A download whose client takes nothing for this long is cut.
    pub stream_stall_timeout: std::time::Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body_bytes: 64 << 30,
            max_object_bytes: 3 << 20,
            unpack: Default::default(),
            upload_session_timeout: std::time::Duration::from_secs(3600),
            request_body_timeout: std::time::Duration::from_secs(30),
            fairness: Default::default(),
            stream_stall_timeout: std::time::Duration::from_secs(60),
        }
    }
}

/// Shared state of every handler. Every middleware layer and handler clones it per request, so it
/// is one reference count rather than one per field (their atomic updates, shared by the worker
/// threads, showed in the profile of GETs).
#[derive(Clone)]
pub struct AppState(Arc<SharedState>);

impl AppState {
    pub fn new(shared: SharedState) -> Self {
        Self(Arc::new(shared))
    }
}

impl std::ops::Deref for AppState {
    type Target = SharedState;
    fn deref(&self) -> &SharedState {
        &self.0
    }
}

/// What [`AppState`] holds.
pub struct SharedState {
    pub store: Store,
    /// Authentication and authorization.
    pub access: Arc<crate::auth::Access>,
    pub limits: Arc<Limits>,
    /// Chunked upload sessions on disk.
    pub uploads: Arc<crate::storage::sessions::UploadSessions>,
    /// Upload sessions being ingested as their pieces arrive.
    pub early_ingests: Arc<content::upload::EarlyIngests>,
    /// Cancelled when the server starts shutting down: long-running responses (watches) end so
    /// clients re-list elsewhere instead of holding the shutdown up.
    pub shutdown: tokio_util::sync::CancellationToken,
    /// Events about uploads (committed, refused).
    pub events: crate::events::EventRecorder,
}

/// A receiver as a response-body stream that may be polled again after it ended (compression
/// layers do; `futures::stream::unfold` would panic).
pub(crate) struct ChannelStream(pub tokio::sync::mpsc::Receiver<Result<axum::body::Bytes, std::io::Error>>);

impl futures_util::Stream for ChannelStream {
    type Item = Result<axum::body::Bytes, std::io::Error>;
    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        self.0.poll_recv(cx)
    }
}

/// Runs a store call on the blocking pool.
async fn blocking<T, F>(app: &AppState, f: F) -> ApiResult<T>
where
    T: Send + 'static,
    F: FnOnce(&Store) -> Result<T, StorageError> + Send + 'static,
{
    let store = app.store.clone();
    tokio::task::spawn_blocking(move || f(&store)).await?.map_err(ApiError::from)
}

/// Writes objects: applied on the blocking pool, acknowledged once durable without holding a
/// thread while the flush they share with concurrent writes runs. A request dropped before its
/// writes' turn (its connection abandoned) leaves them unapplied, as a cancelled request context
/// does in kube-apiserver: the client retrying elsewhere must not see them land after its retry.
async fn write_objects(
    app: &AppState,
    writes: Vec<crate::storage::ObjectWrite>,
) -> ApiResult<crate::storage::WriteOutcome> {
    let abandoned = tokio_util::sync::CancellationToken::new();
    let _dropped = abandoned.clone().drop_guard();
    let pending = blocking(app, move |store| store.apply_objects_unless(writes, abandoned)).await?;
    app.store.acknowledge(pending).await.map_err(ApiError::from)
}

/// The whole HTTP API; `/metrics` serves `metrics_registry` once the API's own metrics joined it.
pub fn router(state: AppState, metrics_registry: prometheus_client::registry::Registry) -> Router {
    let object_limit = state.limits.max_object_bytes;
    let fairness = fairness::Fairness::new(state.limits.fairness);
    let (request_metrics, exposition) =
        metrics::install(metrics_registry, state.store.clone(), fairness.clone(), state.uploads.clone());
    let base = "/apis/content.stowage.dev/v1alpha1";
    let api = Router::new()
        .route("/api", get(discovery::core_versions))
        .route("/apis", get(discovery::groups))
        .route("/apis/content.stowage.dev", get(discovery::group))
        .route(base, get(discovery::resources))
        .route(&format!("{base}/{{resource}}"), get(handlers::list_all))
        .route(
            &format!("{base}/namespaces/{{namespace}}/{{resource}}"),
            get(handlers::list_namespaced).post(handlers::create).delete(handlers::delete_collection),
        )
        .route(
            &format!("{base}/namespaces/{{namespace}}/{{resource}}/{{name}}"),
            get(handlers::get).put(handlers::update).patch(patch::patch).delete(handlers::delete),
        )
        .route(
            &format!("{base}/namespaces/{{namespace}}/{{resource}}/{{name}}/status"),
            get(handlers::get).put(handlers::update).patch(patch::patch),
        )
        .layer(DefaultBodyLimit::max(object_limit))
        .route(
            &format!("{base}/namespaces/{{namespace}}/{{resource}}/{{name}}/content"),
            get(content::get_content)
                .layer(content_compression())
                .put(content::put_bundle_content)
                .post(content::post_bundle_content)
                .patch(content::patch_bundle_content)
                .delete(content::delete_bundle_content)
                .layer(DefaultBodyLimit::disable())
                // Outside the compression layer: bytes as on the wire.
                .layer(middleware::from_fn_with_state(request_metrics.clone(), metrics::content::count)),
        )
        .route("/openapi/v2", get(openapi::v2))
        .route("/openapi/v3", get(openapi::v3_index))
        .route("/openapi/v3/apis/content.stowage.dev/v1alpha1", get(openapi::v3_group_version))
        .route("/metrics", get(metrics::serve).with_state(exposition))
        .fallback(not_found)
        // Inside the gate: who may not write learns that first, not that the disk is full.
        .layer(middleware::from_fn_with_state(state.clone(), disk_space::refuse_writes_when_full))
        // Standalone only; below the disk-space check (reviews write nothing), inside the gate.
        .merge(reviews::routes(state.access.authorizer.is_standalone()))
        .merge(events::routes(state.access.authorizer.is_standalone()))
        // Inside the gate, which names the user: seats are per user.
        .layer(middleware::from_fn_with_state(fairness.clone(), fairness::admit))
        .layer(middleware::from_fn_with_state(state.clone(), access::gate))
        .layer(middleware::from_fn(plain_errors_as_status))
        .layer(middleware::from_fn_with_state(state.limits.request_body_timeout, body_rate::enforce));
    Router::new()
        .route("/healthz", get(health::healthz))
        .route("/livez", get(health::livez))
        .route("/readyz", get(health::readyz))
        // One check with its reason: behind the gate, as kube's system:monitoring grants `/readyz/*`.
        .merge(
            Router::new()
                .route("/healthz/{check}", get(health::healthz_check))
                .route("/livez/{check}", get(health::livez_check))
                .route("/readyz/{check}", get(health::readyz_check))
                .layer(middleware::from_fn_with_state(state.clone(), access::gate)),
        )
        // Public, as kube's bootstrap policy (system:public-info-viewer) makes it.
        .route("/version", get(discovery::version))
        // The OCI registry view, behind its own gate (registry credentials and challenges).
        .merge(registry::routes(state.clone(), fairness))
        .merge(api)
        .layer(middleware::from_fn(panic_status::catch))
        .layer(middleware::from_fn_with_state(request_metrics, metrics::record_request))
        // Outside every refusal (408, 401/403, 429, panics): each request gets its line.
        .layer(middleware::from_fn(access_log::log_request))
        // Outermost: whatever layer refuses a request, its body outlives the answer.
        .layer(middleware::from_fn(held_body::hold_until_answered))
        .with_state(state)
}

/// Marks a content response whose stored content did not compress: it is sent as is whatever the
/// client accepts (HTTP lets a server pick identity), since encoding it would only cost a core.
#[derive(Clone, Copy)]
pub struct Incompressible;

/// `Accept-Encoding: zstd` or `gzip` on content downloads, at the fastest levels (bundles are mostly
/// text; a level that costs more CPU than the network saves does not pay). Only whole (200)
/// representations of content that compressed in the store are encoded: a range applies to the
/// identity bytes the ETag names.
fn content_compression() -> tower_http::compression::CompressionLayer<impl tower_http::compression::Predicate> {
    use axum::http::{Extensions, HeaderMap, StatusCode, Version};
    let worth_it = |status: StatusCode, _: Version, _: &HeaderMap, extensions: &Extensions| {
        status == StatusCode::OK && extensions.get::<Incompressible>().is_none()
    };
    tower_http::compression::CompressionLayer::new()
        .quality(tower_http::CompressionLevel::Fastest)
        .compress_when(worth_it)
}

async fn not_found(request: Request) -> ApiError {
    ApiError::not_found_message(format!("the server could not find the requested resource ({})", request.uri().path()))
}

/// Errors produced outside our handlers (axum's extractor rejections, 405 from routing, body limits)
/// come as plain text; clients expect a `Status`, so wrap them in one.
async fn plain_errors_as_status(request: Request, next: Next) -> Response {
    let response = next.run(request).await;
    let code = response.status();
    let is_json = response
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("application/json"));
    if !(code.is_client_error() || code.is_server_error()) || is_json {
        return response;
    }
    let message = match axum::body::to_bytes(response.into_body(), 4096).await {
        Ok(bytes) if !bytes.is_empty() => String::from_utf8_lossy(&bytes).into_owned(),
        _ => code.canonical_reason().unwrap_or("error").to_string(),
    };
    ApiError::from_code(code, message).into_response()
}
