//! PATCH on objects and their `status`: JSON merge patch (RFC 7386), JSON patch (RFC 6902) and
//! strategic merge patch — which, for these types as for custom resources, has merge-patch
//! semantics (no list merge keys are declared), honouring only its map directives. The patched object then goes through exactly the
//! checks and rules of an update; a conflict with a concurrent writer is retried, as the
//! kube-apiserver does, unless the patch itself pinned a resourceVersion.

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::Response;
use serde_json::Value;

use super::handlers::{check_object, json_response, replace, updatable_resource_def, Params, UpdateScope};
use super::status::{ApiError, ApiResult};
use super::{blocking, AppState};
use crate::storage::ObjectKey;

const RETRIES: usize = 5;

pub async fn patch(
    state: State<AppState>,
    Path((namespace, resource, name)): Path<(String, String, String)>,
    params: Params,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    patch_scoped(state, namespace, resource, name, params, headers, body, UpdateScope::Main).await
}

pub async fn patch_status(
    state: State<AppState>,
    Path((namespace, resource, name)): Path<(String, String, String)>,
    params: Params,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    patch_scoped(state, namespace, resource, name, params, headers, body, UpdateScope::Status).await
}

enum PatchKind {
    Merge(Value),
    Json(json_patch::Patch),
    Strategic(Value),
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

fn parse(headers: &HeaderMap, body: &Bytes) -> ApiResult<PatchKind> {
    let content_type = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    let media = content_type.split(';').next().unwrap_or("").trim();
    let invalid = |e: serde_json::Error| ApiError::bad_request(format!("invalid patch: {e}"));
    match media {
        "application/merge-patch+json" => Ok(PatchKind::Merge(serde_json::from_slice(body).map_err(invalid)?)),
        "application/strategic-merge-patch+json" => {
            Ok(PatchKind::Strategic(serde_json::from_slice(body).map_err(invalid)?))
        }
        "application/json-patch+json" => Ok(PatchKind::Json(serde_json::from_slice(body).map_err(invalid)?)),
        _ => Err(ApiError::unsupported_media_type(format!(
            "the body of the request was in an unknown format ({media}) - accepted media types include: \
             application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json"
        ))),
    }
}

#[allow(clippy::too_many_arguments)]
async fn patch_scoped(
    State(app): State<AppState>,
    namespace: String,
    resource: String,
    name: String,
    Query(params): Params,
    headers: HeaderMap,
    body: Bytes,
    scope: UpdateScope,
) -> ApiResult<Response> {
    let def = updatable_resource_def(&resource, scope)?;
    let patch = parse(&headers, &body)?;
    let mut attempt = 0;
    loop {
        attempt += 1;
        let key = ObjectKey::new(def.plural, &namespace, &name);
        let stored = blocking(&app, move |store| store.get_object(&key))
            .await?
            .ok_or_else(|| ApiError::not_found(def.plural, &name))?;
        let mut patched = stored.value.clone();
        match &patch {
            PatchKind::Merge(p) => json_patch::merge(&mut patched, p),
            PatchKind::Strategic(p) => strategic_merge(&mut patched, p),
            PatchKind::Json(p) => json_patch::patch(&mut patched, p)
                .map_err(|e| ApiError::new_unprocessable(format!("the JSON patch could not be applied: {e}")))?,
        }
        let pinned = patched.pointer("/metadata/resourceVersion").and_then(Value::as_str).map(str::to_string);
        let rv = match pinned.as_deref() {
            Some(text) if text != stored.resource_version.to_string() => {
                text.parse().map_err(|_| ApiError::bad_request(format!("invalid resourceVersion {text:?}")))?
            }
            _ => stored.resource_version,
        };
        if patched.pointer("/metadata/name").and_then(Value::as_str) != Some(name.as_str()) {
            return Err(ApiError::bad_request("metadata.name cannot be changed by a patch"));
        }
        let (obj, warnings) = check_object(def, patched, &params)?;
        match replace(&app, def, &namespace, &name, obj, &stored.value, rv, &params, scope).await {
            Err(e) if e.reason == "Conflict" && rv == stored.resource_version && attempt < RETRIES => continue,
            Err(e) => return Err(e),
            Ok(updated) => return Ok(json_response(StatusCode::OK, &updated, &warnings)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
