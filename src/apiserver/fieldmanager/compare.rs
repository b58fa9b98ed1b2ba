//! Comparing two versions of an object: which paths a write added, modified or removed, as
//! structured-merge-diff's `Compare` reports them. Leaves (scalars, atomic lists and maps, empty
//! containers) are added, modified or removed; a map, list item or granular container that appears
//! or disappears as a whole is added or removed too (this is why an Update entry says
//! `"f:labels":{".":{},...}` when it created the labels).

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use super::fieldset::FieldSet;
use super::path::PathElement;
use super::types::{ListType, MapType, Shape, Ty};

#[derive(Debug, Default)]
pub struct Comparison {
    pub added: FieldSet,
    pub modified: FieldSet,
    pub removed: FieldSet,
}

impl Comparison {
    /// Paths whose value the write set: added or modified.
    pub fn changed(&self) -> FieldSet {
        self.added.union(&self.modified)
    }
}

/// Compares `old` with `new`.
pub fn compare(ty: Ty<'_>, old: &Value, new: &Value) -> Comparison {
    let mut walk = CompareWalk { out: Comparison::default(), path: Vec::new() };
    walk.value(ty, Some(old), Some(new));
    walk.out
}

struct CompareWalk {
    out: Comparison,
    path: Vec<PathElement>,
}

/// The container shape two values share (a `null` side takes the other side's shape), or `None`
/// when they are compared as leaves.
fn shared_shape<'s>(ty: Ty<'s>, old: Option<&Value>, new: Option<&Value>) -> Option<Shape<'s>> {
    match (old.filter(|v| !v.is_null()), new.filter(|v| !v.is_null())) {
        (None, None) => None,
        (Some(one), None) | (None, Some(one)) => Some(ty.shape(one)),
        (Some(a), Some(b)) => match (ty.shape(a), ty.shape(b)) {
            (Shape::Map(map), Shape::Map(_)) => Some(Shape::Map(map)),
            (Shape::List(list), Shape::List(_)) => Some(Shape::List(list)),
            _ => None,
        },
    }
}

fn is_empty_container(value: Option<&Value>) -> bool {
    match value {
        None | Some(Value::Null) => true,
        Some(Value::Object(map)) => map.is_empty(),
        Some(Value::Array(items)) => items.is_empty(),
        Some(_) => false,
    }
}

impl CompareWalk {
    fn value(&mut self, ty: Ty<'_>, old: Option<&Value>, new: Option<&Value>) {
        let both_empty = is_empty_container(old) && is_empty_container(new);
        let walked = match shared_shape(ty, old, new) {
            Some(_) if both_empty => false,
            Some(Shape::Map(map)) => {
                self.map(map, old, new);
                true
            }
            Some(Shape::List(list)) => self.list(list, old, new),
            _ => false,
        };
        if !walked {
            self.leaf(old, new);
            return;
        }
        // A container that appeared or disappeared as a whole.
        match (old, new) {
            (None, Some(_)) => self.out.added.insert(&self.path),
            (Some(_), None) => self.out.removed.insert(&self.path),
            _ => {}
        }
    }

    fn leaf(&mut self, old: Option<&Value>, new: Option<&Value>) {
        match (old, new) {
            (None, Some(_)) => self.out.added.insert(&self.path),
            (Some(_), None) => self.out.removed.insert(&self.path),
            (Some(a), Some(b)) if a != b => self.out.modified.insert(&self.path),
            _ => {}
        }
    }

    fn map(&mut self, map: MapType<'_>, old: Option<&Value>, new: Option<&Value>) {
        let old = old.and_then(Value::as_object);
        let new = new.and_then(Value::as_object);
        let mut keys: Vec<&String> = old.into_iter().flat_map(|m| m.keys()).collect();
        keys.extend(new.into_iter().flat_map(|m| m.keys()).filter(|k| !old.is_some_and(|o| o.contains_key(*k))));
        for key in keys {
            self.path.push(PathElement::Field(key.clone()));
            self.value(map.field(key).ty, old.and_then(|m| m.get(key)), new.and_then(|m| m.get(key)));
            self.path.pop();
        }
    }

    /// Compares items by key or value; `false` when an item has no usable key (then the list is
    /// compared as one leaf).
    fn list(&mut self, list: ListType<'_>, old: Option<&Value>, new: Option<&Value>) -> bool {
        let no_items: &[Value] = &[];
        let old_items = old.and_then(Value::as_array).map_or(no_items, Vec::as_slice);
        let new_items = new.and_then(Value::as_array).map_or(no_items, Vec::as_slice);
        let (Ok(old_elements), Ok(new_elements)) = (list.elements(old_items), list.elements(new_items)) else {
            return false;
        };
        // The first item with a given key stands for all of them, as structured-merge-diff does.
        let mut old_by_element: BTreeMap<&PathElement, &Value> = BTreeMap::new();
        for (element, item) in old_elements.iter().zip(old_items) {
            old_by_element.entry(element).or_insert(item);
        }
        let mut new_by_element: BTreeMap<&PathElement, &Value> = BTreeMap::new();
        let mut order = Vec::new();
        for (element, item) in new_elements.iter().zip(new_items) {
            if !new_by_element.contains_key(element) {
                new_by_element.insert(element, item);
                order.push(element);
            }
        }
        let mut old_only = BTreeSet::new();
        for element in old_elements.iter() {
            if !new_by_element.contains_key(element) && old_only.insert(element) {
                order.push(element);
            }
        }
        for element in order {
            self.path.push(element.clone());
            self.value(list.item, old_by_element.get(element).copied(), new_by_element.get(element).copied());
            self.path.pop();
        }
        true
    }
}
