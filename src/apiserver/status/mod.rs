//! Kubernetes `Status` errors: every failure the API returns, in the shape clients parse.
//!
//! Lower layers have their own typed errors. The store's, server-side apply's, an upload's, a
//! list's and a blocking task's become an [`ApiError`] through the `From` impls in [`from`];
//! authentication and authorization failures are converted by the access gate, handlers re-label a
//! NotFound/Conflict/AlreadyExists with the resource and name, and errors of the request itself are
//! built where they are found. Every one renders as `{"kind":"Status",...}`.

mod from;

pub(crate) use from::ListFailure;
pub use from::{BodyTooLarge, PieceRefused, UndecodableBody, UploadFailure};

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

pub use crate::api::Cause;
use kube::core::response::{StatusDetails, StatusSummary};

use super::GROUP;

/// `metav1.StatusReason`: why a request failed, in the words clients switch on
/// (`IsNotFound`, `IsConflict`, …). Compared as values, never as strings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    BadRequest,
    Unauthorized,
    Forbidden,
    NotFound,
    AlreadyExists,
    Conflict,
    /// 410: a resourceVersion or continue token the server no longer holds.
    Expired,
    Invalid,
    MethodNotAllowed,
    NotAcceptable,
    UnsupportedMediaType,
    RequestEntityTooLarge,
    RequestedRangeNotSatisfiable,
    Timeout,
    TooManyRequests,
    ServiceUnavailable,
    InsufficientStorage,
    InternalError,
    Unknown,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::BadRequest => "BadRequest",
            Reason::Unauthorized => "Unauthorized",
            Reason::Forbidden => "Forbidden",
            Reason::NotFound => "NotFound",
            Reason::AlreadyExists => "AlreadyExists",
            Reason::Conflict => "Conflict",
            Reason::Expired => "Expired",
            Reason::Invalid => "Invalid",
            Reason::MethodNotAllowed => "MethodNotAllowed",
            Reason::NotAcceptable => "NotAcceptable",
            Reason::UnsupportedMediaType => "UnsupportedMediaType",
            Reason::RequestEntityTooLarge => "RequestEntityTooLarge",
            Reason::RequestedRangeNotSatisfiable => "RequestedRangeNotSatisfiable",
            Reason::Timeout => "Timeout",
            Reason::TooManyRequests => "TooManyRequests",
            Reason::ServiceUnavailable => "ServiceUnavailable",
            Reason::InsufficientStorage => "InsufficientStorage",
            Reason::InternalError => "InternalError",
            Reason::Unknown => "Unknown",
        }
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An API failure: HTTP code, Kubernetes reason, message and details.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    pub code: StatusCode,
    pub reason: Reason,
    pub message: String,
    pub details: Option<Box<serde_json::Value>>,
    /// The Status's `metadata` (a ListMeta), e.g. the continue token of an expired list.
    pub list_meta: Option<Box<serde_json::Value>>,
}

impl ApiError {
    pub(crate) fn new(code: StatusCode, reason: Reason, message: impl Into<String>) -> ApiError {
        ApiError { code, reason, message: message.into(), details: None, list_meta: None }
    }

    fn with_details(mut self, details: serde_json::Value) -> ApiError {
        self.details = Some(Box::new(details));
        self
    }

    pub fn with_list_meta(mut self, list_meta: serde_json::Value) -> ApiError {
        self.list_meta = Some(Box::new(list_meta));
        self
    }

    /// A Status for an error that carries only an HTTP code and a message.
    pub fn from_code(code: StatusCode, message: String) -> ApiError {
        let reason = match code {
            StatusCode::BAD_REQUEST => Reason::BadRequest,
            StatusCode::UNAUTHORIZED => Reason::Unauthorized,
            StatusCode::FORBIDDEN => Reason::Forbidden,
            StatusCode::NOT_FOUND => Reason::NotFound,
            StatusCode::METHOD_NOT_ALLOWED => Reason::MethodNotAllowed,
            StatusCode::NOT_ACCEPTABLE => Reason::NotAcceptable,
            StatusCode::REQUEST_TIMEOUT => Reason::Timeout,
            StatusCode::CONFLICT => Reason::Conflict,
            StatusCode::PAYLOAD_TOO_LARGE => Reason::RequestEntityTooLarge,
            StatusCode::UNSUPPORTED_MEDIA_TYPE => Reason::UnsupportedMediaType,
            StatusCode::UNPROCESSABLE_ENTITY => Reason::Invalid,
            StatusCode::TOO_MANY_REQUESTS => Reason::TooManyRequests,
            StatusCode::SERVICE_UNAVAILABLE => Reason::ServiceUnavailable,
            StatusCode::GATEWAY_TIMEOUT => Reason::Timeout,
            StatusCode::INSUFFICIENT_STORAGE => Reason::InsufficientStorage,
            _ if code.is_server_error() => Reason::InternalError,
            _ => Reason::Unknown,
        };
        ApiError::new(code, reason, message)
    }

