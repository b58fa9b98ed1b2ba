//! Reading a policy file: multi-document YAML of `rbac.authorization.k8s.io/v1` Roles, ClusterRoles,
//! RoleBindings and ClusterRoleBindings, or `v1` `List`s of them.
//!
//! Objects are decoded strictly (an unknown field is an error, as with `kubectl apply`'s default
//! strict field validation, so a typo such as `apiGroup:` in a rule cannot silently grant nothing),
//! defaulted and validated as kube-apiserver would before storing them. `metadata` may carry anything
//! (labels, annotations); only `name` and `namespace` are read. A ClusterRole's `aggregationRule` is
//! accepted and ignored (aggregation is not supported).

use serde::de::IgnoredAny;
use serde::{Deserialize, Deserializer};
use serde_yaml_ng::Value;

use super::{Location, PolicyError};

/// The API group of the RBAC kinds and of `roleRef`s.
pub(super) const RBAC_GROUP: &str = "rbac.authorization.k8s.io";
const RBAC_V1: &str = "rbac.authorization.k8s.io/v1";

/// A `PolicyRule`, as written.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PolicyRule {
    #[serde(default, deserialize_with = "null_default")]
    pub verbs: Vec<String>,
    #[serde(default, deserialize_with = "null_default")]
    pub api_groups: Vec<String>,
    #[serde(default, deserialize_with = "null_default")]
    pub resources: Vec<String>,
    #[serde(default, deserialize_with = "null_default")]
    pub resource_names: Vec<String>,
    #[serde(default, rename = "nonResourceURLs", deserialize_with = "null_default")]
    pub non_resource_urls: Vec<String>,
}

/// A binding's `Subject` (`apiGroup` defaulted away after validation).
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct Subject {
    pub kind: String,
    #[serde(default, deserialize_with = "null_default")]
    pub api_group: String,
    #[serde(default, deserialize_with = "null_default")]
    pub name: String,
    #[serde(default, deserialize_with = "null_default")]
    pub namespace: String,
}

/// A binding's `roleRef`.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct RoleRef {
    #[serde(default, deserialize_with = "null_default")]
    pub api_group: String,
    pub kind: String,
    #[serde(default, deserialize_with = "null_default")]
    pub name: String,
}

