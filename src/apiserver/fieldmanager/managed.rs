//! `metadata.managedFields`: the managers of an object and the field set each owns, decoded from and
//! encoded to `ManagedFieldsEntry` JSON, kept the way kube-apiserver keeps them: one entry per
//! (manager, operation, apiVersion, subresource), entries with an empty set dropped, Apply entries
//! first then by time, at most ten Update entries (older ones folded into `ancient-changes`).

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use super::fieldset::FieldSet;
use super::path::PathElement;

/// What kube calls the bucket of folded old Update entries.
const ANCIENT_CHANGES: &str = "ancient-changes";

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Operation {
    Apply,
    Update,
}

impl Operation {
    fn as_str(self) -> &'static str {
        match self {
            Operation::Apply => "Apply",
            Operation::Update => "Update",
        }
    }
}

/// Who wrote: one managedFields entry per key.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ManagerKey {
    pub manager: String,
    pub operation: Operation,
    pub api_version: String,
    /// `""` for the main resource.
    pub subresource: String,
}

impl ManagerKey {
    /// A manager without a name is `unknown`, as in kube.
    pub fn new(manager: &str, operation: Operation, api_version: &str, subresource: &str) -> ManagerKey {
        let manager = if manager.is_empty() { "unknown" } else { manager };
        ManagerKey {
            manager: manager.to_string(),
            operation,
            api_version: api_version.to_string(),
            subresource: subresource.to_string(),
        }
    }

    /// How kube names a manager in a conflict: `"kubectl"`, `"ctl" with subresource "status"`,
    /// and `using <apiVersion>` for Update managers.
    pub fn describe(&self) -> String {
        let mut out = quote(&self.manager);
        if !self.subresource.is_empty() {
            out = format!("{out} with subresource {}", quote(&self.subresource));
        }
        if self.operation == Operation::Update {
            out = format!("{out} using {}", self.api_version);
        }
        out
    }
}

fn quote(text: &str) -> String {
    Value::String(text.to_string()).to_string()
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub set: FieldSet,
    /// RFC 3339, as written.
    pub time: Option<String>,
}

#[derive(Clone, Debug, Default)]
pub struct ManagedFields {
    entries: BTreeMap<ManagerKey, Entry>,
}

/// Whether a client's `managedFields` asks to clear them: `[]` or `[{}]`.
pub fn is_reset(sent: Option<&Value>) -> bool {
    match sent.and_then(Value::as_array).map(Vec::as_slice) {
        Some([]) => true,
        Some([only]) => only.as_object().is_some_and(Map::is_empty),
        _ => false,
    }
}

/// Decodes `metadata.managedFields` (absent or null: none).
pub fn decode(encoded: Option<&Value>) -> Result<ManagedFields, String> {
    let mut managed = ManagedFields::default();
    let items = match encoded {
        None | Some(Value::Null) => return Ok(managed),
        Some(Value::Array(items)) => items,
        Some(_) => return Err("managedFields must be a list".into()),
    };
    for (index, item) in items.iter().enumerate() {
        let text = |field: &str| item.get(field).and_then(Value::as_str).unwrap_or("");
        let operation = match text("operation") {
            "Apply" => Operation::Apply,
            "Update" => Operation::Update,
            _ => return Err("operation must be `Apply` or `Update`".into()),
        };
        if text("apiVersion").is_empty() {
            return Err("apiVersion must not be empty".into());
        }
        match text("fieldsType") {
            "FieldsV1" => {}
            "" => return Err(format!("missing fieldsType in managed fields entry {index}")),
            other => return Err(format!("invalid fieldsType {other:?} in managed fields entry {index}")),
        }
        let set = match item.get("fieldsV1") {
            None | Some(Value::Null) => FieldSet::default(),
            Some(fields) => FieldSet::from_fields_v1(fields)?,
        };
        let key = ManagerKey {
            manager: text("manager").to_string(),
            operation,
            api_version: text("apiVersion").to_string(),
            subresource: text("subresource").to_string(),
        };
        let time = item.get("time").and_then(Value::as_str).map(str::to_string);
        managed.entries.insert(key, Entry { set, time });
    }
    Ok(managed)
}

/// Seconds since the epoch of an RFC 3339 time (0 when absent or unreadable, like a nil time).
fn seconds(time: Option<&String>) -> i64 {
    time.and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok()).map_or(0, |t| t.timestamp())
}

impl ManagedFields {
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn get(&self, key: &ManagerKey) -> Option<&Entry> {
        self.entries.get(key)
    }

    /// Sets an entry; an empty set removes it.
    pub fn put(&mut self, key: ManagerKey, entry: Entry) {
        if entry.set.is_empty() {
            self.entries.remove(&key);
        } else {
            self.entries.insert(key, entry);
        }
    }

