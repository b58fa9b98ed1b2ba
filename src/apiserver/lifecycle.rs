//! How objects go away, with Kubernetes' semantics: finalizers hold an object in a visible
//! "being deleted" state (`metadata.deletionTimestamp`) until the last one is removed; a delete's
//! propagation policy decides what happens to its dependents (`ownerReferences`): `Background`
//! deletes the owner now and the dependents after, `Foreground` keeps the owner (finalizer
//! `foregroundDeletion`) until the dependents that block it are gone, `Orphan` (finalizer `orphan`)
//! cuts the dependents loose. The dependents' side is [`super::garbage_collector`]'s job.
//!
//! These functions are synchronous store operations (run them on the blocking pool) shared by the
//! DELETE handlers, updates that remove the last finalizer, and the garbage collector.

use std::collections::HashMap;

use serde_json::{json, Value};

use super::status::{ApiError, ApiResult, Cause};
use super::GROUP;
use crate::api::meta;
use crate::storage::{ObjectKey, ObjectWrite, Precondition, StorageError, Store, StoredObject};
use crate::strategy::{self, ResourceDef};

pub const FOREGROUND: &str = "foregroundDeletion";
pub const ORPHAN: &str = "orphan";
/// Finalizer names without a domain that Kubernetes accepts.
const STANDARD_FINALIZERS: [&str; 3] = ["kubernetes", FOREGROUND, ORPHAN];
/// Attempts at a read-modify-write before giving up on a busy object.
const RETRIES: usize = 5;

/// What a delete does to the object's dependents.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Propagation {
    Background,
    Foreground,
    Orphan,
}

/// A parsed DELETE request (`DeleteOptions` body and query parameters).
#[derive(Clone, Debug)]
pub struct DeleteOptions {
    pub propagation: Propagation,
    pub uid: Option<String>,
    pub resource_version: Option<u64>,
}

impl DeleteOptions {
    pub fn parse(body: &[u8], params: &HashMap<String, String>) -> ApiResult<DeleteOptions> {
        let options: Value = if body.iter().all(u8::is_ascii_whitespace) {
            json!({})
        } else {
            serde_json::from_slice(body).map_err(|e| ApiError::bad_request(format!("invalid DeleteOptions: {e}")))?
        };
        let text = |pointer: &str, param: &str| {
            options.pointer(pointer).and_then(Value::as_str).map(str::to_string).or_else(|| params.get(param).cloned())
        };
        let orphan = options
            .get("orphanDependents")
            .and_then(Value::as_bool)
            .or_else(|| params.get("orphanDependents").map(|v| v == "true"));
        let propagation = match (text("/propagationPolicy", "propagationPolicy").as_deref(), orphan) {
            (Some(_), Some(_)) => {
                return Err(invalid_options(Cause::invalid(
                    "propagationPolicy",
                    &json!(text("/propagationPolicy", "propagationPolicy")),
                    "orphanDependents and deletionPropagation cannot be both set",
                )))
            }
            (Some("Background") | None, None) | (None, Some(false)) => Propagation::Background,
            (Some("Foreground"), _) => Propagation::Foreground,
            (Some("Orphan"), _) | (None, Some(true)) => Propagation::Orphan,
            (Some(other), _) => {
                return Err(invalid_options(Cause::not_supported(
                    "propagationPolicy",
                    &json!(other),
                    &["Foreground", "Background", "Orphan"],
                )))
            }
        };
        let resource_version = match options.pointer("/preconditions/resourceVersion").and_then(Value::as_str) {
            Some(rv) => Some(rv.parse().map_err(|_| ApiError::bad_request(format!("invalid resourceVersion {rv:?}")))?),
            None => None,
        };
        let uid = options.pointer("/preconditions/uid").and_then(Value::as_str).map(str::to_string);
        Ok(DeleteOptions { propagation, uid, resource_version })
    }

    pub fn background() -> DeleteOptions {
        DeleteOptions { propagation: Propagation::Background, uid: None, resource_version: None }
    }
}

fn invalid_options(cause: Cause) -> ApiError {
    ApiError::invalid("DeleteOptions", "", vec![cause])
}

