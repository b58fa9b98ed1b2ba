//! The BundleContent strategy: written only by the server (users change metadata and delete),
//! its schema and table, and what deleting the served one does to its Bundle. The fields are
//! [`crate::api::content`].

use serde_json::{json, Value};

use super::{
    decode_or_default, name_and_age, short_digest, Column, OnDelete, ResourceDef, Subresource, AGE_COLUMN, NAME_COLUMN,
};
use crate::api::meta;
use crate::api::schema::{array_of, doc_string, integer, kind_root, object, string};
use crate::api::Bundle;
use crate::api::BundleContent;
use crate::api::BundleStatus;
use crate::api::Cause;

pub static BUNDLE_CONTENT: ResourceDef = ResourceDef {
    api_version: crate::api::API_VERSION,
    plural: BundleContent::PLURAL,
    singular: "bundlecontent",
    kind: BundleContent::KIND,
    list_kind: "BundleContentList",
    short_names: &["bc"],
    user_writable: false,
    // Created only by the server; users (and garbage collectors) may change metadata and delete.
    verbs: &["delete", "deletecollection", "get", "list", "patch", "update", "watch"],
    subresources: &[Subresource { name: "content", verbs: &["get"] }],
    takes_uploads: false,
    schema,
    default: |_| {},
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
    selectable_fields: &[("spec.bundle", "/spec/bundle")],
    secret_refs: |_| Vec::new(),
    on_delete: Some(OnDelete { target: owning_bundle, update: unserve }),
    view: None,
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

/// The Bundle a BundleContent belongs to.
fn owning_bundle(content: &Value) -> Option<(&'static str, String)> {
    let content: BundleContent = decode_or_default(content);
    Some((Bundle::PLURAL, content.spec.bundle)).filter(|(_, name)| !name.is_empty())
}

/// Deleting the revision a Bundle serves leaves that Bundle without content: say so in its status
/// rather than point at nothing. Deleting the newest content while an older one is served
/// (`spec.revision`) forgets it and its pins, so the sources are fetched again when needed.
fn unserve(bundle: &Value, content: &Value) -> Option<Value> {
    let name = content.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("");
    let typed: Bundle = decode_or_default(bundle);
    let current = typed.status.clone().unwrap_or_default();
    let status = if current.content_name.as_deref() == Some(name) {
        BundleStatus::content_deleted(typed.generation(), name)
    } else if current.latest_content() == Some(name) {
        BundleStatus { latest_content_name: None, resolved_sources: Vec::new(), ..current }
    } else {
        return None;
    };
    let status = serde_json::to_value(status).ok()?;
    let mut updated = bundle.clone();
    updated.as_object_mut()?.insert("status".into(), status);
    Some(updated)
}

fn row(obj: &Value) -> Vec<Value> {
    let content: BundleContent = decode_or_default(obj);
    let (name, age) = name_and_age(obj);
    let spec = content.spec;
    vec![
        name,
        json!(spec.bundle),
        json!(spec.format),
        json!(spec.files),
        json!(meta::human_bytes(spec.size)),
        json!(meta::human_bytes(spec.stored_size)),
        json!(short_digest(&spec.digest)),
        age,
    ]
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::api::FormatDetails;
    use crate::api::ResolvedSource;
    use crate::strategy::schema_check::{declared, written};

    #[test]
    fn the_schema_declares_exactly_the_typed_fields() {
        let mut content = BundleContent::default();
        content.spec.sources = vec![ResolvedSource::git("r", "c".into())];
        content.spec.format_details =
            FormatDetails { objects: BTreeMap::from([("Pod".into(), 1)]), ..Default::default() };
        let schema = schema();
        let value = serde_json::to_value(&content).unwrap();
        let of = |set: std::collections::BTreeSet<String>| -> Vec<String> {
            set.into_iter().filter(|p| p.starts_with("spec")).collect()
        };
        assert_eq!(of(written(&schema, &value)), of(declared(&schema)));
    }

    #[test]
    fn deleting_the_served_content_says_so_in_the_bundle() {
        let bundle = json!({"metadata": {"name": "b", "generation": 4}, "spec": {}, "status": {"contentName": "b-1", "phase": "Unpacked"}});
        let served = json!({"metadata": {"name": "b-1"}, "spec": {"bundle": "b"}});
        let other = json!({"metadata": {"name": "b-2"}, "spec": {"bundle": "b"}});
        assert_eq!(owning_bundle(&served), Some(("bundles", "b".to_string())));
        assert_eq!(unserve(&bundle, &other), None);
        let updated = unserve(&bundle, &served).unwrap();
        assert_eq!(updated["status"]["conditions"][0]["reason"], "ContentDeleted");
        assert_eq!(updated["status"]["observedGeneration"], 4);
        assert!(updated["status"].get("contentName").is_none());
    }
}
