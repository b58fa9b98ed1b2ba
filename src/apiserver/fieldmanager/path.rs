//! Path elements: one step from a value into a child (a field, an associative-list item by key, a
//! set item by value, an atomic-list item by index), with the total order, the human-readable form
//! (`.spec.paused`, `[type="Ready"]`) and the FieldsV1 key form (`f:`, `k:`, `v:`, `i:`) that
//! structured-merge-diff uses.

use std::cmp::Ordering;
use std::fmt;

use serde_json::{Map, Value};

/// One step into a value.
#[derive(Clone, Debug)]
pub enum PathElement {
    /// A field of a map or struct: `f:name`.
    Field(String),
    /// An item of an associative list, by its key fields sorted by name: `k:{"type":"Ready"}`.
    Key(Vec<(String, Value)>),
    /// An item of a set, by its value: `v:"finalizer"`.
    Value(Value),
    /// An item of an atomic list, by position: `i:0` (only ever read from client-written FieldsV1).
    Index(usize),
}

/// A path from the root of an object.
pub type Path = [PathElement];

impl PathElement {
    /// A key element from key fields in any order.
    pub fn key(mut fields: Vec<(String, Value)>) -> PathElement {
        fields.sort_by(|a, b| a.0.cmp(&b.0));
        PathElement::Key(fields)
    }

    /// The FieldsV1 object key: `f:name`, `k:{...}`, `v:<json>`, `i:<n>`.
    pub fn to_fields_v1_key(&self) -> String {
        match self {
            PathElement::Field(name) => format!("f:{name}"),
            PathElement::Key(fields) => {
                let object: Map<String, Value> = fields.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
                format!("k:{}", Value::Object(object))
            }
            PathElement::Value(value) => format!("v:{value}"),
            PathElement::Index(index) => format!("i:{index}"),
        }
    }

    /// Parses a FieldsV1 object key (not `.`).
    pub fn from_fields_v1_key(key: &str) -> Result<PathElement, String> {
        let invalid = || format!("invalid FieldsV1 key {key:?}");
        let (prefix, rest) = key.split_once(':').ok_or_else(invalid)?;
        match prefix {
            "f" => Ok(PathElement::Field(rest.to_string())),
            "k" => match serde_json::from_str::<Value>(rest) {
                Ok(Value::Object(map)) if !map.is_empty() => Ok(PathElement::key(map.into_iter().collect())),
                _ => Err(invalid()),
            },
            "v" => serde_json::from_str::<Value>(rest).map(PathElement::Value).map_err(|_| invalid()),
            "i" => rest.parse::<usize>().map(PathElement::Index).map_err(|_| invalid()),
            _ => Err(invalid()),
        }
    }

    fn rank(&self) -> u8 {
        match self {
            PathElement::Field(_) => 0,
            PathElement::Key(_) => 1,
            PathElement::Value(_) => 2,
            PathElement::Index(_) => 3,
        }
    }
}

impl Ord for PathElement {
    /// Fields, then keys, then values, then indexes; within a kind, by content.
    fn cmp(&self, other: &Self) -> Ordering {
        match (self, other) {
            (PathElement::Field(a), PathElement::Field(b)) => a.cmp(b),
            (PathElement::Key(a), PathElement::Key(b)) => {
                for ((name_a, value_a), (name_b, value_b)) in a.iter().zip(b.iter()) {
                    let order = name_a.cmp(name_b).then_with(|| compare_values(value_a, value_b));
                    if order != Ordering::Equal {
                        return order;
                    }
                }
                a.len().cmp(&b.len())
            }
            (PathElement::Value(a), PathElement::Value(b)) => compare_values(a, b),
            (PathElement::Index(a), PathElement::Index(b)) => a.cmp(b),
            _ => self.rank().cmp(&other.rank()),
        }
    }
}

impl PartialOrd for PathElement {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for PathElement {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for PathElement {}

impl fmt::Display for PathElement {
    /// `.name`, `[type="Ready"]`, `[="value"]`, `[0]`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PathElement::Field(name) => write!(f, ".{name}"),
            PathElement::Key(fields) => {
                let parts: Vec<String> = fields.iter().map(|(k, v)| format!("{k}={}", value_to_string(v))).collect();
                write!(f, "[{}]", parts.join(","))
            }
            PathElement::Value(value) => write!(f, "[={}]", value_to_string(value)),
            PathElement::Index(index) => write!(f, "[{index}]"),
        }
    }
}

/// A path as kube prints it in conflicts: `.status.conditions[type="Ready"].status`.
pub fn path_to_string(path: &Path) -> String {
    path.iter().map(PathElement::to_string).collect()
}

/// A value in a printed path: strings quoted, containers spelled out.
fn value_to_string(value: &Value) -> String {
    match value {
        Value::Array(items) => format!("[{}]", items.iter().map(value_to_string).collect::<Vec<_>>().join(",")),
        Value::Object(map) => {
            let parts: Vec<String> = map.iter().map(|(k, v)| format!("{k}={}", value_to_string(v))).collect();
            format!("{{{}}}", parts.join(";"))
        }
        other => other.to_string(),
    }
}

/// The total order structured-merge-diff gives values: numbers, strings, booleans, lists, maps,
/// null; numbers compare numerically across integers and floats.
pub fn compare_values(a: &Value, b: &Value) -> Ordering {
    fn rank(v: &Value) -> u8 {
        match v {
            Value::Number(_) => 0,
            Value::String(_) => 1,
            Value::Bool(_) => 2,
            Value::Array(_) => 3,
            Value::Object(_) => 4,
            Value::Null => 5,
        }
    }
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_i64(), y.as_i64()) {
            (Some(x), Some(y)) => x.cmp(&y),
            _ => match (x.as_u64(), y.as_u64()) {
                (Some(x), Some(y)) => x.cmp(&y),
                _ => {
                    let (x, y) = (x.as_f64().unwrap_or(f64::NAN), y.as_f64().unwrap_or(f64::NAN));
                    x.partial_cmp(&y).unwrap_or(Ordering::Equal)
                }
            },
        },
        (Value::String(x), Value::String(y)) => x.cmp(y),
        (Value::Bool(x), Value::Bool(y)) => x.cmp(y),
        (Value::Array(x), Value::Array(y)) => {
            for (i, j) in x.iter().zip(y.iter()) {
                let order = compare_values(i, j);
                if order != Ordering::Equal {
                    return order;
                }
            }
            x.len().cmp(&y.len())
        }
        (Value::Object(x), Value::Object(y)) => {
            let mut x: Vec<(&String, &Value)> = x.iter().collect();
            let mut y: Vec<(&String, &Value)> = y.iter().collect();
            x.sort_by(|a, b| a.0.cmp(b.0));
            y.sort_by(|a, b| a.0.cmp(b.0));
            for ((ka, va), (kb, vb)) in x.iter().zip(y.iter()) {
                let order = ka.cmp(kb).then_with(|| compare_values(va, vb));
                if order != Ordering::Equal {
                    return order;
                }
            }
            x.len().cmp(&y.len())
        }
        _ => rank(a).cmp(&rank(b)),
    }
}
