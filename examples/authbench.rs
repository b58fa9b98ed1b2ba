//! Cost of the standalone auth chain per request, measured in-process: bearer-token authentication
//! against a token file of 1,000 users, then an RBAC decision against a policy of 1,000
//! RoleBindings, for an allowed and a forbidden request. Prints one JSON line per case.
//!
//! cargo run --release --example authbench [-- ITERATIONS]

use std::time::Instant;

use axum::http::{HeaderMap, HeaderValue};
use stowage::auth::attributes::{Attributes, ResourceAttributes};
use stowage::auth::authn::{Authenticator, TokenAuthenticator};
use stowage::auth::rbac::Policy;
use stowage::auth::token_file::TokenFile;
use stowage::auth::trust::{ClientTrust, PeerCertificate, TrustAnchors};

const USERS: usize = 1000;

fn main() -> anyhow::Result<()> {
    let iterations: u32 = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(200_000);
    let tokens: String = (0..USERS).map(|i| format!("token-{i},user-{i},{i},\"group-{}\"\n", i % 10)).collect();
    let mut policy = String::from(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: reader}\nrules:\n\
         - {apiGroups: [content.stowage.dev], resources: [bundles, bundles/content], verbs: [get, list, watch]}\n",
    );
    for i in 0..USERS {
        policy.push_str(&format!(
            "---\napiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{name: b{i}, namespace: ns-{i}}}\n\
             roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: reader}}\n\
             subjects: [{{kind: User, name: user-{i}}}]\n"
        ));
    }
    let policy = Policy::parse(&policy)?;
    let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let trust = std::sync::Arc::new(ClientTrust::new(provider, &TrustAnchors::default())?);
    let authenticator =
        Authenticator { trust, tokens: vec![TokenAuthenticator::File(TokenFile::parse(&tokens)?)], anonymous: true };
    let mut headers = HeaderMap::new();
    headers.insert("authorization", HeaderValue::from_static("Bearer token-500"));
    let runtime = tokio::runtime::Builder::new_current_thread().build()?;
    for (case, namespace) in [("allowed", "ns-500"), ("forbidden", "ns-501")] {
        let started = Instant::now();
        let mut allowed = 0u32;
        for _ in 0..iterations {
            let user = runtime.block_on(authenticator.authenticate(&PeerCertificate::None, &headers))?;
            let attributes = Attributes::resource(
                user,
                ResourceAttributes {
                    namespace: namespace.into(),
                    verb: "get".into(),
                    group: "content.stowage.dev".into(),
                    version: "v1alpha1".into(),
                    resource: "bundles".into(),
                    name: "app".into(),
                    ..ResourceAttributes::default()
                },
            );
            allowed += u32::from(policy.authorize(&attributes).is_allowed());
        }
        let per = started.elapsed().as_secs_f64() * 1e6 / f64::from(iterations);
        println!(r#"{{"case":"{case}","iterations":{iterations},"allowed":{allowed},"us_per_request":{per:.3}}}"#);
    }
    Ok(())
}
