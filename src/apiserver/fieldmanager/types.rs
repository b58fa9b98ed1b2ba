//! How a value is walked, read from the resource's structural schema (OpenAPI v3 as a CRD declares
//! it), the way kube-apiserver converts a CRD schema for structured-merge-diff:
//!
//! - objects are granular maps: each field is owned on its own; `properties` are *declared* fields,
//!   `additionalProperties` gives the type of any other key (labels, annotations);
//!   `x-kubernetes-map-type: atomic` makes the whole object one leaf;
//! - arrays are atomic (one leaf) unless `x-kubernetes-list-type` is `set` (items owned by value)
//!   or `map` with `x-kubernetes-list-map-keys` (items owned by key);
//! - `x-kubernetes-preserve-unknown-fields` subtrees (and fields the schema does not declare) are
//!   *deduced* from the value, as structured-merge-diff's `__untyped_deduced_` type: objects are
//!   granular maps of deduced values, arrays are atomic, everything else is a scalar leaf.

use serde_json::{Map, Value};

use super::path::PathElement;

/// The type of a value: a schema node, or deduced from the value.
#[derive(Clone, Copy, Debug)]
pub enum Ty<'s> {
    Schema(&'s Value),
    /// Unknown shape, walked granularly (preserve-unknown-fields).
    Deduced,
    /// Unknown shape, one leaf (items of deduced lists).
    Atomic,
}

/// How one value of a type is walked.
pub enum Shape<'s> {
    /// Compared, merged and owned as a whole.
    Leaf,
    Map(MapType<'s>),
    List(ListType<'s>),
}

#[derive(Clone, Copy)]
pub struct MapType<'s> {
    fields: Option<&'s Map<String, Value>>,
    elements: Option<Ty<'s>>,
}

#[derive(Clone, Copy)]
pub struct ListType<'s> {
    pub item: Ty<'s>,
    keys: Option<&'s Vec<Value>>,
}

/// A map field's type and whether the schema declares it (`properties`).
pub struct FieldType<'s> {
    pub ty: Ty<'s>,
    pub declared: bool,
    /// Neither declared nor allowed by `additionalProperties`/preserve-unknown-fields.
    pub unknown: bool,
}

fn is_true(schema: &Value, key: &str) -> bool {
    schema.get(key).and_then(Value::as_bool) == Some(true)
}

