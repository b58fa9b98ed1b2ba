//! Structural schemas, as a CRD would declare them (OpenAPI v3): the building blocks each
//! resource's schema is written with. The schemas are checked against the typed model by tests
//! (`bundle::strategy`, `content::strategy`): every field a schema declares decodes into the types,
//! and every field the types write is declared.

use serde_json::{json, Value};

pub fn string() -> Value {
    json!({"type": "string"})
}

pub fn doc_string(description: &str) -> Value {
    json!({"type": "string", "description": description})
}

pub fn integer() -> Value {
    json!({"type": "integer", "format": "int64"})
}

pub fn boolean() -> Value {
    json!({"type": "boolean"})
}

pub fn string_map() -> Value {
    json!({"type": "object", "additionalProperties": {"type": "string"}})
}

pub fn object(description: &str, properties: Value) -> Value {
    json!({"type": "object", "description": description, "properties": properties})
}

pub fn array_of(items: Value) -> Value {
    json!({"type": "array", "items": items})
}

/// A list whose items are owned one by one, by value (`x-kubernetes-list-type: set`).
pub fn list_set(items: Value) -> Value {
    json!({"type": "array", "items": items, "x-kubernetes-list-type": "set"})
}

/// A list whose items are owned one by one, by their key fields (`x-kubernetes-list-type: map`).
pub fn list_map(items: Value, keys: &[&str]) -> Value {
    json!({"type": "array", "items": items, "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": keys})
}

/// A list replaced and owned as a whole (what a list without `x-kubernetes-list-type` is too).
pub fn list_atomic(items: Value) -> Value {
    json!({"type": "array", "items": items, "x-kubernetes-list-type": "atomic"})
}

/// `metav1.ObjectMeta`, the fields clients send.
pub fn object_meta() -> Value {
    let owner_reference = object(
        "An object this one depends on.",
        json!({
            "apiVersion": string(), "kind": string(), "name": string(), "uid": string(),
            "controller": boolean(), "blockOwnerDeletion": boolean(),
        }),
    );
    object(
        "Standard object metadata.",
        json!({
            "name": string(),
            "generateName": string(),
            "namespace": string(),
            "selfLink": string(),
            "uid": string(),
            "resourceVersion": string(),
            "generation": integer(),
            "creationTimestamp": string(),
            "deletionTimestamp": string(),
            "deletionGracePeriodSeconds": integer(),
            "labels": string_map(),
            "annotations": string_map(),
            "ownerReferences": list_map(owner_reference, &["uid"]),
            "finalizers": list_set(string()),
            "managedFields": list_atomic(json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true})),
        }),
    )
}

/// `metav1.Condition`.
pub fn condition() -> Value {
    object(
        "A condition of the object, per Kubernetes API conventions.",
        json!({
            "type": string(), "status": string(), "reason": string(), "message": string(),
            "lastTransitionTime": string(), "observedGeneration": integer(),
        }),
    )
}

/// `status.conditions`: [`condition`]s keyed by `type`, as `metav1.Condition` lists are declared.
pub fn conditions() -> Value {
    list_map(condition(), &["type"])
}

/// The root of a kind: apiVersion, kind, metadata, spec, status.
pub fn kind_root(description: &str, spec: Value, status: Value) -> Value {
    object(
        description,
        json!({
            "apiVersion": string(),
            "kind": string(),
            "metadata": object_meta(),
            "spec": spec,
            "status": status,
        }),
    )
}
