//! Authorization: may this user do this? Standalone, an RBAC policy file answers; without one,
//! only `system:masters` may do anything. (In a cluster a SubjectAccessReview answers.) Anything
//! not allowed is forbidden: RBAC has no explicit deny.

use super::attributes::{Attributes, Decision, SYSTEM_MASTERS};
use super::rbac::PolicyWatcher;

/// The authorizer in force.
pub enum Authorizer {
    /// `--authorization-policy-file`, re-read when it changes.
    Policy(PolicyWatcher),
    /// No policy: only `system:masters` (the admin kubeconfig) is allowed.
    MastersOnly,
}

impl Authorizer {
    pub async fn authorize(&self, attributes: &Attributes) -> Decision {
        match self {
            Authorizer::Policy(policy) => policy.authorize(attributes),
            Authorizer::MastersOnly if attributes.user.groups.iter().any(|g| g == SYSTEM_MASTERS) => {
                Decision::Allow(String::new())
            }
            Authorizer::MastersOnly => Decision::NoOpinion(String::new()),
        }
    }
}