    pub fn not_found(resource: &str, name: &str) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, Reason::NotFound, format!("{resource}.{GROUP} {name:?} not found"))
            .with_details(json!({"name": name, "group": GROUP, "kind": resource}))
    }

    /// A 404 for something that is not an object (a path inside content, an unknown resource).
    pub fn not_found_message(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, Reason::NotFound, message)
    }

    pub fn already_exists(resource: &str, name: &str) -> ApiError {
        ApiError::new(
            StatusCode::CONFLICT,
            Reason::AlreadyExists,
            format!("{resource}.{GROUP} {name:?} already exists"),
        )
        .with_details(json!({"name": name, "group": GROUP, "kind": resource}))
    }

    /// A 409 about something other than an object's version (a finished upload session).
    pub fn conflict_message(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::CONFLICT, Reason::Conflict, message)
    }

    pub fn conflict(resource: &str, name: &str) -> ApiError {
        ApiError::new(
            StatusCode::CONFLICT,
            Reason::Conflict,
            format!(
                "Operation cannot be fulfilled on {resource}.{GROUP} {name:?}: the object has been modified; \
                 please apply your changes to the latest version and try again"
            ),
        )
        .with_details(json!({"name": name, "group": GROUP, "kind": resource}))
    }

    /// 422 with field causes, message in kube-apiserver's form.
    pub fn invalid(kind: &str, name: &str, causes: Vec<Cause>) -> ApiError {
        let list = causes.iter().map(|c| format!("{}: {}", c.field, c.message)).collect::<Vec<_>>();
        let summary = match list.as_slice() {
            [one] => one.clone(),
            all => format!("[{}]", all.join(", ")),
        };
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            Reason::Invalid,
            format!("{kind}.{GROUP} {name:?} is invalid: {summary}"),
        )
        .with_details(json!({"name": name, "group": GROUP, "kind": kind, "causes": causes}))
    }

    /// 422 for a request that is well-formed but cannot be applied (e.g. a failing JSON patch test).
    pub fn new_unprocessable(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, Reason::Invalid, message)
    }

    /// 504 for a resourceVersion the server has not reached (after waiting a little for it).
    pub fn too_large_resource_version(requested: u64, current: u64) -> ApiError {
        ApiError::new(
            StatusCode::GATEWAY_TIMEOUT,
            Reason::Timeout,
            format!("Too large resource version: {requested}, current: {current}"),
        )
        .with_details(json!({
            "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
            "retryAfterSeconds": 1,
        }))
    }

    /// Adds `details.causes` (keeping other details).
    pub fn with_causes(self, causes: Vec<Cause>) -> ApiError {
        let mut details = self.details.as_deref().and_then(serde_json::Value::as_object).cloned().unwrap_or_default();
        details.insert("causes".into(), json!(causes));
        self.with_details(serde_json::Value::Object(details))
    }

    /// 409 for a server-side apply that would change fields other managers own.
    pub fn apply_conflict(message: impl Into<String>, causes: Vec<Cause>) -> ApiError {
        ApiError::new(StatusCode::CONFLICT, Reason::Conflict, message).with_causes(causes)
    }

    /// 410: a watch from a resourceVersion the change log no longer holds.
    pub fn gone(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::GONE, Reason::Expired, message)
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, Reason::BadRequest, message)
    }

    pub fn too_large(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, Reason::RequestEntityTooLarge, message)
    }

    pub fn unsupported_media_type(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::UNSUPPORTED_MEDIA_TYPE, Reason::UnsupportedMediaType, message)
    }

    pub fn method_not_allowed(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::METHOD_NOT_ALLOWED, Reason::MethodNotAllowed, message)
    }

    /// 403 with kube-apiserver's message; `details` names the object when there is one.
    pub fn forbidden(message: impl Into<String>, details: Option<serde_json::Value>) -> ApiError {
        let error = ApiError::new(StatusCode::FORBIDDEN, Reason::Forbidden, message);
        match details {
            Some(details) => error.with_details(details),
            None => error,
        }
    }

    /// 503: something the request needs (the cluster's authentication or authorization) did not
    /// answer; clients retry.
    pub fn unavailable(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, Reason::ServiceUnavailable, message)
    }

    pub fn unauthorized() -> ApiError {
        ApiError::new(StatusCode::UNAUTHORIZED, Reason::Unauthorized, "Unauthorized")
    }

    pub fn range_not_satisfiable(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::RANGE_NOT_SATISFIABLE, Reason::RequestedRangeNotSatisfiable, message)
    }

    /// 507: the data directory is (nearly) full. Reads keep working; writes succeed again once
    /// space is freed, without a restart. `retryAfterSeconds` tells clients it is not permanent.
    pub fn insufficient_storage(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INSUFFICIENT_STORAGE, Reason::InsufficientStorage, message)
            .with_details(json!({"retryAfterSeconds": 10}))
    }

    /// 429 from admission control; `retryAfterSeconds` (and the `Retry-After` header the caller
    /// sets) tell clients to come back, as kube-apiserver's flow control does.
    pub fn too_many_requests(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::TOO_MANY_REQUESTS, Reason::TooManyRequests, message)
            .with_details(json!({"retryAfterSeconds": 1}))
    }

    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, Reason::InternalError, message)
    }

    /// The `Status` object, as kube-core's type (what kube-rs clients decode it into), with the
    /// `kind` and `apiVersion` kube-apiserver sends.
    pub fn status_body(&self) -> serde_json::Value {
        let metadata = self.list_meta.as_deref().and_then(|m| serde_json::from_value(m.clone()).ok());
        let details = self.details.as_deref().and_then(|d| serde_json::from_value::<StatusDetails>(d.clone()).ok());
        let status = kube::core::Status {
            status: Some(StatusSummary::Failure),
            code: self.code.as_u16(),
            message: self.message.clone(),
            metadata: Some(metadata.unwrap_or_default()),
            reason: self.reason.as_str().into(),
            details,
        };
        let mut body = json!({"kind": "Status", "apiVersion": "v1"});
        if let (Some(fields), Ok(serde_json::Value::Object(status))) =
            (body.as_object_mut(), serde_json::to_value(status))
        {
            fields.extend(status);
        }
        body
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = self.status_body();
        (self.code, [(axum::http::header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
    }
}

pub type ApiResult<T> = Result<T, ApiError>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::StorageError;

    #[test]
    fn a_poisoned_store_is_a_503_that_says_writes_wait_for_a_restart() {
        let cause = "fsync of a pack file failed: Input/output error (os error 5)".to_string();
        let body = ApiError::from(StorageError::Poisoned(cause)).status_body();
        assert_eq!((body["code"].as_u64(), body["reason"].as_str()), (Some(503), Some("ServiceUnavailable")));
        assert_eq!(
            body["message"],
            "the store could not make a write durable (fsync of a pack file failed: Input/output error (os error 5)); \
             writes are refused until stowage restarts; reads still work"
        );
    }

    #[test]
    fn a_status_is_kube_cores_with_its_causes_and_retry_hint() {
        let invalid = ApiError::invalid("Bundle", "b", vec![Cause::required("spec.sources", "at least one source")]);
        let body = invalid.status_body();
        assert_eq!((body["kind"].as_str(), body["apiVersion"].as_str()), (Some("Status"), Some("v1")));
        assert_eq!(body["metadata"], json!({}));
        let decoded: kube::core::Status = serde_json::from_value(body).unwrap();
        assert!(decoded.is_failure());
        assert_eq!((decoded.code, decoded.reason.as_str()), (422, "Invalid"));
        let details = decoded.details.unwrap();
        assert_eq!((details.name.as_str(), details.kind.as_str()), ("b", "Bundle"));
        assert_eq!(details.causes[0].field, "spec.sources");
        let busy = ApiError::too_many_requests("slow down").status_body();
        assert_eq!(busy["details"]["retryAfterSeconds"], 1);
        let expired = ApiError::gone("too old").with_list_meta(json!({"continue": "x", "resourceVersion": "7"}));
        assert_eq!(expired.status_body()["metadata"]["continue"], "x");
    }
}
