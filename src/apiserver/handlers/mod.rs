//! The generic verbs — get, list, create, update, update status, delete, deletecollection —
//! written once for every resource in [`crate::strategy`], and what they share: decoding and
//! checking bodies, validation, dry runs, responses.

mod delete;
mod paging;
pub(super) mod read;
mod write;

pub use delete::{delete, delete_collection};
pub(crate) use paging::parse as list_options;
pub(crate) use paging::{continue_token, ListOptions};
pub use read::{get, get_object, list_all, list_namespaced};
pub(crate) use read::{next_step, StepFilter};
pub use write::{create, update};
pub(super) use write::{create_object, replace};
pub(crate) use write::{new_object, replacement, WriteRequest};

use std::collections::HashMap;

use axum::body::Bytes;
use axum::extract::Query;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use super::status::{ApiError, ApiResult, Cause, Reason, UndecodableBody};
use super::table;
use super::{fieldmanager, lifecycle, schema, API_VERSION};
use crate::strategy::{self, ResourceDef};

pub type Params = Query<HashMap<String, String>>;

pub fn resource_def(plural: &str) -> ApiResult<&'static ResourceDef> {
    strategy::lookup(plural).ok_or_else(|| {
        ApiError::not_found_message(format!("the server could not find the requested resource ({plural})"))
    })
}

/// A resource users may create and update (BundleContents are written only by the server).
pub(super) fn writable_resource_def(plural: &str) -> ApiResult<&'static ResourceDef> {
    let def = resource_def(plural)?;
    if !def.user_writable {
        return Err(ApiError::method_not_allowed(format!("{} are written only by the server", def.plural)));
    }
    Ok(def)
}

/// A resource a user may update in `scope`: every resource's metadata (labels, finalizers, owner
/// references — garbage collectors patch those), spec and status only where users own them.
pub(super) fn updatable_resource_def(plural: &str, scope: UpdateScope) -> ApiResult<&'static ResourceDef> {
    match scope {
        UpdateScope::Main => resource_def(plural),
        UpdateScope::Status => writable_resource_def(plural),
    }
}

/// Who makes a write, for `managedFields`: the `fieldManager` parameter, else the program name in
/// the User-Agent (kube-apiserver's rule).
pub(super) fn field_manager(params: &HashMap<String, String>, headers: &HeaderMap) -> ApiResult<String> {
    let Some(manager) = params.get("fieldManager") else {
        let agent = headers.get(axum::http::header::USER_AGENT).and_then(|v| v.to_str().ok());
        return Ok(fieldmanager::manager_from_user_agent(agent));
    };
    let cause = if manager.len() > fieldmanager::MAX_MANAGER_LENGTH {
        Cause::invalid(
            "fieldManager",
            &json!(manager),
            format!("must have at most {} bytes", fieldmanager::MAX_MANAGER_LENGTH),
        )
    } else if manager.chars().any(char::is_control) {
        Cause::invalid("fieldManager", &json!(manager), "must consist of printable characters")
    } else {
        return Ok(manager.clone());
    };
    Err(ApiError::new_unprocessable(format!("fieldManager: {}", cause.message)).with_causes(vec![cause]))
}

/// JSON response with optional `Warning` headers.
pub fn json_response(code: StatusCode, body: &Value, warnings: &[String]) -> Response {
    let mut response =
        (code, [(axum::http::header::CONTENT_TYPE, "application/json")], body.to_string()).into_response();
    for warning in warnings {
        let text = format!("299 - {:?}", warning);
        if let Ok(value) = HeaderValue::from_str(&text) {
            response.headers_mut().append("warning", value);
        }
    }
    response
}

fn render(def: &ResourceDef, obj: &Value, headers: &HeaderMap, params: &HashMap<String, String>) -> Value {
    table::render_one(def, obj, table::negotiate(headers, params.get("includeObject").map(String::as_str)))
}

/// Parses a request body into an object of `def`'s kind: schema check, unknown-field handling per
/// `fieldValidation`, pruning. Returns the object and any warnings.
pub(crate) fn decode_body(
    def: &ResourceDef,
    body: &Bytes,
    params: &HashMap<String, String>,
) -> ApiResult<(Value, Vec<String>)> {
    let obj: Value = serde_json::from_slice(body).map_err(|e| cannot_handle(def, e.to_string()))?;
    check_object(def, obj, params)
}

