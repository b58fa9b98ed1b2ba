//! Who is calling: TLS identities and (in later work) delegated authentication and authorization.
//!
//! Standalone mode trusts client certificates signed by the server's own CA: the certificate's CN is
//! the user name and its O entries are the groups, as in kube-apiserver.

use std::collections::BTreeMap;

pub mod attributes;
pub mod delegated;
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

/// The identity proven by the TLS connection a request arrived on; `None` when the client sent no
/// (valid) certificate. Inserted as a request extension by the listener.
#[derive(Clone, Debug, Default)]
pub struct PeerIdentity(pub Option<UserInfo>);
