//! Standalone authorization: a policy file of Kubernetes RBAC objects (`--authorization-policy-file`)
//! evaluated with RBAC's exact semantics.
//!
//! The file is multi-document YAML of `rbac.authorization.k8s.io/v1` Roles, ClusterRoles,
//! RoleBindings and ClusterRoleBindings, or `v1` `List`s of them (`document.rs` has the decoding and
//! validation rules). RoleBindings grant in their own namespace, with a Role of that namespace or a
//! ClusterRole; ClusterRoleBindings grant a ClusterRole everywhere, and only they can grant
//! non-resource URLs. A binding whose role does not exist grants nothing (as in kube, the not-found
//! message becomes the reason of the `NoOpinion`). `rules.rs` lists the matching semantics.
//!
//! [`Policy::authorize`] allows members of `system:masters` outright (kube-apiserver's privileged-group
//! authorizer, which runs before RBAC); otherwise it answers `Allow` or `NoOpinion`, never `Deny`, as
//! RBAC does: the caller turns `NoOpinion` into a 403 with [`Attributes::forbidden_message_with_reason`].
//! Aggregation rules are not supported. [`PolicyWatcher`] re-reads the file when it changes.
//! [`Policy::rules_for`] lists what a user may do in a namespace (a SelfSubjectRulesReview), and
//! [`BOOTSTRAP`] holds the part of kube's bootstrap policy every standalone server carries.

mod bootstrap;
mod document;
mod index;
mod rules;
mod watcher;

#[cfg(test)]
mod tests;

use std::fmt;
use std::path::{Path, PathBuf};

use crate::auth::attributes::{Attributes, Decision, SYSTEM_MASTERS};
use crate::auth::UserInfo;

pub use bootstrap::BOOTSTRAP;
pub use document::PolicyRule;
pub use watcher::{PolicyWatcher, ReloadOutcome, POLL_INTERVAL};

/// Where in the file an object is: its YAML document (1-based) and, inside a `List`, its item
/// (0-based, as `items[i]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Location {
    pub document: usize,
    pub item: Option<usize>,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.item {
            None => write!(f, "document {}", self.document),
            Some(item) => write!(f, "document {} items[{item}]", self.document),
        }
    }
}

/// Why a policy file was refused. Messages say what is wrong once: the underlying error is part
/// of the message, not a `source()` a caller would print again; the path is the caller's to name
/// (`reading --authorization-policy-file PATH: …`).
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("{error}")]
    Io { path: PathBuf, error: std::io::Error },
    #[error("{error}")]
    InFile { path: PathBuf, error: Box<PolicyError> },
    #[error("{at}: {error}")]
    Yaml { at: Location, error: serde_yaml_ng::Error },
    #[error("{at}: not a Kubernetes object (a mapping with apiVersion and kind)")]
    NotAnObject { at: Location },
    #[error(
        "{at}: unsupported kind {kind:?} (apiVersion {api_version:?}): expected Role, ClusterRole, RoleBinding or \
         ClusterRoleBinding of rbac.authorization.k8s.io/v1, or a v1 List of them"
    )]
    UnsupportedKind { at: Location, api_version: String, kind: String },
    #[error("{at}: {kind} {name:?}: {error}")]
    Malformed { at: Location, kind: String, name: String, error: serde_yaml_ng::Error },
    #[error("{at}: {kind} {name:?}: {message}")]
    Invalid { at: Location, kind: String, name: String, message: String },
    #[error("{at}: {kind} {name:?} is defined twice")]
    Duplicate { at: Location, kind: String, name: String },
    #[error("the authorization policy watcher must be started inside a tokio runtime")]
    NoRuntime,
}

/// How many objects of each kind a policy holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PolicyStats {
    pub roles: usize,
    pub cluster_roles: usize,
    pub role_bindings: usize,
    pub cluster_role_bindings: usize,
}

impl fmt::Display for PolicyStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} Roles, {} ClusterRoles, {} RoleBindings, {} ClusterRoleBindings",
            self.roles, self.cluster_roles, self.role_bindings, self.cluster_role_bindings
        )
    }
}

/// A parsed, validated and indexed RBAC policy. Immutable; [`PolicyWatcher`] swaps whole policies.
#[derive(Debug, Default)]
pub struct Policy {
    compiled: index::Compiled,
}

impl Policy {
    /// Reads and parses the policy file at `path`.
    pub fn load(path: &Path) -> Result<Self, PolicyError> {
        let text = std::fs::read_to_string(path).map_err(|error| PolicyError::Io { path: path.to_owned(), error })?;
        Self::parse(&text).map_err(|e| PolicyError::InFile { path: path.to_owned(), error: Box::new(e) })
    }

