//! Reading objects: get, and list with selectors, paging and resourceVersion semantics. A list is
//! serialised object by object as the store reads it ([`ListBody`]), never built as one document.

use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use super::paging;
use super::{json_response, render, resource_def, selectable_fields, Params};
use crate::apiserver::resources::ResourceDef;
use crate::apiserver::selectors::{FieldSelector, LabelSelector};
use crate::apiserver::status::{ApiError, ApiResult};
use crate::apiserver::table::{self, Representation};
use crate::apiserver::{blocking, AppState, API_VERSION};
use crate::storage::{ListQuery, ListSink, ObjectKey};

pub async fn list_all(
    state: State<AppState>,
    Path(resource): Path<String>,
    params: Params,
    headers: HeaderMap,
) -> ApiResult<Response> {
    list(state, None, &resource, params, headers).await
}

pub async fn list_namespaced(
    state: State<AppState>,
    Path((namespace, resource)): Path<(String, String)>,
    params: Params,
    headers: HeaderMap,
) -> ApiResult<Response> {
    list(state, Some(namespace), &resource, params, headers).await
}

async fn list(
    State(app): State<AppState>,
    namespace: Option<String>,
    resource: &str,
    Query(params): Params,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let def = resource_def(resource)?;
    let labels = LabelSelector::parse(params.get("labelSelector").map(String::as_str).unwrap_or(""))?;
    let fields =
        FieldSelector::parse(params.get("fieldSelector").map(String::as_str).unwrap_or(""), &selectable_fields(def))?;
    if params.get("watch").is_some_and(|w| w == "true" || w == "1") {
        return crate::apiserver::watch::serve(&app, def, namespace, &params, &headers, labels, fields).await;
    }
    let options = paging::parse(&params)?;
    paging::wait_for(&app, options.not_older_than).await?;
    let (at, after, limit) = (options.at, options.after.clone(), options.limit);
    let representation = table::negotiate(&headers, params.get("includeObject").map(String::as_str));
    let body = ListBody { def, representation, items: Vec::new() };
    let store = app.store.clone();
    let page = tokio::task::spawn_blocking(move || {
        let query =
            ListQuery { resource: def.plural, namespace: namespace.as_deref(), at, after: after.as_deref(), limit };
        store.list_into(&query, &|o| labels.matches(o) && fields.matches(o), body)
    })
    .await
    .map_err(|e| ApiError::internal(format!("store task failed: {e}")))?
    .map_err(|e| paging::list_error(e, &options))?;
    let mut list_meta = json!({"resourceVersion": page.resource_version.to_string()});
    if let Some(last) = &page.last {
        list_meta["continue"] = json!(paging::continue_token(page.resource_version, last));
    }
    Ok(page.items.into_response(list_meta))
}

/// A list response written while the store reads the list: every object goes straight into JSON
/// bytes, in the representation the client asked for, so a list holds one decoded object at a time.
struct ListBody {
    def: &'static ResourceDef,
    representation: Representation,
    /// The items so far, comma-separated.
    items: Vec<u8>,
}

impl ListSink for ListBody {
    fn push(&mut self, object: Value) {
        if !self.items.is_empty() {
            self.items.push(b',');
        }
        // Writing a JSON value into memory cannot fail.
        let _ = match self.representation {
            Representation::Object => serde_json::to_writer(&mut self.items, &object),
            Representation::Metadata => {
                serde_json::to_writer(&mut self.items, &table::partial_object_metadata(&object))
            }
            Representation::Table { include } => {
                serde_json::to_writer(&mut self.items, &table::row(self.def, &object, include))
            }
        };
    }

    fn restart(&mut self) {
        self.items.clear();
    }
}

impl ListBody {
    /// The whole list: its head (kind, apiVersion, `list_meta`, a table's columns), the items, and
    /// the closing brackets, sent as three chunks of one known length.
    fn into_response(self, list_meta: Value) -> Response {
        let (head, items_field) = match self.representation {
            Representation::Object => {
                (json!({"kind": self.def.list_kind, "apiVersion": API_VERSION, "metadata": list_meta}), "items")
            }
            Representation::Metadata => (
                json!({"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1", "metadata": list_meta}),
                "items",
            ),
            Representation::Table { .. } => (
                json!({
                    "kind": "Table",
                    "apiVersion": "meta.k8s.io/v1",
                    "metadata": list_meta,
                    "columnDefinitions": table::columns(self.def),
                }),
                "rows",
            ),
        };
        let mut head = head.to_string();
        head.pop(); // the object's closing brace: the items follow
        head.push_str(&format!(",\"{items_field}\":["));
        let tail: &'static [u8] = b"]}";
        let length = head.len() + self.items.len() + tail.len();
        let chunks = [Bytes::from(head), Bytes::from(self.items), Bytes::from_static(tail)];
        let body = Body::from_stream(futures_util::stream::iter(chunks.map(Ok::<_, std::io::Error>)));
        let headers =
            [(header::CONTENT_TYPE, "application/json".to_string()), (header::CONTENT_LENGTH, length.to_string())];
        (StatusCode::OK, headers, body).into_response()
    }
}

pub async fn get(
    State(app): State<AppState>,
    Path((namespace, resource, name)): Path<(String, String, String)>,
    Query(params): Params,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let def = resource_def(&resource)?;
    let obj = get_object(&app, def, &namespace, &name).await?;
    Ok(json_response(StatusCode::OK, &render(def, &obj, &headers, &params), &[]))
}

pub async fn get_object(app: &AppState, def: &ResourceDef, namespace: &str, name: &str) -> ApiResult<Value> {
    let key = ObjectKey::new(def.plural, namespace, name);
    blocking(app, move |store| store.get_object(&key))
        .await?
        .map(|o| o.value)
        .ok_or_else(|| ApiError::not_found(def.plural, name))
}
