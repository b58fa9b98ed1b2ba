//! Paged lists of API objects as of one resourceVersion (consistent snapshots), read without
//! stopping writers.
//!
//! sled keeps only the current state, so a page "as of" a resourceVersion `at` is the current state
//! with every object changed since `at` replaced by its state before that change, which the change
//! log records (`ChangeEvent::previous`). A list takes no lock: it reads `at` (the current version,
//! unless the client named one), scans the live objects while writers go on, and keeps, alongside,
//! the set of objects the log says changed after `at` — caught up after every step of the scan, so
//! an object that changed, appeared or vanished behind the scan's back is known before the scan
//! passes its key. Such an object is served as the log says it was at `at`.
//!
//! A snapshot is readable exactly as long as the log still covers it; after that the caller gets
//! [`StorageError::Expired`], as a kube-apiserver does once etcd compacted the revision a continue
//! token names. A fresh list whose version the log dropped while it was being read starts over once,
//! at a newer version ([`ListSink::restart`]).
//!
//! Objects are decoded one at a time and handed to a [`ListSink`] (the API writes each straight into
//! the response bytes), so a list holds one decoded object, not a page of them.

use std::collections::BTreeMap;
use std::ops::Bound;

use serde::Deserialize;
use serde_json::Value;

use super::objects::decode_envelope;
use super::{be, decode_json, key, read_be, Result, StorageError, Store};

/// What to list.
pub struct ListQuery<'a> {
    /// Resource (plural).
    pub resource: &'a str,
    /// One namespace, or all.
    pub namespace: Option<&'a str>,
    /// The resourceVersion to list at; `None` lists the current state.
    pub at: Option<u64>,
    /// Continue after this object (`namespace/name`, as returned in [`ListPage::last`]).
    pub after: Option<&'a str>,
    /// At most this many objects (that pass the filter).
    pub limit: Option<usize>,
}

/// One page of a list: its objects (as the [`ListSink`] kept them) and where it ends.
#[derive(Debug)]
pub struct ListPage<S = Vec<Value>> {
    pub items: S,
    /// The resourceVersion the whole list (every page) is consistent at.
    pub resource_version: u64,
    /// Set when more objects may follow: the `namespace/name` of the last object returned.
    pub last: Option<String>,
}

/// Receives the objects of a page, in key order, one at a time.
pub trait ListSink {
    /// The next object that passed the filter.
    fn push(&mut self, object: Value);
    /// The list starts over (at a newer resourceVersion): forget every object pushed so far.
    fn restart(&mut self);
}

impl ListSink for Vec<Value> {
    fn push(&mut self, object: Value) {
        Vec::push(self, object);
    }
    fn restart(&mut self) {
        self.clear();
    }
}

impl Store {
    /// A page of objects, in key order (namespace, then name), consistent at one resourceVersion.
    pub fn list_page(&self, query: &ListQuery, filter: &dyn Fn(&Value) -> bool) -> Result<ListPage> {
        self.list_into(query, filter, Vec::new())
    }

    /// [`Store::list_page`], handing each object to `sink` as it is read.
    pub fn list_into<S: ListSink>(
        &self,
        query: &ListQuery,
        filter: &dyn Fn(&Value) -> bool,
        mut sink: S,
    ) -> Result<ListPage<S>> {
        let (resource_version, last) = match self.scan(query, filter, &mut sink) {
            // The log dropped the version this fresh list started at while it was read: the
            // writers outran it. Once more, at the version they reached.
            Err(StorageError::Expired(_)) if query.at.is_none() => {
                sink.restart();
                self.scan(query, filter, &mut sink)?
            }
            other => other?,
        };
        Ok(ListPage { items: sink, resource_version, last })
    }

