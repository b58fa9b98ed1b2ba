//! Who is calling: TLS identities and (in later work) delegated authentication and authorization.
//!
//! Standalone mode trusts client certificates signed by the server's own CA: the certificate's CN is
//! the user name and its O entries are the groups, as in kube-apiserver.

use std::collections::BTreeMap;

pub mod attributes;
pub mod authn;
pub mod authz;
pub mod delegated;
pub mod impersonation;
pub mod pki;
pub mod rbac;
pub mod serving;
pub mod tls;
pub mod token_file;
pub mod trust;

/// An authenticated user, as Kubernetes `user.Info` describes one (and as a SubjectAccessReview spec
/// carries it: `user`, `uid`, `groups`, `extra`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UserInfo {
    pub name: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

/// Who may call, and what they may do: the authentication chain and the authorizer in force.
pub struct Access {
    pub authenticator: authn::Authenticator,
    pub authorizer: authz::Authorizer,
}
