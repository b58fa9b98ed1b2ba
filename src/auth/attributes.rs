//! Authorization request attributes and decisions, shared by every authorizer (the standalone RBAC
//! policy and, in a cluster, SubjectAccessReview).
//!
//! [`Attributes`] maps 1:1 onto a `SubjectAccessReview` spec: the user fields of [`UserInfo`]
//! (`user`, `uid`, `groups`, `extra`) plus exactly one of `resourceAttributes` ([`ResourceAttributes`],
//! which serializes to that JSON shape) or `nonResourceAttributes` ([`NonResourceAttributes`]).
//! The forbidden messages reproduce kube-apiserver's `responsewriters.forbiddenMessage` and
//! `apierrors.NewForbidden` byte for byte.

use serde::{Deserialize, Serialize};

use super::UserInfo;

/// Members of this group are allowed everything, before any policy is consulted.
pub const SYSTEM_MASTERS: &str = "system:masters";
/// The group kube-apiserver adds to every authenticated user.
pub const ALL_AUTHENTICATED: &str = "system:authenticated";
/// The group of the anonymous user.
pub const ALL_UNAUTHENTICATED: &str = "system:unauthenticated";
/// The user name of unauthenticated requests.
pub const ANONYMOUS: &str = "system:anonymous";

impl UserInfo {
    /// The anonymous user: `system:anonymous` in group `system:unauthenticated`.
    pub fn anonymous() -> Self {
        UserInfo { name: ANONYMOUS.to_owned(), groups: vec![ALL_UNAUTHENTICATED.to_owned()], ..Self::default() }
    }

    /// Adds `system:authenticated` as kube-apiserver's `AuthenticatedGroupAdder` does after the whole
    /// authentication chain: not for `system:anonymous`, and not when the user already carries
    /// `system:authenticated` or `system:unauthenticated`. Individual authenticators (certificates,
    /// the token file, front-proxy headers) return users without it; the chain calls this once.
    pub fn with_authenticated_group(mut self) -> Self {
        let has_marker = self.groups.iter().any(|g| g == ALL_AUTHENTICATED || g == ALL_UNAUTHENTICATED);
        if self.name != ANONYMOUS && !has_marker {
            self.groups.push(ALL_AUTHENTICATED.to_owned());
        }
        self
    }
}

/// Who asks to do what: one authorization request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attributes {
    pub user: UserInfo,
    pub request: Request,
}

/// What is asked: a resource request or a non-resource (path) request, never both.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    Resource(ResourceAttributes),
    NonResource(NonResourceAttributes),
}

/// A request on an API resource; the JSON shape of a SubjectAccessReview's `resourceAttributes`.
/// Empty strings mean "not set" (`group` empty is the core group, `namespace` empty is cluster scope
/// or all namespaces, `name` empty is a collection or a create).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceAttributes {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub verb: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub group: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub version: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub resource: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub subresource: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
}

/// A request on a path outside the resource API (`/metrics`, `/healthz`, `/apis`); the JSON shape of a
/// SubjectAccessReview's `nonResourceAttributes`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NonResourceAttributes {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub path: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub verb: String,
}

impl Attributes {
    /// A resource request by `user`.
    pub fn resource(user: UserInfo, attributes: ResourceAttributes) -> Self {
        Attributes { user, request: Request::Resource(attributes) }
    }

    /// A non-resource request: `verb` (lower-case HTTP method, e.g. `get`) on `path`.
    pub fn non_resource(user: UserInfo, verb: impl Into<String>, path: impl Into<String>) -> Self {
        Attributes {
            user,
            request: Request::NonResource(NonResourceAttributes { path: path.into(), verb: verb.into() }),
        }
    }

    /// The verb of either kind of request.
    pub fn verb(&self) -> &str {
        match &self.request {
            Request::Resource(r) => &r.verb,
            Request::NonResource(n) => &n.verb,
        }
    }

    /// The namespace the request is in; empty for cluster-scoped and non-resource requests.
    pub fn namespace(&self) -> &str {
        match &self.request {
            Request::Resource(r) => &r.namespace,
            Request::NonResource(_) => "",
        }
    }

    /// kube-apiserver's forbidden message, e.g. `User "alice" cannot get resource "bundles/content" in
    /// API group "content.stowage.dev" in the namespace "team-a"` or `User "alice" cannot get path
    /// "/metrics"`. `&`, `<` and `>` are HTML-escaped as kube-apiserver does.
    pub fn forbidden_message(&self) -> String {
        let user = go_quote(&self.user.name);
        let message = match &self.request {
            Request::NonResource(n) => format!("User {user} cannot {} path {}", n.verb, go_quote(&n.path)),
            Request::Resource(r) => {
                let mut resource = r.resource.clone();
                if !r.subresource.is_empty() {
                    resource = format!("{resource}/{}", r.subresource);
                }
                let (resource, group) = (go_quote(&resource), go_quote(&r.group));
                let scope = if r.namespace.is_empty() {
                    "at the cluster scope".to_owned()
                } else {
                    format!("in the namespace {}", go_quote(&r.namespace))
                };
                format!("User {user} cannot {} resource {resource} in API group {group} {scope}", r.verb)
            }
        };
        message.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
    }

    /// [`Self::forbidden_message`] with kube-apiserver's `: reason` suffix when the authorizer gave a
    /// reason (e.g. `RBAC: clusterrole.rbac.authorization.k8s.io "viewer" not found`).
    pub fn forbidden_message_with_reason(&self, reason: &str) -> String {
        let message = self.forbidden_message();
        if reason.is_empty() {
            message
        } else {
            format!("{message}: {reason}")
        }
    }

