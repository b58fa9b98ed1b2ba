//! API objects (JSON documents) with Kubernetes resourceVersion semantics and a change log.
//!
//! Every write takes one global lock, allocates the next resourceVersion, checks preconditions and
//! applies all of its object changes, change-log entries, the counter and any revision-state
//! changes in one atomic batch; it returns once that batch is durable ([`super::commit`]). An
//! object may *own* a content revision: deleting the object releases it (the garbage collector
//! does the rest).

use std::sync::atomic::Ordering;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::commit::PendingWrite;
use super::meta::{Batch, Reads};
use super::{
    be, decode_json, encode_json, key, read_be, Result, RevisionId, RevisionRecord, RevisionState, StorageError, Store,
};

pub(super) const RV_COUNTER: &[u8] = b"mrv";

/// What one write built: its resourceVersion, its objects as written, whether a revision changed
/// state, and the bytes it adds to the change log.
pub(super) type BuiltWrite = (u64, Vec<Value>, bool, u64);

/// Present once the owner index (`d` keys) covers every object.
const OWNER_INDEX_READY: &[u8] = b"mownerindex";
/// Objects per page of internal passes, and per batch when the owner index is built.
const OBJECTS_PAGE: usize = 256;
/// The oldest resourceVersion whose changes the log still holds in full.
const LOG_START: &[u8] = b"mlogstart";

/// Where an object lives: resource (plural, e.g. `bundles`), namespace, name.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ObjectKey {
    pub resource: String,
    pub namespace: String,
    pub name: String,
}

impl ObjectKey {
    pub fn new(resource: &str, namespace: &str, name: &str) -> ObjectKey {
        ObjectKey { resource: resource.into(), namespace: namespace.into(), name: name.into() }
    }

    pub(super) fn encode(&self) -> Vec<u8> {
        key(b'o', &[self.resource.as_bytes(), b"/", self.namespace.as_bytes(), b"/", self.name.as_bytes()])
    }

    fn describe(&self) -> String {
        format!("{} {:?} in namespace {:?}", self.resource, self.name, self.namespace)
    }
}

/// A read begun by [`Store::consistent_read`].
pub struct ConsistentRead<'a> {
    store: &'a Store,
}

impl ConsistentRead<'_> {
    /// [`Store::get_object`], without another check: at least as new as the read's start.
    pub fn get_object(&self, key: &ObjectKey) -> Result<Option<StoredObject>> {
        self.store.object_as_read(key)
    }
}

/// An object as stored.
#[derive(Clone, Debug)]
pub struct StoredObject {
    pub value: Value,
    pub resource_version: u64,
    /// The content revision this object owns, if any.
    pub revision: Option<RevisionId>,
}

/// An object as stored; read with the object owned, written with it borrowed (the same bytes).
#[derive(Serialize, Deserialize)]
pub(super) struct Envelope<O = Value> {
    pub(super) rv: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    revision: Option<RevisionId>,
    pub(super) object: O,
}

/// What must hold for a write to go ahead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Precondition {
    None,
    MustNotExist,
    MustExist,
    ResourceVersion(u64),
}

/// One change in an atomic write.
#[derive(Clone, Debug)]
pub enum ObjectWrite {
    /// Create or replace. The store sets `metadata.resourceVersion`. `revision` attaches a content
    /// revision (which becomes `Committed` in the same batch); `None` keeps any existing attachment.
    Put {
        key: ObjectKey,
        object: Value,
        precondition: Precondition,
        revision: Option<RevisionId>,
    },
    Delete {
        key: ObjectKey,
        precondition: Precondition,
    },
}

impl ObjectWrite {
    /// What the write does, for logs: `put bundles "a" in namespace "ns"`.
    pub(super) fn describe(&self) -> String {
        match self {
            ObjectWrite::Put { key, .. } => format!("put {}", key.describe()),
            ObjectWrite::Delete { key, .. } => format!("delete {}", key.describe()),
        }
    }
}

/// A change-log entry, in the shape of a watch event.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ChangeEvent {
    #[serde(rename = "type")]
    pub kind: String,
    pub resource: String,
    pub namespace: String,
    pub name: String,
    pub object: Value,
    /// The object as it was before this change (`None` for ADDED). Lets a reader reconstruct any
    /// state the log still covers: consistent paged lists, selector transitions in watches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous: Option<Value>,
}

