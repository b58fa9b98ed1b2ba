//! Field sets: which paths of an object a manager owns, as a tree (structured-merge-diff's
//! `fieldpath.Set`), their set algebra, and their FieldsV1 JSON encoding as it appears in
//! `metadata.managedFields[].fieldsV1`.
//!
//! A path is in a set when its last element is a *member* of the node its prefix leads to; nodes
//! also have *children* (sub-sets). A path can be both a member and have children: FieldsV1 then
//! writes `".": {}` inside the child's object.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value};

use super::path::{Path, PathElement};

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldSet {
    members: BTreeSet<PathElement>,
    children: BTreeMap<PathElement, FieldSet>,
}

impl FieldSet {
    pub fn is_empty(&self) -> bool {
        self.members.is_empty() && self.children.values().all(FieldSet::is_empty)
    }

    /// Adds `path` (the empty path, the root, is never a member).
    pub fn insert(&mut self, path: &Path) {
        match path {
            [] => {}
            [last] => {
                self.members.insert(last.clone());
            }
            [first, rest @ ..] => self.children.entry(first.clone()).or_default().insert(rest),
        }
    }

    pub fn is_member(&self, element: &PathElement) -> bool {
        self.members.contains(element)
    }

    /// The sub-set of paths under `element` (relative to it).
    pub fn child(&self, element: &PathElement) -> Option<&FieldSet> {
        self.children.get(element).filter(|child| !child.is_empty())
    }

    pub fn children(&self) -> impl Iterator<Item = (&PathElement, &FieldSet)> {
        self.children.iter()
    }

    pub fn union(&self, other: &FieldSet) -> FieldSet {
        let mut out = self.clone();
        out.members.extend(other.members.iter().cloned());
        for (element, child) in &other.children {
            let merged = match out.children.get(element) {
                Some(mine) => mine.union(child),
                None => child.clone(),
            };
            out.children.insert(element.clone(), merged);
        }
        out.normalized()
    }

    /// Paths of `self` that are not paths of `other` (exact paths: a member of `other` does not
    /// remove what lies below it).
    pub fn difference(&self, other: &FieldSet) -> FieldSet {
        let members = self.members.difference(&other.members).cloned().collect();
        let children = self
            .children
            .iter()
            .map(|(element, child)| match other.children.get(element) {
                Some(theirs) => (element.clone(), child.difference(theirs)),
                None => (element.clone(), child.clone()),
            })
            .collect();
        FieldSet { members, children }.normalized()
    }

    pub fn intersection(&self, other: &FieldSet) -> FieldSet {
        let members = self.members.intersection(&other.members).cloned().collect();
        let children = self
            .children
            .iter()
            .filter_map(|(element, child)| {
                other.children.get(element).map(|theirs| (element.clone(), child.intersection(theirs)))
            })
            .collect();
        FieldSet { members, children }.normalized()
    }

    /// Every path, members of a node before its children's paths, each group in element order.
    pub fn paths(&self) -> Vec<Vec<PathElement>> {
        let mut out = Vec::new();
        self.collect_paths(&mut Vec::new(), &mut out);
        out
    }

    fn collect_paths(&self, prefix: &mut Vec<PathElement>, out: &mut Vec<Vec<PathElement>>) {
        for member in &self.members {
            let mut path = prefix.clone();
            path.push(member.clone());
            out.push(path);
        }
        for (element, child) in &self.children {
            prefix.push(element.clone());
            child.collect_paths(prefix, out);
            prefix.pop();
        }
    }

    /// Makes `element` a member of this node (used when walking with a schema).
    pub fn add_member(&mut self, element: PathElement) {
        self.members.insert(element);
    }

    /// Replaces the sub-set under `element`.
    pub fn set_child(&mut self, element: PathElement, child: FieldSet) {
        if child.is_empty() {
            self.children.remove(&element);
        } else {
            self.children.insert(element, child);
        }
    }

    fn normalized(mut self) -> FieldSet {
        self.children.retain(|_, child| !child.is_empty());
        self
    }

    /// The FieldsV1 JSON object: `{"f:spec":{".":{},"f:paused":{}}}`.
    pub fn to_fields_v1(&self) -> Value {
        Value::Object(self.fields_v1_contents(false))
    }

    fn fields_v1_contents(&self, include_self: bool) -> Map<String, Value> {
        let mut out = Map::new();
        if include_self && !self.is_empty() {
            out.insert(".".into(), Value::Object(Map::new()));
        }
        let elements: BTreeSet<&PathElement> = self.members.iter().chain(self.children.keys()).collect();
        for element in elements {
            let contents = match self.children.get(element) {
                Some(child) => child.fields_v1_contents(self.members.contains(element)),
                None => Map::new(),
            };
            out.insert(element.to_fields_v1_key(), Value::Object(contents));
        }
        out
    }

    /// Parses a FieldsV1 JSON object.
    pub fn from_fields_v1(value: &Value) -> Result<FieldSet, String> {
        let Value::Object(map) = value else {
            return Err("FieldsV1 must be a JSON object".into());
        };
        let mut set = FieldSet::default();
        for (key, child) in map {
            if key == "." {
                continue; // marks the parent as a member: read by the parent
            }
            let element = PathElement::from_fields_v1_key(key)?;
            let Value::Object(child_map) = child else {
                return Err(format!("FieldsV1 value of {key:?} must be a JSON object"));
            };
            if child_map.is_empty() || child_map.contains_key(".") {
                set.members.insert(element.clone());
            }
            let child_set = FieldSet::from_fields_v1(child)?;
            set.set_child(element, child_set);
        }
        Ok(set)
    }
}