    /// The whole `message` of the 403 `Status` kube-apiserver returns (`apierrors.NewForbidden`), e.g.
    /// `bundles.content.stowage.dev "b" is forbidden: User "alice" cannot get resource ...`, or
    /// `forbidden: User "alice" cannot get path "/metrics"`.
    pub fn forbidden_status_message(&self, reason: &str) -> String {
        let detail = self.forbidden_message_with_reason(reason);
        let (resource, name) = match &self.request {
            Request::Resource(r) if !r.group.is_empty() => (format!("{}.{}", r.resource, r.group), r.name.as_str()),
            Request::Resource(r) => (r.resource.clone(), r.name.as_str()),
            Request::NonResource(_) => (String::new(), ""),
        };
        match (resource.is_empty(), name.is_empty()) {
            (true, _) => format!("forbidden: {detail}"),
            (false, true) => format!("{resource} is forbidden: {detail}"),
            (false, false) => format!("{resource} {} is forbidden: {detail}", go_quote(name)),
        }
    }
}

/// An authorizer's answer. `NoOpinion` means no rule matched: the caller asks the next authorizer or,
/// as the last one, refuses with 403. The reason is for logs and for the forbidden message's suffix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    Allow(String),
    Deny(String),
    NoOpinion(String),
}

impl Decision {
    pub fn is_allowed(&self) -> bool {
        matches!(self, Decision::Allow(_))
    }

    pub fn reason(&self) -> &str {
        match self {
            Decision::Allow(r) | Decision::Deny(r) | Decision::NoOpinion(r) => r,
        }
    }
}

/// Quotes like Go's `%q` (`strconv.Quote`) for the strings kube-apiserver's messages contain.
pub(crate) fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{b}' => out.push_str("\\v"),
            c if (c as u32) < 0x80 && c.is_control() => out.push_str(&format!("\\x{:02x}", c as u32)),
            c if c.is_control() && (c as u32) <= 0xffff => out.push_str(&format!("\\u{:04x}", c as u32)),
            c if c.is_control() => out.push_str(&format!("\\U{:08x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alice() -> UserInfo {
        UserInfo { name: "alice".into(), groups: vec!["dev".into()], ..UserInfo::default() }
    }

    fn bundles(verb: &str, namespace: &str, subresource: &str, name: &str) -> Attributes {
        let r = ResourceAttributes {
            verb: verb.into(),
            group: "content.stowage.dev".into(),
            version: "v1alpha1".into(),
            resource: "bundles".into(),
            subresource: subresource.into(),
            namespace: namespace.into(),
            name: name.into(),
        };
        Attributes::resource(alice(), r)
    }

    #[test]
    fn forbidden_messages_match_kube_apiserver() {
        let a = bundles("get", "team-a", "content", "b1");
        assert_eq!(
            a.forbidden_message(),
            r#"User "alice" cannot get resource "bundles/content" in API group "content.stowage.dev" in the namespace "team-a""#
        );
        assert_eq!(
            a.forbidden_status_message(""),
            r#"bundles.content.stowage.dev "b1" is forbidden: User "alice" cannot get resource "bundles/content" in API group "content.stowage.dev" in the namespace "team-a""#
        );
        let list = bundles("list", "", "", "");
        assert_eq!(
            list.forbidden_message(),
            r#"User "alice" cannot list resource "bundles" in API group "content.stowage.dev" at the cluster scope"#
        );
        assert_eq!(
            list.forbidden_message_with_reason(r#"RBAC: role.rbac.authorization.k8s.io "x" not found"#),
            r#"User "alice" cannot list resource "bundles" in API group "content.stowage.dev" at the cluster scope: RBAC: role.rbac.authorization.k8s.io "x" not found"#
        );
        assert!(list.forbidden_status_message("").starts_with("bundles.content.stowage.dev is forbidden: User"));
        let core = Attributes::resource(
            UserInfo::anonymous(),
            ResourceAttributes {
                verb: "get".into(),
                resource: "secrets".into(),
                namespace: "ns".into(),
                name: "s".into(),
                ..ResourceAttributes::default()
            },
        );
        assert_eq!(
            core.forbidden_status_message(""),
            r#"secrets "s" is forbidden: User "system:anonymous" cannot get resource "secrets" in API group "" in the namespace "ns""#
        );
        let path = Attributes::non_resource(alice(), "get", "/metrics");
        assert_eq!(path.forbidden_message(), r#"User "alice" cannot get path "/metrics""#);
        assert_eq!(path.forbidden_status_message(""), r#"forbidden: User "alice" cannot get path "/metrics""#);
        let odd = Attributes::non_resource(UserInfo::default(), "get", "/<a>&\"q\"\n");
        assert_eq!(odd.forbidden_message(), r#"User "" cannot get path "/&lt;a&gt;&amp;\"q\"\n""#);
    }

    #[test]
    fn authenticated_group_is_added_once_and_not_to_anonymous() {
        let u = alice().with_authenticated_group().with_authenticated_group();
        assert_eq!(u.groups, vec!["dev".to_owned(), ALL_AUTHENTICATED.to_owned()]);
        assert_eq!(UserInfo::anonymous().with_authenticated_group().groups, vec![ALL_UNAUTHENTICATED.to_owned()]);
    }

    #[test]
    fn resource_attributes_serialize_as_subject_access_review() {
        let r = ResourceAttributes { verb: "get".into(), resource: "bundles".into(), ..Default::default() };
        assert_eq!(serde_json::to_string(&r).ok().as_deref(), Some(r#"{"verb":"get","resource":"bundles"}"#));
        let n = NonResourceAttributes { path: "/metrics".into(), verb: "get".into() };
        assert_eq!(serde_json::to_string(&n).ok().as_deref(), Some(r#"{"path":"/metrics","verb":"get"}"#));
    }
}
