//! PATCH on objects and their `status`: JSON merge patch (RFC 7386), JSON patch (RFC 6902),
//! strategic merge patch — which, for these types as for custom resources, has merge-patch
//! semantics (no list merge keys are declared), honouring only its map directives — and
//! server-side apply (`application/apply-patch+yaml`, see [`super::fieldmanager`]), which also
//! creates objects that do not exist. The patched object then goes through exactly the
//! checks and rules of an update; a conflict with a concurrent writer is retried, as the
//! kube-apiserver does, unless the patch itself pinned a resourceVersion.

use std::collections::HashMap;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::Response;
use serde_json::Value;

use super::access::Identity;
use super::handlers::{
    check_object, create_object, field_manager, json_response, replace, updatable_resource_def, Params, UpdateScope,
    WriteRequest,
};
use super::status::{ApiError, ApiResult, Reason};
use super::{blocking, fieldmanager, AppState};
use crate::api::meta;
use crate::storage::ObjectKey;
use crate::strategy::ResourceDef;

const RETRIES: usize = 5;

pub(crate) enum PatchKind {
    Merge(Value),
    Json(json_patch::Patch),
    Strategic(Value),
    /// Server-side apply: the applied configuration.
    Apply(Value),
}

fn is_directive(key: &str) -> bool {
    key == "$patch"
        || key == "$retainKeys"
        || key.starts_with("$setElementOrder/")
        || key.starts_with("$deleteFromPrimitiveList/")
}

/// Applies a strategic merge patch with merge-patch semantics: maps merge, `null` deletes, lists
/// are replaced (no merge keys are declared); `$patch: delete` removes the map it is in and
/// `$patch: replace` replaces it whole; ordering and retain-keys directives have nothing to act on.
fn strategic_merge(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    match patch.get("$patch").and_then(Value::as_str) {
        Some("delete") => {
            *target = Value::Null;
            return;
        }
        Some("replace") => *target = Value::Object(serde_json::Map::new()),
        _ => {}
    }
    if !target.is_object() {
        *target = Value::Object(serde_json::Map::new());
    }
    let Some(fields) = target.as_object_mut() else { return };
    for (key, value) in patch.iter().filter(|(k, _)| !is_directive(k)) {
        if value.is_null() {
            fields.remove(key);
            continue;
        }
        let field = fields.entry(key.clone()).or_insert(Value::Null);
        strategic_merge(field, value);
        if field.is_null() {
            fields.remove(key);
        }
    }
}

/// The patch a request body is, by its Content-Type.
pub(crate) fn parse(headers: &HeaderMap, body: &Bytes) -> ApiResult<PatchKind> {
    let content_type = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    let media = content_type.split(';').next().unwrap_or("").trim();
    let invalid = |e: serde_json::Error| ApiError::bad_request(format!("invalid patch: {e}"));
    match media {
        "application/merge-patch+json" => Ok(PatchKind::Merge(serde_json::from_slice(body).map_err(invalid)?)),
        "application/strategic-merge-patch+json" => {
            Ok(PatchKind::Strategic(serde_json::from_slice(body).map_err(invalid)?))
        }
        "application/json-patch+json" => Ok(PatchKind::Json(serde_json::from_slice(body).map_err(invalid)?)),
        "application/apply-patch+yaml" => Ok(PatchKind::Apply(
            serde_yaml_ng::from_slice(body).map_err(|e| ApiError::bad_request(format!("invalid apply patch: {e}")))?,
        )),
        _ => Err(ApiError::unsupported_media_type(format!(
            "the body of the request was in an unknown format ({media}) - accepted media types include: \
             application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json, \
             application/apply-patch+yaml"
        ))),
    }
}

/// Most operations in one JSON patch (kube-apiserver's limit).
const MAX_JSON_PATCH_OPERATIONS: usize = 10_000;
/// Most bytes a JSON patch's `copy` operations may add in total: each copy can double the
/// object, so a small patch could otherwise build gigabytes (kube-apiserver limits it too).
const MAX_JSON_PATCH_COPY_BYTES: u64 = 3 << 20;

