//! The schemas of the OpenAPI documents: our kinds and their lists (named as kube names CRD
//! definitions, with `x-kubernetes-group-version-kind`) and the meta types they reference.
//!
//! A kind's schema is the structural schema requests are validated against (`ResourceDef::schema`),
//! with `metadata` pointing at the shared `ObjectMeta` definition, which is itself built from the
//! same `schema::object_meta` the validator uses.

use serde_json::{json, Map, Value};

use super::{definition_name, Dialect, DELETE_OPTIONS, LIST_META, OBJECT_META, PATCH, STATUS};
use crate::api::schema::{array_of, boolean, doc_string, integer, object, object_meta, string};
use crate::apiserver::discovery::API_RESOURCES;
use crate::apiserver::schema::set_field;
use crate::apiserver::{GROUP, VERSION};

const API_VERSION_DOC: &str = "APIVersion defines the versioned schema of this representation of an object.";
const KIND_DOC: &str = "Kind is a string value representing the REST resource this object represents.";

fn gvk(kind: &str) -> Value {
    json!([{"group": GROUP, "version": VERSION, "kind": kind}])
}

/// A property that refers to a definition, with a description kept beside the reference (OpenAPI v3
/// ignores siblings of `$ref`, hence kube's single-element `allOf`).
fn property_ref(dialect: Dialect, name: &str, description: &str) -> Value {
    match dialect {
        Dialect::Swagger2 => {
            let mut reference = dialect.reference(name);
            set_field(&mut reference, "description", json!(description));
            reference
        }
        Dialect::OpenApi3 => json!({"allOf": [dialect.reference(name)], "default": {}, "description": description}),
    }
}

/// Every definition of one document, in a stable order.
pub fn definitions(dialect: Dialect) -> Map<String, Value> {
    let mut out = Map::new();
    for resource in API_RESOURCES.iter() {
        let def = resource.def;
        let mut schema = (def.schema)();
        if let Some(properties) = schema.get_mut("properties").and_then(Value::as_object_mut) {
            properties.insert("apiVersion".into(), doc_string(API_VERSION_DOC));
            properties.insert("kind".into(), doc_string(KIND_DOC));
            properties.insert("metadata".into(), property_ref(dialect, OBJECT_META, "Standard object's metadata."));
        }
        set_field(&mut schema, "x-kubernetes-group-version-kind", gvk(def.kind));
        out.insert(definition_name(def.kind), schema);
        let list = json!({
            "type": "object",
            "description": format!("{} is a list of {}.", def.list_kind, def.kind),
            "required": ["items"],
            "properties": {
                "apiVersion": doc_string(API_VERSION_DOC),
                "kind": doc_string(KIND_DOC),
                "metadata": property_ref(dialect, LIST_META, "Standard list metadata."),
                "items": array_of(dialect.reference(&definition_name(def.kind))),
            },
            "x-kubernetes-group-version-kind": gvk(def.list_kind),
        });
        out.insert(definition_name(def.list_kind), list);
    }
    out.extend(meta_definitions(dialect));
    out
}

/// The `meta.k8s.io/v1` types our operations refer to.
fn meta_definitions(dialect: Dialect) -> Vec<(String, Value)> {
    let list_meta = object(
        "ListMeta describes metadata that synthetic resources must have, including lists.",
        json!({
            "continue": string(),
            "remainingItemCount": integer(),
            "resourceVersion": string(),
            "selfLink": string(),
        }),
    );
    let cause = object(
        "StatusCause provides more information about an api.Status failure.",
        json!({"field": string(), "message": string(), "reason": string()}),
    );
    let details = object(
        "StatusDetails is a set of additional properties that MAY be set by the server.",
        json!({
            "causes": array_of(cause),
            "group": string(),
            "kind": string(),
            "name": string(),
            "retryAfterSeconds": integer(),
            "uid": string(),
        }),
    );
    let status = object(
        "Status is a return value for calls that don't return other objects.",
        json!({
            "apiVersion": doc_string(API_VERSION_DOC),
            "code": integer(),
            "details": details,
            "kind": doc_string(KIND_DOC),
            "message": string(),
            "metadata": property_ref(dialect, LIST_META, "Standard list metadata."),
            "reason": string(),
            "status": doc_string("Status of the operation: Success or Failure."),
        }),
    );
    let delete_options = object(
        "DeleteOptions may be provided when deleting an API object.",
        json!({
            "apiVersion": doc_string(API_VERSION_DOC),
            "dryRun": array_of(string()),
            "gracePeriodSeconds": integer(),
            "kind": doc_string(KIND_DOC),
            "orphanDependents": boolean(),
            "preconditions": object("Preconditions for the delete.", json!({"resourceVersion": string(), "uid": string()})),
            "propagationPolicy": string(),
        }),
    );
    let patch = json!({"type": "object", "description": "A JSON patch or JSON merge patch of the object."});
    vec![
        (OBJECT_META.to_string(), object_meta()),
        (LIST_META.to_string(), list_meta),
        (STATUS.to_string(), status),
        (DELETE_OPTIONS.to_string(), delete_options),
        (PATCH.to_string(), patch),
    ]
}
