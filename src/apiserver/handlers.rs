//! The generic verbs — get, list, create, update, update status, delete — written once for every
//! resource in [`super::resources`].

use std::collections::HashMap;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use super::resources::{self, ResourceDef};
use super::selectors::{FieldSelector, LabelSelector};
use super::status::{ApiError, ApiResult, Cause};
use super::table::{self, Representation};
use super::{blocking, meta, schema, AppState, API_VERSION};
use crate::storage::{ObjectKey, ObjectWrite, Precondition};

pub type Params = Query<HashMap<String, String>>;

pub fn resource_def(plural: &str) -> ApiResult<&'static ResourceDef> {
    resources::lookup(plural).ok_or_else(|| {
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

/// Fields a field selector may name, per resource.
fn selectable_fields(def: &ResourceDef) -> Vec<(&'static str, &'static str)> {
    let mut fields = vec![("metadata.name", "/metadata/name"), ("metadata.namespace", "/metadata/namespace")];
    match def.plural {
        "bundles" => fields.push(("status.phase", "/status/phase")),
        "bundlecontents" => fields.push(("spec.bundle", "/spec/bundle")),
        _ => {}
    }
    fields
}

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
        return super::watch::serve(&app, def, namespace, &params, &headers, labels, fields).await;
    }
    let (objects, rv) = blocking(&app, move |store| store.list_objects(def.plural, namespace.as_deref())).await?;
    let items: Vec<Value> =
        objects.into_iter().map(|o| o.value).filter(|o| labels.matches(o) && fields.matches(o)).collect();
    let list_meta = json!({"resourceVersion": rv.to_string()});
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

/// Parses a request body into an object of `def`'s kind: schema check, unknown-field handling per
/// `fieldValidation`, pruning. Returns the object and any warnings.
fn decode_body(def: &ResourceDef, body: &Bytes, params: &HashMap<String, String>) -> ApiResult<(Value, Vec<String>)> {
    let obj: Value = serde_json::from_slice(body).map_err(|e| cannot_handle(def, e.to_string()))?;
    check_object(def, obj, params)
}

fn cannot_handle(def: &ResourceDef, detail: String) -> ApiError {
    let kind = def.kind;
    ApiError::bad_request(format!("{kind} in version \"v1alpha1\" cannot be handled as a {kind}: {detail}"))
}

/// Checks a whole object (a request body, or the result of a patch) against the resource's
/// schema: kind, unknown fields per `fieldValidation`, types; prunes undeclared fields.
pub(super) fn check_object(
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
    let schema = (def.schema)();
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
    if let Some(map) = obj.as_object_mut() {
        map.insert("metadata".into(), Value::Object(meta));
    }
}

fn validate(def: &ResourceDef, obj: &Value) -> ApiResult<()> {
    let name = obj.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("");
    let mut causes = Vec::new();
    for error in meta::dns1123_subdomain_errors(name) {
        causes.push(Cause::invalid("metadata.name", &json!(name), error));
    }
    causes.extend(meta::label_causes(obj.pointer("/metadata/labels")));
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

/// `generateName` suffix: five characters from Kubernetes' alphabet (no vowels, no look-alikes).
fn random_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let bytes = uuid::Uuid::new_v4().into_bytes();
    bytes.iter().take(5).map(|b| ALPHABET[*b as usize % ALPHABET.len()] as char).collect()
}

pub async fn create(
    State(app): State<AppState>,
    Path((namespace, resource)): Path<(String, String)>,
    Query(params): Params,
    body: Bytes,
) -> ApiResult<Response> {
    let def = writable_resource_def(&resource)?;
    let (mut obj, warnings) = decode_body(def, &body, &params)?;
    let mut meta = take_metadata(&mut obj);
    match meta.get("namespace").and_then(Value::as_str) {
        Some(ns) if !ns.is_empty() && ns != namespace => {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ))
        }
        _ => {}
    }
    let name = meta.get("name").and_then(Value::as_str).unwrap_or("").to_string();
    let name = if name.is_empty() {
        match meta.get("generateName").and_then(Value::as_str).filter(|g| !g.is_empty()) {
            Some(prefix) => format!("{prefix}{}", random_suffix()),
            None => {
                return Err(ApiError::invalid(
                    def.kind,
                    "",
                    vec![Cause::required("metadata.name", "name or generateName is required")],
                ))
            }
        }
    } else {
        name
    };
    if let Some(error) = meta::dns1123_label_errors(&namespace).into_iter().next() {
        return Err(ApiError::invalid(
            def.kind,
            &name,
            vec![Cause::invalid("metadata.namespace", &json!(namespace), error)],
        ));
    }
    meta.insert("name".into(), json!(name));
    meta.insert("namespace".into(), json!(namespace));
    meta.insert("uid".into(), json!(uuid::Uuid::new_v4().to_string()));
    meta.insert("creationTimestamp".into(), json!(meta::now_timestamp()));
    meta.insert("generation".into(), json!(1));
    for field in ["resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds", "selfLink"] {
        meta.remove(field);
    }
    put_metadata(&mut obj, meta);
    validate(def, &obj)?;
    let obj_map = obj.as_object_mut().ok_or_else(|| ApiError::internal("object is not a map"))?;
    obj_map.remove("status");
    if let Some(status) = (def.initial_status)(&obj) {
        obj["status"] = status;
    }
    if dry_run(&params)? {
        return Ok(json_response(StatusCode::CREATED, &obj, &warnings));
    }
    let key = ObjectKey::new(def.plural, &namespace, &name);
    let write = ObjectWrite::Put { key, object: obj, precondition: Precondition::MustNotExist, revision: None };
    let outcome =
        blocking(&app, move |store| store.write_objects(vec![write])).await.map_err(|e| relabel(e, def, &name))?;
    let created = outcome.objects.into_iter().next().unwrap_or(Value::Null);
    Ok(json_response(StatusCode::CREATED, &created, &warnings))
}

