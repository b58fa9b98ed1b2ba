//! The OpenAPI documents: `/openapi/v2` (Swagger 2.0, what the kube-aggregator merges into the
//! cluster's document) and `/openapi/v3` with its group-version document (what kubectl validates
//! and explains with — it finds `fieldValidation` support on the PATCH operations).
//!
//! Both are generated once from the same sources — the resource definitions (schemas) and the
//! discovery description (which verbs exist) — carry `x-kubernetes-group-version-kind` on
//! definitions and operations, and are answered from memory with an ETag. The v3 index names the
//! group-version document by its hash, so clients may cache that URL forever.

mod definitions;
mod operations;
mod render;

use std::sync::LazyLock;

use axum::http::{header, HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use super::negotiation::{accepted, not_acceptable, Caching, Document};
use super::{GROUP, VERSION};

pub const OBJECT_META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta";
pub const LIST_META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.ListMeta";
pub const STATUS: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.Status";
pub const DELETE_OPTIONS: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.DeleteOptions";
pub const PATCH: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.Patch";

/// Where the group-version document is, relative to `/openapi/v3/`.
const GV_PATH: &str = "apis/content.stowage.dev/v1alpha1";

/// A kind's definition name, as kube names CRD definitions: the group reversed, e.g.
/// `dev.stowage.content.v1alpha1.Bundle`.
pub fn definition_name(kind: &str) -> String {
    let reversed: Vec<&str> = GROUP.split('.').rev().collect();
    format!("{}.{VERSION}.{kind}", reversed.join("."))
}

/// Which OpenAPI a document is written in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    Swagger2,
    OpenApi3,
}

impl Dialect {
    pub fn reference(self, name: &str) -> Value {
        match self {
            Dialect::Swagger2 => json!({"$ref": format!("#/definitions/{name}")}),
            Dialect::OpenApi3 => json!({"$ref": format!("#/components/schemas/{name}")}),
        }
    }
}

fn info() -> Value {
    json!({"title": "stowage", "version": VERSION})
}

pub fn v2_document() -> Value {
    let operations = operations::operations();
    json!({
        "swagger": "2.0",
        "info": info(),
        "paths": render::paths(Dialect::Swagger2, &operations),
        "definitions": definitions::definitions(Dialect::Swagger2),
    })
}

pub fn v3_group_version_document() -> Value {
    let operations = operations::operations();
    json!({
        "openapi": "3.0.0",
        "info": info(),
        "paths": render::paths(Dialect::OpenApi3, &operations),
        "components": {"schemas": definitions::definitions(Dialect::OpenApi3)},
    })
}

struct Documents {
    v2: Document,
    v3_index: Document,
    v3_group_version: Document,
}

static DOCUMENTS: LazyLock<Documents> = LazyLock::new(|| {
    let v3_group_version = Document::json(&v3_group_version_document());
    let url = format!("/openapi/v3/{GV_PATH}?hash={}", v3_group_version.hash());
    let v3_index = Document::json(&json!({"paths": {GV_PATH: {"serverRelativeURL": url}}}));
    Documents { v2: Document::json(&v2_document()), v3_index, v3_group_version }
});

/// We serve JSON only: a client that asks only for the protobuf form gets 406 and retries with JSON.
fn accepts_json(headers: &HeaderMap) -> bool {
    accepted(headers).iter().any(|range| range.accepts("application/json"))
}

pub async fn v2(headers: HeaderMap) -> Response {
    if !accepts_json(&headers) {
        return not_acceptable("application/json");
    }
    DOCUMENTS.v2.respond(&headers, "application/json", Caching::Revalidate)
}

pub async fn v3_index(headers: HeaderMap) -> Response {
    DOCUMENTS.v3_index.respond(&headers, "application/json", Caching::Revalidate)
}

/// With `?hash=` of the current document the response is immutable; a stale hash is redirected
/// (301) to the current one, as kube-openapi does.
pub async fn v3_group_version(uri: Uri, headers: HeaderMap) -> Response {
    if !accepts_json(&headers) {
        return not_acceptable("application/json");
    }
    let document = &DOCUMENTS.v3_group_version;
    let hash = uri.query().unwrap_or("").split('&').find_map(|pair| pair.strip_prefix("hash="));
    match hash {
        Some(asked) if asked != document.hash() => {
            let location = format!("/openapi/v3/{GV_PATH}?hash={}", document.hash());
            (StatusCode::MOVED_PERMANENTLY, [(header::LOCATION, location)]).into_response()
        }
        Some(_) => document.respond(&headers, "application/json", Caching::Immutable),
        None => document.respond(&headers, "application/json", Caching::Revalidate),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `$ref` of a document resolves inside it.
    fn assert_refs_resolve(doc: &Value, node: &Value) {
        match node {
            Value::Object(map) => {
                if let Some(target) = map.get("$ref").and_then(Value::as_str) {
                    let pointer = target.trim_start_matches('#');
                    assert!(doc.pointer(pointer).is_some(), "dangling {target}");
                }
                map.values().for_each(|v| assert_refs_resolve(doc, v));
            }
            Value::Array(items) => items.iter().for_each(|v| assert_refs_resolve(doc, v)),
            _ => {}
        }
    }

    #[test]
    fn documents_are_self_contained_and_name_kinds() {
        for doc in [v2_document(), v3_group_version_document()] {
            assert_refs_resolve(&doc, &doc);
            let text = doc.to_string();
            assert!(text.contains("dev.stowage.content.v1alpha1.BundleList"));
            for (path, item) in doc["paths"].as_object().unwrap() {
                for (method, op) in item.as_object().unwrap().iter().filter(|(m, _)| *m != "parameters") {
                    assert!(op["x-kubernetes-group-version-kind"]["kind"].is_string(), "{method} {path}");
                }
            }
        }
    }
}
