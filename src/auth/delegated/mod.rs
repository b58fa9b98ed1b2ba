//! Delegated authentication and authorization: what an aggregated API server does in a cluster
//! (k8s.io/apiserver's delegating authenticator and authorizer, as metrics-server and sample-apiserver
//! use them), against the kube-apiserver through a kube-rs [`kube::Client`].
//!
//! - [`client`]: the client, from the in-cluster service account or a `--kubeconfig` file, with the
//!   10-second request timeout kube uses for its authentication and authorization webhooks.
//! - [`token_review`]: [`TokenReviewer`] asks `authentication.k8s.io/v1` TokenReview who a bearer token
//!   is; answers (positive and negative) are cached by the token's SHA-256, transport errors never.
//! - [`service_account`]: [`ServiceAccountVerifier`] verifies service-account JWTs locally against the
//!   issuer keys the cluster publishes.
//! - [`authenticator`]: [`DelegatedTokenAuthenticator`], local verification then TokenReview.
//! - [`sar`]: [`SarAuthorizer`] asks `authorization.k8s.io/v1` SubjectAccessReview, with allow and deny
//!   caches keyed by the whole review.
//! - [`authentication_config`]: the client and front-proxy CAs the kube-apiserver publishes in the
//!   `kube-system/extension-apiserver-authentication` ConfigMap, read into [`TrustAnchors`] and kept
//!   current in a [`ClientTrust`].
//! - [`metrics`]: [`DelegatedMetrics`], the reviews' counts, latencies and cache hits in `/metrics`.
//!
//! Like every authenticator here, these return users without `system:authenticated` unless the cluster
//! put it there (TokenReview answers carry it); the authentication chain adds it once
//! ([`UserInfo::with_authenticated_group`]). An error ([`DelegatedError`]) means "could not ask", never
//! "no": callers answer it with 5xx/`Unavailable`, never with an allow or an anonymous user.
//!
//! [`TrustAnchors`]: crate::auth::trust::TrustAnchors
//! [`ClientTrust`]: crate::auth::trust::ClientTrust
//! [`UserInfo::with_authenticated_group`]: crate::auth::UserInfo::with_authenticated_group

pub mod authentication_config;
pub mod authenticator;
mod cache;
pub mod client;
mod jwks;
pub mod metrics;
mod sa_claims;
pub mod sar;
pub mod service_account;
pub mod token_review;

use std::collections::BTreeMap;
use std::path::PathBuf;

use sha2::{Digest, Sha256};

pub use authentication_config::{read_trust_anchors, AuthenticationConfigWatcher};
pub use authenticator::DelegatedTokenAuthenticator;
pub use client::{delegation_client, ClientSource};
pub use metrics::DelegatedMetrics;
pub use sar::{SarAuthorizer, SarConfig};
pub use service_account::{ServiceAccountConfig, ServiceAccountVerifier, Verdict};
pub use token_review::{TokenReviewConfig, TokenReviewer};

/// Why the cluster could not be asked, or its answer could not be used. Never cached.
#[derive(Debug, thiserror::Error)]
pub enum DelegatedError {
    #[error("cannot load kubeconfig {}: {source}", path.display())]
    Kubeconfig { path: PathBuf, source: kube::config::KubeconfigError },
    #[error("in-cluster configuration: {0}")]
    InCluster(#[from] kube::config::InClusterError),
    #[error("cannot build the kube client: {0}")]
    Client(#[source] kube::Error),
    /// A request to the kube-apiserver failed: transport, timeout, or an error status.
    #[error("{what}: {source}")]
    Request { what: &'static str, source: kube::Error },
    /// The kube-apiserver answered something that is not what the API promises.
    #[error("{what}: {detail}")]
    Response { what: &'static str, detail: String },
    #[error("ConfigMap kube-system/extension-apiserver-authentication: {0}")]
    AuthenticationConfig(String),
    #[error("ConfigMap kube-system/extension-apiserver-authentication: {0}")]
    Trust(#[from] crate::auth::trust::TrustError),
    #[error("no tokio runtime to run the polling task on")]
    NoRuntime,
}

/// SHA-256 of bytes: the cache keys (tokens are never kept, only their digests).
pub(crate) fn digest(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

/// `extra` as the kube API carries it, empty map = none.
pub(crate) fn extra_or_none(extra: &BTreeMap<String, Vec<String>>) -> Option<BTreeMap<String, Vec<String>>> {
    (!extra.is_empty()).then(|| extra.clone())
}

/// A non-empty string or `None`: the kube API's optional fields.
pub(crate) fn non_empty(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_owned())
}
