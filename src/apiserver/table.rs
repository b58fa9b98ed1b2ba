//! Response negotiation for object reads: plain JSON, a `meta.k8s.io/v1` `Table` (what kubectl asks
//! for) with the resource's columns, or `PartialObjectMetadata[List]` (what the garbage collector's
//! and namespace controller's metadata client asks for, protobuf first: JSON is served).

use axum::http::HeaderMap;
use serde_json::{json, Map, Value};

use crate::strategy::ResourceDef;

/// What the client asked to receive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Representation {
    Object,
    Table {
        include: IncludeObject,
    },
    /// `PartialObjectMetadata` (`…List` for lists).
    Metadata,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IncludeObject {
    None,
    Metadata,
    Object,
}

/// Picks the first acceptable representation from `Accept`, like kube-apiserver's negotiation.
pub fn negotiate(headers: &HeaderMap, include_object: Option<&str>) -> Representation {
    let accept = headers.get(axum::http::header::ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or("");
    for media in accept.split(',') {
        let params: Vec<(&str, &str)> = media.split(';').skip(1).filter_map(|p| p.trim().split_once('=')).collect();
        let get = |k: &str| params.iter().find(|(key, _)| *key == k).map(|(_, v)| *v);
        let base = media.split(';').next().unwrap_or("").trim();
        if base != "application/json" && base != "*/*" {
            continue;
        }
        match (get("as"), get("g"), get("v")) {
            (Some("Table"), Some("meta.k8s.io"), Some("v1")) => {
                let include = match include_object {
                    Some("None") => IncludeObject::None,
                    Some("Object") => IncludeObject::Object,
                    _ => IncludeObject::Metadata,
                };
                return Representation::Table { include };
            }
            (Some("PartialObjectMetadata" | "PartialObjectMetadataList"), Some("meta.k8s.io"), Some("v1")) => {
                return Representation::Metadata
            }
            (None, _, _) => return Representation::Object,
            _ => continue,
        }
    }
    Representation::Object
}

/// A `Table` of `objects`, with the list's resourceVersion / continue in its metadata.
pub fn table(def: &ResourceDef, objects: &[Value], include: IncludeObject, list_meta: Value) -> Value {
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": list_meta,
        "columnDefinitions": columns(def),
        "rows": objects.iter().map(|obj| row(def, obj, include)).collect::<Vec<_>>(),
    })
}

/// The `columnDefinitions` of a resource's tables.
pub fn columns(def: &ResourceDef) -> Value {
    def.columns
        .iter()
        .map(|c| {
            json!({"name": c.name, "type": c.kind, "format": c.format, "description": c.description, "priority": c.priority})
        })
        .collect()
}

/// One row of a table: the object's cells, and the object as `include` asks.
pub fn row(def: &ResourceDef, obj: &Value, include: IncludeObject) -> Value {
    let mut row = Map::new();
    row.insert("cells".into(), Value::Array((def.row)(obj)));
    match include {
        IncludeObject::None => {}
        IncludeObject::Metadata => {
            row.insert("object".into(), partial_object_metadata(obj));
        }
        IncludeObject::Object => {
            row.insert("object".into(), obj.clone());
        }
    }
    Value::Object(row)
}

/// `obj` as the client asked for it (single objects and watch events).
pub fn render_one(def: &ResourceDef, obj: &Value, representation: Representation) -> Value {
    match representation {
        Representation::Object => obj.clone(),
        Representation::Metadata => partial_object_metadata(obj),
        Representation::Table { include } => {
            let rv = obj.pointer("/metadata/resourceVersion").cloned().unwrap_or(Value::Null);
            table(def, std::slice::from_ref(obj), include, json!({"resourceVersion": rv}))
        }
    }
}

pub fn partial_object_metadata(obj: &Value) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": obj.get("metadata").cloned().unwrap_or_else(|| json!({})),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubectl_accept_header_selects_table() {
        let mut headers = HeaderMap::new();
        headers.insert(
            "accept",
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
                .parse()
                .unwrap(),
        );
        assert_eq!(negotiate(&headers, None), Representation::Table { include: IncludeObject::Metadata });
        headers.insert("accept", "application/json".parse().unwrap());
        assert_eq!(negotiate(&headers, None), Representation::Object);
    }

    #[test]
    fn metadata_client_accept_header_selects_partial_metadata_as_json() {
        let mut headers = HeaderMap::new();
        headers.insert(
            "accept",
            "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
                .parse()
                .unwrap(),
        );
        assert_eq!(negotiate(&headers, None), Representation::Metadata);
    }
}
