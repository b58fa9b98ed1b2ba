//! The garbage collector for `ownerReferences` among this server's own objects (in a cluster the
//! kube-controller-manager's collector does the same through the metadata client; standalone there
//! is no other). It follows the change log:
//!
//! - an object whose owners (of this server's kinds) are all gone is deleted (background);
//!   references to owners that are gone while others remain are removed;
//! - an owner being deleted with `foregroundDeletion` gets its dependents deleted, and loses the
//!   finalizer (and so goes) once no dependent with `blockOwnerDeletion` remains;
//! - an owner being deleted with `orphan` has its references removed from its dependents, then
//!   loses the finalizer.
//!
//! Each step is an ordinary conditional write; a step that loses a race is retried when the change
//! that beat it comes through the log. A full pass runs at start (work left by a crash) and every
//! few minutes as a safety net.

use std::time::Duration;

use serde_json::Value;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use super::lifecycle::{self, DeleteOptions, FOREGROUND, ORPHAN};
use crate::apiserver::lifecycle::str_at;
use crate::storage::{ChangedObject, ObjectKey, ObjectWrite, Precondition, StorageError, Store, StoredObject};
use crate::strategy::{self, ResourceDef};

const FULL_PASS_EVERY: Duration = Duration::from_secs(300);
const BATCH: usize = 512;

/// Runs the collector until `shutdown`.
pub fn spawn(store: Store, shutdown: CancellationToken) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut notifications = store.subscribe();
        let full_pass = |s: &Store| {
            let rv = s.current_resource_version()?;
            full(s)?;
            Ok(rv)
        };
        let mut from = run(&store, full_pass).await.unwrap_or(0);
        let mut timer = tokio::time::interval_at(tokio::time::Instant::now() + FULL_PASS_EVERY, FULL_PASS_EVERY);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = timer.tick() => from = run(&store, full_pass).await.unwrap_or(from),
                received = notifications.recv() => {
                    if matches!(received, Err(broadcast::error::RecvError::Closed)) {
                        return;
                    }
                    from = run(&store, move |s| follow(s, from)).await.unwrap_or(from);
                }
            }
        }
    })
}

async fn run<F>(store: &Store, work: F) -> Option<u64>
where
    F: FnOnce(&Store) -> Result<u64, StorageError> + Send + 'static,
{
    let store = store.clone();
    match tokio::task::spawn_blocking(move || work(&store)).await {
        Ok(Ok(rv)) => Some(rv),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "garbage collection step failed; retrying with the next change");
            None
        }
        Err(e) => {
            tracing::error!(error = %e, "garbage collection task failed");
            None
        }
    }
}

/// Looks at every object once, a page at a time (writers never wait for the pass).
fn full(store: &Store) -> Result<(), StorageError> {
    for def in strategy::RESOURCES {
        let mut after: Option<String> = None;
        loop {
            let (objects, next) = store.objects_page(def.plural, None, after.as_deref(), BATCH)?;
            for object in objects {
                examine(store, def, &object.value)?;
            }
            match next {
                Some(next) => after = Some(next),
                None => break,
            }
        }
    }
    Ok(())
}

/// Handles the changes after `from`; returns how far it got.
fn follow(store: &Store, mut from: u64) -> Result<u64, StorageError> {
    loop {
        let changes = store.changes_after_as::<Change>(from, BATCH)?;
        let done = changes.len() < BATCH;
        for (rv, change) in changes {
            handle(store, &change)?;
            from = rv;
        }
        if done {
            return Ok(from);
        }
    }
}

/// What the collector reads of a change-log entry: which object changed, and how; the logged
/// object is decoded only for a deletion, the one change whose logged state (uid, owners) matters.
type Change = ChangedObject<Box<serde_json::value::RawValue>>;