    /// One pass of a list: its resourceVersion and, if more objects follow, the last one's name.
    fn scan(
        &self,
        query: &ListQuery,
        filter: &dyn Fn(&Value) -> bool,
        sink: &mut dyn ListSink,
    ) -> Result<(u64, Option<String>)> {
        let resource_prefix = key(b'o', &[query.resource.as_bytes(), b"/"]);
        let prefix = match query.namespace {
            Some(ns) => key(b'o', &[query.resource.as_bytes(), b"/", ns.as_bytes(), b"/"]),
            None => resource_prefix.clone(),
        };
        let start = match query.after {
            Some(after) if prefix.as_slice() <= [resource_prefix.as_slice(), after.as_bytes()].concat().as_slice() => {
                Bound::Excluded([resource_prefix.as_slice(), after.as_bytes()].concat())
            }
            _ => Bound::Included(prefix.clone()),
        };
        let current = self.current_resource_version()?;
        let at = query.at.unwrap_or(current);
        if at > current {
            return Err(StorageError::TooNew { requested: at, current });
        }
        let mut changed = Changed { at, seen: at, prefix: prefix.clone(), first: BTreeMap::new() };
        let mut live = self.tree().range((start.clone(), Bound::Unbounded)).take_while(|item| match item {
            Ok((k, _)) => k.starts_with(&prefix),
            Err(_) => true,
        });
        // Every key up to `position` has been served (or skipped).
        let mut position = start;
        let mut next_live = live.next().transpose()?;
        // After every read of the live tree: what changed up to (at least) the moment it was read.
        changed.catch_up(self)?;
        let mut count = 0;
        let mut last_key: Option<Vec<u8>> = None;
        let limit = query.limit.unwrap_or(usize::MAX);
        loop {
            // The next key in order: from the live tree unless the log knows that key's past.
            let past_key = changed.next_after(&position).cloned();
            let live_first = match (&next_live, &past_key) {
                (None, None) => break,
                (Some((l, _)), Some(p)) => l.as_ref() < p.as_slice(),
                (Some(_), None) => true,
                (None, Some(_)) => false,
            };
            let (object_key, value) = if live_first {
                let Some((object_key, stored)) = next_live.take() else { break };
                let envelope = decode_envelope(&stored)?;
                if envelope.rv > at {
                    // Changed after `at`, yet the log (caught up since) does not say so: trimmed.
                    return Err(StorageError::Expired(at));
                }
                next_live = live.next().transpose()?;
                changed.catch_up(self)?;
                (object_key.to_vec(), Some(envelope.object))
            } else {
                let Some(object_key) = past_key else { break };
                if next_live.as_ref().is_some_and(|(l, _)| l.as_ref() == object_key.as_slice()) {
                    next_live = live.next().transpose()?;
                    changed.catch_up(self)?;
                }
                let value = changed.state_at(self, &object_key)?;
                (object_key, value)
            };
            position = Bound::Excluded(object_key);
            let Some(value) = value else { continue };
            if count == limit {
                // Another object exists beyond the page.
                let last = last_key.map(|k| String::from_utf8_lossy(&k[resource_prefix.len()..]).into_owned());
                return Ok((at, last));
            }
            if filter(&value) {
                sink.push(value);
                count += 1;
                if let Bound::Excluded(k) = &position {
                    last_key = Some(k.clone());
                }
            }
        }
        Ok((at, None))
    }
}

/// The objects under a prefix that the change log says changed after a list's resourceVersion.
struct Changed {
    at: u64,
    /// Log entries up to this resourceVersion are accounted for.
    seen: u64,
    prefix: Vec<u8>,
    /// Object key → the log key of the object's first change after `at`, which holds its state at
    /// `at`; `None` if that change created it (it did not exist at `at`).
    first: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
}

/// What a list needs of a change-log entry (the objects in it are skipped, not decoded).
#[derive(Deserialize)]
struct ChangeHead {
    #[serde(rename = "type")]
    kind: String,
    resource: String,
    namespace: String,
    name: String,
}

/// The state before a change, alone.
#[derive(Deserialize)]
struct Previous {
    previous: Option<Value>,
}

impl Changed {
    /// Reads the log entries written since the last call (none if nothing was written).
    fn catch_up(&mut self, store: &Store) -> Result<()> {
        let current = store.current_resource_version()?;
        if current <= self.seen {
            return Ok(());
        }
        let mut seen = current;
        for item in store.tree().range(key(b'l', &[&be(self.seen + 1)])..key(b'm', &[])) {
            let (log_key, entry) = item?;
            seen = seen.max(read_be(log_key.get(1..).unwrap_or_default())?);
            let change: ChangeHead = decode_json(&entry)?;
            let object_key = key(
                b'o',
                &[change.resource.as_bytes(), b"/", change.namespace.as_bytes(), b"/", change.name.as_bytes()],
            );
            if object_key.starts_with(&self.prefix) {
                // Only the earliest change after `at` tells the state at `at`.
                let created = change.kind == "ADDED";
                self.first.entry(object_key).or_insert_with(|| (!created).then(|| log_key.to_vec()));
            }
        }
        // Checked after reading: a trim that raced the read shows here.
        if !store.log_covers(self.at)? {
            return Err(StorageError::Expired(self.at));
        }
        self.seen = seen;
        Ok(())
    }

    /// The first changed object key after `position`.
    fn next_after(&self, position: &Bound<Vec<u8>>) -> Option<&Vec<u8>> {
        let lower = match position {
            Bound::Included(k) => Bound::Included(k.as_slice()),
            Bound::Excluded(k) => Bound::Excluded(k.as_slice()),
            Bound::Unbounded => Bound::Unbounded,
        };
        self.first.range::<[u8], _>((lower, Bound::Unbounded)).next().map(|(k, _)| k)
    }

    /// The state at `at` of a changed object (`None`: it did not exist).
    fn state_at(&self, store: &Store, object_key: &[u8]) -> Result<Option<Value>> {
        let Some(Some(log_key)) = self.first.get(object_key) else { return Ok(None) };
        // Gone from the log since it was read: trimmed, so the log no longer covers `at`.
        let entry = store.tree().get(log_key)?.ok_or(StorageError::Expired(self.at))?;
        let previous: Previous = decode_json(&entry)?;
        // Entries written before the log kept previous states cannot be replayed.
        previous.previous.map(Some).ok_or(StorageError::Expired(self.at))
    }
}