/// What a delete did.
#[derive(Debug)]
pub enum Deleted {
    /// The object is gone; this was its last state.
    Gone(Value),
    /// Finalizers remain: the object now carries a deletionTimestamp.
    Pending(Value),
}

pub fn finalizers(obj: &Value) -> Vec<String> {
    obj.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .map(|list| list.iter().filter_map(Value::as_str).map(str::to_string).collect())
        .unwrap_or_default()
}

pub fn is_deleting(obj: &Value) -> bool {
    obj.pointer("/metadata/deletionTimestamp").is_some_and(|t| !t.is_null())
}

fn set_finalizers(obj: &mut Value, list: Vec<String>) {
    if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        if list.is_empty() {
            meta.remove("finalizers");
        } else {
            meta.insert("finalizers".into(), json!(list));
        }
    }
}

/// Deletes an object per `options`, retrying on concurrent changes. `dry_run` computes the
/// outcome without writing.
pub fn delete(
    store: &Store,
    def: &ResourceDef,
    key: &ObjectKey,
    options: &DeleteOptions,
    dry_run: bool,
) -> Result<Deleted, StorageError> {
    for _ in 0..RETRIES {
        let Some(stored) = store.get_object(key)? else {
            return Err(StorageError::NotFound(format!("{} {:?}", def.plural, key.name)));
        };
        let uid = stored.value.pointer("/metadata/uid").and_then(Value::as_str).unwrap_or("");
        if options.uid.as_deref().is_some_and(|want| want != uid) {
            return Err(StorageError::Conflict(format!("{} {:?}", def.plural, key.name)));
        }
        if options.resource_version.is_some_and(|rv| rv != stored.resource_version) {
            return Err(StorageError::Conflict(format!("{} {:?}", def.plural, key.name)));
        }
        let mut wanted = finalizers(&stored.value);
        wanted.retain(|f| f != FOREGROUND && f != ORPHAN);
        match options.propagation {
            Propagation::Foreground => wanted.push(FOREGROUND.into()),
            Propagation::Orphan => wanted.push(ORPHAN.into()),
            Propagation::Background => {}
        }
        let result = if wanted.is_empty() {
            remove_now(store, def, key, &stored, dry_run)
        } else {
            let mut obj = stored.value.clone();
            set_finalizers(&mut obj, wanted);
            if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
                meta.entry("deletionTimestamp").or_insert_with(|| json!(meta::now_timestamp()));
                meta.insert("deletionGracePeriodSeconds".into(), json!(0));
            }
            if dry_run {
                return Ok(Deleted::Pending(obj));
            }
            let precondition = Precondition::ResourceVersion(stored.resource_version);
            let write = ObjectWrite::Put { key: key.clone(), object: obj, precondition, revision: None };
            store.write_objects(vec![write]).map(|o| Deleted::Pending(first(o.objects)))
        };
        match result {
            Err(StorageError::Conflict(_)) if options.resource_version.is_none() => continue,
            other => return other,
        }
    }
    Err(StorageError::Conflict(format!("{} {:?}", def.plural, key.name)))
}

/// Removes the object from the store (with its resource's delete hook), if it is still at the
/// version that was read.
pub fn remove_now(
    store: &Store,
    def: &ResourceDef,
    key: &ObjectKey,
    stored: &StoredObject,
    dry_run: bool,
) -> Result<Deleted, StorageError> {
    if dry_run {
        return Ok(Deleted::Gone(stored.value.clone()));
    }
    let precondition = Precondition::ResourceVersion(stored.resource_version);
    let mut writes = vec![ObjectWrite::Delete { key: key.clone(), precondition }];
    writes.extend(delete_effects(store, def, &stored.value)?);
    store.write_objects(writes).map(|o| Deleted::Gone(first(o.objects)))
}

/// What the resource's strategy says deleting `object` changes elsewhere, as writes for the same
/// batch (each at the version read, so a concurrent change makes the delete retry).
fn delete_effects(store: &Store, def: &ResourceDef, object: &Value) -> Result<Vec<ObjectWrite>, StorageError> {
    let Some(hook) = &def.on_delete else { return Ok(Vec::new()) };
    let Some((plural, name)) = (hook.target)(object) else { return Ok(Vec::new()) };
    let key = ObjectKey::new(plural, str_at(object, "/metadata/namespace"), &name);
    let Some(target) = store.get_object(&key)? else { return Ok(Vec::new()) };
    Ok((hook.update)(&target.value, object)
        .map(|updated| ObjectWrite::Put {
            key,
            object: updated,
            precondition: Precondition::ResourceVersion(target.resource_version),
            revision: None,
        })
        .into_iter()
        .collect())
}

