//! RBAC's matching rules, with the exact semantics of kube-apiserver's authorizer
//! (`plugin/pkg/auth/authorizer/rbac` and the `rbac/v1` evaluation helpers):
//!
//! - verbs and API groups match exactly or by `*`;
//! - a request's resource is `resource` or `resource/subresource`; a rule's resource matches it when
//!   it is `*`, equal to it, or `*/subresource` for a request with that subresource. `resource/*` is
//!   *not* a wildcard in Kubernetes (it matches only a subresource literally named `*`);
//! - `resourceNames` restrict a rule to requests whose name is listed, so a request without a name
//!   (create, list, watch, deletecollection) never matches a rule that has them;
//! - non-resource URLs match exactly, by `*`, or by a prefix ending in `*`;
//! - subjects: `User` by name, `Group` by membership, `ServiceAccount` as the user
//!   `system:serviceaccount:NAMESPACE:NAME`, its namespace defaulting to the binding's.

use crate::auth::attributes::{go_quote, Attributes, Request};
use crate::auth::UserInfo;

use super::document::{PolicyRule, Subject};

/// Whether `rule` allows the request (kube's `RuleAllows`).
pub(super) fn rule_allows(attributes: &Attributes, rule: &PolicyRule) -> bool {
    match &attributes.request {
        Request::Resource(r) => {
            verb_matches(rule, &r.verb)
                && api_group_matches(rule, &r.group)
                && resource_matches(rule, &r.resource, &r.subresource)
                && resource_name_matches(rule, &r.name)
        }
        Request::NonResource(n) => verb_matches(rule, &n.verb) && non_resource_url_matches(rule, &n.path),
    }
}

fn verb_matches(rule: &PolicyRule, verb: &str) -> bool {
    rule.verbs.iter().any(|v| v == "*" || v == verb)
}

fn api_group_matches(rule: &PolicyRule, group: &str) -> bool {
    rule.api_groups.iter().any(|g| g == "*" || g == group)
}

/// `rule_resource == "resource/subresource"` (or `== "resource"`), `*`, or `*/subresource`.
fn resource_matches(rule: &PolicyRule, resource: &str, subresource: &str) -> bool {
    rule.resources.iter().any(|r| {
        if r == "*" {
            return true;
        }
        if subresource.is_empty() {
            return r == resource;
        }
        let combined = r.strip_prefix(resource).and_then(|rest| rest.strip_prefix('/')) == Some(subresource);
        combined || r.strip_prefix("*/") == Some(subresource)
    })
}

fn resource_name_matches(rule: &PolicyRule, name: &str) -> bool {
    rule.resource_names.is_empty() || rule.resource_names.iter().any(|n| n == name)
}

fn non_resource_url_matches(rule: &PolicyRule, path: &str) -> bool {
    rule.non_resource_urls
        .iter()
        .any(|url| url == "*" || url == path || (url.ends_with('*') && path.starts_with(url.trim_end_matches('*'))))
}

/// The user name a ServiceAccount subject stands for, `None` when no namespace is known (a
/// ClusterRoleBinding's ServiceAccount without one never applies).
pub(super) fn service_account_user(subject: &Subject, binding_namespace: &str) -> Option<String> {
    let namespace = if subject.namespace.is_empty() { binding_namespace } else { &subject.namespace };
    (!namespace.is_empty()).then(|| format!("system:serviceaccount:{namespace}:{}", subject.name))
}

/// Whether `subject` of a binding in `binding_namespace` ("" for cluster bindings) is `user`.
pub(super) fn applies_to(user: &UserInfo, subject: &Subject, binding_namespace: &str) -> bool {
    match subject.kind.as_str() {
        "User" => user.name == subject.name,
        "Group" => user.groups.contains(&subject.name),
        "ServiceAccount" => service_account_user(subject, binding_namespace).is_some_and(|u| u == user.name),
        _ => false,
    }
}

/// A subject as kube's allow reasons describe it (`ServiceAccount "name/namespace"`).
pub(super) fn describe_subject(subject: &Subject, binding_namespace: &str) -> String {
    if subject.kind == "ServiceAccount" {
        let namespace = if subject.namespace.is_empty() { binding_namespace } else { &subject.namespace };
        format!("{} {}", subject.kind, go_quote(&format!("{}/{namespace}", subject.name)))
    } else {
        format!("{} {}", subject.kind, go_quote(&subject.name))
    }
}

/// kube's `utilerrors.NewAggregate(errs).Error()`: distinct messages, bracketed when more than one.
pub(super) fn aggregate(errors: &[&str]) -> String {
    let mut seen: Vec<&str> = Vec::new();
    for e in errors {
        if !seen.contains(e) {
            seen.push(e);
        }
    }
    match seen.as_slice() {
        [] => String::new(),
        [one] => (*one).to_owned(),
        many => format!("[{}]", many.join(", ")),
    }
}
