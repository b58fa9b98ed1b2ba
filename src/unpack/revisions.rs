//! Turning a finalized revision into what a Bundle serves: one BundleContent per distinct content
//! (owned by its Bundle, named after the digest, reused when the same content comes back), the
//! Bundle's status pointing at it, and old BundleContents beyond `spec.revisionHistoryLimit`
//! deleted — all in one atomic store write. Used by uploads and by the reconcile loop alike.

use serde_json::{json, Value};

use super::format::FormatReport;
use super::source::Resolved;
use super::status;
use crate::apiserver::meta;
use crate::apiserver::resources::bundlecontent::content_name;
use crate::apiserver::API_VERSION;
use crate::storage::{ObjectKey, ObjectWrite, PendingRevision, Precondition, StorageError, Store, StoredObject};

/// Old contents kept beside the served one when `spec.revisionHistoryLimit` is not set.
pub const DEFAULT_HISTORY_LIMIT: u64 = 3;
/// Labels a BundleContent with its Bundle's name.
pub const BUNDLE_LABEL: &str = "content.stowage.dev/bundle";

/// What must still hold for a commit to land.
#[derive(Clone, Debug)]
pub struct Expect {
    pub namespace: String,
    pub name: String,
    /// The Bundle the work was for (a deleted and re-created Bundle is another one).
    pub uid: String,
    /// The generation the content was unpacked for; `None` accepts any (uploads).
    pub generation: Option<u64>,
}

