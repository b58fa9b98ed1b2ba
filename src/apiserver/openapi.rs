//! OpenAPI v3 documents (`/openapi/v3` and the group-version document), generated from the
//! resource definitions: what `kubectl` reads to validate (it finds `fieldValidation` support on the
//! PATCH operations) and to `explain`.

use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{json, Map, Value};

use super::handlers::json_response;
use super::resources::{ResourceDef, RESOURCES};
use super::{GROUP, VERSION};

const GV_PATH: &str = "apis/content.stowage.dev/v1alpha1";

fn schema_name(kind: &str) -> String {
    format!("dev.stowage.content.v1alpha1.{kind}")
}

fn gvk(kind: &str) -> Value {
    json!([{"group": GROUP, "version": VERSION, "kind": kind}])
}

fn query_param(name: &str, description: &str) -> Value {
    json!({"name": name, "in": "query", "description": description, "schema": {"type": "string"}, "uniqueItems": true})
}

fn path_param(name: &str) -> Value {
    json!({"name": name, "in": "path", "required": true, "schema": {"type": "string"}, "uniqueItems": true})
}

fn json_content(kind: &str) -> Value {
    json!({"application/json": {"schema": {"$ref": format!("#/components/schemas/{}", schema_name(kind))}}})
}

fn operation(def: &ResourceDef, action: &str, id: &str, kind: &str, write: bool) -> Value {
    let mut params = Vec::new();
    if write {
        params.push(query_param("dryRun", "When present, the request is not persisted (\"All\")."));
        params.push(query_param("fieldManager", "Name of the actor making the change."));
        params
            .push(query_param("fieldValidation", "How unknown fields are handled: Ignore, Warn (default) or Strict."));
    }
    let mut op = json!({
        "operationId": format!("{id}{}", def.kind),
        "tags": ["contentStowageDev_v1alpha1"],
        "parameters": params,
        "responses": {"200": {"description": "OK", "content": json_content(kind)}},
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": {"group": GROUP, "version": VERSION, "kind": def.kind},
    });
    if write && action != "delete" {
        op["requestBody"] = json!({"content": json_content(def.kind)});
    }
    op
}

fn list_params() -> Vec<Value> {
    ["labelSelector", "fieldSelector", "limit", "continue", "resourceVersion", "watch"]
        .iter()
        .map(|p| query_param(p, ""))
        .collect()
}

/// The group-version document.
pub fn group_version_document() -> Value {
    let mut schemas = Map::new();
    let mut paths = Map::new();
    for def in RESOURCES {
        let mut schema = (def.schema)();
        schema["x-kubernetes-group-version-kind"] = gvk(def.kind);
        schemas.insert(schema_name(def.kind), schema);
        schemas.insert(
            schema_name(def.list_kind),
            json!({
                "type": "object",
                "description": format!("A list of {}.", def.kind),
                "properties": {
                    "apiVersion": {"type": "string"},
                    "kind": {"type": "string"},
                    "metadata": {"type": "object", "properties": {"resourceVersion": {"type": "string"}, "continue": {"type": "string"}}},
                    "items": {"type": "array", "items": {"$ref": format!("#/components/schemas/{}", schema_name(def.kind))}},
                },
                "x-kubernetes-group-version-kind": gvk(def.list_kind),
            }),
        );
        let plural = def.plural;
        let mut collection = json!({
            "get": operation(def, "list", "listNamespaced", def.list_kind, false),
            "parameters": [path_param("namespace")],
        });
        collection["get"]["parameters"] = Value::Array(list_params());
        collection["delete"] = operation(def, "deletecollection", "deleteCollectionNamespaced", def.list_kind, true);
        let mut item = json!({
            "get": operation(def, "get", "readNamespaced", def.kind, false),
            "delete": operation(def, "delete", "deleteNamespaced", def.kind, true),
            "parameters": [path_param("name"), path_param("namespace")],
        });
        if def.user_writable {
            collection["post"] = operation(def, "post", "createNamespaced", def.kind, true);
            item["put"] = operation(def, "put", "replaceNamespaced", def.kind, true);
            let mut patch = operation(def, "patch", "patchNamespaced", def.kind, true);
            patch["requestBody"] = json!({"content": {
                "application/merge-patch+json": {"schema": {"type": "object"}},
                "application/json-patch+json": {"schema": {"type": "object"}},
            }});
            item["patch"] = patch;
        }
        paths.insert(format!("/apis/{GROUP}/{VERSION}/namespaces/{{namespace}}/{plural}"), collection);
        paths.insert(format!("/apis/{GROUP}/{VERSION}/namespaces/{{namespace}}/{plural}/{{name}}"), item);
        let mut all = json!({"get": operation(def, "list", "list", def.list_kind, false)});
        all["get"]["operationId"] = json!(format!("list{}ForAllNamespaces", def.kind));
        paths.insert(format!("/apis/{GROUP}/{VERSION}/{plural}"), all);
    }
    json!({
        "openapi": "3.0.0",
        "info": {"title": "stowage", "version": VERSION},
        "paths": paths,
        "components": {"schemas": schemas},
    })
}

/// A stable hash of the document, so clients can cache it.
fn document_hash() -> String {
    let text = group_version_document().to_string();
    let digest = blake3::hash(text.as_bytes());
    digest.to_hex()[..32].to_uppercase()
}

pub async fn v3_root() -> Response {
    let url = format!("/openapi/v3/{GV_PATH}?hash={}", document_hash());
    json_response(StatusCode::OK, &json!({"paths": {GV_PATH: {"serverRelativeURL": url}}}), &[])
}

pub async fn v3_group_version() -> Response {
    json_response(StatusCode::OK, &group_version_document(), &[])
}