    /// Adds `set` to `key`'s entry (creating it) and stamps it with `now`.
    pub fn add(&mut self, key: ManagerKey, set: &FieldSet, now: &str) {
        let set = match self.entries.get(&key) {
            Some(previous) => previous.set.union(set),
            None => set.clone(),
        };
        self.put(key, Entry { set, time: Some(now.to_string()) });
    }

    /// Removes `paths` from every entry but `except`'s; entries left empty are dropped.
    pub fn remove_from_others(&mut self, except: Option<&ManagerKey>, paths: &FieldSet) {
        for (key, entry) in self.entries.iter_mut() {
            if Some(key) != except {
                entry.set = entry.set.difference(paths);
            }
        }
        self.entries.retain(|_, entry| !entry.set.is_empty());
    }

    /// Everything the managers other than `except` own.
    pub fn owned_by_others(&self, except: &ManagerKey) -> FieldSet {
        self.entries.iter().filter(|(key, _)| *key != except).fold(FieldSet::default(), |all, (_, e)| all.union(&e.set))
    }

    /// Paths of `changed` that managers other than `except` own, by manager, in key order.
    pub fn conflicts(&self, except: &ManagerKey, changed: &FieldSet) -> Vec<(&ManagerKey, Vec<Vec<PathElement>>)> {
        self.entries
            .iter()
            .filter(|(key, _)| *key != except)
            .map(|(key, entry)| (key, entry.set.intersection(changed).paths()))
            .filter(|(_, paths)| !paths.is_empty())
            .collect()
    }

    /// Folds the oldest Update entries into `ancient-changes` (one per apiVersion) until at most
    /// `max` Update entries remain.
    pub fn cap_update_managers(&mut self, max: usize) {
        let mut updaters: Vec<ManagerKey> =
            self.entries.keys().filter(|k| k.operation == Operation::Update).cloned().collect();
        if updaters.len() <= max {
            return;
        }
        updaters.sort_by_cached_key(|key| (seconds(self.entries.get(key).and_then(|e| e.time.as_ref())), key.clone()));
        let mut remaining = updaters.len();
        let mut first_of_version: BTreeMap<String, ManagerKey> = BTreeMap::new();
        for key in updaters {
            if remaining <= max {
                break;
            }
            let bucket = ManagerKey::new(ANCIENT_CHANGES, Operation::Update, &key.api_version, "");
            let Some(first) = first_of_version.get(&key.api_version) else {
                first_of_version.insert(key.api_version.clone(), key);
                continue;
            };
            if key == bucket {
                continue;
            }
            if !self.entries.contains_key(&bucket) {
                if let Some(first_entry) = self.entries.remove(first) {
                    self.entries.insert(bucket.clone(), first_entry);
                }
            }
            let Some(folded) = self.entries.remove(&key) else { continue };
            let set = self.entries.get(&bucket).map_or_else(|| folded.set.clone(), |b| b.set.union(&folded.set));
            self.entries.insert(bucket, Entry { set, time: folded.time });
            remaining -= 1;
        }
    }

    /// The `managedFields` list (`None` when there are no managers): Apply entries first, then by
    /// time, manager, apiVersion and subresource.
    pub fn encode(&self) -> Option<Value> {
        if self.entries.is_empty() {
            return None;
        }
        let mut entries: Vec<(&ManagerKey, &Entry)> = self.entries.iter().collect();
        entries.sort_by_cached_key(|(key, entry)| {
            (
                key.operation,
                seconds(entry.time.as_ref()),
                key.manager.clone(),
                key.api_version.clone(),
                key.subresource.clone(),
            )
        });
        let list = entries
            .into_iter()
            .map(|(key, entry)| {
                let mut item = Map::new();
                item.insert("manager".into(), json!(key.manager));
                item.insert("operation".into(), json!(key.operation.as_str()));
                item.insert("apiVersion".into(), json!(key.api_version));
                if let Some(time) = &entry.time {
                    item.insert("time".into(), json!(time));
                }
                item.insert("fieldsType".into(), json!("FieldsV1"));
                item.insert("fieldsV1".into(), entry.set.to_fields_v1());
                if !key.subresource.is_empty() {
                    item.insert("subresource".into(), json!(key.subresource));
                }
                Value::Object(item)
            })
            .collect();
        Some(Value::Array(list))
    }
}

/// The paths no manager ever owns: type and server-owned metadata (and `metadata` itself).
pub fn without_server_fields(set: &FieldSet) -> FieldSet {
    let mut server = FieldSet::default();
    server.insert(&[PathElement::Field("apiVersion".into())]);
    server.insert(&[PathElement::Field("kind".into())]);
    server.insert(&[PathElement::Field("metadata".into())]);
    for field in [
        "name",
        "namespace",
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "selfLink",
        "managedFields",
    ] {
        server.insert(&[PathElement::Field("metadata".into()), PathElement::Field(field.into())]);
    }
    set.difference(&server)
}
