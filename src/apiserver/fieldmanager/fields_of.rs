//! The field set a value *mentions* (what an applier owns after applying it), and the checks an
//! applied configuration must pass before it is merged: list items with their keys, no duplicate
//! keys or set values, no undeclared fields.

use std::collections::BTreeSet;

use serde_json::Value;

use super::fieldset::FieldSet;
use super::path::{path_to_string, PathElement};
use super::types::{Shape, Ty};

/// Walks a value into a field set.
struct Walk {
    set: FieldSet,
    /// `Some` for an applied configuration: problems are collected instead of tolerated.
    errors: Option<Vec<String>>,
    path: Vec<PathElement>,
}

/// The field set of a stored object. Problems a configuration would be rejected for are tolerated:
/// a list whose items have no usable keys is owned as one leaf, duplicated items as wholes.
pub fn field_set(ty: Ty<'_>, value: &Value) -> FieldSet {
    let mut walk = Walk { set: FieldSet::default(), errors: None, path: Vec::new() };
    walk.value(ty, value);
    walk.set
}

/// The field set of an applied configuration, or every reason it is not a valid one
/// (`.path: message`, as structured-merge-diff words them).
pub fn config_field_set(ty: Ty<'_>, value: &Value) -> Result<FieldSet, Vec<String>> {
    let mut walk = Walk { set: FieldSet::default(), errors: Some(Vec::new()), path: Vec::new() };
    walk.value(ty, value);
    match walk.errors {
        Some(errors) if !errors.is_empty() => Err(errors),
        _ => Ok(walk.set),
    }
}

impl Walk {
    fn error(&mut self, message: String) -> bool {
        let path = path_to_string(&self.path);
        match &mut self.errors {
            Some(errors) => {
                errors.push(if path.is_empty() { message } else { format!("{path}: {message}") });
                true
            }
            None => false,
        }
    }

    fn value(&mut self, ty: Ty<'_>, value: &Value) {
        match (ty.shape(value), value) {
            (Shape::Map(map), Value::Object(entries)) => {
                for (name, child) in entries {
                    let field = map.field(name);
                    self.path.push(PathElement::Field(name.clone()));
                    if field.unknown {
                        self.error("field not declared in schema".into());
                    }
                    let empty_map = child.as_object().is_some_and(|m| m.is_empty());
                    if child.is_null() || empty_map || !field.declared {
                        self.set.insert(&self.path);
                    }
                    self.value(field.ty, child);
                    self.path.pop();
                }
            }
            (Shape::List(list), Value::Array(items)) => {
                let elements = match list.elements(items) {
                    Ok(elements) => elements,
                    Err(message) => {
                        if !self.error(message) {
                            self.set.insert(&self.path); // owned as one leaf
                        }
                        return;
                    }
                };
                let mut seen = BTreeSet::new();
                let mut duplicated = BTreeSet::new();
                for element in &elements {
                    let first_duplicate = !seen.insert(element) && duplicated.insert(element);
                    if first_duplicate && !self.error(format!("duplicate entries for key {element}")) {
                        self.path.push(element.clone());
                        self.set.insert(&self.path); // a duplicated item is owned as a whole
                        self.path.pop();
                    }
                }
                for (element, item) in elements.iter().zip(items) {
                    if duplicated.contains(element) {
                        continue;
                    }
                    self.path.push(element.clone());
                    self.value(list.item, item);
                    self.set.insert(&self.path);
                    self.path.pop();
                }
            }
            _ => self.set.insert(&self.path),
        }
    }
}

/// `set` plus, as members, every declared struct field that has owned paths below it: owning
/// `.spec.paused` then also protects `.spec` itself (structured-merge-diff's
/// `EnsureNamedFieldsAreMembers`), but owning a label does not own the other labels.
pub fn with_named_fields_as_members(set: &FieldSet, ty: Ty<'_>) -> FieldSet {
    let mut out = set.clone();
    for (element, child) in set.children() {
        if let PathElement::Field(name) = element {
            if ty.declares(name) {
                out.add_member(element.clone());
            }
        }
        out.set_child(element.clone(), with_named_fields_as_members(child, ty.child(element)));
    }
    out
}
