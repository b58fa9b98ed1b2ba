//! Who is calling and what they may do. Identities come from TLS client certificates (the CN is the
//! user name and the O entries are the groups, as in kube-apiserver), front-proxy headers on a
//! connection the request-header CA vouches for, static bearer tokens, or — in a cluster —
//! TokenReview and service-account JWTs ([`delegated`]); [`authn`] is the chain, [`impersonation`]
//! the `Impersonate-*` headers. Decisions come from the bootstrap policy and an RBAC policy file
//! ([`rbac`]) standalone, or SubjectAccessReview in a cluster ([`authz`]). [`pki`], [`serving`]
//! and [`trust`] hold the certificates and CAs. This module imports no other module of the crate.

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