/// Applies a JSON patch to a scratch copy of an object, one operation at a time so the bytes
/// its copies add can be counted before they are made.
fn apply_json_patch(doc: &mut Value, patch: &json_patch::Patch) -> ApiResult<()> {
    if patch.0.len() > MAX_JSON_PATCH_OPERATIONS {
        return Err(ApiError::too_large(format!(
            "the allowed number of operations in a JSON patch is {MAX_JSON_PATCH_OPERATIONS}, got {}",
            patch.0.len()
        )));
    }
    let mut copied = 0u64;
    for (index, operation) in patch.0.iter().enumerate() {
        if let json_patch::PatchOperation::Copy(copy) = operation {
            let size = doc.pointer(copy.from.as_str()).map_or(0, |v| json_size(v, MAX_JSON_PATCH_COPY_BYTES + 1));
            copied = copied.saturating_add(size);
            if copied > MAX_JSON_PATCH_COPY_BYTES {
                return Err(ApiError::too_large(format!(
                    "the JSON patch could not be applied: its copy operations add more than \
                     {MAX_JSON_PATCH_COPY_BYTES} bytes (operation {index})"
                )));
            }
        }
        json_patch::patch_unsafe(doc, std::slice::from_ref(operation)).map_err(|mut e| {
            e.operation = index;
            ApiError::new_unprocessable(format!("the JSON patch could not be applied: {e}"))
        })?;
    }
    Ok(())
}

