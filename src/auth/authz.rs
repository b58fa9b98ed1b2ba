//! Authorization: may this user do this? In a cluster a SubjectAccessReview answers; standalone, an
//! RBAC policy file answers, and without one only `system:masters` may do anything. Anything not
//! allowed is forbidden; an authorizer that cannot answer is an error, never an allow.

use super::attributes::{Attributes, Decision, SYSTEM_MASTERS};
use super::delegated::{DelegatedError, SarAuthorizer};
use super::rbac::PolicyWatcher;

/// The authorizer in force.
pub enum Authorizer {
    /// `--authorization-policy-file`, re-read when it changes.
    Policy(PolicyWatcher),
    /// No policy: only `system:masters` (the admin kubeconfig) is allowed.
    MastersOnly,
    /// In a cluster: SubjectAccessReviews (cached), `system:masters` first (boxed: it holds a kube
    /// client, ~300 bytes).
    Delegated(Box<SarAuthorizer>),
}

impl Authorizer {
    pub async fn authorize(&self, attributes: &Attributes) -> Result<Decision, DelegatedError> {
        let master = attributes.user.groups.iter().any(|g| g == SYSTEM_MASTERS);
        Ok(match self {
            Authorizer::Policy(policy) => policy.authorize(attributes),
            Authorizer::MastersOnly | Authorizer::Delegated(_) if master => Decision::Allow(String::new()),
            Authorizer::MastersOnly => Decision::NoOpinion(String::new()),
            Authorizer::Delegated(sar) => sar.authorize(attributes).await?,
        })
    }
}
