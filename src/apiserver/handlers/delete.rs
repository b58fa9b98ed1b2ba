//! Deleting objects: one, or a collection.

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{json, Value};

use super::{dry_run, get_object, json_response, relabel, resource_def, selectable_fields, Params};
use crate::apiserver::selectors::{FieldSelector, LabelSelector};
use crate::apiserver::status::{ApiError, ApiResult};
use crate::apiserver::{blocking, AppState, API_VERSION};
use crate::storage::{ObjectKey, ObjectWrite, Precondition};

pub async fn delete(
    State(app): State<AppState>,
    Path((namespace, resource, name)): Path<(String, String, String)>,
    Query(params): Params,
    body: Bytes,
) -> ApiResult<Response> {
    let def = resource_def(&resource)?;
    let options: Value = if body.is_empty() {
        json!({})
    } else {
        serde_json::from_slice(&body).map_err(|e| ApiError::bad_request(format!("invalid DeleteOptions: {e}")))?
    };
    let old = get_object(&app, def, &namespace, &name).await?;
    let uid = options.pointer("/preconditions/uid").and_then(Value::as_str);
    if uid.is_some_and(|uid| Some(uid) != old.pointer("/metadata/uid").and_then(Value::as_str)) {
        return Err(ApiError::conflict(def.plural, &name));
    }
    let precondition = match options.pointer("/preconditions/resourceVersion").and_then(Value::as_str) {
        Some(rv) => Precondition::ResourceVersion(
            rv.parse().map_err(|_| ApiError::bad_request(format!("invalid resourceVersion {rv:?}")))?,
        ),
        None => Precondition::MustExist,
    };
    if dry_run(&params)? {
        return Ok(json_response(StatusCode::OK, &old, &[]));
    }
    let key = ObjectKey::new(def.plural, &namespace, &name);
    let on_delete = def.on_delete;
    let outcome = blocking(&app, move |store| {
        let mut writes = vec![ObjectWrite::Delete { key, precondition }];
        writes.extend(on_delete(store, &old)?);
        store.write_objects(writes)
    })
    .await
    .map_err(|e| relabel(e, def, &name))?;
    let deleted = outcome.objects.into_iter().next().unwrap_or(Value::Null);
    Ok(json_response(StatusCode::OK, &deleted, &[]))
}

/// DELETE on a collection (`kubectl delete bundles --all`, the namespace controller): every object
/// the selectors match, each with its delete hook, one atomic write per object.
pub async fn delete_collection(
    State(app): State<AppState>,
    Path((namespace, resource)): Path<(String, String)>,
    Query(params): Params,
) -> ApiResult<Response> {
    let def = resource_def(&resource)?;
    let labels = LabelSelector::parse(params.get("labelSelector").map(String::as_str).unwrap_or(""))?;
    let fields =
        FieldSelector::parse(params.get("fieldSelector").map(String::as_str).unwrap_or(""), &selectable_fields(def))?;
    let dry = dry_run(&params)?;
    let deleted = blocking(&app, move |store| {
        let (objects, _) = store.list_objects(def.plural, Some(&namespace))?;
        let mut deleted = Vec::new();
        for object in objects.into_iter().map(|o| o.value).filter(|o| labels.matches(o) && fields.matches(o)) {
            if dry {
                deleted.push(object);
                continue;
            }
            let name = object.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("");
            let mut writes = vec![ObjectWrite::Delete {
                key: ObjectKey::new(def.plural, &namespace, name),
                precondition: Precondition::MustExist,
            }];
            writes.extend((def.on_delete)(store, &object)?);
            match store.write_objects(writes) {
                Ok(outcome) => deleted.extend(outcome.objects.into_iter().next()),
                // Already gone (e.g. a BundleContent deleted with its Bundle a moment ago).
                Err(crate::storage::StorageError::NotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(deleted)
    })
    .await?;
    let body = json!({"kind": def.list_kind, "apiVersion": API_VERSION, "metadata": {}, "items": deleted});
    Ok(json_response(StatusCode::OK, &body, &[]))
}
