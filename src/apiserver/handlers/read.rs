//! Reading objects: get, and list with selectors, paging and resourceVersion semantics. A list is
//! serialised object by object as the store reads it ([`ListBody`]), never built as one document;
//! a long one is read and sent in steps as the client takes them (no thread waits for the client).
//! A full object (a get, or a list's item) is sent as the store holds its JSON, never decoded and
//! encoded again; only selectors, `PartialObjectMetadata` and `Table` decode it.

use axum::body::{Body, Bytes};
use axum::extract::{Extension, Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use std::sync::Arc;

use super::paging;
use super::{json_response, render, resource_def, Params};
use crate::apiserver::selectors::{FieldSelector, LabelSelector};
use crate::apiserver::selectors::{FieldSelector as Fields, LabelSelector as Labels};
use crate::apiserver::stall::ConnectionCut;
use crate::apiserver::status::{ApiError, ApiResult, ListFailure};
use crate::apiserver::table::{self, Representation};
use crate::apiserver::{blocking, AppState, ChannelStream};
use crate::storage::{ListCursor, ListFilter, ListQuery, ListSink, Listed, ObjectKey, StorageError};
use crate::strategy::ResourceDef;

pub async fn list_all(
    state: State<AppState>,
    Path(resource): Path<String>,
    params: Params,
    cut: Option<Extension<ConnectionCut>>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    list(state, None, &resource, params, cut, headers).await
}

pub async fn list_namespaced(
    state: State<AppState>,
    Path((namespace, resource)): Path<(String, String)>,
    params: Params,
    cut: Option<Extension<ConnectionCut>>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    list(state, Some(namespace), &resource, params, cut, headers).await
}

async fn list(
    state: State<AppState>,
    namespace: Option<String>,
    resource: &str,
    params: Params,
    cut: Option<Extension<ConnectionCut>>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    list_of(state, namespace, resource_def(resource)?, params, cut, headers).await
}

/// A list (or watch) of `def`'s objects, in `namespace` or all.
pub(crate) async fn list_of(
    State(app): State<AppState>,
    namespace: Option<String>,
    def: &'static ResourceDef,
    Query(params): Params,
    cut: Option<Extension<ConnectionCut>>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let labels = LabelSelector::parse(params.get("labelSelector").map(String::as_str).unwrap_or(""))?;
    let fields = FieldSelector::parse(
        params.get("fieldSelector").map(String::as_str).unwrap_or(""),
        &def.all_selectable_fields(),
    )?;
    if params.get("watch").is_some_and(|w| w == "true" || w == "1") {
        let cut = cut.map(|Extension(cut)| cut);
        return crate::apiserver::watch::serve(&app, def, namespace, &params, &headers, labels, fields, cut).await;
    }
    let options = paging::parse(&params)?;
    paging::wait_for(&app, options.not_older_than).await?;
    let (at, after, limit) = (options.at, options.after.clone(), options.limit);
    let representation = table::negotiate(&headers, params.get("includeObject").map(String::as_str));
    let filter = step_filter(labels, fields);
    let step_filter = filter.clone();
    let store = app.store.clone();
    let (cursor, body) = tokio::task::spawn_blocking(move || {
        let query =
            ListQuery { resource: def.plural, namespace: namespace.as_deref(), at, after: after.as_deref(), limit };
        let mut body = ListBody::new(def, representation);
        let cursor = store.list_start(&query, list_filter(&step_filter), &mut body)?;
        Ok::<_, StorageError>((cursor, body))
    })
    .await
    .map_err(ApiError::from)?
    .map_err(|error| ApiError::from(ListFailure { error, options: &options }))?;
    Ok(body.into_response(app, cursor, filter, limit.is_some()))
}

/// Filters a list step by step (selectors), shared by the steps on the blocking pool; `None`
/// keeps every object (and the objects need not be decoded).
pub(crate) type StepFilter = Option<Arc<dyn Fn(&Value) -> bool + Send + Sync>>;

/// The filter of a list's selectors: `None` when they select everything.
fn step_filter(labels: Labels, fields: Fields) -> StepFilter {
    if labels.is_empty() && fields.is_empty() {
        return None;
    }
    Some(Arc::new(move |o: &Value| labels.matches(o) && fields.matches(o)))
}

/// A step filter as the store takes it.
pub(crate) fn list_filter(filter: &StepFilter) -> ListFilter<'_> {
    filter.as_deref().map(|f| f as &dyn Fn(&Value) -> bool)
}

