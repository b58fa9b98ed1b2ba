//! One home per resource — the strategy, as sample-apiserver's `registry/…/strategy.go` is: how it
//! is named, described (schema), defaulted, validated, printed (table columns), which fields a
//! selector may name, its verbs and subresources, what deleting it changes, and how the server
//! creates one itself. The API's generic verbs (`apiserver::handlers`) are written once against
//! [`ResourceDef`]; the unpacker creates BundleContents through [`prepare_create`] as the API's
//! create does.
//!
//! The verbs work on JSON by nature (patches, server-side apply, unknown-field pruning), so a
//! strategy's functions take the object as JSON — the JSON boundary — and read it through the
//! typed model ([`decode`]) rather than by pointer.

pub mod bundle;
pub mod bundlecontent;
pub mod event;

use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::api::meta;
use crate::api::Cause;

/// A table column, as `metav1.TableColumnDefinition`.
pub struct Column {
    pub name: &'static str,
    pub kind: &'static str,
    pub format: &'static str,
    pub description: &'static str,
    /// 0 = always shown, 1 = only with `-o wide`.
    pub priority: u8,
}

/// A subresource and the verbs it serves.
pub struct Subresource {
    pub name: &'static str,
    pub verbs: &'static [&'static str],
}

/// What deleting an object changes in another one, in the same atomic write.
pub struct OnDelete {
    /// The other object (plural, name, in the same namespace) the deletion concerns, if any.
    pub target: fn(&Value) -> Option<(&'static str, String)>,
    /// That object as it is written with the deletion; `None` leaves it alone.
    pub update: fn(target: &Value, deleted: &Value) -> Option<Value>,
}

/// Everything the generic verbs need to know about one resource.
pub struct ResourceDef {
    /// `GROUP/VERSION` (`v1` for the core group) objects and lists are written with.
    pub api_version: &'static str,
    pub plural: &'static str,
    pub singular: &'static str,
    pub kind: &'static str,
    pub list_kind: &'static str,
    pub short_names: &'static [&'static str],
    /// Whether users may create it and change its spec and status (BundleContents are written
    /// only by the server; users may still change their metadata and delete them).
    pub user_writable: bool,
    pub verbs: &'static [&'static str],
    pub subresources: &'static [Subresource],
    /// Whether `PUT …/content` uploads into it.
    pub takes_uploads: bool,
    /// The structural schema of the whole object.
    pub schema: fn() -> Value,
    /// Fills in defaults (creates and updates, before validation); only ever adds fields.
    pub default: fn(&mut Value),
    /// Semantic validation beyond the schema (the schema has already passed).
    pub validate: fn(&Value) -> Vec<Cause>,
    /// The status a newly created object starts with.
    pub initial_status: fn(&Value) -> Option<Value>,
    pub columns: &'static [Column],
    /// Cells for one row, in `columns` order.
    pub row: fn(&Value) -> Vec<Value>,
    /// Fields a field selector may name beyond `metadata.name` and `metadata.namespace`:
    /// (field, JSON pointer).
    pub selectable_fields: &'static [(&'static str, &'static str)],
    /// The Secrets an object names (field path, Secret name): a user may only name Secrets they
    /// may read themselves, or the server would read them on their behalf (a confused deputy).
    pub secret_refs: fn(&Value) -> Vec<(String, String)>,
    pub on_delete: Option<OnDelete>,
    /// How a stored object is shown, when this resource is a view of another's objects (core
    /// `v1` Events of the stored `events.k8s.io/v1` ones); `None`: as stored.
    pub view: Option<fn(&Value) -> Value>,
}

pub static RESOURCES: [&ResourceDef; 2] = [&bundle::BUNDLE, &bundlecontent::BUNDLE_CONTENT];

pub fn lookup(plural: &str) -> Option<&'static ResourceDef> {
    RESOURCES.iter().copied().find(|r| r.plural == plural)
}

impl ResourceDef {
    /// Every field a field selector may name, with its JSON pointer.
    pub fn all_selectable_fields(&self) -> Vec<(&'static str, &'static str)> {
        let mut fields = vec![("metadata.name", "/metadata/name"), ("metadata.namespace", "/metadata/namespace")];
        fields.extend_from_slice(self.selectable_fields);
        fields
    }
}