/// Which object a [`ChangeEvent`] changed, and how, without building its contents: for followers
/// of the log that act on current state, which would otherwise build two object trees per entry.
/// `O` is what they keep of the logged object: by default nothing (it is skipped).
#[derive(Clone, Debug, Deserialize)]
pub struct ChangedObject<O = serde::de::IgnoredAny> {
    #[serde(rename = "type")]
    pub kind: String,
    pub resource: String,
    pub namespace: String,
    pub name: String,
    pub object: O,
}

/// A [`ChangeEvent`] as written: the same bytes, everything borrowed.
#[derive(Serialize)]
struct ChangeEventRef<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    resource: &'a str,
    namespace: &'a str,
    name: &'a str,
    object: &'a Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    previous: Option<&'a Value>,
}

/// The result of a write: its resourceVersion and the objects as written (deleted ones as they
/// were last, with the deletion's resourceVersion).
#[derive(Debug)]
pub struct WriteOutcome {
    pub resource_version: u64,
    pub objects: Vec<Value>,
}

fn set_resource_version(object: &mut Value, rv: u64) {
    if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.insert("resourceVersion".into(), Value::String(rv.to_string()));
    }
}

impl Store {
    /// A handle that does not keep the store open: called, it gives the store back while it is.
    pub fn downgrade(&self) -> impl Fn() -> Option<Store> + Send + Sync + 'static {
        let weak = std::sync::Arc::downgrade(&self.inner);
        move || weak.upgrade().map(|inner| Store { inner })
    }

    /// Whether both handles are the same store.
    pub fn same_store(&self, other: &Store) -> bool {
        std::sync::Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// The object as a crash could no longer undo it: if its last change (or its deletion) is
    /// applied but not yet durable, this waits for the flush that covers it (helping with it if
    /// none runs). On a poisoned store that change never becomes durable: `Err(Poisoned)`.
    pub fn get_object(&self, key: &ObjectKey) -> Result<Option<StoredObject>> {
        self.consistent_read()?.get_object(key)
    }

    /// Starts a read of several objects that is as new as a quorum read at its start: with an
    /// object cache, one etcd check for all of them (a download reads its Bundle, then the
    /// BundleContent it names).
    pub fn consistent_read(&self) -> Result<ConsistentRead<'_>> {
        self.backend().fresh_reads()?;
        Ok(ConsistentRead { store: self })
    }

    fn object_as_read(&self, key: &ObjectKey) -> Result<Option<StoredObject>> {
        let durable = self.durable_resource_version();
        let object = object_in(self.reads(), key)?;
        let newest = match &object {
            Some(object) => object.resource_version,
            None => self.deleted_after(key, durable)?,
        };
        if newest > durable {
            self.flush_covering(newest)?;
        }
        Ok(object)
    }

    /// [`Store::get_object`] as the object's JSON: its bytes as stored, never decoded (what
    /// serialising the decoded object would write).
    pub fn get_object_json(&self, key: &ObjectKey) -> Result<Option<Vec<u8>>> {
        self.backend().fresh_reads()?;
        let (newest, json) = self.object_json(key)?;
        self.flush_covering(newest)?;
        Ok(json)
    }

    /// [`Store::get_object_json`] if it can answer without blocking a thread: the store is local
    /// (sled, whose reads are memory or a local file, never the network) and the object's last
    /// change is durable; or a replica's object cache, once the consistent-read check (awaited)
    /// found it current — there every acknowledged write is durable. `None` otherwise: then ask
    /// [`Store::get_object_json`] on a blocking thread.
    pub async fn get_object_json_now(&self, key: &ObjectKey) -> Result<Option<Option<Vec<u8>>>> {
        if self.backend().reads_are_local() {
            let (newest, json) = self.object_json(key)?;
            return Ok((newest <= self.durable_resource_version()).then_some(json));
        }
        let Some(mirror) = self.backend().mirror() else { return Ok(None) };
        if !self.backend().fresh_reads_now().await? {
            return Ok(None);
        }
        match mirror.get(&key.encode()) {
            Some(Some(stored)) => Ok(Some(Some(decode_stored(&stored)?.object.to_vec()))),
            Some(None) => Ok(Some(None)),
            // The cache stopped serving since the check.
            None => Ok(None),
        }
    }

    /// The object's JSON as applied and the resourceVersion a reader must wait for before it may
    /// show it (0 if nothing).
    fn object_json(&self, key: &ObjectKey) -> Result<(u64, Option<Vec<u8>>)> {
        let durable = self.durable_resource_version();
        let stored = self.reads().get(key.encode())?;
        Ok(match &stored {
            Some(stored) => {
                let found = decode_stored(stored)?;
                (found.rv, Some(found.object.to_vec()))
            }
            None => (self.deleted_after(key, durable)?, None),
        })
    }

    /// The object as applied, durable or not: for writers, which order after it anyway.
    fn applied_object(&self, key: &ObjectKey) -> Result<Option<StoredObject>> {
        object_in(Reads::Map(self.tree()), key)
    }

    /// The resourceVersion of the last change to `key` the log holds after `after` (0 if none):
    /// for an object that is gone, when it went. Reads the few changes not yet durable.
    fn deleted_after(&self, key: &ObjectKey, after: u64) -> Result<u64> {
        let mut newest = 0;
        let end = key_log(self.current_resource_version()?.saturating_add(1));
        for item in self.reads().range(key_log(after.saturating_add(1))..end) {
            let (k, v) = item?;
            let change: ChangeEvent = decode_log(&v)?;
            if change.resource == key.resource && change.namespace == key.namespace && change.name == key.name {
                newest = read_be(k.get(1..).unwrap_or_default())?;
            }
        }
        Ok(newest)
    }

    /// All objects of a resource, in one namespace or all, as they are now (applied, durable or
    /// not: for internal passes whose writes order after them; clients list through
    /// [`Store::list_page`]); plus a resourceVersion
    /// every object is at least as new as: whoever follows the change log after it misses nothing.
    /// Read without the object lock, so writers go on meanwhile (an object written during the
    /// read may show in either state; the log has its change). Holds the whole list: internal
    /// passes over many objects use [`Store::objects_page`].
    pub fn list_objects(&self, resource: &str, namespace: Option<&str>) -> Result<(Vec<StoredObject>, u64)> {
        // The map's own counter (not an object cache's): the objects below are read from the map.
        let rv = match self.tree().get(RV_COUNTER)? {
            Some(v) => read_be(&v)?,
            None => 0,
        };
        let mut out = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let (mut page, next) = self.objects_page(resource, namespace, after.as_deref(), OBJECTS_PAGE)?;
            out.append(&mut page);
            match next {
                Some(next) => after = Some(next),
                None => return Ok((out, rv)),
            }
        }
    }

    /// Up to `limit` objects of a resource (in one namespace or all) after `after` (the
    /// `namespace/name` a previous page returned), as they are now, read without the object lock;
    /// and where the next page starts if more may follow. For passes that act on each object with
    /// a precondition (deletecollection, the garbage collector): memory for one page, writers never
    /// wait.
    pub fn objects_page(
        &self,
        resource: &str,
        namespace: Option<&str>,
        after: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<StoredObject>, Option<String>)> {
        let resource_prefix = key(b'o', &[resource.as_bytes(), b"/"]);
        let prefix = match namespace {
            Some(ns) => key(b'o', &[resource.as_bytes(), b"/", ns.as_bytes(), b"/"]),
            None => resource_prefix.clone(),
        };
        let start = match after {
            Some(after) => std::ops::Bound::Excluded([resource_prefix.as_slice(), after.as_bytes()].concat()),
            None => std::ops::Bound::Included(prefix.clone()),
        };
        let mut out = Vec::new();
        let mut last: Option<sled::IVec> = None;
        for item in self.tree().range((start, std::ops::Bound::Unbounded)) {
            let (k, v) = item?;
            if !k.starts_with(&prefix) {
                break;
            }
            if out.len() == limit {
                // Go on after the last object returned.
                let after = last
                    .map(|l| String::from_utf8_lossy(l.get(resource_prefix.len()..).unwrap_or_default()).into_owned());
                return Ok((out, after));
            }
            out.push(decode_object(&v)?);
            last = Some(k);
        }
        Ok((out, None))
    }

    /// The objects in `namespace` with an owner reference to `uid` (`metadata.ownerReferences`),
    /// with their resource, as applied (for the passes that delete or orphan them): found through
    /// the owner index, so the cost follows the dependents, not the namespace.
    pub fn dependents(&self, namespace: &str, uid: &str) -> Result<Vec<(String, StoredObject)>> {
        let mut found = Vec::new();
        if uid.is_empty() {
            return Ok(found);
        }
        if !self.tree().contains_key(OWNER_INDEX_READY)? {
            return self.dependents_by_scan(namespace, uid);
        }
        let prefix = owner_prefix(namespace, uid);
        for k in self.tree().scan_prefix(&prefix).map(|item| item.map(|(k, _)| k)) {
            let k = k?;
            let rest = String::from_utf8_lossy(k.get(prefix.len()..).unwrap_or_default()).into_owned();
            let Some((resource, name)) = rest.split_once('/') else { continue };
            let Some(object) = self.applied_object(&ObjectKey::new(resource, namespace, name))? else { continue };
            // Written in the object's own batch, so always in step; checked all the same (a hash).
            if owner_uids(&object.value).any(|u| u == uid) {
                found.push((resource.to_string(), object));
            }
        }
        Ok(found)
    }

    /// [`Store::dependents`] in a store whose owner index is not built yet: every object is read.
    fn dependents_by_scan(&self, namespace: &str, uid: &str) -> Result<Vec<(String, StoredObject)>> {
        let mut found = Vec::new();
        for item in self.tree().scan_prefix(b"o") {
            let (k, v) = item?;
            let path = String::from_utf8_lossy(k.get(1..).unwrap_or_default()).into_owned();
            let mut parts = path.splitn(3, '/');
            let (Some(resource), Some(ns)) = (parts.next(), parts.next()) else { continue };
            let object = decode_object(&v)?;
            if ns == namespace && owner_uids(&object.value).any(|u| u == uid) {
                found.push((resource.to_string(), object));
            }
        }
        Ok(found)
    }

    /// At open: indexes the owners of every object if the store predates the index.
    pub(super) fn build_owner_index(&self) -> Result<()> {
        if self.tree().contains_key(OWNER_INDEX_READY)? {
            return Ok(());
        }
        let mut batch = Batch::default();
        let mut batched = 0;
        for item in self.tree().scan_prefix(b"o") {
            let (k, v) = item?;
            let path = String::from_utf8_lossy(k.get(1..).unwrap_or_default()).into_owned();
            let mut parts = path.splitn(3, '/');
            let (Some(resource), Some(namespace), Some(name)) = (parts.next(), parts.next(), parts.next()) else {
                continue;
            };
            let key = ObjectKey::new(resource, namespace, name);
            index_owners(&mut batch, &key, None, Some(&decode_object(&v)?.value));
            batched += 1;
            if batched == OBJECTS_PAGE {
                self.tree().apply_batch(std::mem::take(&mut batch))?;
                batched = 0;
            }
        }
        batch.insert(OWNER_INDEX_READY, &[1u8][..]);
        self.tree().apply_batch(batch)?;
        self.flush()
    }

    /// The newest resourceVersion the store's reads reach (replicated with an object cache: the
    /// cache's, which may trail etcd's by the watch's delay; writers read etcd's own).
    pub fn current_resource_version(&self) -> Result<u64> {
        Ok(match self.reads().get(RV_COUNTER)? {
            Some(v) => read_be(&v)?,
            None => 0,
        })
    }

    /// Object writes one [`Store::write_objects`] call can hold (for a caller that splits a large
    /// batch that need not be atomic, such as a sweep). Replicated: within one etcd transaction,
    /// counting three operations per write (the object, its change-log entry, and its revision
    /// record or an owner index) plus the counter and its comparison.
    pub fn writes_at_once(&self) -> usize {
        match self.backend().group_ops() {
            usize::MAX => 256,
            ops => (ops.saturating_sub(2) / 3).max(1),
        }
    }

    /// Applies `writes` atomically (all or nothing), durably, at one new resourceVersion.
    pub fn write_objects(&self, writes: Vec<ObjectWrite>) -> Result<WriteOutcome> {
        let pending = self.apply_objects(writes)?;
        self.make_durable(pending)
    }

    /// Applies `writes` atomically at one new resourceVersion; they are acknowledged once
    /// durable, by [`Store::acknowledge`].
    pub fn apply_objects(&self, writes: Vec<ObjectWrite>) -> Result<PendingWrite> {
        self.apply_objects_unless(writes, CancellationToken::new())
    }

    /// [`Store::apply_objects`] for a caller that may stop waiting (a request whose connection is
    /// abandoned): once `abandoned` is cancelled, writes still waiting their turn are not applied
    /// ([`StorageError::Cancelled`]). One already on its way to the store still lands.
    pub fn apply_objects_unless(&self, writes: Vec<ObjectWrite>, abandoned: CancellationToken) -> Result<PendingWrite> {
        // Refused only at the floor: deletes and status updates must work while content is refused.
        self.ensure_space(super::WriteKind::Metadata)?;
        let applying = self.applying();
        let (rv, objects, collect, log_bytes) = self.apply_queued(writes, abandoned)?;
        let logged = self.inner.log_bytes.fetch_add(log_bytes, Ordering::AcqRel) + log_bytes;
        drop(applying);
        // Trim in steps (each is a range delete), often enough that the log stays near its bounds.
        // Only durable entries go (a follower of the log has not read the others yet), so trimming
        // need not wait for this write's flush.
        let trim_every = (self.inner.options.change_log_len / 4).clamp(1, 1024);
        if rv % trim_every == 0 || logged > self.inner.options.change_log_bytes {
            self.trim_change_log(rv.min(self.durable_resource_version().saturating_add(1)))?;
        }
        Ok(PendingWrite { outcome: WriteOutcome { resource_version: rv, objects }, collect })
    }

    /// The batch of one write at resourceVersion `rv`, and what it built ([`BuiltWrite`]).
    /// The objects' current states are read through `reads`: the map, or (replicated) the object
    /// cache, whose answers the caller's compare-and-swap on the counter then vouches for.
    pub(super) fn object_batch(&self, reads: Reads, rv: u64, writes: &[ObjectWrite]) -> Result<(Batch, BuiltWrite)> {
        let mut batch = Batch::default();
        let mut objects = Vec::with_capacity(writes.len());
        let mut collect = false; // a revision changed state: let the collector look
        let mut log_bytes = 0u64;
        // The writes are borrowed (a replicated write may be built again): each object is copied
        // once, to set its resourceVersion, and encoded twice (object, change log).
        for (i, write) in writes.iter().enumerate() {
            // Each change gets its own change-log slot so watchers see every event in order.
            let log_key = key(b'l', &[&be(rv), &(i as u32).to_be_bytes()]);
            match write {
                ObjectWrite::Put { key, object, precondition, revision } => {
                    let existing = object_in(reads, key)?;
                    check(key, *precondition, existing.as_ref())?;
                    let mut object = object.clone();
                    set_resource_version(&mut object, rv);
                    let revision = match *revision {
                        Some(id) => {
                            // The sweep then clears the "may be garbage" marks of its new chunks.
                            collect = true;
                            let mut record = self.revision_record(id)?;
                            record.state = RevisionState::Committed;
                            batch.insert(key_revision(id), encode_json(&record));
                            Some(id)
                        }
                        None => existing.as_ref().and_then(|e| e.revision),
                    };
                    index_owners(&mut batch, key, existing.as_ref().map(|e| &e.value), Some(&object));
                    let kind = if existing.is_some() { "MODIFIED" } else { "ADDED" };
                    batch.insert(key.encode(), encode_json(&Envelope { rv, revision, object: &object }));
                    let entry = encode_log(&change(kind, key, &object, existing.as_ref().map(|e| &e.value)));
                    log_bytes += entry.len() as u64;
                    batch.insert(log_key, entry);
                    objects.push(object);
                }
                ObjectWrite::Delete { key, precondition } => {
                    let existing = object_in(reads, key)?;
                    check(key, *precondition, existing.as_ref())?;
                    let Some(existing) = existing else { continue };
                    let mut object = existing.value.clone();
                    set_resource_version(&mut object, rv);
                    if let Some(id) = existing.revision {
                        let mut record = self.revision_record(id)?;
                        record.state = RevisionState::Deleting;
                        batch.insert(key_revision(id), encode_json(&record));
                        collect = true;
                    }
                    index_owners(&mut batch, key, Some(&existing.value), None);
                    batch.remove(key.encode());
                    let entry = encode_log(&change("DELETED", key, &object, Some(&existing.value)));
                    log_bytes += entry.len() as u64;
                    batch.insert(log_key, entry);
                    objects.push(object);
                }
            }
        }
        batch.insert(RV_COUNTER, &be(rv)[..]);
        Ok((batch, (rv, objects, collect, log_bytes)))
    }

    /// Durable change-log entries after `after` (exclusive), oldest first.
    pub fn changes_since(&self, after: u64) -> impl Iterator<Item = Result<(u64, ChangeEvent)>> + '_ {
        self.changes_since_as(after)
    }

    /// [`Store::changes_since`], each entry decoded as `T`: a view of [`ChangeEvent`]'s fields
    /// (fields it leaves out are skipped, not built), such as [`ChangedObject`].
    pub fn changes_since_as<T: serde::de::DeserializeOwned>(
        &self,
        after: u64,
    ) -> impl Iterator<Item = Result<(u64, T)>> + '_ {
        // A reader may already be past the durable end (it listed a write still being flushed).
        let durable = self.durable_resource_version().max(after);
        let end = key_log(durable.saturating_add(1));
        self.reads().range(key_log(after.saturating_add(1))..end).map(|item| {
            let (k, v) = item?;
            let rv = read_be(k.get(1..).unwrap_or_default())?;
            Ok((rv, decode_log(&v)?))
        })
    }

    /// At least `limit` changes after `after` (fewer at the end of the log), never splitting the
    /// changes of one resourceVersion, so a reader can resume from the last one it got.
    pub fn changes_after(&self, after: u64, limit: usize) -> Result<Vec<(u64, ChangeEvent)>> {
        self.changes_after_as(after, limit)
    }

    /// [`Store::changes_after`], each entry decoded as `T` (see [`Store::changes_since_as`]).
    pub fn changes_after_as<T: serde::de::DeserializeOwned>(&self, after: u64, limit: usize) -> Result<Vec<(u64, T)>> {
        let mut out: Vec<(u64, T)> = Vec::new();
        for item in self.changes_since_as(after) {
            let (rv, event) = item?;
            if out.len() >= limit && out.last().is_some_and(|(last, _)| *last != rv) {
                break;
            }
            out.push((rv, event));
        }
        Ok(out)
    }

    /// Whether the log still holds every change after `after`, so that the state at `after` can
    /// be replayed or reconstructed.
    pub fn log_covers(&self, after: u64) -> Result<bool> {
        let start = match self.reads().get(LOG_START)? {
            Some(v) => read_be(&v)?,
            None => 0, // never trimmed
        };
        Ok(after.saturating_add(1) >= start)
    }

    /// Drops the oldest entries beyond the log's length, and beyond its byte budget (down to three
    /// quarters of it), whole resourceVersions at a time; the newest one always stays.
    fn trim_change_log(&self, rv: u64) -> Result<()> {
        let _trimming = self.inner.log_trim.lock().unwrap_or_else(|e| e.into_inner());
        let count_floor = rv.saturating_sub(self.inner.options.change_log_len);
        let target = self.inner.options.change_log_bytes / 4 * 3;
        let total = self.inner.log_bytes.load(Ordering::Acquire);
        let mut batch = Batch::default();
        let (mut freed, mut keep_from, mut removing) = (0u64, count_floor, None::<u64>);
        for item in self.tree().range(key(b'l', &[])..key(b'm', &[])) {
            let (k, v) = item?;
            let entry_rv = read_be(k.get(1..).unwrap_or_default())?;
            if removing != Some(entry_rv) {
                // A new resourceVersion: decided as a whole.
                let over = total.saturating_sub(freed) > target;
                if entry_rv >= rv || (entry_rv >= count_floor && !over) {
                    break;
                }
                removing = Some(entry_rv);
                keep_from = keep_from.max(entry_rv + 1);
            }
            freed += v.len() as u64;
            batch.remove(k);
        }
        // The log's new start first, then the entries: a reader never takes the log to cover what
        // is gone. Compare-and-swap, so that of two replicas trimming at once one moves it, forward.
        let start = self.tree().get(LOG_START)?;
        let started = start.as_deref().map(read_be).transpose()?.unwrap_or(0);
        if keep_from > started
            && !self.tree().compare_and_swap(LOG_START, start.as_deref(), Some(&be(keep_from)[..]))?
        {
            return Ok(());
        }
        self.tree().apply_batch(batch)?;
        self.inner.log_bytes.fetch_sub(freed.min(total), Ordering::AcqRel);
        Ok(())
    }

    /// At open: the bytes the change log holds.
    pub(super) fn count_log_bytes(&self) -> Result<()> {
        let mut total = 0u64;
        for item in self.tree().range(key(b'l', &[])..key(b'm', &[])) {
            total += item?.1.len() as u64;
        }
        self.inner.log_bytes.store(total, Ordering::Release);
        Ok(())
    }

    pub(super) fn revision_record(&self, id: RevisionId) -> Result<RevisionRecord> {
        let v = self.tree().get(key_revision(id))?.ok_or_else(|| StorageError::NotFound(format!("revision {id}")))?;
        decode_json(&v)
    }

    pub(super) fn lock_objects(&self) -> std::sync::MutexGuard<'_, ()> {
        self.inner.object_lock.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Log entries are zstd-compressed JSON (Kubernetes objects shrink three- to fivefold); entries