fn cannot_handle(def: &ResourceDef, detail: String) -> ApiError {
    ApiError::from(UndecodableBody { kind: def.kind, version: "v1alpha1", problem: &detail })
}

/// Checks a whole object (a request body, or the result of a patch) against the resource's
/// schema: kind, unknown fields per `fieldValidation`, types; prunes undeclared fields.
pub(crate) fn check_object(
    def: &ResourceDef,
    mut obj: Value,
    params: &HashMap<String, String>,
) -> ApiResult<(Value, Vec<String>)> {
    let kind = def.kind;
    let cannot = |detail: String| cannot_handle(def, detail);
    if !obj.is_object() {
        return Err(cannot("the body is not a JSON object".into()));
    }
    let api_version = obj.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    let body_kind = obj.get("kind").and_then(Value::as_str).unwrap_or("");
    if api_version != API_VERSION || body_kind != kind {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({api_version}) and kind ({body_kind}) do not match the request \
             ({API_VERSION}, {kind})"
        )));
    }
    let schema = schema::of(def);
    let report = schema::check(&schema, &obj);
    let mut warnings = Vec::new();
    if !report.unknown.is_empty() {
        let unknown: Vec<String> = report.unknown.iter().map(|f| format!("unknown field {f:?}")).collect();
        match params.get("fieldValidation").map(String::as_str) {
            Some("Strict") => return Err(cannot(format!("strict decoding error: {}", unknown.join(", ")))),
            Some("Ignore") => {}
            None | Some("Warn") => warnings = unknown,
            Some(other) => {
                return Err(ApiError::bad_request(format!(
                    "fieldValidation must be one of Ignore, Warn or Strict, not {other:?}"
                )))
            }
        }
    }
    let name = obj.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("").to_string();
    if !report.causes.is_empty() {
        return Err(ApiError::invalid(def.kind, &name, report.causes));
    }
    schema::prune(&schema, &mut obj);
    Ok((obj, warnings))
}

/// Takes `metadata` out of an object to edit it; [`put_metadata`] puts it back.
fn take_metadata(obj: &mut Value) -> serde_json::Map<String, Value> {
    match obj.get_mut("metadata").map(Value::take) {
        Some(Value::Object(map)) => map,
        _ => serde_json::Map::new(),
    }
}

fn put_metadata(obj: &mut Value, meta: serde_json::Map<String, Value>) {
    schema::set_field(obj, "metadata", Value::Object(meta));
}

/// Validates an object about to be stored; `causes` are problems the caller found already.
fn validate(def: &ResourceDef, obj: &Value, mut causes: Vec<Cause>) -> ApiResult<()> {
    let name = obj.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("");
    causes.extend(strategy::metadata_causes(obj));
    causes.extend(lifecycle::finalizer_causes(obj));
    causes.extend(lifecycle::owner_reference_causes(obj));
    causes.extend((def.validate)(obj));
    if causes.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(def.kind, name, causes))
    }
}

fn dry_run(params: &HashMap<String, String>) -> ApiResult<bool> {
    match params.get("dryRun").map(String::as_str) {
        None | Some("") => Ok(false),
        Some("All") => Ok(true),
        Some(other) => {
            Err(ApiError::bad_request(format!("unsupported dryRun value {other:?}: only \"All\" is supported")))
        }
    }
}

/// Re-labels a generic storage error with the resource and name it concerns.
pub(super) fn relabel(err: ApiError, def: &ResourceDef, name: &str) -> ApiError {
    match err.reason {
        Reason::AlreadyExists => ApiError::already_exists(def.plural, name),
        Reason::Conflict => ApiError::conflict(def.plural, name),
        Reason::NotFound => ApiError::not_found(def.plural, name),
        _ => err,
    }
}

/// Which part of the object an update may change: the `status` route changes only status.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum UpdateScope {
    Main,
    Status,
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for UpdateScope {
    type Rejection = std::convert::Infallible;

    /// From the route the request matched (not the URL: an object may be named `status`).
    async fn from_request_parts(parts: &mut axum::http::request::Parts, _: &S) -> Result<Self, Self::Rejection> {
        let route = parts.extensions.get::<axum::extract::MatchedPath>().map(|m| m.as_str()).unwrap_or("");
        Ok(if route.ends_with("/status") { UpdateScope::Status } else { UpdateScope::Main })
    }
}
