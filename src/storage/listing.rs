//! Paged lists of API objects as of one resourceVersion (consistent snapshots), read without
//! stopping writers.
//!
//! A list without a resourceVersion is at the *durable* one ([`Store::durable_resource_version`]),
//! never showing a write a crash could still take back.
//!
//! sled keeps only the current state, so a page "as of" a resourceVersion `at` is the current state
//! with every object changed since `at` replaced by its state before that change, which the change
//! log records (`ChangeEvent::previous`). A list takes no lock: it reads `at` (the durable version,
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
//! Objects are handed one at a time to a [`ListSink`] as [`Listed`]: the object's JSON as stored,
//! decoded only when the filter or the sink needs its fields (the API copies a plain list's objects
//! straight into the response bytes), so a list holds one object, not a page of them. A long list is read
//! in steps ([`ListCursor`]): each step fills the sink up to its bound and the caller sends it
//! before asking for the next, so neither the list nor a thread is held for a slow client.

use std::collections::BTreeMap;
use std::ops::Bound;

use serde::Deserialize;
use serde_json::Value;

use super::objects::decode_stored;
use super::{be, key, read_be, Result, StorageError, Store};

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

/// Which objects a list keeps: all (`None`, read without decoding them), or those a predicate over
/// the decoded object accepts.
pub type ListFilter<'a> = Option<&'a (dyn Fn(&Value) -> bool + 'a)>;

/// One object of a list: its JSON as stored (exactly what serialising the decoded object writes),
/// decoded only when asked for, or an object the change log gave back decoded.
pub struct Listed<'a> {
    json: Option<&'a [u8]>,
    value: Option<Value>,
}

impl<'a> Listed<'a> {
    fn stored(json: &'a [u8]) -> Listed<'a> {
        Listed { json: Some(json), value: None }
    }

    fn decoded(value: Value) -> Listed<'static> {
        Listed { json: None, value: Some(value) }
    }

    /// The object, decoded (once).
    pub fn value(&mut self) -> Result<&Value> {
        let value = match (self.value.take(), self.json) {
            (Some(value), _) => value,
            (None, Some(json)) => super::decode_json(json)?,
            (None, None) => Value::Null,
        };
        Ok(self.value.insert(value))
    }

    /// The object, decoded.
    pub fn into_value(mut self) -> Result<Value> {
        self.value()?;
        Ok(self.value.unwrap_or(Value::Null))
    }

    /// Appends the object's JSON to `out`: the stored bytes as they are, when there are any.
    pub fn write_json(&self, out: &mut Vec<u8>) {
        match (self.json, &self.value) {
            (Some(json), _) => out.extend_from_slice(json),
            // Writing a JSON value into memory cannot fail.
            (None, Some(value)) => {
                let _ = serde_json::to_writer(out, value);
            }
            (None, None) => out.extend_from_slice(b"null"),
        }
    }
}

/// Receives the objects of a page, in key order, one at a time.
pub trait ListSink {
    /// The next object that passed the filter. An error (an object that cannot be decoded) ends
    /// the list.
    fn push(&mut self, object: Listed<'_>) -> Result<()>;
    /// The list starts over (at a newer resourceVersion): forget every object pushed so far.
    fn restart(&mut self);
    /// Whether the sink holds enough for one step of a [`ListCursor`]: the step ends there and
    /// the next one goes on after the last object pushed.
    fn is_full(&self) -> bool {
        false
    }
}

impl ListSink for Vec<Value> {
    fn push(&mut self, object: Listed<'_>) -> Result<()> {
        Vec::push(self, object.into_value()?);
        Ok(())
    }
    fn restart(&mut self) {
        self.clear();
    }
}

impl Store {
    /// A page of objects, in key order (namespace, then name), consistent at one resourceVersion.
    pub fn list_page(&self, query: &ListQuery, filter: ListFilter) -> Result<ListPage> {
        self.list_into(query, filter, Vec::new())
    }

    /// [`Store::list_page`], handing each object to `sink` as it is read.
    pub fn list_into<S: ListSink>(&self, query: &ListQuery, filter: ListFilter, mut sink: S) -> Result<ListPage<S>> {
        let mut cursor = self.list_start(query, filter, &mut sink)?;
        while !cursor.is_done() {
            cursor.fill(self, filter, &mut sink)?;
        }
        Ok(ListPage { items: sink, resource_version: cursor.at, last: cursor.last })
    }

