//! Reading objects: get, and list with selectors, paging and resourceVersion semantics.

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde_json::{json, Value};

use super::paging;
use super::{json_response, render, resource_def, selectable_fields, Params};
use crate::apiserver::resources::ResourceDef;
use crate::apiserver::selectors::{FieldSelector, LabelSelector};
use crate::apiserver::status::{ApiError, ApiResult};
use crate::apiserver::table::{self, Representation};
use crate::apiserver::{blocking, AppState, API_VERSION};
use crate::storage::{ListQuery, ObjectKey};

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
    let store = app.store.clone();
    let page = tokio::task::spawn_blocking(move || {
        let query =
            ListQuery { resource: def.plural, namespace: namespace.as_deref(), at, after: after.as_deref(), limit };
        store.list_page(&query, &|o| labels.matches(o) && fields.matches(o))
    })
    .await
    .map_err(|e| ApiError::internal(format!("store task failed: {e}")))?
    .map_err(|e| paging::list_error(e, &options))?;
    let items = page.items;
    let mut list_meta = json!({"resourceVersion": page.resource_version.to_string()});
    if let Some(last) = &page.last {
        list_meta["continue"] = json!(paging::continue_token(page.resource_version, last));
    }
    let body = match table::negotiate(&headers, params.get("includeObject").map(String::as_str)) {
        Representation::Table { include } => table::table(def, &items, include, list_meta),
        Representation::Metadata => json!({
            "kind": "PartialObjectMetadataList",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": list_meta,
            "items": items.iter().map(table::partial_object_metadata).collect::<Vec<_>>(),
        }),
        Representation::Object => json!({
            "kind": def.list_kind,
            "apiVersion": API_VERSION,
            "metadata": list_meta,
            "items": items,
        }),
    };
    Ok(json_response(StatusCode::OK, &body, &[]))
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