/// Reads a stored or checked object through the typed model. Objects passed the schema before
/// they were stored, so this fails only for values the schema cannot express (a negative size).
pub fn decode<T: DeserializeOwned>(obj: &Value) -> Result<T, Cause> {
    T::deserialize(obj).map_err(|e| Cause::invalid("", &Value::Null, format!("does not decode: {e}")))
}

/// Like [`decode`], for readers that print or inspect: a value that does not decode reads as
/// the type's default.
pub fn decode_or_default<T: DeserializeOwned + Default>(obj: &Value) -> T {
    decode(obj).unwrap_or_default()
}

/// Server-owned metadata of a new object: uid, creation time, generation 1; what a client may
/// not set is removed. The API's create and the unpacker's both go through it.
pub fn stamp_new(metadata: &mut Map<String, Value>) {
    metadata.insert("uid".into(), json!(uuid::Uuid::new_v4().to_string()));
    metadata.insert("creationTimestamp".into(), json!(meta::now_timestamp()));
    metadata.insert("generation".into(), json!(1));
    for field in ["resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds", "selfLink"] {
        metadata.remove(field);
    }
}

/// What is wrong with an object's name and labels, the metadata rules every kind shares (the API
/// adds its finalizer and owner-reference rules after these, then the kind's own validation).
pub fn metadata_causes(obj: &Value) -> Vec<Cause> {
    let name = obj.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("");
    let mut causes: Vec<Cause> = meta::dns1123_subdomain_errors(name)
        .into_iter()
        .map(|e| Cause::invalid("metadata.name", &json!(name), e))
        .collect();
    causes.extend(meta::label_causes(obj.pointer("/metadata/labels")));
    causes
}

/// A server-side create (the unpacker's BundleContents): stamped, defaulted, validated, given
/// its initial status — the steps the API's create takes, without a request around them.
pub fn prepare_create(def: &ResourceDef, mut obj: Value) -> Result<Value, Vec<Cause>> {
    if let Some(metadata) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        stamp_new(metadata);
    }
    (def.default)(&mut obj);
    let mut causes = metadata_causes(&obj);
    causes.extend((def.validate)(&obj));
    if !causes.is_empty() {
        return Err(causes);
    }
    if let (Some(status), Some(map)) = ((def.initial_status)(&obj), obj.as_object_mut()) {
        map.insert("status".into(), status);
    }
    Ok(obj)
}

/// Sets `spec` fields a default added and the object lacks; never rewrites a field that is there
/// (so a user's spec keeps its exact form).
fn add_defaulted(obj: &mut Value, defaulted: Value) {
    let (Some(map), Value::Object(defaulted)) = (obj.as_object_mut(), defaulted) else { return };
    let spec = map.entry("spec").or_insert_with(|| json!({}));
    if let Some(spec) = spec.as_object_mut() {
        for (field, value) in defaulted {
            spec.entry(field).or_insert(value);
        }
    }
}

/// The NAME and AGE columns every kind shares.
pub const NAME_COLUMN: Column = Column {
    name: "Name",
    kind: "string",
    format: "name",
    description: "Name must be unique within a namespace.",
    priority: 0,
};
pub const AGE_COLUMN: Column =
    Column { name: "Age", kind: "date", format: "", description: "Time since the object was created.", priority: 0 };

/// `sha256:0123456789ab` — enough of a digest to tell revisions apart in a table.
pub fn short_digest(digest: &str) -> String {
    digest.chars().take("sha256:".len() + 12).collect()
}

/// NAME and AGE cells of an object: its name and how long ago it was created.
fn name_and_age(obj: &Value) -> (Value, Value) {
    #[derive(Deserialize, Default)]
    #[serde(rename_all = "camelCase")]
    struct Meta {
        #[serde(default)]
        name: String,
        #[serde(default)]
        creation_timestamp: Option<String>,
    }
    let meta: Meta = obj.get("metadata").map(decode_or_default).unwrap_or_default();
    (json!(meta.name), json!(meta::human_age(meta.creation_timestamp.as_deref())))
}

#[cfg(test)]
mod schema_check;
