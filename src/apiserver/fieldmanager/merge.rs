//! Merging an applied configuration into the live object, and pruning what an applier stopped
//! applying, with structured-merge-diff's rules: maps merge key by key, associative lists item by
//! key and sets item by value (the configuration's order wins for the items it names, the live
//! object's other items keep their place), leaves and atomic containers are replaced.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value};

use super::fields_of::{field_set, with_named_fields_as_members};
use super::fieldset::FieldSet;
use super::path::PathElement;
use super::types::{ListType, MapType, Shape, Ty};

/// `config` merged over `live`; `None` when the result is "no value" (a `null` in the
/// configuration for a field that is not nullable: the field is removed, and still owned).
pub fn merge(ty: Ty<'_>, live: Option<&Value>, config: &Value) -> Option<Value> {
    let live = live.filter(|v| !v.is_null());
    if config.is_null() {
        // A null granular container merges as an empty one: the live items stay.
        return match live.map(|l| ty.shape(l)) {
            Some(Shape::Map(_) | Shape::List(_)) => live.cloned(),
            _ if ty.nullable() => Some(Value::Null),
            _ => None,
        };
    }
    match (ty.shape(config), live.map(|l| (ty.shape(l), l))) {
        (Shape::Map(map), None) => merge_map(map, None, config),
        (Shape::Map(map), Some((Shape::Map(_), live))) => merge_map(map, Some(live), config),
        (Shape::List(list), None) => merge_list(list, None, config),
        (Shape::List(list), Some((Shape::List(_), live))) => merge_list(list, Some(live), config),
        _ => Some(config.clone()),
    }
}

fn merge_map(map: MapType<'_>, live: Option<&Value>, config: &Value) -> Option<Value> {
    let empty = Map::new();
    let live = live.and_then(Value::as_object).unwrap_or(&empty);
    let config_entries = config.as_object().unwrap_or(&empty);
    if live.is_empty() && config_entries.is_empty() {
        return Some(config.clone());
    }
    let mut out = Map::new();
    for (key, live_value) in live {
        match config_entries.get(key) {
            Some(config_value) => {
                if let Some(merged) = merge(map.field(key).ty, Some(live_value), config_value) {
                    out.insert(key.clone(), merged);
                }
            }
            None => {
                out.insert(key.clone(), live_value.clone());
            }
        }
    }
    for (key, config_value) in config_entries {
        if !live.contains_key(key) {
            if let Some(merged) = merge(map.field(key).ty, None, config_value) {
                out.insert(key.clone(), merged);
            }
        }
    }
    Some(Value::Object(out))
}

fn merge_list(list: ListType<'_>, live: Option<&Value>, config: &Value) -> Option<Value> {
    let no_items: &[Value] = &[];
    let live_items = live.and_then(Value::as_array).map_or(no_items, Vec::as_slice);
    let config_items = config.as_array().map_or(no_items, Vec::as_slice);
    if live_items.is_empty() && config_items.is_empty() {
        return Some(config.clone());
    }
    let (Ok(live_elements), Ok(config_elements)) = (list.elements(live_items), list.elements(config_items)) else {
        return Some(config.clone()); // live items without keys: the configuration replaces the list
    };
    // Live items whose key appears once (a duplicated key is replaced by the configuration's item).
    let mut live_counts: BTreeMap<&PathElement, (usize, &Value)> = BTreeMap::new();
    for (element, item) in live_elements.iter().zip(live_items) {
        live_counts.entry(element).and_modify(|(count, _)| *count += 1).or_insert((1, item));
    }
    let live_single = |element: &PathElement| live_counts.get(element).filter(|(n, _)| *n == 1).map(|(_, v)| *v);
    let in_config: BTreeSet<&PathElement> = config_elements.iter().collect();
    // Items both sides name, in the configuration's order: the order the output gives them.
    let mut shared = config_elements.iter().filter(|e| live_single(e).is_some()).peekable();

    let live_pairs: Vec<(&PathElement, &Value)> = live_elements.iter().zip(live_items).collect();
    let config_pairs: Vec<(&PathElement, &Value)> = config_elements.iter().zip(config_items).collect();
    let mut out = Vec::with_capacity(live_items.len().max(config_items.len()));
    let mut merged: BTreeSet<&PathElement> = BTreeSet::new();
    let push = |out: &mut Vec<Value>, element: &PathElement, config_item: &Value| {
        if let Some(item) = merge(list.item, live_single(element), config_item) {
            out.push(item);
        }
    };
    let (mut l, mut c) = (0, 0);
    while l < live_pairs.len() || c < config_pairs.len() {
        if let (Some(&(live_element, _)), Some(&(config_element, config_item))) =
            (live_pairs.get(l), config_pairs.get(c))
        {
            if live_element == config_element {
                merged.insert(config_element);
                push(&mut out, config_element, config_item);
                l += 1;
                c += 1;
                shared.next();
                continue;
            }
            // A shared item the configuration places later: it is emitted there.
            if in_config.contains(live_element) && shared.peek().is_some_and(|next| *next != live_element) {
                l += 1;
                continue;
            }
        }
        if let Some(&(live_element, live_item)) = live_pairs.get(l) {
            if !in_config.contains(live_element) {
                out.push(live_item.clone());
                l += 1;
                continue;
            }
            if merged.contains(live_element) {
                l += 1;
                continue;
            }
        }
        match config_pairs.get(c) {
            Some(&(config_element, config_item)) => {
                merged.insert(config_element);
                push(&mut out, config_element, config_item);
                c += 1;
                if shared.peek().is_some_and(|next| *next == config_element) {
                    shared.next();
                }
            }
            None => l += 1, // unreachable while every configuration item is merged once; never loop
        }
    }
    Some(Value::Array(out))
}

