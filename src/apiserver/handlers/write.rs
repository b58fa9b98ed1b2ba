//! Writing objects: create and update (of the object or its `status`), and [`replace`], the one
//! path every change to an existing object (update, patch) goes through.

use std::collections::HashMap;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde_json::{json, Value};

use super::{
    decode_body, dry_run, field_manager, get_object, json_response, put_metadata, relabel, take_metadata,
    updatable_resource_def, validate, writable_resource_def, Params, UpdateScope,
};
use crate::api::meta;
use crate::apiserver::access::{check_secret_access, Identity};
use crate::apiserver::schema::set_field;
use crate::apiserver::status::{ApiError, ApiResult, Cause};
use crate::apiserver::{blocking, fieldmanager, lifecycle, write_objects, AppState};
use crate::auth::UserInfo;
use crate::storage::{ObjectKey, ObjectWrite, Precondition, StoredObject};
use crate::strategy::{self, ResourceDef};

/// `generateName` suffix: five characters from Kubernetes' alphabet (no vowels, no look-alikes).
fn random_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let bytes = uuid::Uuid::new_v4().into_bytes();
    bytes
        .iter()
        .take(5)
        .filter_map(|b| ALPHABET.get(usize::from(*b) % ALPHABET.len()).map(|c| char::from(*c)))
        .collect()
}

/// How a write is made: its query parameters, which part of the object it may change, and who
/// makes it.
pub(crate) struct WriteRequest<'a> {
    pub def: &'static ResourceDef,
    pub namespace: &'a str,
    pub params: &'a HashMap<String, String>,
    pub scope: UpdateScope,
    /// Who asks (the write may not name Secrets they cannot read).
    pub user: &'a UserInfo,
    /// The field manager of a non-apply write, whose ownership the write records in
    /// `managedFields`; `None` when they were computed already (server-side apply).
    pub manager: Option<&'a str>,
}

impl WriteRequest<'_> {
    /// `managedFields` for a non-apply write of `new` over `old`. Like kube-apiserver, a write
    /// whose ownership cannot be computed still goes ahead, without managedFields.
    fn track(&self, old: Option<&Value>, new: Value) -> Value {
        let Some(manager) = self.manager else { return new };
        let subresource = (self.scope == UpdateScope::Status).then_some("status");
        let schema = crate::apiserver::schema::of(self.def);
        match fieldmanager::update(&schema, old, new.clone(), manager, subresource, &meta::now_timestamp()) {
            Ok(tracked) => tracked,
            Err(e) => {
                tracing::warn!(error = %e, "managedFields not updated; resetting them");
                let mut new = new;
                if let Some(meta) = new.get_mut("metadata").and_then(Value::as_object_mut) {
                    meta.remove("managedFields");
                }
                new
            }
        }
    }
}

pub async fn create(
    State(app): State<AppState>,
    Path((namespace, resource)): Path<(String, String)>,
    Query(params): Params,
    Identity(user): Identity,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    let def = writable_resource_def(&resource)?;
    let manager = field_manager(&params, &headers)?;
    let (obj, warnings) = decode_body(def, &body, &params)?;
    let scope = UpdateScope::Main;
    let request =
        WriteRequest { def, namespace: &namespace, params: &params, scope, user: &user, manager: Some(&manager) };
    let created = create_object(&app, &request, obj).await?;
    Ok(json_response(StatusCode::CREATED, &created, &warnings))
}

/// The object a create writes, and its name: server-owned metadata set, status initialised,
/// validated. Everything but the Secret check and the write itself.
pub(crate) fn new_object(request: &WriteRequest<'_>, mut obj: Value) -> ApiResult<(String, Value)> {
    let (def, namespace) = (request.def, request.namespace);
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
    if let Some(error) = meta::dns1123_label_errors(namespace).into_iter().next() {
        return Err(ApiError::invalid(
            def.kind,
            &name,
            vec![Cause::invalid("metadata.namespace", &json!(namespace), error)],
        ));
    }
    meta.insert("name".into(), json!(name));
    meta.insert("namespace".into(), json!(namespace));
    strategy::stamp_new(&mut meta);
    put_metadata(&mut obj, meta);
    if let Some(map) = obj.as_object_mut() {
        map.remove("status");
    }
    (def.default)(&mut obj);
    let mut obj = request.track(None, obj);
    validate(def, &obj, Vec::new())?;
    if let Some(status) = (def.initial_status)(&obj) {
        set_field(&mut obj, "status", status);
    }
    Ok((name, obj))
}

/// Creates an object from a checked body: name (or generateName), server-owned metadata, initial
/// status, validation, then a write that fails if the name is taken.
pub(in crate::apiserver) async fn create_object(
    app: &AppState,
    request: &WriteRequest<'_>,
    obj: Value,
) -> ApiResult<Value> {
    let (def, namespace) = (request.def, request.namespace);
    let (name, obj) = new_object(request, obj)?;
    check_secret_access(app, def, request.user, None, &obj).await?;
    if dry_run(request.params)? {
        return Ok(obj);
    }
    let key = ObjectKey::new(def.plural, namespace, &name);
    let write = ObjectWrite::Put { key, object: obj, precondition: Precondition::MustNotExist, revision: None };
    let outcome = write_objects(app, vec![write]).await.map_err(|e| relabel(e, def, &name))?;
    Ok(outcome.objects.into_iter().next().unwrap_or(Value::Null))
}