    /// Starts a list read in steps: fills `sink` with the first step (up to its
    /// [`ListSink::is_full`]) and returns the cursor for the rest, which is at the same
    /// resourceVersion. A fresh list whose version the log dropped while this step was read (the
    /// writers outran it) starts over once, at the version they reached.
    pub fn list_start(&self, query: &ListQuery, filter: ListFilter, sink: &mut dyn ListSink) -> Result<ListCursor> {
        let mut cursor = self.list_cursor(query)?;
        match cursor.fill(self, filter, sink) {
            Err(StorageError::Expired(_)) if query.at.is_none() => {
                sink.restart();
                cursor = self.list_cursor(query)?;
                cursor.fill(self, filter, sink)?;
            }
            other => other?,
        }
        Ok(cursor)
    }

    fn list_cursor(&self, query: &ListQuery) -> Result<ListCursor> {
        let resource_prefix = key(b'o', &[query.resource.as_bytes(), b"/"]);
        let prefix = match query.namespace {
            Some(ns) => key(b'o', &[query.resource.as_bytes(), b"/", ns.as_bytes(), b"/"]),
            None => resource_prefix.clone(),
        };
        let position = match query.after {
            Some(after) if prefix.as_slice() <= [resource_prefix.as_slice(), after.as_bytes()].concat().as_slice() => {
                Bound::Excluded([resource_prefix.as_slice(), after.as_bytes()].concat())
            }
            _ => Bound::Included(prefix.clone()),
        };
        // What a crash could no longer undo: a fresh list is at the durable resourceVersion (the
        // log has the writes applied since, so it reads as any other past version); a named one
        // not yet durable waits for the flush that covers it. Durable is read before current:
        // read after, a write flushed in between made a fresh list "too new" for itself.
        let at = match query.at {
            Some(at) => at,
            None => self.consistent_resource_version()?,
        };
        let current = self.current_resource_version()?;
        if at > current {
            return Err(StorageError::TooNew { requested: at, current });
        }
        self.flush_covering(at)?;
        Ok(ListCursor {
            at,
            changed: Changed { at, seen: at, prefix: prefix.clone(), first: BTreeMap::new(), pages: None },
            prefix,
            resource_prefix,
            position,
            limit: query.limit.unwrap_or(usize::MAX),
            count: 0,
            last_key: None,
            last: None,
            done: false,
        })
    }
}

/// A list being read in steps at one resourceVersion ([`Store::list_start`]): each
/// [`ListCursor::fill`] goes on where the previous one stopped, keeping what it learnt of the
/// change log, so reading a list in many steps costs what reading it at once does. It holds no
/// lock and no sled iterator between steps: it may wait for a slow client as long as the log
/// covers its version (then a step fails with `Expired`).
pub struct ListCursor {
    at: u64,
    changed: Changed,
    prefix: Vec<u8>,
    resource_prefix: Vec<u8>,
    /// Every key up to here has been served (or skipped).
    position: Bound<Vec<u8>>,
    limit: usize,
    /// Objects that passed the filter so far.
    count: usize,
    last_key: Option<Vec<u8>>,
    /// Set once done, when the limit ended the list before its end: the last object's name.
    last: Option<String>,
    done: bool,
}

impl ListCursor {
    /// The resourceVersion every step is consistent at.
    pub fn resource_version(&self) -> u64 {
        self.at
    }

    /// Whether the list (or its page) is complete.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// Once done: `namespace/name` of the last object if more objects follow the page.
    pub fn continue_after(&self) -> Option<&str> {
        self.last.as_deref()
    }

