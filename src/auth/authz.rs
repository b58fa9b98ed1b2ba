//! Authorization: may this user do this? In a cluster a SubjectAccessReview answers; standalone, the
//! bootstrap policy every cluster has ([`BOOTSTRAP`]: self reviews and discovery for every
//! authenticated user, everything for `system:masters`) and then the RBAC policy file answer, and
//! without a file only the bootstrap policy does. Anything not allowed is forbidden; an authorizer
//! that cannot answer is an error, never an allow.

use super::attributes::{Attributes, Decision, SYSTEM_MASTERS};
use super::delegated::{DelegatedError, SarAuthorizer};
use super::rbac::{PolicyWatcher, RulesFor, BOOTSTRAP};
use super::UserInfo;

/// The authorizer in force.
pub enum Authorizer {
    /// `--authorization-policy-file`, re-read when it changes.
    Policy(PolicyWatcher),
    /// No policy: only `system:masters` (the admin kubeconfig) may use the API.
    MastersOnly,
    /// In a cluster: SubjectAccessReviews (cached), `system:masters` first (boxed: it holds a kube
    /// client, ~300 bytes).
    Delegated(Box<SarAuthorizer>),
}

impl Authorizer {
    pub async fn authorize(&self, attributes: &Attributes) -> Result<Decision, DelegatedError> {
        let master = attributes.user.groups.iter().any(|g| g == SYSTEM_MASTERS);
        Ok(match self {
            Authorizer::Delegated(_) if master => Decision::Allow(String::new()),
            Authorizer::Delegated(sar) => sar.authorize(attributes).await?,
            Authorizer::Policy(policy) => match BOOTSTRAP.authorize(attributes) {
                allowed @ Decision::Allow(_) => allowed,
                _ => policy.authorize(attributes),
            },
            Authorizer::MastersOnly => BOOTSTRAP.authorize(attributes),
        })
    }

    /// Whether this server decides for itself (standalone) rather than asking the cluster.
    pub fn is_standalone(&self) -> bool {
        !matches!(self, Authorizer::Delegated(_))
    }

    /// What `user` may do in `namespace` (a SelfSubjectRulesReview), as kube-apiserver's rule
    /// resolver lists it: the bootstrap policy's rules, then the file's. `None` when delegated (the
    /// cluster answers such reviews itself).
    pub fn rules_for(&self, user: &UserInfo, namespace: &str) -> Option<RulesFor> {
        let mut rules = BOOTSTRAP.rules_for(user, namespace);
        match self {
            Authorizer::Delegated(_) => return None,
            Authorizer::Policy(policy) => rules.extend(policy.policy().rules_for(user, namespace)),
            Authorizer::MastersOnly => {}
        }
        Some(rules)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::attributes::ResourceAttributes;

    fn alice() -> UserInfo {
        UserInfo { name: "alice".into(), ..UserInfo::default() }.with_authenticated_group()
    }

    #[tokio::test]
    async fn without_a_policy_users_may_discover_and_review_themselves_only() {
        let authorizer = Authorizer::MastersOnly;
        let authorizer = &authorizer;
        let allows = |a: Attributes| async move { authorizer.authorize(&a).await.is_ok_and(|d| d.is_allowed()) };
        assert!(allows(Attributes::non_resource(alice(), "get", "/apis")).await);
        let review = ResourceAttributes {
            verb: "create".into(),
            group: "authorization.k8s.io".into(),
            resource: "selfsubjectaccessreviews".into(),
            ..Default::default()
        };
        assert!(allows(Attributes::resource(alice(), review)).await);
        let bundles = ResourceAttributes { verb: "list".into(), resource: "bundles".into(), ..Default::default() };
        assert!(!allows(Attributes::resource(alice(), bundles.clone())).await);
        let admin = UserInfo { groups: vec![SYSTEM_MASTERS.into()], ..alice() };
        assert!(allows(Attributes::resource(admin.clone(), bundles)).await);
        let rules = authorizer.rules_for(&admin, "default").unwrap_or_default();
        assert!(rules.rules.iter().any(|r| r.verbs == ["*"]), "{rules:?}");
        assert!(authorizer.is_standalone());
    }
}