    /// Parses the text of a policy file. An empty text is an empty policy (only `system:masters` allowed).
    pub fn parse(text: &str) -> Result<Self, PolicyError> {
        Ok(Policy { compiled: index::compile(document::parse(text)?)? })
    }

    /// How many objects of each kind the policy holds.
    pub fn stats(&self) -> PolicyStats {
        self.compiled.stats
    }

    /// `Allow` for `system:masters` or when a rule bound to the user allows the request, else
    /// `NoOpinion`. Reasons are kube's: `RBAC: allowed by ClusterRoleBinding "x" of ClusterRole "y" to
    /// Group "z"`, and for `NoOpinion` the unresolvable role references of the user's bindings
    /// (`RBAC: role.rbac.authorization.k8s.io "r" not found`) or the empty string.
    pub fn authorize(&self, attributes: &Attributes) -> Decision {
        if attributes.user.groups.iter().any(|g| g == SYSTEM_MASTERS) {
            return Decision::Allow(format!("allowed: member of group {SYSTEM_MASTERS}"));
        }
        let mut errors = Vec::new();
        if let Some(reason) = visit(&self.compiled.cluster, attributes, &mut errors) {
            return Decision::Allow(reason);
        }
        let namespace = attributes.namespace();
        if !namespace.is_empty() {
            if let Some(scope) = self.compiled.namespaces.get(namespace) {
                if let Some(reason) = visit(scope, attributes, &mut errors) {
                    return Decision::Allow(reason);
                }
            }
        }
        match errors.is_empty() {
            true => Decision::NoOpinion(String::new()),
            false => Decision::NoOpinion(format!("RBAC: {}", rules::aggregate(&errors))),
        }
    }
}

/// What a user may do in one namespace: the rules of the bindings that name them, and the role
/// references of those bindings that could not be resolved.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RulesFor {
    pub rules: Vec<PolicyRule>,
    /// kube's not-found messages (`clusterrole.rbac.authorization.k8s.io "x" not found`), distinct.
    pub errors: Vec<String>,
}

impl RulesFor {
    /// Adds `other`'s rules and errors after these.
    pub fn extend(&mut self, other: RulesFor) {
        self.rules.extend(other.rules);
        for error in other.errors {
            if !self.errors.contains(&error) {
                self.errors.push(error);
            }
        }
    }

    /// The errors as kube aggregates them (one message, or `[a, b]`), if any.
    pub fn evaluation_error(&self) -> Option<String> {
        let errors: Vec<&str> = self.errors.iter().map(String::as_str).collect();
        (!errors.is_empty()).then(|| rules::aggregate(&errors))
    }
}

impl Policy {
    /// kube's `RuleResolver.RulesFor`: the rules of every ClusterRoleBinding and, in `namespace`,
    /// every RoleBinding that names `user`, in the order [`Self::authorize`] visits them. No rule is
    /// added for `system:masters` (in kube a `cluster-admin` binding grants them everything; see
    /// [`BOOTSTRAP`]).
    pub fn rules_for(&self, user: &UserInfo, namespace: &str) -> RulesFor {
        let mut out = RulesFor::default();
        collect(&self.compiled.cluster, user, &mut out);
        if let Some(scope) = self.compiled.namespaces.get(namespace).filter(|_| !namespace.is_empty()) {
            collect(scope, user, &mut out);
        }
        out
    }
}

/// The rules (and unresolvable role references) of the bindings of `scope` that apply to `user`.
fn collect(scope: &index::Scope, user: &UserInfo, out: &mut RulesFor) {
    for position in scope.index.candidates(user) {
        let Some(binding) = scope.bindings.get(position) else { continue };
        if !binding.subjects.iter().any(|s| rules::applies_to(user, s, &binding.namespace)) {
            continue;
        }
        match &binding.rules {
            Ok(rules) => out.rules.extend(rules.iter().cloned()),
            Err(not_found) if !out.errors.contains(not_found) => out.errors.push(not_found.clone()),
            Err(_) => {}
        }
    }
}

/// Visits the bindings of `scope` that apply to the user; the allow reason of the first rule that
/// allows the request. Unresolvable role references of applying bindings are collected in `errors`.
fn visit<'a>(scope: &'a index::Scope, attributes: &Attributes, errors: &mut Vec<&'a str>) -> Option<String> {
    for position in scope.index.candidates(&attributes.user) {
        let Some(binding) = scope.bindings.get(position) else { continue };
        let applying = binding.subjects.iter().find(|s| rules::applies_to(&attributes.user, s, &binding.namespace));
        let Some(subject) = applying else { continue };
        match &binding.rules {
            Err(not_found) => errors.push(not_found),
            Ok(rules) if rules.iter().any(|rule| rules::rule_allows(attributes, rule)) => {
                return Some(format!("RBAC: allowed by {}", binding.describe(subject)));
            }
            Ok(_) => {}
        }
    }
    None
}
