//! Paged lists of API objects as of one resourceVersion (consistent snapshots).
//!
//! sled keeps only the current state, so a page "as of" an older resourceVersion `at` is the
//! current state with every object changed since `at` replaced by its state before that change,
//! which the change log records (`ChangeEvent::previous`). A snapshot is therefore readable exactly
//! as long as the log still covers it; after that the caller gets [`StorageError::Expired`], as a
//! kube-apiserver does once etcd compacted the revision a continue token names.

use std::collections::BTreeMap;
use std::ops::Bound;

use serde_json::Value;

use super::objects::decode_envelope;
use super::{key, Result, StorageError, Store};

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

/// One page of a list.
#[derive(Debug)]
pub struct ListPage {
    pub items: Vec<Value>,
    /// The resourceVersion the whole list (every page) is consistent at.
    pub resource_version: u64,
    /// Set when more objects may follow: the `namespace/name` of the last object returned.
    pub last: Option<String>,
}

impl Store {
    /// A page of objects, in key order (namespace, then name), consistent at one resourceVersion.
    pub fn list_page(&self, query: &ListQuery, filter: &dyn Fn(&Value) -> bool) -> Result<ListPage> {
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
        // Under the write lock, so the current state and the log agree with each other.
        let _guard = self.lock_objects();
        let current = self.current_resource_version()?;
        let at = query.at.unwrap_or(current);
        if at > current {
            return Err(StorageError::TooNew { requested: at, current });
        }
        let changed = self.states_at(at, &prefix)?;
        let mut live = self.tree().range((start.clone(), Bound::Unbounded)).take_while(|item| match item {
            Ok((k, _)) => k.starts_with(&prefix),
            Err(_) => true,
        });
        let mut past = changed.range((start, Bound::Unbounded)).peekable();
        let mut next_live = live.next().transpose()?;
        let mut items = Vec::new();
        let mut last_key: Option<Vec<u8>> = None;
        let limit = query.limit.unwrap_or(usize::MAX);
        loop {
            // The next key in order: from the live tree unless the log knows that key's past.
            let live_key = next_live.as_ref().map(|(k, _)| k.to_vec());
            let past_key = past.peek().map(|(k, _)| (*k).clone());
            let (object_key, value) = match (live_key, past_key) {
                (None, None) => break,
                (Some(l), p) if p.as_ref().is_none_or(|p| l < *p) => {
                    let value = match next_live.take() {
                        Some((_, v)) => Some(decode_envelope(&v)?.object),
                        None => None,
                    };
                    next_live = live.next().transpose()?;
                    (l, value)
                }
                (l, Some(p)) => {
                    if l.as_ref() == Some(&p) {
                        next_live = live.next().transpose()?;
                    }
                    let value = past.next().and_then(|(_, v)| v.clone());
                    (p, value)
                }
                (Some(_), None) => break, // unreachable: the first arm takes it
            };
            let Some(value) = value else { continue };
            if items.len() == limit {
                // Another object exists beyond the page.
                let last = last_key.map(|k| String::from_utf8_lossy(&k[resource_prefix.len()..]).into_owned());
                return Ok(ListPage { items, resource_version: at, last });
            }
            if filter(&value) {
                items.push(value);
                last_key = Some(object_key);
            }
        }
        Ok(ListPage { items, resource_version: at, last: None })
    }

    /// For every object under `prefix` changed after `at`: its state at `at` (`None` = it did not
    /// exist then). Keys are object keys.
    fn states_at(&self, at: u64, prefix: &[u8]) -> Result<BTreeMap<Vec<u8>, Option<Value>>> {
        let mut states = BTreeMap::new();
        if at == self.current_resource_version()? {
            return Ok(states);
        }
        if !self.log_covers(at)? {
            return Err(StorageError::Expired(at));
        }
        for change in self.changes_since(at) {
            let (_, change) = change?;
            let object_key = key(
                b'o',
                &[change.resource.as_bytes(), b"/", change.namespace.as_bytes(), b"/", change.name.as_bytes()],
            );
            if !object_key.starts_with(prefix) || states.contains_key(&object_key) {
                continue; // only the earliest change after `at` tells the state at `at`
            }
            let before = match change.kind.as_str() {
                "ADDED" => None,
                // Entries written before the log kept previous states cannot be replayed.
                _ => Some(change.previous.ok_or(StorageError::Expired(at))?),
            };
            states.insert(object_key, before);
        }
        Ok(states)
    }
}