#[derive(Deserialize)]
struct Meta {
    #[serde(default, deserialize_with = "null_default")]
    name: String,
    #[serde(default, deserialize_with = "null_default")]
    namespace: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RoleDoc {
    #[serde(rename = "apiVersion")]
    _api_version: IgnoredAny,
    #[serde(rename = "kind")]
    _kind: IgnoredAny,
    metadata: Meta,
    #[serde(default, deserialize_with = "null_default")]
    rules: Vec<PolicyRule>,
    aggregation_rule: Option<Value>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct BindingDoc {
    #[serde(rename = "apiVersion")]
    _api_version: IgnoredAny,
    #[serde(rename = "kind")]
    _kind: IgnoredAny,
    metadata: Meta,
    #[serde(default, deserialize_with = "null_default")]
    subjects: Vec<Subject>,
    role_ref: RoleRef,
}

#[derive(Deserialize)]
struct ListDoc {
    #[serde(default, deserialize_with = "null_default")]
    items: Vec<Value>,
}

/// One validated object. Namespaces are empty for the cluster-scoped kinds.
#[derive(Debug)]
pub(super) enum Object {
    Role { namespace: String, name: String, rules: Vec<PolicyRule> },
    ClusterRole { name: String, rules: Vec<PolicyRule> },
    RoleBinding { namespace: String, name: String, subjects: Vec<Subject>, role_ref: RoleRef },
    ClusterRoleBinding { name: String, subjects: Vec<Subject>, role_ref: RoleRef },
}

fn null_default<'de, D: Deserializer<'de>, T: Default + Deserialize<'de>>(d: D) -> Result<T, D::Error> {
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// Every object of `text`, in file order; empty documents are skipped.
pub(super) fn parse(text: &str) -> Result<Vec<(Location, Object)>, PolicyError> {
    let mut out = Vec::new();
    for (i, document) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
        let at = Location { document: i + 1, item: None };
        // Stop at the first error: the document iterator repeats a failure forever.
        let value = Value::deserialize(document).map_err(|error| PolicyError::Yaml { at, error })?;
        if !matches!(value, Value::Null) {
            object(value, at, &mut out)?;
        }
    }
    Ok(out)
}

fn object(value: Value, at: Location, out: &mut Vec<(Location, Object)>) -> Result<(), PolicyError> {
    let field = |key: &str| value.get(key).and_then(Value::as_str).unwrap_or("").to_owned();
    let (api_version, kind) = (field("apiVersion"), field("kind"));
    if !value.is_mapping() || kind.is_empty() {
        return Err(PolicyError::NotAnObject { at });
    }
    let meta = |key: &str| value.get("metadata").and_then(|m| m.get(key)).and_then(Value::as_str).unwrap_or("");
    let name = match meta("namespace") {
        "" => meta("name").to_owned(),
        ns => format!("{ns}/{}", meta("name")),
    };
    let malformed = |error| PolicyError::Malformed { at, kind: kind.clone(), name: name.clone(), error };
    let object = match (api_version.as_str(), kind.as_str()) {
        ("v1", "List") if at.item.is_none() => {
            let list: ListDoc = serde_yaml_ng::from_value(value).map_err(malformed)?;
            for (i, item) in list.items.into_iter().enumerate() {
                object(item, Location { item: Some(i), ..at }, out)?;
            }
            return Ok(());
        }
        (RBAC_V1, "Role" | "ClusterRole") => {
            let doc: RoleDoc = serde_yaml_ng::from_value(value).map_err(malformed)?;
            let namespaced = kind == "Role";
            let name = object_name(&doc.metadata, namespaced).map_err(|m| invalid(at, &kind, &doc.metadata, m))?;
            if doc.aggregation_rule.is_some() {
                if namespaced {
                    return Err(invalid(at, &kind, &doc.metadata, "a Role has no aggregationRule".to_owned()));
                }
                tracing::warn!(%at, name = %name, "RBAC policy: aggregationRule is not supported and is ignored");
            }
            for (i, rule) in doc.rules.iter().enumerate() {
                validate_rule(rule, namespaced)
                    .map_err(|m| invalid(at, &kind, &doc.metadata, format!("rules[{i}]: {m}")))?;
            }
            match namespaced {
                true => Object::Role { namespace: doc.metadata.namespace, name, rules: doc.rules },
                false => Object::ClusterRole { name, rules: doc.rules },
            }
        }
        (RBAC_V1, "RoleBinding" | "ClusterRoleBinding") => {
            let mut doc: BindingDoc = serde_yaml_ng::from_value(value).map_err(malformed)?;
            let namespaced = kind == "RoleBinding";
            let name = object_name(&doc.metadata, namespaced).map_err(|m| invalid(at, &kind, &doc.metadata, m))?;
            validate_binding(&mut doc, namespaced).map_err(|m| invalid(at, &kind, &doc.metadata, m))?;
            let (subjects, role_ref) = (doc.subjects, doc.role_ref);
            match namespaced {
                true => Object::RoleBinding { namespace: doc.metadata.namespace, name, subjects, role_ref },
                false => Object::ClusterRoleBinding { name, subjects, role_ref },
            }
        }
        _ => return Err(PolicyError::UnsupportedKind { at, api_version, kind }),
    };
    out.push((at, object));
    Ok(())
}

fn invalid(at: Location, kind: &str, meta: &Meta, message: String) -> PolicyError {
    let name = match meta.namespace.as_str() {
        "" => meta.name.clone(),
        ns => format!("{ns}/{}", meta.name),
    };
    PolicyError::Invalid { at, kind: kind.to_owned(), name, message }
}

/// The object's name; namespaced kinds need a namespace (the file has no default namespace), the
/// namespace of a cluster-scoped object is ignored as kube-apiserver ignores it.
fn object_name(meta: &Meta, namespaced: bool) -> Result<String, String> {
    if meta.name.is_empty() {
        return Err("metadata.name is required".to_owned());
    }
    if namespaced && meta.namespace.is_empty() {
        return Err("metadata.namespace is required".to_owned());
    }
    Ok(meta.name.clone())
}

/// kube-apiserver's `ValidatePolicyRule`.
fn validate_rule(rule: &PolicyRule, namespaced: bool) -> Result<(), String> {
    if rule.verbs.is_empty() {
        return Err("verbs must contain at least one value".to_owned());
    }
    if !rule.non_resource_urls.is_empty() {
        if namespaced {
            return Err("namespaced rules cannot apply to non-resource URLs".to_owned());
        }
        if !rule.api_groups.is_empty() || !rule.resources.is_empty() || !rule.resource_names.is_empty() {
            return Err("rules cannot apply to both regular resources and non-resource URLs".to_owned());
        }
        return Ok(());
    }
    if rule.api_groups.is_empty() {
        return Err("resource rules must supply at least one api group (\"\" is the core group)".to_owned());
    }
    if rule.resources.is_empty() {
        return Err("resource rules must supply at least one resource".to_owned());
    }
    Ok(())
}

/// kube-apiserver's defaulting and validation of `roleRef` and `subjects`.
fn validate_binding(doc: &mut BindingDoc, namespaced: bool) -> Result<(), String> {
    let role_ref = &mut doc.role_ref;
    if role_ref.api_group.is_empty() {
        role_ref.api_group = RBAC_GROUP.to_owned();
    }
    if role_ref.api_group != RBAC_GROUP {
        return Err(format!("roleRef.apiGroup must be {RBAC_GROUP:?}, not {:?}", role_ref.api_group));
    }
    match role_ref.kind.as_str() {
        "ClusterRole" => {}
        "Role" if namespaced => {}
        other if namespaced => return Err(format!("roleRef.kind must be \"Role\" or \"ClusterRole\", not {other:?}")),
        other => return Err(format!("roleRef.kind must be \"ClusterRole\", not {other:?}")),
    }
    if role_ref.name.is_empty() {
        return Err("roleRef.name is required".to_owned());
    }
    for (i, subject) in doc.subjects.iter().enumerate() {
        let wrong = |m: &str| Err(format!("subjects[{i}]: {m}"));
        if subject.name.is_empty() {
            return wrong("name is required");
        }
        match subject.kind.as_str() {
            "ServiceAccount" if !subject.api_group.is_empty() => {
                return wrong("apiGroup must be \"\" for ServiceAccount")
            }
            "ServiceAccount" if !namespaced && subject.namespace.is_empty() => return wrong("namespace is required"),
            "ServiceAccount" => {}
            "User" | "Group" if subject.api_group.is_empty() || subject.api_group == RBAC_GROUP => {}
            "User" | "Group" => return wrong("apiGroup must be \"rbac.authorization.k8s.io\""),
            _ => return wrong("kind must be \"User\", \"Group\" or \"ServiceAccount\""),
        }
    }
    Ok(())
}
