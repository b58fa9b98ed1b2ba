//! One place per resource: how it is named, validated, defaulted, printed (table columns) and
//! described (schema). The generic verbs in `handlers` are written once against [`ResourceDef`].

pub mod bundle;
pub mod bundlecontent;

use serde_json::Value;

use super::status::Cause;
use crate::storage::{ObjectWrite, StorageError, Store};

/// A table column, as `metav1.TableColumnDefinition`.
pub struct Column {
    pub name: &'static str,
    pub kind: &'static str,
    pub format: &'static str,
    pub description: &'static str,
    /// 0 = always shown, 1 = only with `-o wide`.
    pub priority: u8,
}

/// Everything the generic verbs need to know about one resource.
pub struct ResourceDef {
    pub plural: &'static str,
    pub singular: &'static str,
    pub kind: &'static str,
    pub list_kind: &'static str,
    pub short_names: &'static [&'static str],
    /// Whether users may create and update it (BundleContents are written only by the server).
    pub user_writable: bool,
    /// The structural schema of the whole object.
    pub schema: fn() -> Value,
    /// Semantic validation beyond the schema (the schema has already passed).
    pub validate: fn(&Value) -> Vec<Cause>,
    /// The status a newly created object starts with.
    pub initial_status: fn(&Value) -> Option<Value>,
    pub columns: &'static [Column],
    /// Cells for one row, in `columns` order.
    pub row: fn(&Value) -> Vec<Value>,
    /// The Secrets an object names (field path, Secret name): a user may only name Secrets they
    /// may read themselves, or the server would read them on their behalf (a confused deputy).
    pub secret_refs: fn(&Value) -> Vec<(String, String)>,
    /// Writes that go with deleting this object, in the same atomic batch.
    pub on_delete: fn(&Store, &Value) -> Result<Vec<ObjectWrite>, StorageError>,
}

pub static RESOURCES: [&ResourceDef; 2] = [&bundle::BUNDLE, &bundlecontent::BUNDLE_CONTENT];

pub fn lookup(plural: &str) -> Option<&'static ResourceDef> {
    RESOURCES.iter().copied().find(|r| r.plural == plural)
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

pub fn str_at<'a>(obj: &'a Value, pointer: &str) -> &'a str {
    obj.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

pub fn u64_at(obj: &Value, pointer: &str) -> Option<u64> {
    obj.pointer(pointer).and_then(Value::as_u64)
}

/// `sha256:0123456789ab` — enough of a digest to tell revisions apart in a table.
pub fn short_digest(digest: &str) -> String {
    digest.chars().take("sha256:".len() + 12).collect()
}

/// For kinds that name no Secrets.
pub fn no_secret_refs(_: &Value) -> Vec<(String, String)> {
    Vec::new()
}