/// written before compression are plain JSON, told apart by zstd's magic number.
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];
/// Largest decompressed log entry accepted (objects are limited far below this).
const MAX_LOG_ENTRY: usize = 64 << 20;

fn encode_log(event: &ChangeEventRef<'_>) -> Vec<u8> {
    let json = encode_json(event);
    super::chunks::zstd_with_thread_context(&json, 1).unwrap_or(json)
}

pub(super) fn decode_log<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T> {
    thread_local! {
        // Every follower of the log (watch cache, collector, reconciler) decodes every entry: a
        // context per entry cost more than the decompression.
        static DECOMPRESSOR: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> =
            std::cell::RefCell::new(zstd::bulk::Decompressor::new().ok());
    }
    if bytes.starts_with(&ZSTD_MAGIC) {
        // The frame records its size (written by `encode_log`): allocating the bound instead
        // mapped and unmapped 64 MiB per entry.
        let size = zstd::zstd_safe::get_frame_content_size(bytes)
            .ok()
            .flatten()
            .and_then(|size| usize::try_from(size).ok())
            .map_or(MAX_LOG_ENTRY, |size| size.min(MAX_LOG_ENTRY));
        let json = DECOMPRESSOR
            .with(|d| match d.borrow_mut().as_mut() {
                Some(decompressor) => decompressor.decompress(bytes, size),
                None => zstd::bulk::decompress(bytes, size),
            })
            .map_err(|e| StorageError::Corrupt(format!("undecodable change-log entry: {e}")))?;
        return decode_json(&json);
    }
    decode_json(bytes)
}