/// A string field of an object's metadata (or any JSON pointer), empty when absent.
pub fn str_at<'a>(obj: &'a Value, pointer: &str) -> &'a str {
    obj.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

fn first(objects: Vec<Value>) -> Value {
    objects.into_iter().next().unwrap_or(Value::Null)
}

/// Rules for an update of `old` into `new` that concern deletion: the deletion fields are the
/// server's (kept from `old`), and no finalizer may be added once deletion started.
pub fn carry_deletion_state(old: &Value, new: &mut Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    if is_deleting(old) {
        let before = finalizers(old);
        let added: Vec<String> = finalizers(new).into_iter().filter(|f| !before.contains(f)).collect();
        if !added.is_empty() {
            causes.push(Cause::forbidden(
                "metadata.finalizers",
                format!(
                    "no new finalizers can be added if the object is being deleted, found new finalizers {added:?}"
                ),
            ));
        }
    }
    if let Some(meta) = new.get_mut("metadata").and_then(Value::as_object_mut) {
        for field in ["deletionTimestamp", "deletionGracePeriodSeconds"] {
            match old.pointer(&format!("/metadata/{field}")) {
                Some(value) => meta.insert(field.into(), value.clone()),
                None => meta.remove(field),
            };
        }
    }
    causes
}

/// Whether an object being deleted has no finalizers left, so it must go now.
pub fn is_finalized(obj: &Value) -> bool {
    is_deleting(obj) && finalizers(obj).is_empty()
}

/// Finalizer names must be qualified (`example.com/name`) unless they are Kubernetes' own.
pub fn finalizer_causes(obj: &Value) -> Vec<Cause> {
    finalizers(obj)
        .iter()
        .enumerate()
        .filter(|(_, f)| !STANDARD_FINALIZERS.contains(&f.as_str()))
        .filter_map(|(i, f)| {
            let field = format!("metadata.finalizers[{i}]");
            match f.split_once('/') {
                None => Some(Cause::invalid(
                    field,
                    &json!(f),
                    "name is neither a standard finalizer name nor is it fully qualified",
                )),
                Some((domain, name)) if !meta::dns1123_subdomain_errors(domain).is_empty() || name.is_empty() => {
                    Some(Cause::invalid(field, &json!(f), "must be a qualified name such as example.com/cleanup"))
                }
                Some(_) => None,
            }
        })
        .collect()
}

/// Owner references must name an owner fully, and at most one may be the controller.
pub fn owner_reference_causes(obj: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    let refs = obj.pointer("/metadata/ownerReferences").and_then(Value::as_array).cloned().unwrap_or_default();
    for (i, owner) in refs.iter().enumerate() {
        for field in ["apiVersion", "kind", "name", "uid"] {
            if owner.get(field).and_then(Value::as_str).is_none_or(str::is_empty) {
                causes.push(Cause::required(
                    format!("metadata.ownerReferences[{i}].{field}"),
                    format!("{field} must not be empty"),
                ));
            }
        }
    }
    let controllers = refs.iter().filter(|r| r.get("controller").and_then(Value::as_bool) == Some(true)).count();
    if controllers > 1 {
        causes.push(Cause::invalid(
            "metadata.ownerReferences",
            &json!(refs),
            "Only one reference can have Controller set to true",
        ));
    }
    causes
}

/// An owner reference to one of this server's own kinds: its resource and the owner's uid.
pub fn own_owner(reference: &Value) -> Option<(&'static ResourceDef, &str, &str)> {
    let api_version = reference.get("apiVersion").and_then(Value::as_str)?;
    if api_version.split('/').next() != Some(GROUP) {
        return None;
    }
    let kind = reference.get("kind").and_then(Value::as_str)?;
    let def = strategy::RESOURCES.iter().copied().find(|r| r.kind == kind)?;
    Some((def, reference.get("name").and_then(Value::as_str)?, reference.get("uid").and_then(Value::as_str)?))
}