/// `value` without the paths of `remove` (members are removed with everything below them).
/// `None` when nothing is left of a container.
pub fn remove_paths(ty: Ty<'_>, value: &Value, remove: &FieldSet) -> Option<Value> {
    match (ty.shape(value), value) {
        (Shape::Map(map), Value::Object(entries)) => {
            let mut out = Map::new();
            for (key, child) in entries {
                let element = PathElement::Field(key.clone());
                if remove.is_member(&element) {
                    continue;
                }
                let kept = match remove.child(&element) {
                    Some(below) => remove_paths(map.field(key).ty, child, below),
                    None => Some(child.clone()),
                };
                if let Some(kept) = kept {
                    out.insert(key.clone(), kept);
                }
            }
            (!out.is_empty()).then_some(Value::Object(out))
        }
        (Shape::List(list), Value::Array(items)) => {
            let Ok(elements) = list.elements(items) else {
                return Some(value.clone());
            };
            let mut out = Vec::new();
            for (element, item) in elements.iter().zip(items) {
                if remove.is_member(element) {
                    continue;
                }
                let kept = match remove.child(element) {
                    Some(below) => remove_paths(list.item, item, below),
                    None => Some(item.clone()),
                };
                out.extend(kept);
            }
            (!out.is_empty()).then_some(Value::Array(out))
        }
        _ => Some(value.clone()),
    }
}

fn remove_from_root(ty: Ty<'_>, value: &Value, remove: &FieldSet) -> Value {
    remove_paths(ty, value, remove).unwrap_or_else(|| Value::Object(Map::new()))
}

/// Removes from `merged` what the applier owned in its previous apply (`last`) and no longer
/// applies, unless some manager — the applier's new configuration included — owns it (`owned`).
/// Fields nobody owns are only removed when the applier owned them last time.
pub fn prune(ty: Ty<'_>, merged: &Value, last: &FieldSet, owned: &FieldSet) -> Value {
    let with_named = |set: &FieldSet| with_named_fields_as_members(set, ty);
    let last = with_named(last);
    let owned = with_named(owned);
    let merged_set = with_named(&field_set(ty, merged));
    // Remove everything the applier owned, then put back what anyone owns...
    let pruned = remove_from_root(ty, merged, &last);
    let removed = merged_set.difference(&with_named(&field_set(ty, &pruned)).union(&owned));
    let pruned = remove_from_root(ty, merged, &removed);
    // ...and what nobody owns but the applier did not own either.
    let removed = merged_set.difference(&with_named(&field_set(ty, &pruned))).intersection(&last);
    remove_from_root(ty, merged, &removed)
}