/// Reads the next step of `cursor` into `sink` on the blocking pool (a short call: the step ends
/// once the sink is full); gives both back for the next one.
pub(crate) async fn next_step<S: ListSink + Send + 'static>(
    app: &AppState,
    mut cursor: ListCursor,
    filter: &StepFilter,
    mut sink: S,
) -> ApiResult<(ListCursor, S)> {
    let filter = filter.clone();
    blocking(app, move |store| {
        cursor.fill(store, list_filter(&filter), &mut sink)?;
        Ok((cursor, sink))
    })
    .await
}

/// Bytes of rendered objects, and objects, per step of a list: what a list holds at a time.
const STEP_BYTES: usize = 1 << 20;
const STEP_OBJECTS: usize = 500;

/// A list response written while the store reads the list: every object goes straight into JSON
/// bytes, in the representation the client asked for, so a list holds one decoded object and at
/// most one step of output at a time.
struct ListBody {
    def: &'static ResourceDef,
    representation: Representation,
    /// The items of this step, comma-separated (and preceded by one if an earlier step had items).
    items: Vec<u8>,
    /// Objects in this step.
    count: usize,
    /// Whether any item was written, in this step or before.
    any: bool,
}

impl ListSink for ListBody {
    fn push(&mut self, mut object: Listed<'_>) -> Result<(), StorageError> {
        if self.any {
            self.items.push(b',');
        }
        self.any = true;
        self.count += 1;
        // Writing a JSON value into memory cannot fail.
        match self.representation {
            Representation::Object => match self.def.view {
                Some(view) => {
                    let _ = serde_json::to_writer(&mut self.items, &view(object.value()?));
                }
                None => object.write_json(&mut self.items),
            },
            Representation::Metadata => {
                let _ = serde_json::to_writer(&mut self.items, &table::partial_object_metadata(object.value()?));
            }
            Representation::Table { include } => {
                let _ = serde_json::to_writer(&mut self.items, &table::row(self.def, object.value()?, include));
            }
        }
        Ok(())
    }

    fn restart(&mut self) {
        self.items.clear();
        self.count = 0;
        self.any = false;
    }

    fn is_full(&self) -> bool {
        self.items.len() >= STEP_BYTES || self.count >= STEP_OBJECTS
    }
}

impl ListBody {
    fn new(def: &'static ResourceDef, representation: Representation) -> ListBody {
        ListBody { def, representation, items: Vec::new(), count: 0, any: false }
    }

    /// This step's items; the body is ready for the next step.
    fn take_items(&mut self) -> Bytes {
        self.count = 0;
        Bytes::from(std::mem::take(&mut self.items))
    }