#[derive(Debug, thiserror::Error)]
pub enum CommitError {
    #[error("the Bundle is gone")]
    Gone,
    #[error("the Bundle's spec changed while unpacking")]
    Superseded,
    #[error(transparent)]
    Storage(#[from] StorageError),
}

/// Attaches `pending` (or reuses the BundleContent already holding the same digest) and points the
/// Bundle at it; returns the Bundle as written. Blocking.
pub fn commit(
    store: &Store,
    expect: &Expect,
    mut pending: PendingRevision,
    report: &FormatReport,
    resolved: &[Resolved],
) -> Result<Value, CommitError> {
    let record = pending.record().clone();
    let content = content_name(&expect.name, &record.digest);
    let bundle_key = ObjectKey::new("bundles", &expect.namespace, &expect.name);
    // Retry on conflict: the Bundle's metadata may change while a long unpack runs.
    for _ in 0..8 {
        let bundle = current(store, expect)?;
        let existing = store.get_object(&ObjectKey::new("bundlecontents", &expect.namespace, &content))?;
        let reuse = existing.as_ref().is_some_and(|e| {
            e.value.pointer("/spec/digest").and_then(Value::as_str) == Some(record.digest.as_str())
                && owned_by(&e.value, &expect.uid)
        });
        let mut updated = bundle.value.clone();
        set_status(&mut updated, status::unpacked(&bundle.value, &content, &record, report, resolved));
        let mut writes = vec![ObjectWrite::Put {
            key: bundle_key.clone(),
            object: updated,
            precondition: Precondition::ResourceVersion(bundle.resource_version),
            revision: None,
        }];
        writes.extend(prune(store, &bundle.value, &content)?);
        let result = if reuse {
            // Identical content is already stored: the new copy is released when `pending` drops.
            store.write_objects(writes)
        } else {
            let key = ObjectKey::new("bundlecontents", &expect.namespace, &content);
            let precondition = match &existing {
                // Same name, other content or owner (a 10-hex-digit prefix collision, or a leftover
                // orphan): delete it first, which releases its revision, then write ours.
                Some(e) => {
                    let precondition = Precondition::ResourceVersion(e.resource_version);
                    writes.insert(0, ObjectWrite::Delete { key: key.clone(), precondition });
                    precondition
                }
                None => Precondition::MustNotExist,
            };
            let object = content_object(&bundle.value, &content, &record, report, resolved);
            writes.insert(
                usize::from(existing.is_some()),
                ObjectWrite::Put { key, object, precondition, revision: Some(record.id) },
            );
            pending.commit(writes)
        };
        match result {
            Err(StorageError::Conflict(_)) => continue,
            Err(e) => return Err(e.into()),
            Ok(outcome) => {
                return Ok(outcome
                    .objects
                    .into_iter()
                    .find(|o| o.get("kind").and_then(Value::as_str) == Some("Bundle"))
                    .unwrap_or(Value::Null))
            }
        }
    }
    Err(StorageError::Conflict(format!("bundles {:?}", expect.name)).into())
}

/// The Bundle, if it is still the one (and the generation) the work was for.
pub fn current(store: &Store, expect: &Expect) -> Result<StoredObject, CommitError> {
    let key = ObjectKey::new("bundles", &expect.namespace, &expect.name);
    let Some(bundle) = store.get_object(&key)? else { return Err(CommitError::Gone) };
    let uid = bundle.value.pointer("/metadata/uid").and_then(Value::as_str).unwrap_or("");
    if uid != expect.uid || bundle.value.pointer("/metadata/deletionTimestamp").is_some() {
        return Err(CommitError::Gone);
    }
    let generation = bundle.value.pointer("/metadata/generation").and_then(Value::as_u64).unwrap_or(1);
    if expect.generation.is_some_and(|g| g != generation) {
        return Err(CommitError::Superseded);
    }
    Ok(bundle)
}

/// Writes `status` computed from the current Bundle, if it is still the expected one. Blocking.
pub fn write_status(store: &Store, expect: &Expect, compute: &dyn Fn(&Value) -> Value) -> Result<(), CommitError> {
    for _ in 0..8 {
        let bundle = current(store, expect)?;
        let mut updated = bundle.value.clone();
        set_status(&mut updated, compute(&bundle.value));
        if updated == bundle.value {
            return Ok(());
        }
        let write = ObjectWrite::Put {
            key: ObjectKey::new("bundles", &expect.namespace, &expect.name),
            object: updated,
            precondition: Precondition::ResourceVersion(bundle.resource_version),
            revision: None,
        };
        match store.write_objects(vec![write]) {
            Err(StorageError::Conflict(_)) => continue,
            other => return other.map(|_| ()).map_err(CommitError::from),
        }
    }
    Err(StorageError::Conflict(format!("bundles {:?}", expect.name)).into())
}

fn owned_by(object: &Value, uid: &str) -> bool {
    object
        .pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .is_some_and(|refs| refs.iter().any(|r| r.get("uid").and_then(Value::as_str) == Some(uid)))
}

/// Deletes of the Bundle's BundleContents beyond its history limit: newest kept, never `active`.
fn prune(store: &Store, bundle: &Value, active: &str) -> Result<Vec<ObjectWrite>, StorageError> {
    let namespace = bundle.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or("");
    let uid = bundle.pointer("/metadata/uid").and_then(Value::as_str).unwrap_or("");
    let limit = bundle.pointer("/spec/revisionHistoryLimit").and_then(Value::as_u64).unwrap_or(DEFAULT_HISTORY_LIMIT);
    // The Bundle's own contents, through the store's owner index: no scan of the namespace.
    let mut old: Vec<StoredObject> = store
        .dependents(namespace, uid)?
        .into_iter()
        .filter(|(resource, _)| resource == "bundlecontents")
        .map(|(_, c)| c)
        .filter(|c| c.value.pointer("/metadata/name").and_then(Value::as_str) != Some(active))
        .filter(|c| c.value.pointer("/metadata/deletionTimestamp").is_none())
        .collect();
    // Newest first: BundleContents never change after creation, so the resourceVersion orders them.
    old.sort_by_key(|c| std::cmp::Reverse(c.resource_version));
    Ok(old
        .into_iter()
        .skip(limit as usize)
        .map(|c| {
            let name = c.value.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("");
            ObjectWrite::Delete {
                key: ObjectKey::new("bundlecontents", namespace, name),
                precondition: Precondition::ResourceVersion(c.resource_version),
            }
        })
        .collect())
}

fn content_object(
    bundle: &Value,
    content: &str,
    record: &crate::storage::RevisionRecord,
    report: &FormatReport,
    resolved: &[Resolved],
) -> Value {
    let name = bundle.pointer("/metadata/name").cloned().unwrap_or(Value::Null);
    let namespace = bundle.pointer("/metadata/namespace").cloned().unwrap_or(Value::Null);
    json!({
        "apiVersion": API_VERSION,
        "kind": "BundleContent",
        "metadata": {
            "name": content,
            "namespace": namespace,
            "uid": uuid::Uuid::new_v4().to_string(),
            "creationTimestamp": meta::now_timestamp(),
            "generation": 1,
            "labels": {BUNDLE_LABEL: name},
            "ownerReferences": [{
                "apiVersion": API_VERSION,
                "kind": "Bundle",
                "name": name,
                "uid": bundle.pointer("/metadata/uid").cloned().unwrap_or(Value::Null),
                "controller": true,
                "blockOwnerDeletion": true,
            }],
        },
        "spec": {
            "bundle": name,
            "digest": record.digest,
            "format": report.format,
            "formatDetails": report.details(),
            "files": record.files,
            "size": record.size,
            "storedSize": record.stored_size,
            "sources": resolved,
        },
    })
}

/// Sets an object's `status` (a stored object is always a JSON object; `value["status"] = …`
/// would panic on anything else).
fn set_status(object: &mut Value, status: Value) {
    if let Some(map) = object.as_object_mut() {
        map.insert("status".into(), status);
    }
}
