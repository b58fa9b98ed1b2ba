//! Test support: a schema and the typed model describe the same fields. Every field a fully
//! populated typed object writes is declared by the schema, and every field the schema declares
//! is written by it (so a field added to one and not the other fails a test).

use std::collections::BTreeSet;

use serde_json::Value;

/// Paths the schema declares, down to leaves (or nodes whose content is free-form).
pub fn declared(schema: &Value) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    walk_schema(schema, "", &mut out);
    out
}

fn walk_schema(schema: &Value, path: &str, out: &mut BTreeSet<String>) {
    let free = schema.get("x-kubernetes-preserve-unknown-fields").and_then(Value::as_bool) == Some(true);
    let items = schema.get("items");
    match (schema.get("properties").and_then(Value::as_object), items) {
        (Some(props), _) if !free && !props.is_empty() => {
            for (field, child) in props {
                walk_schema(child, &join(path, field), out);
            }
        }
        (_, Some(items)) if !free => walk_schema(items, &format!("{path}[]"), out),
        _ => {
            out.insert(path.to_string());
        }
    }
}

/// Paths a value writes, cut where the schema declares free-form content.
pub fn written(schema: &Value, value: &Value) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    walk_value(Some(schema), value, "", &mut out);
    out
}

fn walk_value(schema: Option<&Value>, value: &Value, path: &str, out: &mut BTreeSet<String>) {
    let free =
        schema.is_some_and(|s| s.get("x-kubernetes-preserve-unknown-fields").and_then(Value::as_bool) == Some(true));
    let props = schema.and_then(|s| s.get("properties")).and_then(Value::as_object).filter(|p| !p.is_empty());
    match value {
        Value::Object(map) if !free && (props.is_some() || schema.is_none()) => {
            for (field, child) in map {
                walk_value(props.and_then(|p| p.get(field)), child, &join(path, field), out);
            }
        }
        Value::Array(items) if !free => {
            for item in items {
                walk_value(schema.and_then(|s| s.get("items")), item, &format!("{path}[]"), out);
            }
        }
        _ => {
            out.insert(path.to_string());
        }
    }
}

fn join(path: &str, field: &str) -> String {
    if path.is_empty() {
        field.to_string()
    } else {
        format!("{path}.{field}")
    }
}