/// Where the change log's entries at `rv` start.
fn key_log(rv: u64) -> Vec<u8> {
    key(b'l', &[&be(rv)])
}

pub(super) fn key_revision(id: RevisionId) -> Vec<u8> {
    key(b'v', &[&be(id)])
}

/// The uids an object's `metadata.ownerReferences` name.
fn owner_uids(object: &Value) -> impl Iterator<Item = &str> {
    object
        .pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|r| r.get("uid").and_then(Value::as_str))
        .filter(|uid| !uid.is_empty())
}

/// `d` namespace `/` hash(uid): the keys of the objects `uid` owns in `namespace` start so (a
/// fixed-width hash, so no uid is a prefix of another).
fn owner_prefix(namespace: &str, uid: &str) -> Vec<u8> {
    let hash = blake3::hash(uid.as_bytes());
    key(b'd', &[namespace.as_bytes(), b"/", &hash.as_bytes()[..16]])
}

/// Moves an object's owner-index entries from its `old` owners to its `new` ones, in its batch.
fn index_owners(batch: &mut Batch, key: &ObjectKey, old: Option<&Value>, new: Option<&Value>) {
    let entry = |uid: &str| {
        let mut k = owner_prefix(&key.namespace, uid);
        k.extend_from_slice(key.resource.as_bytes());
        k.push(b'/');
        k.extend_from_slice(key.name.as_bytes());
        k
    };
    // Removals first: a Batch keeps the last operation on a key, so kept owners stay indexed.
    for uid in old.into_iter().flat_map(owner_uids) {
        batch.remove(entry(uid));
    }
    for uid in new.into_iter().flat_map(owner_uids) {
        batch.insert(entry(uid), &[][..]);
    }
}

