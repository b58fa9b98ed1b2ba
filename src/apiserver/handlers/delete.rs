//! Deleting objects: one, or a collection. The semantics (finalizers, propagation policies,
//! preconditions) live in [`crate::apiserver::lifecycle`]; these handlers parse and respond.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use super::{dry_run, json_response, relabel, resource_def, Params};
use crate::apiserver::lifecycle::{self, DeleteOptions, Deleted};
use crate::apiserver::selectors::{FieldSelector, LabelSelector};
use crate::apiserver::status::ApiResult;
use crate::apiserver::{blocking, AppState, ChannelStream};
use crate::storage::{ObjectKey, StorageError};
use crate::strategy::ResourceDef;

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
/// the selectors match, one by one, each with the request's DeleteOptions. The objects are read a
/// page at a time without the store's write lock; the first page is deleted before the response
/// starts (its errors are the response's), the rest while the deleted objects are streamed out.
pub async fn delete_collection(
    State(app): State<AppState>,
    Path((namespace, resource)): Path<(String, String)>,
    Query(params): Params,
    body: Bytes,
) -> ApiResult<Response> {
    let def = resource_def(&resource)?;
    let labels = LabelSelector::parse(params.get("labelSelector").map(String::as_str).unwrap_or(""))?;
    let fields = FieldSelector::parse(
        params.get("fieldSelector").map(String::as_str).unwrap_or(""),
        &def.all_selectable_fields(),
    )?;
    let options = DeleteOptions::parse(&body, &params)?;
    let dry = dry_run(&params)?;
    let collection = Arc::new(Collection { def, namespace, labels, fields, options, dry });
    let (first, mut after) = delete_page(&app, &collection, None).await?;
    let mut head = json!({"kind": def.list_kind, "apiVersion": def.api_version, "metadata": {}}).to_string();
    head.pop(); // the closing brace: the items follow
    head.push_str(",\"items\":[");
    if after.is_none() {
        let mut whole = head.into_bytes();
        whole.extend_from_slice(&first);
        whole.extend_from_slice(b"]}");
        return Ok((StatusCode::OK, [(header::CONTENT_TYPE, "application/json")], whole).into_response());
    }
    let (tx, rx) = tokio::sync::mpsc::channel(2);
    tokio::spawn(async move {
        let mut any = !first.is_empty();
        for chunk in [Bytes::from(head), first] {
            if tx.send(Ok(chunk)).await.is_err() {
                return;
            }
        }
        while let Some(from) = after.take() {
            let mut items = match delete_page(&app, &collection, Some(from)).await {
                Ok((items, next)) => {
                    after = next;
                    items
                }
                Err(e) => {
                    tracing::warn!(error = %e.message, "deletecollection ended early");
                    let _ = tx.send(Err(std::io::Error::other(e.message))).await;
                    return;
                }
            };
            if any && !items.is_empty() {
                items = [&b","[..], &items].concat().into();
            }
            any |= !items.is_empty();
            // The client went away: stop deleting (what is left is still there to delete again).
            if tx.send(Ok(items)).await.is_err() {
                return;
            }
        }
        let _ = tx.send(Ok(Bytes::from_static(b"]}"))).await;
    });
    Ok((StatusCode::OK, [(header::CONTENT_TYPE, "application/json")], Body::from_stream(ChannelStream(rx)))
        .into_response())
}

/// What a deletecollection deletes, and how.
struct Collection {
    def: &'static ResourceDef,
    namespace: String,
    labels: LabelSelector,
    fields: FieldSelector,
    options: DeleteOptions,
    dry: bool,
}

/// Objects read (and deleted if selected) per step of a deletecollection.
const PAGE: usize = 256;

/// Deletes the selected objects of the page after `after`: their last states as comma-separated
/// JSON, and where the next page starts.
async fn delete_page(
    app: &AppState,
    collection: &Arc<Collection>,
    after: Option<String>,
) -> ApiResult<(Bytes, Option<String>)> {
    let c = collection.clone();
    blocking(app, move |store| {
        let (objects, next) = store.objects_page(c.def.plural, Some(&c.namespace), after.as_deref(), PAGE)?;
        let mut items: Vec<u8> = Vec::new();
        for object in objects.into_iter().map(|o| o.value).filter(|o| c.labels.matches(o) && c.fields.matches(o)) {
            let name = object.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("");
            let key = ObjectKey::new(c.def.plural, &c.namespace, name);
            let last = match lifecycle::delete(store, c.def, &key, &c.options, c.dry) {
                Ok(Deleted::Gone(last) | Deleted::Pending(last)) => last,
                // Gone meanwhile (e.g. collected with its owner a moment ago).
                Err(StorageError::NotFound(_)) => continue,
                Err(e) => return Err(e),
            };
            if !items.is_empty() {
                items.push(b',');
            }
            // Writing a JSON value into memory cannot fail.
            let _ = serde_json::to_writer(&mut items, &last);
        }
        Ok((Bytes::from(items), next))
    })
    .await
}
