//! The compiled policy: bindings with their role references resolved once at load, indexed by
//! subject so that a request only looks at the bindings naming its user or one of its groups.
//!
//! ServiceAccount subjects are indexed under the user name they stand for. Candidates are visited in
//! file order (ClusterRoleBindings, then the RoleBindings of the request's namespace), as kube's rule
//! resolver visits its listers, so allow reasons name the same binding kube would.

use std::collections::HashMap;
use std::sync::Arc;

use crate::auth::attributes::go_quote;
use crate::auth::UserInfo;

use super::document::{Object, PolicyRule, RoleRef, Subject};
use super::rules::{describe_subject, service_account_user};
use super::{Location, PolicyError, PolicyStats};

/// A RoleBinding (non-empty `namespace`) or ClusterRoleBinding.
#[derive(Debug)]
pub(super) struct Binding {
    pub name: String,
    pub namespace: String,
    pub role_ref: RoleRef,
    pub subjects: Vec<Subject>,
    /// The referenced role's rules, or kube's not-found message when it does not exist.
    pub rules: Result<Arc<[PolicyRule]>, String>,
}

impl Binding {
    /// kube's source description, e.g. `RoleBinding "read/team-a" of Role "reader" to User "alice"`.
    pub fn describe(&self, subject: &Subject) -> String {
        let (kind, name) = match self.namespace.as_str() {
            "" => ("ClusterRoleBinding", self.name.clone()),
            ns => ("RoleBinding", format!("{}/{ns}", self.name)),
        };
        let (role_kind, role, to) =
            (&self.role_ref.kind, go_quote(&self.role_ref.name), describe_subject(subject, &self.namespace));
        format!("{kind} {} of {role_kind} {role} to {to}", go_quote(&name))
    }
}

/// Binding positions by the user names and groups their subjects name.
#[derive(Debug, Default)]
pub(super) struct SubjectIndex {
    users: HashMap<String, Vec<usize>>,
    groups: HashMap<String, Vec<usize>>,
}

impl SubjectIndex {
    fn add(&mut self, position: usize, binding: &Binding) {
        for subject in &binding.subjects {
            let key = match subject.kind.as_str() {
                "User" => Some((&mut self.users, subject.name.clone())),
                "Group" => Some((&mut self.groups, subject.name.clone())),
                "ServiceAccount" => service_account_user(subject, &binding.namespace).map(|u| (&mut self.users, u)),
                _ => None,
            };
            if let Some((map, key)) = key {
                map.entry(key).or_default().push(position);
            }
        }
    }

    /// Positions of the bindings that may apply to `user`, ascending and distinct.
    pub fn candidates(&self, user: &UserInfo) -> Vec<usize> {
        let mut out: Vec<usize> = self.users.get(user.name.as_str()).cloned().unwrap_or_default();
        for group in &user.groups {
            if let Some(positions) = self.groups.get(group.as_str()) {
                out.extend_from_slice(positions);
            }
        }
        out.sort_unstable();
        out.dedup();
        out
    }
}

/// The bindings of one scope (all ClusterRoleBindings, or one namespace's RoleBindings) and their index.
#[derive(Debug, Default)]
pub(super) struct Scope {
    pub bindings: Vec<Binding>,
    pub index: SubjectIndex,
}

impl Scope {
    fn push(&mut self, binding: Binding) {
        let position = self.bindings.len();
        self.index.add(position, &binding);
        self.bindings.push(binding);
    }
}

/// The compiled form of a policy file.
#[derive(Debug, Default)]
pub(super) struct Compiled {
    pub cluster: Scope,
    pub namespaces: HashMap<String, Scope>,
    pub stats: PolicyStats,
}

type Roles = HashMap<(String, String), Arc<[PolicyRule]>>;

/// Resolves role references and builds the indexes; a duplicate object is an error.
pub(super) fn compile(objects: Vec<(Location, Object)>) -> Result<Compiled, PolicyError> {
    let mut roles: Roles = HashMap::new();
    let mut cluster_roles: HashMap<String, Arc<[PolicyRule]>> = HashMap::new();
    let mut bindings = Vec::new();
    let mut seen_bindings = std::collections::HashSet::new();
    let mut stats = PolicyStats::default();
    let duplicate = |at, kind: &str, name: String| PolicyError::Duplicate { at, kind: kind.to_owned(), name };
    for (at, object) in objects {
        match object {
            Object::Role { namespace, name, rules } => {
                let key = (namespace, name);
                if roles.contains_key(&key) {
                    return Err(duplicate(at, "Role", format!("{}/{}", key.0, key.1)));
                }
                roles.insert(key, rules.into());
                stats.roles += 1;
            }
            Object::ClusterRole { name, rules } => {
                if cluster_roles.contains_key(&name) {
                    return Err(duplicate(at, "ClusterRole", name));
                }
                cluster_roles.insert(name, rules.into());
                stats.cluster_roles += 1;
            }
            Object::RoleBinding { namespace, name, subjects, role_ref } => {
                if !seen_bindings.insert((namespace.clone(), name.clone())) {
                    return Err(duplicate(at, "RoleBinding", format!("{namespace}/{name}")));
                }
                bindings.push((namespace, name, subjects, role_ref));
                stats.role_bindings += 1;
            }
            Object::ClusterRoleBinding { name, subjects, role_ref } => {
                if !seen_bindings.insert((String::new(), name.clone())) {
                    return Err(duplicate(at, "ClusterRoleBinding", name));
                }
                bindings.push((String::new(), name, subjects, role_ref));
                stats.cluster_role_bindings += 1;
            }
        }
    }
    let mut compiled = Compiled { stats, ..Compiled::default() };
    for (namespace, name, subjects, role_ref) in bindings {
        let rules = resolve(&roles, &cluster_roles, &role_ref, &namespace);
        let binding = Binding { name, namespace, role_ref, subjects, rules };
        match binding.namespace.as_str() {
            "" => compiled.cluster.push(binding),
            ns => compiled.namespaces.entry(ns.to_owned()).or_default().push(binding),
        }
    }
    Ok(compiled)
}

/// kube's `GetRoleReferenceRules`: a Role in the binding's namespace or a ClusterRole.
fn resolve(
    roles: &Roles,
    cluster_roles: &HashMap<String, Arc<[PolicyRule]>>,
    role_ref: &RoleRef,
    namespace: &str,
) -> Result<Arc<[PolicyRule]>, String> {
    let found = match role_ref.kind.as_str() {
        "Role" => roles.get(&(namespace.to_owned(), role_ref.name.clone())),
        _ => cluster_roles.get(&role_ref.name),
    };
    let resource = if role_ref.kind == "Role" { "role" } else { "clusterrole" };
    found.cloned().ok_or_else(|| format!("{resource}.rbac.authorization.k8s.io {} not found", go_quote(&role_ref.name)))
}