    /// The list document's head (kind, apiVersion, `list_meta` unless `None`, a table's columns)
    /// up to the opening bracket of its items.
    fn head(&self, list_meta: Option<Value>) -> String {
        let (mut head, items_field) = match self.representation {
            Representation::Object => {
                (json!({"kind": self.def.list_kind, "apiVersion": self.def.api_version}), "items")
            }
            Representation::Metadata => {
                (json!({"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1"}), "items")
            }
            Representation::Table { .. } => (
                json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "columnDefinitions": table::columns(self.def)}),
                "rows",
            ),
        };
        if let Some(list_meta) = list_meta {
            crate::apiserver::schema::set_field(&mut head, "metadata", list_meta);
        }
        let mut head = head.to_string();
        head.pop(); // the object's closing brace: the items follow
        head.push_str(&format!(",\"{items_field}\":["));
        head
    }

    /// The response. A list read in one step is sent with its length. A longer one is streamed,
    /// step by step as the client takes it: its `metadata` comes first when no limit was asked
    /// for (no `continue` can follow), else after the items, once the page's end is known. A step
    /// that fails (the change log no longer covers the list's version) cuts the stream, so the
    /// client sees an error, never a short list.
    fn into_response(mut self, app: AppState, cursor: ListCursor, filter: StepFilter, limited: bool) -> Response {
        let meta = |cursor: &ListCursor| {
            let rv = cursor.resource_version();
            match cursor.continue_after() {
                Some(last) => {
                    json!({"resourceVersion": rv.to_string(), "continue": paging::continue_token(rv, last)})
                }
                None => json!({"resourceVersion": rv.to_string()}),
            }
        };
        let headers = [(header::CONTENT_TYPE, "application/json")];
        if cursor.is_done() {
            let head = self.head(Some(meta(&cursor)));
            let tail: &'static [u8] = b"]}";
            let length = head.len() + self.items.len() + tail.len();
            let chunks = [Bytes::from(head), self.take_items(), Bytes::from_static(tail)];
            let body = Body::from_stream(futures_util::stream::iter(chunks.map(Ok::<_, std::io::Error>)));
            return (StatusCode::OK, headers, [(header::CONTENT_LENGTH, length.to_string())], body).into_response();
        }
        let meta_first = !limited;
        let head = self.head(meta_first.then(|| meta(&cursor)));
        let (tx, rx) = tokio::sync::mpsc::channel(2);
        tokio::spawn(async move {
            let first = [Bytes::from(head), self.take_items()];
            for chunk in first {
                if tx.send(Ok(chunk)).await.is_err() {
                    return;
                }
            }
            let (mut cursor, mut body) = (cursor, self);
            while !cursor.is_done() {
                (cursor, body) = match next_step(&app, cursor, &filter, body).await {
                    Ok(next) => next,
                    Err(e) => {
                        tracing::warn!(error = %e.message, "a streamed list ended early");
                        let _ = tx.send(Err(std::io::Error::other(e.message))).await;
                        return;
                    }
                };
                if tx.send(Ok(body.take_items())).await.is_err() {
                    return; // the client went away
                }
            }
            let tail = if meta_first { "]}".to_string() } else { format!("],\"metadata\":{}}}", meta(&cursor)) };
            let _ = tx.send(Ok(Bytes::from(tail))).await;
        });
        (StatusCode::OK, headers, Body::from_stream(ChannelStream(rx))).into_response()
    }
}

pub async fn get(
    state: State<AppState>,
    Path((namespace, resource, name)): Path<(String, String, String)>,
    params: Params,
    headers: HeaderMap,
) -> ApiResult<Response> {
    get_of(state, resource_def(&resource)?, namespace, name, params, headers).await
}

/// One of `def`'s objects.
pub(crate) async fn get_of(
    State(app): State<AppState>,
    def: &'static ResourceDef,
    namespace: String,
    name: String,
    Query(params): Params,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let representation = table::negotiate(&headers, params.get("includeObject").map(String::as_str));
    if let (Some(view), Representation::Object) = (def.view, representation) {
        let obj = get_object(&app, def, &namespace, &name).await?;
        return Ok(json_response(StatusCode::OK, &view(&obj), &[]));
    }
    if representation != Representation::Object {
        let obj = get_object(&app, def, &namespace, &name).await?;
        return Ok(json_response(StatusCode::OK, &render(def, &obj, &headers, &params), &[]));
    }
    // The object as stored is the response: read here when that blocks no thread (a local store,
    // the object's last change durable; a replica's object cache found current), else on the
    // blocking pool.
    let key = ObjectKey::new(def.plural, &namespace, &name);
    let json = match app.store.get_object_json_now(&key).await.map_err(ApiError::from)? {
        Some(json) => json,
        None => blocking(&app, move |store| store.get_object_json(&key)).await?,
    };
    let json = json.ok_or_else(|| ApiError::not_found(def.plural, &name))?;
    Ok((StatusCode::OK, [(header::CONTENT_TYPE, "application/json")], json).into_response())
}

pub async fn get_object(app: &AppState, def: &ResourceDef, namespace: &str, name: &str) -> ApiResult<Value> {
    let key = ObjectKey::new(def.plural, namespace, name);
    blocking(app, move |store| store.get_object(&key))
        .await?
        .map(|o| o.value)
        .ok_or_else(|| ApiError::not_found(def.plural, name))
}