impl<'s> Ty<'s> {
    /// The shape of `value` under this type. A value that does not have the schema's container
    /// type (or is null) is a leaf; the schema check reports it.
    pub fn shape(self, value: &Value) -> Shape<'s> {
        match self {
            Ty::Atomic => Shape::Leaf,
            Ty::Deduced => match value {
                Value::Object(_) => Shape::Map(MapType { fields: None, elements: Some(Ty::Deduced) }),
                _ => Shape::Leaf,
            },
            Ty::Schema(schema) => match (schema.get("type").and_then(Value::as_str), value) {
                (Some("object"), Value::Object(_)) => {
                    if schema.get("x-kubernetes-map-type").and_then(Value::as_str) == Some("atomic") {
                        return Shape::Leaf;
                    }
                    Shape::Map(MapType {
                        fields: schema.get("properties").and_then(Value::as_object),
                        elements: self.elements(),
                    })
                }
                (Some("array"), Value::Array(_)) => {
                    let item = schema.get("items").map_or(Ty::Atomic, Ty::Schema);
                    match schema.get("x-kubernetes-list-type").and_then(Value::as_str) {
                        Some("set") => Shape::List(ListType { item, keys: None }),
                        Some("map") => match schema.get("x-kubernetes-list-map-keys").and_then(Value::as_array) {
                            Some(keys) if !keys.is_empty() => Shape::List(ListType { item, keys: Some(keys) }),
                            _ => Shape::Leaf,
                        },
                        _ => Shape::Leaf,
                    }
                }
                (None, _) if is_true(schema, "x-kubernetes-preserve-unknown-fields") => Ty::Deduced.shape(value),
                _ => Shape::Leaf,
            },
        }
    }

    /// The type of keys a map does not declare, if it allows any.
    fn elements(self) -> Option<Ty<'s>> {
        match self {
            Ty::Schema(schema) => match schema.get("additionalProperties") {
                Some(additional) if additional.is_object() => Some(Ty::Schema(additional)),
                _ if is_true(schema, "x-kubernetes-preserve-unknown-fields") => Some(Ty::Deduced),
                _ => None,
            },
            Ty::Deduced => Some(Ty::Deduced),
            Ty::Atomic => Some(Ty::Atomic),
        }
    }

    /// Whether `name` is a declared field (`properties`) of this type.
    pub fn declares(self, name: &str) -> bool {
        match self {
            Ty::Schema(schema) => {
                schema.get("properties").and_then(Value::as_object).is_some_and(|fields| fields.contains_key(name))
            }
            _ => false,
        }
    }

    /// The type of the child reached by `element`, without a value at hand (walking a field set).
    pub fn child(self, element: &PathElement) -> Ty<'s> {
        match (self, element) {
            (Ty::Schema(schema), PathElement::Field(name)) => {
                match schema.get("properties").and_then(|p| p.get(name.as_str())) {
                    Some(field) => Ty::Schema(field),
                    None => self.elements().unwrap_or(Ty::Deduced),
                }
            }
            (Ty::Schema(schema), _) => schema.get("items").map_or(Ty::Atomic, Ty::Schema),
            (Ty::Deduced, PathElement::Field(_)) => Ty::Deduced,
            _ => Ty::Atomic,
        }
    }

    /// Whether a `null` is kept as a value (`nullable: true`) rather than meaning "absent".
    pub fn nullable(self) -> bool {
        match self {
            Ty::Schema(schema) => is_true(schema, "nullable"),
            _ => true,
        }
    }
}

impl<'s> MapType<'s> {
    pub fn field(&self, name: &str) -> FieldType<'s> {
        match self.fields.and_then(|fields| fields.get(name)) {
            Some(schema) => FieldType { ty: Ty::Schema(schema), declared: true, unknown: false },
            None => match self.elements {
                Some(ty) => FieldType { ty, declared: false, unknown: false },
                None => FieldType { ty: Ty::Deduced, declared: false, unknown: true },
            },
        }
    }
}

impl<'s> ListType<'s> {
    /// The path element of a list item: its key fields, or its value for a set. Errors are
    /// structured-merge-diff's messages.
    pub fn item_element(&self, item: &Value) -> Result<PathElement, String> {
        let Some(keys) = self.keys else {
            return match item {
                Value::Object(_) => Err("associative list without keys has an element that's a map type".into()),
                Value::Array(_) => Err("not supported: associative list with lists as elements".into()),
                Value::Null => Err("associative list without keys has an element that's an explicit null".into()),
                scalar => Ok(PathElement::Value(scalar.clone())),
            };
        };
        let map = match item {
            Value::Object(map) => map,
            Value::Null => return Err("associative list with keys may not have a null element".into()),
            _ => return Err("associative list with keys may not have non-map elements".into()),
        };
        let mut fields = Vec::with_capacity(keys.len());
        for key in keys {
            let Some(name) = key.as_str() else { continue };
            let default = match self.item {
                Ty::Schema(schema) => schema.pointer(&format!("/properties/{}/default", escape_pointer(name))),
                _ => None,
            };
            match map.get(name).or(default) {
                Some(value) => fields.push((name.to_string(), value.clone())),
                None => {
                    return Err(format!(
                        "associative list with keys has an element that omits key field {name:?} (and doesn't have \
                         default value)"
                    ))
                }
            }
        }
        Ok(PathElement::key(fields))
    }

    /// The path elements of every item, or the first error with the item's index.
    pub fn elements(&self, items: &[Value]) -> Result<Vec<PathElement>, String> {
        items
            .iter()
            .enumerate()
            .map(|(index, item)| self.item_element(item).map_err(|e| format!("element {index}: {e}")))
            .collect()
    }
}

fn escape_pointer(token: &str) -> String {
    token.replace('~', "~0").replace('/', "~1")
}
