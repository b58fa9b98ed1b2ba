//! `BundleContent`: one immutable, unpacked revision of a Bundle's content, written only by the
//! server and owned by its Bundle. Its `content` subresource serves exactly that revision.

use serde_json::{json, Value};

use super::{no_secret_refs, short_digest, str_at, u64_at, Column, ResourceDef, AGE_COLUMN, NAME_COLUMN};
use crate::apiserver::meta;
use crate::apiserver::schema::{array_of, doc_string, integer, kind_root, object, set_field, string};
use crate::apiserver::status::Cause;
use crate::storage::{ObjectKey, ObjectWrite, Precondition, StorageError, Store};

pub static BUNDLE_CONTENT: ResourceDef = ResourceDef {
    plural: "bundlecontents",
    singular: "bundlecontent",
    kind: "BundleContent",
    list_kind: "BundleContentList",
    short_names: &["bc"],
    user_writable: false,
    schema,
    validate: |_| Vec::<Cause>::new(),
    initial_status: |_| None,
    columns: &[
        NAME_COLUMN,
        Column { name: "Bundle", kind: "string", format: "", description: "The Bundle it belongs to.", priority: 0 },
        Column { name: "Format", kind: "string", format: "", description: "Bundle format.", priority: 0 },
        Column { name: "Files", kind: "integer", format: "", description: "Number of files.", priority: 0 },
        Column { name: "Size", kind: "string", format: "", description: "Bytes of content.", priority: 0 },
        Column {
            name: "Stored",
            kind: "string",
            format: "",
            description: "Compressed bytes of its chunks.",
            priority: 0,
        },
        Column { name: "Digest", kind: "string", format: "", description: "sha256 of the served tar.", priority: 0 },
        AGE_COLUMN,
    ],
    row,
    secret_refs: no_secret_refs,
    on_delete,
};

fn schema() -> Value {
    let spec = object(
        "The revision: immutable, written by the server.",
        json!({
            "bundle": doc_string("Name of the owning Bundle."),
            "digest": doc_string("sha256 of the deterministic tar served by the content subresource."),
            "format": string(),
            "files": integer(),
            "size": integer(),
            "storedSize": integer(),
            "formatDetails": {"type": "object", "x-kubernetes-preserve-unknown-fields": true,
                "description": "Objects by kind; chart and version; package and clusterServiceVersion."},
            "sources": array_of(json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true,
                "description": "Each source pinned: image digest, git commit, http sha256, upload digest."})),
        }),
    );
    kind_root("One immutable unpacked revision of a Bundle's content.", spec, object("Unused.", json!({})))
}

/// Deleting the revision a Bundle serves leaves that Bundle without content: say so in its status
/// rather than point at nothing.
fn on_delete(store: &Store, content: &Value) -> Result<Vec<ObjectWrite>, StorageError> {
    let namespace = str_at(content, "/metadata/namespace");
    let name = str_at(content, "/metadata/name");
    let key = ObjectKey::new("bundles", namespace, str_at(content, "/spec/bundle"));
    let Some(bundle) = store.get_object(&key)? else { return Ok(vec![]) };
    if str_at(&bundle.value, "/status/contentName") != name {
        return Ok(vec![]);
    }
    let generation = u64_at(&bundle.value, "/metadata/generation").unwrap_or(1);
    let mut object = bundle.value.clone();
    set_field(
        &mut object,
        "status",
        json!({
            "observedGeneration": generation,
            "phase": "Pending",
            "conditions": [{
                "type": "Unpacked",
                "status": "False",
                "reason": "ContentDeleted",
                "message": format!("BundleContent {name:?} was deleted"),
                "lastTransitionTime": meta::now_timestamp(),
                "observedGeneration": generation,
            }],
        }),
    );
    Ok(vec![ObjectWrite::Put {
        key,
        object,
        precondition: Precondition::ResourceVersion(bundle.resource_version),
        revision: None,
    }])
}

fn row(obj: &Value) -> Vec<Value> {
    vec![
        json!(str_at(obj, "/metadata/name")),
        json!(str_at(obj, "/spec/bundle")),
        json!(str_at(obj, "/spec/format")),
        u64_at(obj, "/spec/files").map_or(Value::Null, |n| json!(n)),
        json!(u64_at(obj, "/spec/size").map(meta::human_bytes).unwrap_or_default()),
        json!(u64_at(obj, "/spec/storedSize").map(meta::human_bytes).unwrap_or_default()),
        json!(short_digest(str_at(obj, "/spec/digest"))),
        json!(meta::human_age(obj.pointer("/metadata/creationTimestamp").and_then(Value::as_str))),
    ]
}

/// `NAME-<first 10 hex digits of the digest>`, shortened so it stays a valid object name.
pub fn content_name(bundle: &str, digest: &str) -> String {
    let hex = digest.trim_start_matches("sha256:");
    let short = &hex[..hex.len().min(10)];
    let mut base: String = bundle.chars().take(253 - 11).collect();
    while base.ends_with(['-', '.']) {
        base.pop();
    }
    format!("{base}-{short}")
}