fn handle(store: &Store, change: &Change) -> Result<(), StorageError> {
    let Some(def) = strategy::lookup(&change.resource) else { return Ok(()) };
    if change.kind != "DELETED" {
        // Re-read: the log entry may be stale, and acting on the current state is what counts.
        let key = ObjectKey::new(def.plural, &change.namespace, &change.name);
        if let Some(current) = store.get_object(&key)? {
            examine(store, def, &current.value)?;
        }
        return Ok(());
    }
    // Its dependents lost an owner; its owners may be waiting for it to go.
    let object: Value = serde_json::from_str(change.object.get())
        .map_err(|e| StorageError::Corrupt(format!("undecodable change-log entry: {e}")))?;
    let uid = str_at(&object, "/metadata/uid");
    for (dependent_def, dependent) in dependents(store, &change.namespace, uid)? {
        examine(store, dependent_def, &dependent.value)?;
    }
    for reference in owner_references(&object) {
        if let Some((owner_def, name, _)) = lifecycle::own_owner(&reference) {
            if let Some(owner) = store.get_object(&ObjectKey::new(owner_def.plural, &change.namespace, name))? {
                examine(store, owner_def, &owner.value)?;
            }
        }
    }
    Ok(())
}

/// Does whatever `object` needs: as an owner being deleted, and as a dependent.
fn examine(store: &Store, def: &ResourceDef, object: &Value) -> Result<(), StorageError> {
    if lifecycle::is_deleting(object) {
        let finalizers = lifecycle::finalizers(object);
        if finalizers.iter().any(|f| f == ORPHAN) {
            orphan_dependents(store, def, object)?;
        } else if finalizers.iter().any(|f| f == FOREGROUND) {
            delete_dependents(store, def, object)?;
        }
    }
    collect_if_orphaned(store, def, object)
}

fn orphan_dependents(store: &Store, def: &ResourceDef, owner: &Value) -> Result<(), StorageError> {
    let namespace = str_at(owner, "/metadata/namespace");
    let uid = str_at(owner, "/metadata/uid");
    for (dependent_def, dependent) in dependents(store, namespace, uid)? {
        let mut object = dependent.value.clone();
        retain_owners(&mut object, |r| str_at(r, "/uid") != uid);
        ignore_races(put(store, dependent_def, &dependent, object))?;
    }
    ignore_races(remove_finalizer(store, def, owner, ORPHAN)).map(drop)
}

fn delete_dependents(store: &Store, def: &ResourceDef, owner: &Value) -> Result<(), StorageError> {
    let namespace = str_at(owner, "/metadata/namespace");
    let uid = str_at(owner, "/metadata/uid");
    let mut blocking = false;
    for (dependent_def, dependent) in dependents(store, namespace, uid)? {
        if !lifecycle::is_deleting(&dependent.value) {
            let key = ObjectKey::new(dependent_def.plural, namespace, str_at(&dependent.value, "/metadata/name"));
            match ignore_races(lifecycle::delete(store, dependent_def, &key, &DeleteOptions::background(), false))? {
                Some(lifecycle::Deleted::Gone(_)) => continue,
                Some(lifecycle::Deleted::Pending(_)) | None => {}
            }
        }
        let blocks = owner_references(&dependent.value)
            .iter()
            .any(|r| str_at(r, "/uid") == uid && r.get("blockOwnerDeletion").and_then(Value::as_bool) == Some(true));
        blocking |= blocks;
    }
    if !blocking {
        ignore_races(remove_finalizer(store, def, owner, FOREGROUND))?;
    }
    Ok(())
}

