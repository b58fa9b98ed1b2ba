//! The walker that checks a request body against a resource's structural schema (written with
//! [`crate::api::schema`]): unknown fields (reported per `fieldValidation`) and wrong types (422),
//! then pruning.

use std::collections::HashMap;
use std::sync::{Arc, PoisonError, RwLock};

use serde_json::Value;

use super::status::Cause;
use crate::strategy::ResourceDef;

/// A resource's structural schema, built once per resource (every write walks it; building it
/// is hundreds of allocations). The map holds one entry per resource the server defines.
pub fn of(def: &ResourceDef) -> Arc<Value> {
    static SCHEMAS: RwLock<Option<HashMap<&'static str, Arc<Value>>>> = RwLock::new(None);
    if let Some(schema) =
        SCHEMAS.read().unwrap_or_else(PoisonError::into_inner).as_ref().and_then(|m| m.get(def.plural))
    {
        return schema.clone();
    }
    let schema = Arc::new((def.schema)());
    let mut schemas = SCHEMAS.write().unwrap_or_else(PoisonError::into_inner);
    schemas.get_or_insert_with(HashMap::new).entry(def.plural).or_insert(schema).clone()
}

/// What checking a body against its schema found.
#[derive(Debug, Default)]
pub struct SchemaReport {
    /// Paths of fields the schema does not declare, e.g. `spec.bogus`.
    pub unknown: Vec<String>,
    /// Type and enum violations.
    pub causes: Vec<Cause>,
}

pub fn check(schema: &Value, value: &Value) -> SchemaReport {
    let mut report = SchemaReport::default();
    walk(schema, value, "", &mut report);
    report
}

fn join(path: &str, field: &str) -> String {
    if path.is_empty() {
        field.to_string()
    } else {
        format!("{path}.{field}")
    }
}

fn walk(schema: &Value, value: &Value, path: &str, report: &mut SchemaReport) {
    if value.is_null() {
        return; // null means "unset" for optional fields, as in the Kubernetes decoder
    }
    let preserve = schema.get("x-kubernetes-preserve-unknown-fields").and_then(Value::as_bool) == Some(true);
    match schema.get("type").and_then(Value::as_str) {
        Some("object") => {
            let Some(map) = value.as_object() else {
                report.causes.push(Cause::type_invalid(path, value, "object"));
                return;
            };
            let properties = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties").filter(|a| a.is_object());
            for (field, child) in map {
                let child_path = join(path, field);
                match (properties.and_then(|p| p.get(field)), additional) {
                    (Some(s), _) | (None, Some(s)) => walk(s, child, &child_path, report),
                    (None, None) if preserve => {}
                    (None, None) => report.unknown.push(child_path),
                }
            }
        }
        Some("array") => {
            let Some(items) = value.as_array() else {
                report.causes.push(Cause::type_invalid(path, value, "array"));
                return;
            };
            if let Some(item_schema) = schema.get("items") {
                for (i, item) in items.iter().enumerate() {
                    walk(item_schema, item, &format!("{path}[{i}]"), report);
                }
            }
        }
        Some("string") => match value.as_str() {
            None => report.causes.push(Cause::type_invalid(path, value, "string")),
            Some(s) => {
                if let Some(allowed) = schema.get("enum").and_then(Value::as_array) {
                    if !allowed.iter().any(|a| a.as_str() == Some(s)) {
                        let names: Vec<&str> = allowed.iter().filter_map(Value::as_str).collect();
                        report.causes.push(Cause::not_supported(path, value, &names));
                    }
                }
            }
        },
        Some("integer") if !(value.is_i64() || value.is_u64()) => {
            report.causes.push(Cause::type_invalid(path, value, "integer"))
        }
        Some("boolean") if !value.is_boolean() => report.causes.push(Cause::type_invalid(path, value, "boolean")),
        _ => {}
    }
}

/// Sets `field` of a JSON object; anything else is left alone (`value[field] = …` would panic).
pub fn set_field(target: &mut Value, field: &str, value: Value) {
    if let Some(map) = target.as_object_mut() {
        map.insert(field.into(), value);
    }
}

/// Removes every field the schema does not declare (CRD pruning), after [`check`] reported them.
pub fn prune(schema: &Value, value: &mut Value) {
    if schema.get("x-kubernetes-preserve-unknown-fields").and_then(Value::as_bool) == Some(true) {
        return;
    }
    match (schema.get("type").and_then(Value::as_str), value) {
        (Some("object"), Value::Object(map)) => {
            let properties = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties").filter(|a| a.is_object());
            map.retain(|field, _| properties.is_some_and(|p| p.contains_key(field)) || additional.is_some());
            for (field, child) in map.iter_mut() {
                if let Some(s) = properties.and_then(|p| p.get(field)).or(additional) {
                    prune(s, child);
                }
            }
        }
        (Some("array"), Value::Array(items)) => {
            if let Some(item_schema) = schema.get("items") {
                items.iter_mut().for_each(|item| prune(item_schema, item));
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::api::schema::{array_of, boolean, kind_root, object, string};

    #[test]
    fn reports_unknown_fields_and_types() {
        let schema = kind_root(
            "t",
            object("s", json!({"paused": boolean(), "items": array_of(object("i", json!({"a": string()})))})),
            object("st", json!({})),
        );
        let body = json!({"apiVersion": "x", "metadata": {"name": "n", "bogus": 1}, "spec": {"paused": "yes", "items": [{"a": "x", "b": 2}], "zzz": 1}});
        let report = check(&schema, &body);
        assert_eq!(report.unknown, vec!["metadata.bogus", "spec.items[0].b", "spec.zzz"]);
        assert_eq!(report.causes.len(), 1);
        assert_eq!(report.causes[0].field, "spec.paused");
    }
}