/// Re-labels a generic storage error with the resource and name it concerns.
pub(super) fn relabel(err: ApiError, def: &ResourceDef, name: &str) -> ApiError {
    match err.reason {
        "AlreadyExists" => ApiError::already_exists(def.plural, name),
        "Conflict" => ApiError::conflict(def.plural, name),
        "NotFound" => ApiError::not_found(def.plural, name),
        _ => err,
    }
}

/// Which part of the object an update may change.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum UpdateScope {
    Main,
    Status,
}

pub async fn update(
    state: State<AppState>,
    Path((namespace, resource, name)): Path<(String, String, String)>,
    params: Params,
    body: Bytes,
) -> ApiResult<Response> {
    update_scoped(state, namespace, resource, name, params, body, UpdateScope::Main).await
}

pub async fn update_status(
    state: State<AppState>,
    Path((namespace, resource, name)): Path<(String, String, String)>,
    params: Params,
    body: Bytes,
) -> ApiResult<Response> {
    update_scoped(state, namespace, resource, name, params, body, UpdateScope::Status).await
}

async fn update_scoped(
    State(app): State<AppState>,
    namespace: String,
    resource: String,
    name: String,
    Query(params): Params,
    body: Bytes,
    scope: UpdateScope,
) -> ApiResult<Response> {
    let def = writable_resource_def(&resource)?;
    let (obj, warnings) = decode_body(def, &body, &params)?;
    let body_name = obj.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("");
    if body_name != name {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({body_name}) does not match the name on the URL ({name})"
        )));
    }
    let rv_text = obj.pointer("/metadata/resourceVersion").and_then(Value::as_str).unwrap_or("").to_string();
    if rv_text.is_empty() {
        return Err(ApiError::invalid(
            def.kind,
            &name,
            vec![Cause::invalid("metadata.resourceVersion", &json!("0x0"), "must be specified for an update")],
        ));
    }
    let rv: u64 = rv_text.parse().map_err(|_| ApiError::bad_request(format!("invalid resourceVersion {rv_text:?}")))?;
    let old = get_object(&app, def, &namespace, &name).await?;
    let updated = replace(&app, def, &namespace, &name, obj, &old, rv, &params, scope).await?;
    Ok(json_response(StatusCode::OK, &updated, &warnings))
}

/// Writes `obj` over `old` (stored at resourceVersion `rv`), keeping what the scope protects:
/// server-owned metadata always, status on the main resource, everything but status on `status`.
#[allow(clippy::too_many_arguments)]
pub(super) async fn replace(
    app: &AppState,
    def: &'static ResourceDef,
    namespace: &str,
    name: &str,
    mut obj: Value,
    old: &Value,
    rv: u64,
    params: &HashMap<String, String>,
    scope: UpdateScope,
) -> ApiResult<Value> {
    // Server-owned metadata never changes through an update.
    let mut meta = take_metadata(&mut obj);
    for field in ["uid", "creationTimestamp", "namespace", "generation"] {
        if let Some(value) = old.pointer(&format!("/metadata/{field}")) {
            meta.insert(field.into(), value.clone());
        }
    }
    match scope {
        UpdateScope::Main => {
            obj["status"] = old.get("status").cloned().unwrap_or(Value::Null);
            if obj.get("spec") != old.get("spec") {
                let generation = old.pointer("/metadata/generation").and_then(Value::as_u64).unwrap_or(1) + 1;
                meta.insert("generation".into(), json!(generation));
            }
            put_metadata(&mut obj, meta);
        }
        UpdateScope::Status => {
            drop(meta);
            let status = obj.get("status").cloned().unwrap_or(Value::Null);
            obj = old.clone();
            obj["status"] = status;
        }
    }
    if obj.get("status").is_some_and(Value::is_null) {
        if let Some(map) = obj.as_object_mut() {
            map.remove("status");
        }
    }
    validate(def, &obj)?;
    if dry_run(params)? {
        return Ok(obj);
    }
    let key = ObjectKey::new(def.plural, namespace, name);
    let write = ObjectWrite::Put { key, object: obj, precondition: Precondition::ResourceVersion(rv), revision: None };
    let outcome =
        blocking(app, move |store| store.write_objects(vec![write])).await.map_err(|e| relabel(e, def, name))?;
    Ok(outcome.objects.into_iter().next().unwrap_or(Value::Null))
}

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