fn change<'a>(kind: &'a str, key: &'a ObjectKey, object: &'a Value, previous: Option<&'a Value>) -> ChangeEventRef<'a> {
    ChangeEventRef { kind, resource: &key.resource, namespace: &key.namespace, name: &key.name, object, previous }
}

/// A stored object's resourceVersion and its JSON, borrowed from the stored bytes (not decoded).
pub(super) struct StoredRef<'a> {
    pub(super) rv: u64,
    pub(super) object: &'a [u8],
}

/// An [`Envelope`] read without decoding its object: the object's bytes are what serialising the
/// decoded object writes (the envelope is `serde_json`'s compact output, and decoding then
/// encoding it again gives the same bytes), so they can be sent as they are.
pub(super) fn decode_stored(bytes: &[u8]) -> Result<StoredRef<'_>> {
    if let Some(found) = split_envelope(bytes) {
        return Ok(found);
    }
    /// Any other spelling of an envelope (none is written today): read by serde.
    #[derive(Deserialize)]
    struct Raw<'a> {
        rv: u64,
        #[serde(borrow)]
        object: &'a RawValue,
    }
    let raw: Raw =
        serde_json::from_slice(bytes).map_err(|e| StorageError::Corrupt(format!("undecodable record: {e}")))?;
    Ok(StoredRef { rv: raw.rv, object: raw.object.get().as_bytes() })
}

