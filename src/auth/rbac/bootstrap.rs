//! The part of kube-apiserver's bootstrap RBAC policy (`plugin/pkg/auth/authorizer/rbac/bootstrappolicy`)
//! that a standalone server carries whatever its policy file says, so that kubectl works for every
//! authenticated user as it does against a cluster:
//!
//! - `cluster-admin` bound to `system:masters` (everything; it is what a SelfSubjectRulesReview
//!   lists for the admin kubeconfig);
//! - `system:basic-user` bound to `system:authenticated`: the self reviews (`kubectl auth whoami`,
//!   `kubectl auth can-i`, `--list`);
//! - `system:discovery` bound to `system:authenticated`: `/api`, `/apis`, `/openapi` and health,
//!   which kubectl reads before anything else;
//! - `system:public-info-viewer` bound to `system:authenticated` and `system:unauthenticated`:
//!   health and `/version`.
//!
//! The rules are kube 1.33's, verbatim. The policy file cannot refer to these roles (its bindings
//! name roles of the file): it is compiled on its own, so a file written before they existed keeps
//! its meaning.

use std::sync::LazyLock;

use super::Policy;

const TEXT: &str = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: cluster-admin}
rules:
- {apiGroups: ["*"], resources: ["*"], verbs: ["*"]}
- {nonResourceURLs: ["*"], verbs: ["*"]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: cluster-admin}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: cluster-admin}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: Group, name: "system:masters"}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "system:basic-user"}
rules:
- {apiGroups: [authentication.k8s.io], resources: [selfsubjectreviews], verbs: [create]}
- {apiGroups: [authorization.k8s.io], resources: [selfsubjectaccessreviews, selfsubjectrulesreviews], verbs: [create]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "system:basic-user"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:basic-user"}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: Group, name: "system:authenticated"}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "system:discovery"}
rules:
- nonResourceURLs: [/livez, /readyz, /healthz, /version, /version/, /api, /api/*, /apis, /apis/*, /openapi, /openapi/*]
  verbs: [get]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "system:discovery"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:discovery"}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: Group, name: "system:authenticated"}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "system:public-info-viewer"}
rules:
- {nonResourceURLs: [/livez, /readyz, /healthz, /version, /version/], verbs: [get]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "system:public-info-viewer"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:public-info-viewer"}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: Group, name: "system:authenticated"}
- {apiGroup: rbac.authorization.k8s.io, kind: Group, name: "system:unauthenticated"}
"#;

/// The bootstrap policy, compiled once. The text is a constant a unit test parses; were it ever
/// not to parse, the policy would be empty (only `system:masters` allowed), never a panic.
pub static BOOTSTRAP: LazyLock<Policy> = LazyLock::new(|| Policy::parse(TEXT).unwrap_or_default());

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::attributes::{Attributes, ResourceAttributes};
    use crate::auth::UserInfo;

    fn user(name: &str) -> UserInfo {
        UserInfo { name: name.into(), ..UserInfo::default() }.with_authenticated_group()
    }

    fn review(user: UserInfo, group: &str, resource: &str) -> Attributes {
        let r = ResourceAttributes {
            verb: "create".into(),
            group: group.into(),
            version: "v1".into(),
            resource: resource.into(),
            ..ResourceAttributes::default()
        };
        Attributes::resource(user, r)
    }

    #[test]
    fn parses_and_grants_what_kube_grants() {
        let policy = Policy::parse(TEXT).unwrap();
        assert_eq!(policy.stats().cluster_role_bindings, 4);
        for (group, resource) in [
            ("authentication.k8s.io", "selfsubjectreviews"),
            ("authorization.k8s.io", "selfsubjectaccessreviews"),
            ("authorization.k8s.io", "selfsubjectrulesreviews"),
        ] {
            assert!(BOOTSTRAP.authorize(&review(user("alice"), group, resource)).is_allowed(), "{resource}");
            assert!(!BOOTSTRAP.authorize(&review(UserInfo::anonymous(), group, resource)).is_allowed());
        }
        assert!(!BOOTSTRAP
            .authorize(&review(user("alice"), "authorization.k8s.io", "subjectaccessreviews"))
            .is_allowed());
        for path in ["/apis", "/api/v1", "/openapi/v3", "/version"] {
            assert!(BOOTSTRAP.authorize(&Attributes::non_resource(user("alice"), "get", path)).is_allowed(), "{path}");
        }
        assert!(!BOOTSTRAP.authorize(&Attributes::non_resource(user("alice"), "get", "/metrics")).is_allowed());
        assert!(!BOOTSTRAP.authorize(&Attributes::non_resource(UserInfo::anonymous(), "get", "/apis")).is_allowed());
        assert!(BOOTSTRAP.authorize(&Attributes::non_resource(UserInfo::anonymous(), "get", "/version")).is_allowed());
        let bundles = ResourceAttributes { verb: "get".into(), resource: "bundles".into(), ..Default::default() };
        assert!(!BOOTSTRAP.authorize(&Attributes::resource(user("alice"), bundles)).is_allowed());
    }

    #[test]
    fn masters_are_listed_everything() {
        let admin = UserInfo { groups: vec!["system:masters".into()], ..user("admin") }.with_authenticated_group();
        let rules = BOOTSTRAP.rules_for(&admin, "default").rules;
        assert!(rules.iter().any(|r| r.resources == ["*"] && r.api_groups == ["*"] && r.verbs == ["*"]), "{rules:?}");
        assert!(rules.iter().any(|r| r.non_resource_urls == ["*"]), "{rules:?}");
        let alice = BOOTSTRAP.rules_for(&user("alice"), "default").rules;
        assert_eq!(alice.len(), 4, "basic-user (2 rules), discovery, public-info-viewer: {alice:?}");
        assert!(alice.iter().all(|r| !r.verbs.contains(&"*".to_owned())));
    }
}
