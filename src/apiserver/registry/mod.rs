//! A read-only OCI Distribution view of stored content at `/v2/`, on the server's own listener:
//! each Bundle is the repository `<namespace>/<bundle>`, tagged `latest` (the served revision), by
//! each kept revision, and for charts by chart version. So `helm pull oci://…`, Flux's
//! `OCIRepository`, `podman`, `skopeo`, containerd and the kubelet read the content stowage already
//! holds, under the same identities and RBAC as the `content` subresource.
//!
//! A plain or registry+v1 revision is an image whose one uncompressed layer is the served tar
//! (nothing new is stored; its digest is the revision's); a Helm revision is Helm's chart artifact
//! ([`artifact`], [`chart_layer`]). Pushes get `UNSUPPORTED`: content enters through the API.

mod artifact;
mod chart_layer;
mod error;
mod gate;
mod handlers;
mod repository;

use std::sync::Arc;

use axum::middleware;
use axum::routing::get;
use axum::{Extension, Router};

use super::fairness::{self, Fairness};
use super::AppState;

/// The `/v2/` routes, behind their own gate (credentials the registry way, the repository's
/// authorization), then the fairness seats every request takes. Nested, so that what no route
/// matches under `/v2` gets the registry's answer rather than the API's.
pub fn routes(app: AppState, fairness: Arc<Fairness>) -> Router<AppState> {
    let repository = "/{namespace}/{name}";
    let view = Router::new()
        .route("/", get(handlers::root).fallback(handlers::unsupported))
        .route("/_catalog", get(handlers::catalog).fallback(handlers::unsupported))
        .route(
            &format!("{repository}/manifests/{{reference}}"),
            get(handlers::manifest).fallback(handlers::unsupported),
        )
        .route(&format!("{repository}/blobs/{{digest}}"), get(handlers::blob).fallback(handlers::unsupported))
        .route(&format!("{repository}/tags/list"), get(handlers::tags).fallback(handlers::unsupported))
        .fallback(handlers::other);
    Router::new()
        // `/v2/` itself, which a nested `/` does not match.
        .route("/v2/", get(handlers::root).fallback(handlers::unsupported))
        .nest("/v2", view)
        .layer(Extension(Arc::new(repository::Artifacts::default())))
        .layer(middleware::from_fn_with_state(fairness, fairness::admit))
        .layer(middleware::from_fn_with_state(app, gate::gate))
        .layer(middleware::from_fn(error::as_registry_errors))
}