/// The envelope as [`encode_json`] writes it, `{"rv":N,"object":{…}}` or
/// `{"rv":N,"revision":M,"object":{…}}`, split without scanning the object: a list reads
/// thousands of them, and validating each object's JSON was most of its time. The bytes are the
/// store's own (sled checksums what it reads back).
fn split_envelope(bytes: &[u8]) -> Option<StoredRef<'_>> {
    let number = |text: &[u8]| -> Option<(u64, usize)> {
        let digits = text.iter().take_while(|b| b.is_ascii_digit()).count();
        let value = std::str::from_utf8(text.get(..digits)?).ok()?.parse().ok()?;
        Some((value, digits))
    };
    let rest = bytes.strip_prefix(br#"{"rv":"#)?;
    let (rv, digits) = number(rest)?;
    let mut rest = rest.get(digits..)?;
    if let Some(after) = rest.strip_prefix(br#","revision":"#) {
        let (_, digits) = number(after)?;
        rest = after.get(digits..)?;
    }
    let object = rest.strip_prefix(br#","object":"#)?.strip_suffix(b"}")?;
    (object.starts_with(b"{") && object.ends_with(b"}")).then_some(StoredRef { rv, object })
}

/// The object at `key` as `reads` has it.
fn object_in(reads: Reads, key: &ObjectKey) -> Result<Option<StoredObject>> {
    reads.get(key.encode())?.map(|v| decode_object(&v)).transpose()
}

fn decode_object(bytes: &[u8]) -> Result<StoredObject> {
    let envelope: Envelope = decode_json(bytes)?;
    Ok(StoredObject { value: envelope.object, resource_version: envelope.rv, revision: envelope.revision })
}

fn check(key: &ObjectKey, precondition: Precondition, existing: Option<&StoredObject>) -> Result<()> {
    match (precondition, existing) {
        (Precondition::MustNotExist, Some(_)) => Err(StorageError::AlreadyExists(key.describe())),
        (Precondition::MustExist | Precondition::ResourceVersion(_), None) => {
            Err(StorageError::NotFound(key.describe()))
        }
        (Precondition::ResourceVersion(rv), Some(e)) if e.resource_version != rv => {
            Err(StorageError::Conflict(key.describe()))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The borrowed forms write exactly what the owned ones read back (stored bytes are sent as
    /// they are, and old records must keep decoding).
    #[test]
    fn borrowed_records_are_written_as_the_owned_ones() {
        let object = serde_json::json!({"metadata": {"name": "a", "resourceVersion": "7"}, "spec": {"x": "é\n"}});
        let previous = serde_json::json!({"metadata": {"name": "a"}});
        for revision in [None, Some(3)] {
            let owned = Envelope { rv: 7, revision, object: object.clone() };
            let borrowed = Envelope { rv: 7, revision, object: &object };
            assert_eq!(encode_json(&borrowed), encode_json(&owned));
        }
        let key = ObjectKey::new("bundles", "ns", "a");
        for previous in [None, Some(&previous)] {
            let bytes = encode_log(&change("MODIFIED", &key, &object, previous));
            let event: ChangeEvent = decode_log(&bytes).unwrap();
            assert_eq!((event.kind.as_str(), event.name.as_str(), &event.object), ("MODIFIED", "a", &object));
            assert_eq!(event.previous.as_ref(), previous);
            let owned = ChangeEvent { previous: previous.cloned(), ..event };
            assert_eq!(encode_json(&change("MODIFIED", &key, &object, previous)), encode_json(&owned));
        }
    }
}