    /// Reads on until `sink` is full, the limit is reached or the list ends.
    pub fn fill(&mut self, store: &Store, filter: ListFilter, sink: &mut dyn ListSink) -> Result<()> {
        if self.done {
            return Ok(());
        }
        let prefix = self.prefix.clone();
        // Ends where the prefix does: a scan past it would read a page beyond (from etcd, where
        // an object cache holds no more keys).
        let end = super::meta::prefix_end(&prefix).map_or(Bound::Unbounded, Bound::Excluded);
        let mut live = store.reads().range((self.position.clone(), end)).take_while(|item| match item {
            Ok((k, _)) => k.starts_with(&prefix),
            Err(_) => true,
        });
        let mut next_live = live.next().transpose()?;
        // After every read of the live tree: what changed up to (at least) the moment it was read.
        self.changed.catch_up(store)?;
        loop {
            // The next key in order: from the live tree unless the log knows that key's past.
            let past_key = self.changed.next_after(&self.position).cloned();
            let live_first = match (&next_live, &past_key) {
                (None, None) => break,
                (Some((l, _)), Some(p)) => l.as_ref() < p.as_slice(),
                (Some(_), None) => true,
                (None, Some(_)) => false,
            };
            let (object_key, found) = if live_first {
                let Some((object_key, stored)) = next_live.take() else { break };
                next_live = live.next().transpose()?;
                self.changed.catch_up(store)?;
                (object_key.to_vec(), Some(Found::Stored(stored)))
            } else {
                let Some(object_key) = past_key else { break };
                if next_live.as_ref().is_some_and(|(l, _)| l.as_ref() == object_key.as_slice()) {
                    next_live = live.next().transpose()?;
                    self.changed.catch_up(store)?;
                }
                let value = self.changed.state_at(store, &object_key)?;
                (object_key, value.map(Found::Past))
            };
            let Some(found) = found else {
                self.position = Bound::Excluded(object_key);
                continue;
            };
            let stored;
            let mut listed = match found {
                Found::Stored(bytes) => {
                    stored = bytes;
                    let envelope = decode_stored(&stored)?;
                    if envelope.rv > self.at {
                        // Changed after `at`, yet the log (caught up before it was read) does not
                        // say so: trimmed.
                        return Err(StorageError::Expired(self.at));
                    }
                    Listed::stored(envelope.object)
                }
                Found::Past(value) => Listed::decoded(value),
            };
            if self.count == self.limit {
                // Another object exists beyond the page.
                let resource_prefix = self.resource_prefix.len();
                self.last = self
                    .last_key
                    .take()
                    .map(|k| String::from_utf8_lossy(k.get(resource_prefix..).unwrap_or_default()).into_owned());
                self.done = true;
                return Ok(());
            }
            self.position = Bound::Excluded(object_key);
            let selected = match filter {
                None => true,
                Some(filter) => filter(listed.value()?),
            };
            if selected {
                sink.push(listed)?;
                self.count += 1;
                if let Bound::Excluded(k) = &self.position {
                    self.last_key = Some(k.clone());
                }
                if sink.is_full() {
                    return Ok(());
                }
            }
        }
        self.done = true;
        Ok(())
    }
}

/// An object a step read: as stored, or its past state from the change log.
enum Found {
    Stored(sled::IVec),
    Past(Value),
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
    /// Replicated: the map's page count when this last caught up. The live objects come from
    /// etcd a page at a time, so only a new page can hold what a catch-up has not seen; catching
    /// up after every object would cost three etcd round trips each.
    pages: Option<u64>,
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
        let pages = store.reads().pages_read();
        if pages.is_some() && pages == self.pages {
            return Ok(());
        }
        let current = store.current_resource_version()?;
        // Read after this catch-up's own reads: a later page (of this list, or of another one)
        // moves it on.
        let caught_up = |changed: &mut Changed| changed.pages = store.reads().pages_read();
        if current <= self.seen {
            caught_up(self);
            return Ok(());
        }
        let mut seen = current;
        for item in store.reads().range(key(b'l', &[&be(self.seen + 1)])..key(b'm', &[])) {
            let (log_key, entry) = item?;
            seen = seen.max(read_be(log_key.get(1..).unwrap_or_default())?);
            let change: ChangeHead = super::objects::decode_log(&entry)?;
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
        caught_up(self);
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
        let entry = store.reads().get(log_key)?.ok_or(StorageError::Expired(self.at))?;
        let previous: Previous = super::objects::decode_log(&entry)?;
        // Entries written before the log kept previous states cannot be replayed.
        previous.previous.map(Some).ok_or(StorageError::Expired(self.at))
    }
}
