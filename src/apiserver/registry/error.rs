//! The registry view's one error type, rendered as the distribution spec's error body
//! (`{"errors":[{"code","message","detail"}]}`), which every OCI client prints; and the layer that
//! turns a Kubernetes `Status` from the shared layers (fairness's 429, the panic net, a store
//! failure) into the same body.

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::apiserver::status::ApiError;

/// The realm of the Basic challenge: `podman login`, docker config files and image pull Secrets
/// answer it with a user name and, as the password, a Kubernetes token.
pub const CHALLENGE: &str = "Basic realm=\"stowage\"";

/// Why a registry request failed, by the distribution spec's error codes.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// No credentials, or credentials no authenticator accepts: 401 with a challenge.
    #[error("authentication required: send a Kubernetes token as the password (Basic) or as a Bearer token")]
    Unauthorized,
    #[error("{0}")]
    Denied(String),
    #[error("{0}")]
    NameUnknown(String),
    #[error("{0}")]
    ManifestUnknown(String),
    #[error("{0}")]
    BlobUnknown(String),
    #[error("{0}")]
    DigestInvalid(String),
    /// What a read-only registry refuses (pushes, deletes, uploads).
    #[error("{0}")]
    Unsupported(String),
    #[error("{0}")]
    TooManyRequests(String),
    #[error("{0}")]
    Unavailable(String),
    /// Anything else, with the status a Kubernetes request would have got.
    #[error("{1}")]
    Other(StatusCode, String),
}

impl RegistryError {
    fn code(&self) -> (StatusCode, &'static str) {
        match self {
            RegistryError::Unauthorized => (StatusCode::UNAUTHORIZED, "UNAUTHORIZED"),
            RegistryError::Denied(_) => (StatusCode::FORBIDDEN, "DENIED"),
            RegistryError::NameUnknown(_) => (StatusCode::NOT_FOUND, "NAME_UNKNOWN"),
            RegistryError::ManifestUnknown(_) => (StatusCode::NOT_FOUND, "MANIFEST_UNKNOWN"),
            RegistryError::BlobUnknown(_) => (StatusCode::NOT_FOUND, "BLOB_UNKNOWN"),
            RegistryError::DigestInvalid(_) => (StatusCode::BAD_REQUEST, "DIGEST_INVALID"),
            RegistryError::Unsupported(_) => (StatusCode::METHOD_NOT_ALLOWED, "UNSUPPORTED"),
            RegistryError::TooManyRequests(_) => (StatusCode::TOO_MANY_REQUESTS, "TOOMANYREQUESTS"),
            RegistryError::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "UNAVAILABLE"),
            RegistryError::Other(code, _) => (*code, "UNKNOWN"),
        }
    }
}

/// Marks a response whose body is already the registry's error body.
#[derive(Clone, Copy)]
struct RegistryBody;

#[derive(Serialize)]
struct Errors<'a> {
    errors: [Item<'a>; 1],
}

#[derive(Serialize)]
struct Item<'a> {
    code: &'a str,
    message: &'a str,
}

impl IntoResponse for RegistryError {
    fn into_response(self) -> Response {
        let (status, code) = self.code();
        let message = self.to_string();
        let body = serde_json::to_vec(&Errors { errors: [Item { code, message: &message }] }).unwrap_or_default();
        let mut response = Response::new(Body::from(body));
        *response.status_mut() = status;
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if status == StatusCode::UNAUTHORIZED {
            headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static(CHALLENGE));
        }
        response.extensions_mut().insert(RegistryBody);
        response
    }
}

/// Store failures and the shared helpers' errors, by their status: a 404 there means the Bundle
/// or its content is gone.
impl From<ApiError> for RegistryError {
    fn from(e: ApiError) -> Self {
        match e.code {
            StatusCode::UNAUTHORIZED => RegistryError::Unauthorized,
            StatusCode::FORBIDDEN => RegistryError::Denied(e.message),
            StatusCode::NOT_FOUND => RegistryError::NameUnknown(e.message),
            StatusCode::TOO_MANY_REQUESTS => RegistryError::TooManyRequests(e.message),
            StatusCode::SERVICE_UNAVAILABLE => RegistryError::Unavailable(e.message),
            code => RegistryError::Other(code, e.message),
        }
    }
}

/// Every error that leaves the registry view is in its format: a Kubernetes `Status` from a layer
/// shared with the API (429 from fairness, a range that cannot be served, the panic net) is
/// rewritten, keeping its status code and message. Every response names the API version, as
/// registries do.
pub async fn as_registry_errors(request: Request, next: Next) -> Response {
    let mut response = in_registry_format(next.run(request).await).await;
    response.headers_mut().insert("docker-distribution-api-version", HeaderValue::from_static("registry/2.0"));
    response
}

async fn in_registry_format(mut response: Response) -> Response {
    let status = response.status();
    if !(status.is_client_error() || status.is_server_error()) || response.extensions().get::<RegistryBody>().is_some()
    {
        return response;
    }
    let kept = [header::RETRY_AFTER, header::CONTENT_RANGE]
        .into_iter()
        .filter_map(|name| response.headers().get(&name).cloned().map(|value| (name, value)))
        .collect::<Vec<_>>();
    let message = match axum::body::to_bytes(std::mem::take(response.body_mut()), 64 << 10).await {
        Ok(bytes) => serde_json::from_slice::<serde_json::Value>(&bytes)
            .ok()
            .and_then(|status| status.get("message").and_then(|m| m.as_str()).map(str::to_string))
            .unwrap_or_else(|| status.canonical_reason().unwrap_or("error").to_string()),
        Err(_) => status.canonical_reason().unwrap_or("error").to_string(),
    };
    let mut rewritten = RegistryError::from(ApiError::from_code(status, message)).into_response();
    *rewritten.status_mut() = status;
    for (name, value) in kept {
        rewritten.headers_mut().insert(name, value);
    }
    rewritten
}