/// A dependent whose owners of this server's kinds are gone is deleted; dangling references to
/// gone owners are dropped while other owners remain.
fn collect_if_orphaned(store: &Store, def: &ResourceDef, object: &Value) -> Result<(), StorageError> {
    let references = owner_references(object);
    if references.is_empty() || lifecycle::is_deleting(object) {
        return Ok(());
    }
    let namespace = str_at(object, "/metadata/namespace");
    let mut gone = Vec::new();
    for reference in &references {
        let Some((owner_def, name, uid)) = lifecycle::own_owner(reference) else { continue };
        let owner = store.get_object(&ObjectKey::new(owner_def.plural, namespace, name))?;
        if owner.is_none_or(|o| str_at(&o.value, "/metadata/uid") != uid) {
            gone.push(uid.to_string());
        }
    }
    if gone.is_empty() {
        return Ok(());
    }
    let key = ObjectKey::new(def.plural, namespace, str_at(object, "/metadata/name"));
    if gone.len() == references.len() {
        tracing::info!(resource = def.plural, namespace, name = %key.name, "deleting: its owners are gone");
        return ignore_races(lifecycle::delete(store, def, &key, &DeleteOptions::background(), false)).map(drop);
    }
    let Some(stored) = store.get_object(&key)? else { return Ok(()) };
    let mut updated = stored.value.clone();
    retain_owners(&mut updated, |r| !gone.iter().any(|g| g == str_at(r, "/uid")));
    ignore_races(put(store, def, &stored, updated)).map(drop)
}

/// Objects in `namespace` with an owner reference to `uid`, through the store's owner index: a
/// deleted owner costs its dependents, not a scan of its namespace (which made deleting N objects
/// O(N²)).
fn dependents(
    store: &Store,
    namespace: &str,
    uid: &str,
) -> Result<Vec<(&'static ResourceDef, StoredObject)>, StorageError> {
    Ok(store
        .dependents(namespace, uid)?
        .into_iter()
        .filter_map(|(resource, object)| strategy::lookup(&resource).map(|def| (def, object)))
        .collect())
}

fn remove_finalizer(store: &Store, def: &ResourceDef, owner: &Value, finalizer: &str) -> Result<(), StorageError> {
    let key = ObjectKey::new(def.plural, str_at(owner, "/metadata/namespace"), str_at(owner, "/metadata/name"));
    let Some(stored) = store.get_object(&key)? else { return Ok(()) };
    let mut remaining = lifecycle::finalizers(&stored.value);
    remaining.retain(|f| f != finalizer);
    let mut object = stored.value.clone();
    if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        if remaining.is_empty() {
            meta.remove("finalizers");
        } else {
            meta.insert("finalizers".into(), remaining.into());
        }
    }
    if lifecycle::is_finalized(&object) {
        return lifecycle::remove_now(store, def, &key, &stored, false).map(drop);
    }
    put(store, def, &stored, object)
}

fn put(store: &Store, def: &ResourceDef, stored: &StoredObject, object: Value) -> Result<(), StorageError> {
    let key = ObjectKey::new(
        def.plural,
        str_at(&stored.value, "/metadata/namespace"),
        str_at(&stored.value, "/metadata/name"),
    );
    let precondition = Precondition::ResourceVersion(stored.resource_version);
    store.write_objects(vec![ObjectWrite::Put { key, object, precondition, revision: None }]).map(drop)
}

/// A lost race (the object changed or went meanwhile) is not a failure: the change that won comes
/// through the log and brings the object back here.
fn ignore_races<T>(result: Result<T, StorageError>) -> Result<Option<T>, StorageError> {
    match result {
        Ok(v) => Ok(Some(v)),
        Err(StorageError::Conflict(_) | StorageError::NotFound(_)) => Ok(None),
        Err(e) => Err(e),
    }
}

fn owner_references(object: &Value) -> Vec<Value> {
    object.pointer("/metadata/ownerReferences").and_then(Value::as_array).cloned().unwrap_or_default()
}

fn retain_owners(object: &mut Value, keep: impl Fn(&Value) -> bool) {
    if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        let kept: Vec<Value> = owner_references_of(meta).into_iter().filter(|r| keep(r)).collect();
        if kept.is_empty() {
            meta.remove("ownerReferences");
        } else {
            meta.insert("ownerReferences".into(), Value::Array(kept));
        }
    }
}

fn owner_references_of(meta: &serde_json::Map<String, Value>) -> Vec<Value> {
    meta.get("ownerReferences").and_then(Value::as_array).cloned().unwrap_or_default()
}
