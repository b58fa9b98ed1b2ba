//! Deleting objects: one, or a collection. The semantics (finalizers, propagation policies,
//! preconditions) live in [`crate::apiserver::lifecycle`]; these handlers parse and respond.

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{json, Value};

use super::{dry_run, json_response, relabel, resource_def, selectable_fields, Params};
use crate::apiserver::lifecycle::{self, DeleteOptions, Deleted};
use crate::apiserver::selectors::{FieldSelector, LabelSelector};
use crate::apiserver::status::ApiResult;
use crate::apiserver::{blocking, AppState, API_VERSION};
use crate::storage::{ObjectKey, StorageError};

/// DELETE on one object: 200 with the object, as it was last if it is gone, or with its
/// deletionTimestamp if finalizers (including the propagation policy's) hold it.
pub async fn delete(
    State(app): State<AppState>,
    Path((namespace, resource, name)): Path<(String, String, String)>,
    Query(params): Params,
    body: Bytes,
) -> ApiResult<Response> {
    let def = resource_def(&resource)?;
    let options = DeleteOptions::parse(&body, &params)?;
    let dry = dry_run(&params)?;
    let key = ObjectKey::new(def.plural, &namespace, &name);
    let outcome = blocking(&app, move |store| lifecycle::delete(store, def, &key, &options, dry))
        .await
        .map_err(|e| relabel(e, def, &name))?;
    let (Deleted::Gone(object) | Deleted::Pending(object)) = outcome;
    Ok(json_response(StatusCode::OK, &object, &[]))
}

/// DELETE on a collection (`kubectl delete bundles --all`, the namespace controller): every object
/// the selectors match, one by one, each with the request's DeleteOptions.
pub async fn delete_collection(
    State(app): State<AppState>,
    Path((namespace, resource)): Path<(String, String)>,
    Query(params): Params,
    body: Bytes,
) -> ApiResult<Response> {
    let def = resource_def(&resource)?;
    let labels = LabelSelector::parse(params.get("labelSelector").map(String::as_str).unwrap_or(""))?;
    let fields =
        FieldSelector::parse(params.get("fieldSelector").map(String::as_str).unwrap_or(""), &selectable_fields(def))?;
    let options = DeleteOptions::parse(&body, &params)?;
    let dry = dry_run(&params)?;
    let deleted = blocking(&app, move |store| {
        let (objects, _) = store.list_objects(def.plural, Some(&namespace))?;
        let mut deleted = Vec::new();
        for object in objects.into_iter().map(|o| o.value).filter(|o| labels.matches(o) && fields.matches(o)) {
            let name = object.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("");
            let key = ObjectKey::new(def.plural, &namespace, name);
            match lifecycle::delete(store, def, &key, &options, dry) {
                Ok(Deleted::Gone(last) | Deleted::Pending(last)) => deleted.push(last),
                // Gone meanwhile (e.g. collected with its owner a moment ago).
                Err(StorageError::NotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(deleted)
    })
    .await?;
    let body = json!({"kind": def.list_kind, "apiVersion": API_VERSION, "metadata": {}, "items": deleted});
    Ok(json_response(StatusCode::OK, &body, &[]))
}