/// PUT on an object or its `status`.
pub async fn update(
    State(app): State<AppState>,
    Path((namespace, resource, name)): Path<(String, String, String)>,
    Query(params): Params,
    scope: UpdateScope,
    Identity(user): Identity,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    let def = updatable_resource_def(&resource, scope)?;
    let manager = field_manager(&params, &headers)?;
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
    let request =
        WriteRequest { def, namespace: &namespace, params: &params, scope, user: &user, manager: Some(&manager) };
    let updated = replace(&app, &request, &name, obj, &old, rv).await?;
    Ok(json_response(StatusCode::OK, &updated, &warnings))
}

/// What an update of `old` with `obj` writes: server-owned metadata kept, the scope's protected
/// part carried over, deletion state carried, validated. Everything but the Secret check and the
/// write itself.
pub(crate) fn replacement(request: &WriteRequest<'_>, mut obj: Value, old: &Value) -> ApiResult<Value> {
    let (def, scope) = (request.def, request.scope);
    // Server-owned metadata never changes through an update.
    let mut meta = take_metadata(&mut obj);
    for field in ["uid", "creationTimestamp", "namespace", "generation"] {
        if let Some(value) = old.pointer(&format!("/metadata/{field}")) {
            meta.insert(field.into(), value.clone());
        }
    }
    match scope {
        UpdateScope::Main => {
            (def.default)(&mut obj);
            set_field(&mut obj, "status", old.get("status").cloned().unwrap_or(Value::Null));
            if obj.get("spec") != old.get("spec") {
                let generation =
                    old.pointer("/metadata/generation").and_then(Value::as_u64).unwrap_or(1).saturating_add(1);
                meta.insert("generation".into(), json!(generation));
            }
            put_metadata(&mut obj, meta);
        }
        UpdateScope::Status => {
            drop(meta);
            let status = obj.get("status").cloned().unwrap_or(Value::Null);
            obj = old.clone();
            set_field(&mut obj, "status", status);
        }
    }
    if obj.get("status").is_some_and(Value::is_null) {
        if let Some(map) = obj.as_object_mut() {
            map.remove("status");
        }
    }
    let mut obj = request.track(Some(old), obj);
    let mut causes = lifecycle::carry_deletion_state(old, &mut obj);
    if !def.user_writable && obj.get("spec") != old.get("spec") {
        causes.push(Cause::invalid("spec", obj.get("spec").unwrap_or(&Value::Null), "field is immutable"));
    }
    validate(def, &obj, causes)?;
    Ok(obj)
}

/// Writes `obj` over `old` (stored at resourceVersion `rv`), keeping what the scope protects:
/// server-owned metadata always, status on the main resource, everything but status on `status`.
pub(in crate::apiserver) async fn replace(
    app: &AppState,
    request: &WriteRequest<'_>,
    name: &str,
    obj: Value,
    old: &Value,
    rv: u64,
) -> ApiResult<Value> {
    let (def, namespace) = (request.def, request.namespace);
    let obj = replacement(request, obj, old)?;
    check_secret_access(app, def, request.user, Some(old), &obj).await?;
    let dry = dry_run(request.params)?;
    let key = ObjectKey::new(def.plural, namespace, name);
    if lifecycle::is_finalized(&obj) {
        // The last finalizer is gone: the object goes now (the update is its deletion).
        let stored = StoredObject { value: obj, resource_version: rv, revision: None };
        let deleted = blocking(app, move |store| lifecycle::remove_now(store, def, &key, &stored, dry))
            .await
            .map_err(|e| relabel(e, def, name))?;
        let (lifecycle::Deleted::Gone(last) | lifecycle::Deleted::Pending(last)) = deleted;
        return Ok(last);
    }
    if dry {
        return Ok(obj);
    }
    let at_stored_version = old.pointer("/metadata/resourceVersion").and_then(Value::as_str) == Some(&*rv.to_string());
    if at_stored_version && unchanged(old, &obj) {
        // Like kube-apiserver: a write that changes nothing is not a write (no new
        // resourceVersion, no watch event), so no-op applies and updates from controllers are free.
        return Ok(old.clone());
    }
    let write = ObjectWrite::Put { key, object: obj, precondition: Precondition::ResourceVersion(rv), revision: None };
    let outcome = write_objects(app, vec![write]).await.map_err(|e| relabel(e, def, name))?;
    Ok(outcome.objects.into_iter().next().unwrap_or(Value::Null))
}

/// Whether `new` is `old` but for the resourceVersion it was sent with.
fn unchanged(old: &Value, new: &Value) -> bool {
    let mut new = new.clone();
    match (old.pointer("/metadata/resourceVersion"), new.get_mut("metadata").and_then(Value::as_object_mut)) {
        (Some(rv), Some(meta)) => {
            meta.insert("resourceVersion".into(), rv.clone());
        }
        (None, Some(meta)) => {
            meta.remove("resourceVersion");
        }
        _ => {}
    }
    *old == new
}