/// The size of `value` as JSON, counted up to `limit` (then `limit`).
fn json_size(value: &Value, limit: u64) -> u64 {
    struct Counter {
        bytes: u64,
        limit: u64,
    }
    impl std::io::Write for Counter {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.bytes += buf.len() as u64;
            if self.bytes >= self.limit {
                return Err(std::io::Error::other("limit reached"));
            }
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut counter = Counter { bytes: 0, limit };
    let _ = serde_json::to_writer(&mut counter, value);
    counter.bytes.min(limit)
}

/// What `patch` makes of `live` (`None`: the object does not exist, which only an apply may
/// create), checked like a request body: the object to write and the warnings to send.
#[allow(clippy::too_many_arguments)]
pub(crate) fn patched_object(
    def: &'static ResourceDef,
    patch: &PatchKind,
    live: Option<&Value>,
    params: &HashMap<String, String>,
    manager: &str,
    force: bool,
    scope: UpdateScope,
    name: &str,
) -> ApiResult<(Value, Vec<String>)> {
    match (patch, live) {
        (PatchKind::Apply(applied), live) => {
            let (applied, warnings) = check_object(def, applied.clone(), params)?;
            let subresource = (scope == UpdateScope::Status).then_some("status");
            if live.is_none() && scope == UpdateScope::Status {
                return Err(ApiError::not_found(def.plural, name));
            }
            let schema = crate::apiserver::schema::of(def);
            let now = meta::now_timestamp();
            let result = fieldmanager::apply(&schema, live, &applied, manager, force, subresource, &now)
                .map_err(ApiError::from)?;
            Ok((result, warnings))
        }
        (_, None) => Err(ApiError::not_found(def.plural, name)),
        (other, Some(live)) => {
            let mut patched = live.clone();
            match other {
                PatchKind::Merge(p) => json_patch::merge(&mut patched, p),
                PatchKind::Strategic(p) => strategic_merge(&mut patched, p),
                PatchKind::Json(p) => apply_json_patch(&mut patched, p)?,
                PatchKind::Apply(_) => {}
            }
            check_object(def, patched, params)
        }
    }
}

/// PATCH on an object or its `status`.
pub async fn patch(
    State(app): State<AppState>,
    Path((namespace, resource, name)): Path<(String, String, String)>,
    Query(params): Params,
    scope: UpdateScope,
    Identity(user): Identity,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    let def = updatable_resource_def(&resource, scope)?;
    let patch = parse(&headers, &body)?;
    let is_apply = matches!(patch, PatchKind::Apply(_));
    let force = match params.get("force").map(String::as_str) {
        None => false,
        Some(_) if !is_apply => {
            return Err(ApiError::new_unprocessable("force: Forbidden: may not be specified for non-apply patch"))
        }
        Some(value) => value == "true",
    };
    if is_apply && !params.contains_key("fieldManager") {
        return Err(ApiError::new_unprocessable("fieldManager: Required value: is required for apply patch"));
    }
    let manager = field_manager(&params, &headers)?;
    let mut attempt = 0;
    loop {
        attempt += 1;
        let key = ObjectKey::new(def.plural, &namespace, &name);
        let stored = blocking(&app, move |store| store.get_object(&key)).await?;
        let live = stored.as_ref().map(|s| &s.value);
        let (patched, warnings) = patched_object(def, &patch, live, &params, &manager, force, scope, &name)?;
        if patched.pointer("/metadata/name").and_then(Value::as_str) != Some(name.as_str()) {
            return Err(ApiError::bad_request("metadata.name cannot be changed by a patch"));
        }
        // Apply computed managedFields itself; other patches record the manager's ownership.
        let tracked_by = (!is_apply).then_some(manager.as_str());
        let request =
            WriteRequest { def, namespace: &namespace, params: &params, scope, user: &user, manager: tracked_by };
        let Some(stored) = stored else {
            // Server-side apply creates what does not exist.
            return match create_object(&app, &request, patched).await {
                Err(e) if e.reason == Reason::AlreadyExists && attempt < RETRIES => continue,
                Err(e) => Err(e),
                Ok(created) => Ok(json_response(StatusCode::CREATED, &created, &warnings)),
            };
        };
        let pinned = patched.pointer("/metadata/resourceVersion").and_then(Value::as_str).map(str::to_string);
        let rv = match pinned.as_deref() {
            Some(text) if text != stored.resource_version.to_string() => {
                text.parse().map_err(|_| ApiError::bad_request(format!("invalid resourceVersion {text:?}")))?
            }
            _ => stored.resource_version,
        };
        match replace(&app, &request, &name, patched, &stored.value, rv).await {
            Err(e) if e.reason == Reason::Conflict && rv == stored.resource_version && attempt < RETRIES => continue,
            Err(e) => return Err(e),
            Ok(updated) => return Ok(json_response(StatusCode::OK, &updated, &warnings)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn json_patch(ops: Value) -> json_patch::Patch {
        serde_json::from_value(ops).unwrap()
    }

    #[test]
    fn json_patch_copies_that_would_explode_the_object_are_refused() {
        // Found by fuzzing (fuzz/regressions/patch): each copy into the source's own subtree
        // doubles it; 25 such operations in a 2 KB body made a 28 GB object.
        let ops: Vec<Value> = (0..25)
            .map(|i| json!({"op": "copy", "from": "/metadata/labels", "path": format!("/metadata/labels/x{i}")}))
            .collect();
        let mut obj = json!({"metadata": {"labels": {"app": "web", "tier": "frontend"}}});
        let err = apply_json_patch(&mut obj, &json_patch(json!(ops))).unwrap_err();
        assert_eq!(err.code, StatusCode::PAYLOAD_TOO_LARGE);
        assert!(err.message.contains("copy operations add more than 3145728 bytes"), "{}", err.message);
    }

    #[test]
    fn json_patch_errors_name_the_failing_operation() {
        let mut obj = json!({"a": 1});
        let ops = json!([{"op": "add", "path": "/b", "value": 2}, {"op": "remove", "path": "/missing"}]);
        let err = apply_json_patch(&mut obj, &json_patch(ops)).unwrap_err();
        assert_eq!(err.code, StatusCode::UNPROCESSABLE_ENTITY);
        assert!(err.message.contains("operation '/1'"), "{}", err.message);
        let ops = json!([{"op": "copy", "from": "/a", "path": "/c"}, {"op": "test", "path": "/c", "value": 1}]);
        apply_json_patch(&mut obj, &json_patch(ops)).unwrap();
    }

    #[test]
    fn strategic_merge_has_merge_semantics_and_map_directives() {
        let mut obj = json!({"metadata": {"labels": {"a": "1", "b": "2"}}, "spec": {"sources": [{"upload": {}}], "paused": true}});
        let patch = json!({
            "metadata": {"labels": {"b": null, "c": "3"}},
            "spec": {"sources": [{"http": {"url": "https://x"}}], "$setElementOrder/sources": [{"http": {}}]},
        });
        strategic_merge(&mut obj, &patch);
        assert_eq!(obj["metadata"]["labels"], json!({"a": "1", "c": "3"}));
        assert_eq!(obj["spec"], json!({"sources": [{"http": {"url": "https://x"}}], "paused": true}));
        strategic_merge(&mut obj, &json!({"metadata": {"labels": {"$patch": "replace", "z": "9"}}}));
        assert_eq!(obj["metadata"]["labels"], json!({"z": "9"}));
        strategic_merge(&mut obj, &json!({"metadata": {"labels": {"$patch": "delete"}}}));
        assert!(obj["metadata"].get("labels").is_none());
    }
}
