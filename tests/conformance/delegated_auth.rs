//! `stowage::auth::delegated` against the stub kube-apiserver: TokenReview answers, caching and
//! expiry; service-account JWTs verified locally (no TokenReview), refused when expired, not yet valid
//! or for another audience, handed to TokenReview when another issuer's; keys rotated mid-test;
//! SubjectAccessReview decisions and caches; the authentication ConfigMap reaching `ClientTrust`; and
//! a failing or vanished kube-apiserver turning into errors, never into a user or an allow.

use std::sync::Arc;
use std::time::{Duration, Instant};

use jsonwebtoken::Algorithm;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use stowage::auth::attributes::{Attributes, Decision, ResourceAttributes};
use stowage::auth::delegated::service_account::{
    CREDENTIAL_ID_KEY, NODE_NAME_KEY, NODE_UID_KEY, POD_NAME_KEY, POD_UID_KEY,
};
use stowage::auth::delegated::{
    delegation_client, read_trust_anchors, AuthenticationConfigWatcher, ClientSource, DelegatedTokenAuthenticator,
    SarAuthorizer, SarConfig, ServiceAccountConfig, ServiceAccountVerifier, TokenReviewConfig, TokenReviewer, Verdict,
};
use stowage::auth::rbac::ReloadOutcome;
use stowage::auth::trust::PeerCertificate;
use stowage::auth::UserInfo;

use crate::harness::{eventually, eventually_every};
use crate::stub_apiserver::{now, service_account_uid, Endpoint, SaToken, StubApiServer, STUB_ISSUER};

const TTL: Duration = Duration::from_millis(400);
/// How often a cached answer is looked at while waiting for it to expire.
const LOOK: Duration = Duration::from_millis(20);

/// Calls `ask` every 20 ms until the stub has had `n` requests at `endpoint` (the cached answer
/// `ask` gets expired, so it was asked again), failing after ten TTLs; asserts the answer was
/// cached for at least the TTL since `cached`, when it was asked for.
async fn asked_again<F, Fut>(
    stub: &StubApiServer,
    endpoint: Endpoint,
    n: usize,
    cached: Instant,
    what: &str,
    mut ask: F,
) where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    eventually_every(TTL * 10, LOOK, &format!("{what} asked again"), || {
        let asking = ask();
        async move {
            asking.await;
            match stub.requests(endpoint) {
                seen if seen >= n => Ok(()),
                seen => Err(format!("{seen} requests")),
            }
        }
    })
    .await;
    assert_eq!(stub.requests(endpoint), n, "{what}: one request once its answer expired");
    assert!(cached.elapsed() >= TTL, "{what}: asked again {:?} after it was cached, before the TTL", cached.elapsed());
}

async fn client(stub: &StubApiServer) -> kube::Client {
    delegation_client(&ClientSource::Kubeconfig(stub.kubeconfig().to_owned())).await.expect("kube client for the stub")
}

fn user(name: &str, groups: &[&str]) -> UserInfo {
    UserInfo {
        name: name.into(),
        uid: format!("uid-{name}"),
        groups: groups.iter().map(|g| g.to_string()).collect(),
        extra: [("scopes".to_owned(), vec!["read".to_owned()])].into(),
    }
}

fn reviewer(client: kube::Client, audiences: &[&str]) -> TokenReviewer {
    let audiences = audiences.iter().map(|a| a.to_string()).collect();
    TokenReviewer::new(client, TokenReviewConfig { audiences, success_ttl: TTL, failure_ttl: TTL, cache_size: 16 })
}

/// An authenticator whose key refreshes are never rate-limited.
fn authenticator(client: kube::Client, audiences: &[&str]) -> DelegatedTokenAuthenticator {
    let config = ServiceAccountConfig {
        audiences: audiences.iter().map(|a| a.to_string()).collect(),
        min_refresh_interval: Duration::ZERO,
        ..ServiceAccountConfig::default()
    };
    let local = ServiceAccountVerifier::new(client.clone(), config);
    DelegatedTokenAuthenticator::new(Some(local), reviewer(client, audiences))
}

#[tokio::test]
async fn delegated_token_review_answers_are_cached_until_their_ttl() {
    let stub = StubApiServer::start();
    let alice = user("alice", &["dev", "system:authenticated"]);
    stub.add_token("alice-token", alice.clone());
    let reviews = reviewer(client(&stub).await, &[]);

    let cached = Instant::now();
    assert_eq!(reviews.authenticate("alice-token").await.expect("review"), Some(alice.clone()));
    assert_eq!(reviews.authenticate("alice-token").await.expect("cached"), Some(alice.clone()));
    assert_eq!(stub.requests(Endpoint::TokenReview), 1, "the second answer comes from the cache");
    assert_eq!(reviews.authenticate("bogus").await.expect("review"), None);
    assert_eq!(reviews.authenticate("bogus").await.expect("cached"), None);
    assert_eq!(stub.requests(Endpoint::TokenReview), 2, "refusals are cached too");
    let sent = stub.reviews(Endpoint::TokenReview);
    assert_eq!(sent[0]["apiVersion"], "authentication.k8s.io/v1");
    assert!(sent[0]["spec"].get("audiences").is_none(), "no audiences asked for: {}", sent[0]);

    // Past the TTL both are asked again; a revoked token is then refused.
    stub.remove_token("alice-token");
    let alice_then = alice.clone();
    asked_again(&stub, Endpoint::TokenReview, 3, cached, "alice's review", || async {
        let answer = reviews.authenticate("alice-token").await.expect("review");
        assert!(answer.is_none() || answer == Some(alice_then.clone()), "{answer:?}");
    })
    .await;
    assert_eq!(reviews.authenticate("alice-token").await.expect("review"), None, "revoked");
    asked_again(&stub, Endpoint::TokenReview, 4, cached, "the refusal of bogus", || async {
        assert_eq!(reviews.authenticate("bogus").await.expect("review"), None);
    })
    .await;
}

#[tokio::test]
async fn delegated_token_review_checks_audiences() {
    let stub = StubApiServer::start();
    let answer = |audiences: &[&str]| crate::stub_apiserver::StaticToken {
        user: user("bob", &[]),
        audiences: Some(audiences.iter().map(|a| a.to_string()).collect()),
    };
    stub.add_static_token("for-stowage", answer(&["stowage"]));
    stub.add_static_token("for-others", answer(&["others"]));
    let reviews = reviewer(client(&stub).await, &["stowage"]);
    assert_eq!(reviews.authenticate("for-stowage").await.expect("review").map(|u| u.name), Some("bob".into()));
    assert_eq!(reviews.authenticate("for-others").await.expect("review"), None);
    let sent = stub.reviews(Endpoint::TokenReview);
    assert_eq!(sent[0]["spec"]["audiences"], serde_json::json!(["stowage"]));
}

#[tokio::test]
async fn delegated_errors_are_never_cached_nor_users() {
    let mut stub = StubApiServer::start();
    stub.add_token("alice-token", user("alice", &[]));
    stub.allow("alice", "get", "bundles/content", "team-a");
    let client = client(&stub).await;
    let reviews = reviewer(client.clone(), &[]);
    let sar = SarAuthorizer::new(client.clone(), SarConfig { allow_ttl: TTL, deny_ttl: TTL, cache_size: 16 });
    let get = get_bundles("alice", "team-a");

    stub.set_failure(Some(500));
    assert!(reviews.authenticate("alice-token").await.is_err());
    assert!(sar.authorize(&get).await.is_err());
    stub.set_failure(Some(403));
    assert!(reviews.authenticate("alice-token").await.is_err(), "a forbidden TokenReview is an error");
    stub.set_failure(None);
    assert!(reviews.authenticate("alice-token").await.expect("review").is_some());
    assert!(sar.authorize(&get).await.expect("review").is_allowed());
    assert_eq!(stub.requests(Endpoint::TokenReview), 3, "errors were not cached");
    assert_eq!(stub.requests(Endpoint::SubjectAccessReview), 2);

    // The stand-in goes away: cached answers stay until their TTL, then errors.
    let token = stub.service_account_token("team-a", "builder", &[STUB_ISSUER], now() + 600);
    stub.stop();
    assert!(reviews.authenticate("alice-token").await.expect("cached").is_some());
    assert!(sar.authorize(&get).await.expect("cached").is_allowed());
    eventually_every(TTL * 10, LOOK, "the cached review expired: an error", || async {
        match reviews.authenticate("alice-token").await {
            Err(_) => Ok(()),
            Ok(user) => Err(format!("still {user:?}")),
        }
    })
    .await;
    eventually_every(TTL * 10, LOOK, "the cached decision expired: an error", || async {
        match sar.authorize(&get).await {
            Err(_) => Ok(()),
            Ok(decision) => Err(format!("still {decision:?}")),
        }
    })
    .await;
    // Without the issuer's keys a service-account token cannot be verified locally either.
    let sa = ServiceAccountVerifier::new(client.clone(), ServiceAccountConfig::default());
    assert!(matches!(sa.verify(&token).await, Verdict::NotLocal(_)));
    let auth = DelegatedTokenAuthenticator::new(Some(sa), reviewer(client, &[]));
    assert!(auth.authenticate(&token).await.is_err(), "an unverifiable token is an error, not anonymous");
}

fn bound_token(stub: &StubApiServer, exp: i64) -> SaToken {
    let issuer = stub.issuer();
    let mut token = SaToken::new("team-a", "builder", &[issuer.as_str()], exp);
    token.pod = Some(("builder-7d9f".into(), "pod-uid-1".into()));
    token.node = Some(("node-1".into(), "node-uid-1".into()));
    token.jti = Some("jti-1".into());
    token
}

#[tokio::test]
async fn delegated_service_account_tokens_are_verified_locally() {
    let stub = StubApiServer::start();
    let auth = authenticator(client(&stub).await, &[]);
    let token = stub.sign(&bound_token(&stub, now() + 600));
    let got = auth.authenticate(&token).await.expect("authenticate").expect("a user");
    assert_eq!(got.name, "system:serviceaccount:team-a:builder");
    assert_eq!(got.uid, service_account_uid("team-a", "builder"));
    assert_eq!(got.groups, vec!["system:serviceaccounts".to_owned(), "system:serviceaccounts:team-a".to_owned()]);
    let extra = |k: &str| got.extra.get(k).cloned().unwrap_or_default();
    assert_eq!(extra(POD_NAME_KEY), vec!["builder-7d9f".to_owned()]);
    assert_eq!(extra(POD_UID_KEY), vec!["pod-uid-1".to_owned()]);
    assert_eq!(extra(NODE_NAME_KEY), vec!["node-1".to_owned()]);
    assert_eq!(extra(NODE_UID_KEY), vec!["node-uid-1".to_owned()]);
    assert_eq!(extra(CREDENTIAL_ID_KEY), vec!["JTI=jti-1".to_owned()]);
    assert_eq!(got.extra.len(), 5);

    // The API audience several distributions use is accepted by default too.
    let token = stub.service_account_token("team-a", "plain", &["https://kubernetes.default.svc"], now() + 600);
    let plain = auth.authenticate(&token).await.expect("authenticate").expect("a user");
    assert!(plain.extra.contains_key(CREDENTIAL_ID_KEY) && !plain.extra.contains_key(POD_NAME_KEY));
    assert_eq!(stub.requests(Endpoint::TokenReview), 0, "no TokenReview for local tokens");
    assert_eq!(stub.requests(Endpoint::OpenIdConfiguration), 1);
    assert_eq!(stub.requests(Endpoint::Jwks), 1);
}

#[tokio::test]
async fn delegated_invalid_service_account_tokens_are_refused_locally() {
    let stub = StubApiServer::start();
    let auth = authenticator(client(&stub).await, &["stowage"]);
    let valid = SaToken::new("team-a", "builder", &["stowage"], now() + 600);
    assert!(auth.authenticate(&stub.sign(&valid)).await.expect("authenticate").is_some());

    let expired = SaToken { exp: now() - 120, iat: now() - 3600, nbf: Some(now() - 3600), ..valid.clone() };
    let early = SaToken { nbf: Some(now() + 300), ..valid.clone() };
    let future = SaToken { iat: now() + 300, nbf: None, ..valid.clone() };
    let elsewhere = SaToken { audiences: vec!["https://kubernetes.default.svc".into()], ..valid.clone() };
    let mut forged = stub.sign(&valid);
    forged.replace_range(forged.len() - 6.., "AAAAAA");
    let local = match auth.service_accounts() {
        Some(local) => local.clone(),
        None => panic!("local verification is on"),
    };
    for (what, token) in [
        ("expired", stub.sign(&expired)),
        ("not yet valid", stub.sign(&early)),
        ("issued in the future", stub.sign(&future)),
        ("for another audience", stub.sign(&elsewhere)),
        ("forged", forged),
    ] {
        assert!(matches!(local.verify(&token).await, Verdict::Rejected(_)), "{what}");
        assert_eq!(auth.authenticate(&token).await.expect("authenticate"), None, "{what}");
    }
    assert_eq!(stub.requests(Endpoint::TokenReview), 0, "refused without asking the cluster");
}

#[tokio::test]
async fn delegated_verified_tokens_are_not_remembered_past_expiry() {
    let stub = StubApiServer::start();
    let config = ServiceAccountConfig { leeway: Duration::ZERO, ..Default::default() };
    let local = ServiceAccountVerifier::new(client(&stub).await, config);
    let issuer = stub.issuer();
    let expires = now() + 2;
    let token = stub.service_account_token("team-a", "brief", &[issuer.as_str()], expires);
    assert!(matches!(local.verify(&token).await, Verdict::Verified(_)));
    assert!(matches!(local.verify(&token).await, Verdict::Verified(_)));
    // Verified until it expires (no leeway), then rejected, not remembered.
    eventually_every(
        Duration::from_secs(10),
        Duration::from_millis(50),
        "expired, and no longer remembered",
        || async {
            match local.verify(&token).await {
                Verdict::Rejected(_) => Ok(()),
                Verdict::Verified(_) => Err("still verified".to_owned()),
                other => panic!("neither verified nor rejected: {other:?}"),
            }
        },
    )
    .await;
    assert!(now() >= expires, "rejected before it expired");
}

#[tokio::test]
async fn delegated_tokens_local_verification_cannot_decide_go_to_token_review() {
    let stub = StubApiServer::start();
    let auth = authenticator(client(&stub).await, &[]);
    let issuer = stub.issuer();

    // Another issuer's JWT (signed with a key the cluster publishes, even): TokenReview decides.
    let foreign = SaToken {
        issuer: Some("https://issuer.example".into()),
        ..SaToken::new("x", "y", &[issuer.as_str()], now() + 600)
    };
    let foreign = stub.sign(&foreign);
    assert_eq!(auth.authenticate(&foreign).await.expect("authenticate"), None);
    assert_eq!(stub.requests(Endpoint::TokenReview), 1);
    let other = user("carol", &["system:authenticated"]);
    stub.add_token("opaque-token", other.clone());
    assert_eq!(auth.authenticate("opaque-token").await.expect("authenticate"), Some(other));
    assert_eq!(stub.requests(Endpoint::TokenReview), 2);

    // Past warnafter (kube's extended projected tokens), or bound to a secret: bound objects need
    // checking, so the cluster is asked (and the stub, like the kube-apiserver, accepts them).
    let stale =
        SaToken { warnafter: Some(now() - 10), ..SaToken::new("team-a", "stale", &[issuer.as_str()], now() + 600) };
    let stale = auth.authenticate(&stub.sign(&stale)).await.expect("authenticate");
    assert_eq!(stale.map(|u| u.name), Some("system:serviceaccount:team-a:stale".into()));
    let mut secret = SaToken::new("team-a", "legacy", &[issuer.as_str()], now() + 600);
    secret.secret = Some(("legacy-token".into(), "secret-uid".into()));
    assert!(auth.authenticate(&stub.sign(&secret)).await.expect("authenticate").is_some());
    assert_eq!(stub.requests(Endpoint::TokenReview), 4);
}

#[tokio::test]
async fn delegated_issuer_keys_rotate_mid_test() {
    let stub = StubApiServer::start();
    let auth = authenticator(client(&stub).await, &[]);
    let issuer = stub.issuer();
    let first = stub.service_account_token("team-a", "a", &[issuer.as_str()], now() + 600);
    assert!(auth.authenticate(&first).await.expect("authenticate").is_some());
    assert_eq!(stub.requests(Endpoint::Jwks), 1);

    // A new ES256 key: its first token makes the verifier re-fetch the keys, then verify locally.
    let old_kid = "stub-key-1";
    let new_kid = stub.rotate_signing_key(Algorithm::ES256);
    let second = stub.service_account_token("team-a", "b", &[issuer.as_str()], now() + 600);
    assert!(auth.authenticate(&second).await.expect("authenticate").is_some());
    assert_eq!(stub.requests(Endpoint::Jwks), 2);
    assert_eq!(stub.requests(Endpoint::TokenReview), 0);
    assert_eq!(auth.service_accounts().map(|s| s.key_count()), Some(2));

    // The old key is withdrawn: tokens signed with it are refused (by TokenReview, after a re-fetch
    // found the key gone).
    stub.unpublish_key(old_kid);
    let stale = SaToken { kid: Some(old_kid.into()), ..SaToken::new("team-a", "c", &[issuer.as_str()], now() + 600) };
    let stale = stub.sign(&stale);
    let third = SaToken { kid: Some(new_kid.clone()), ..SaToken::new("team-a", "d", &[issuer.as_str()], now() + 600) };
    assert!(auth.authenticate(&stub.sign(&third)).await.expect("authenticate").is_some());
    assert_eq!(stub.requests(Endpoint::Jwks), 2, "a known kid needs no re-fetch");
    // The verifier still knows the old key until it re-fetches; force that, as its periodic refresh would.
    if let Some(local) = auth.service_accounts() {
        local.refresh_keys().await.expect("refresh");
    }
    assert_eq!(auth.authenticate(&stale).await.expect("authenticate"), None);
    assert_eq!(stub.requests(Endpoint::TokenReview), 1);

    // Refreshes on unknown kids are rate-limited: until the interval passes such tokens go straight
    // to TokenReview.
    let limited = ServiceAccountConfig { min_refresh_interval: Duration::from_secs(3600), ..Default::default() };
    let limited = ServiceAccountVerifier::new(client(&stub).await, limited);
    assert!(matches!(limited.verify(&second).await, Verdict::Verified(_)));
    let jwks = stub.requests(Endpoint::Jwks);
    stub.rotate_signing_key(Algorithm::RS256);
    let fourth = stub.service_account_token("team-a", "e", &[issuer.as_str()], now() + 600);
    assert!(matches!(limited.verify(&fourth).await, Verdict::NotLocal(_)));
    assert_eq!(stub.requests(Endpoint::Jwks), jwks, "no re-fetch within the rate limit");
}

fn get_bundles(name: &str, namespace: &str) -> Attributes {
    let request = ResourceAttributes {
        verb: "get".into(),
        group: "content.stowage.dev".into(),
        version: "v1alpha1".into(),
        resource: "bundles".into(),
        subresource: "content".into(),
        namespace: namespace.into(),
        name: "b1".into(),
    };
    Attributes::resource(user(name, &["dev"]), request)
}

#[tokio::test]
async fn delegated_subject_access_reviews_decide_and_are_cached() {
    let stub = StubApiServer::start();
    stub.allow("alice", "get", "bundles/content", "team-a");
    stub.deny("mallory", "*", "*", "*", "mallory is banned");
    stub.allow("group:dev", "get", "secrets", "team-a");
    stub.allow_path("alice", "get", "/metrics");
    stub.set_no_opinion("no RBAC rule matched", "role \"x\" not found");
    let sar = SarAuthorizer::new(client(&stub).await, SarConfig { allow_ttl: TTL, deny_ttl: TTL, cache_size: 16 });

    let decide = |a: Attributes| {
        let sar = sar.clone();
        async move { sar.authorize(&a).await.expect("SubjectAccessReview") }
    };
    let cached = Instant::now();
    assert_eq!(decide(get_bundles("alice", "team-a")).await, Decision::Allow("allowed by the stub".into()));
    assert_eq!(decide(get_bundles("mallory", "team-a")).await, Decision::Deny("mallory is banned".into()));
    let none = decide(get_bundles("alice", "team-b")).await;
    assert_eq!(none, Decision::NoOpinion("no RBAC rule matched: role \"x\" not found".into()));
    assert!(decide(Attributes::non_resource(user("alice", &[]), "get", "/metrics")).await.is_allowed());
    assert!(!decide(Attributes::non_resource(user("alice", &[]), "get", "/debug")).await.is_allowed());
    assert_eq!(stub.requests(Endpoint::SubjectAccessReview), 5);

    // The wire format: user, uid, groups, extra and the resource attributes.
    let sent = &stub.reviews(Endpoint::SubjectAccessReview)[0];
    assert_eq!(sent["apiVersion"], "authorization.k8s.io/v1");
    assert_eq!(
        sent["spec"],
        serde_json::json!({"user": "alice", "uid": "uid-alice", "groups": ["dev"], "extra": {"scopes": ["read"]},
            "resourceAttributes": {"namespace": "team-a", "verb": "get", "group": "content.stowage.dev",
                "version": "v1alpha1", "resource": "bundles", "subresource": "content", "name": "b1"}})
    );

    // Allows, denials and no-opinions are all cached, keyed by the whole request.
    for a in [get_bundles("alice", "team-a"), get_bundles("mallory", "team-a"), get_bundles("alice", "team-b")] {
        decide(a).await;
    }
    assert_eq!(stub.requests(Endpoint::SubjectAccessReview), 5);
    let mut other_uid = get_bundles("alice", "team-a");
    other_uid.user.uid = "another".into();
    decide(other_uid).await;
    assert_eq!(stub.requests(Endpoint::SubjectAccessReview), 6);
    asked_again(&stub, Endpoint::SubjectAccessReview, 7, cached, "alice's allow", || async {
        decide(get_bundles("alice", "team-a")).await;
    })
    .await;
    asked_again(&stub, Endpoint::SubjectAccessReview, 8, cached, "mallory's denial", || async {
        decide(get_bundles("mallory", "team-a")).await;
    })
    .await;

    // `can`: may a user get a Secret?
    let dev = user("dana", &["dev"]);
    assert!(sar.can(&dev, "get", "", "secrets", "team-a", "pull-secret").await.expect("can"));
    assert!(!sar.can(&dev, "get", "", "secrets", "team-b", "pull-secret").await.expect("can"));
    let sent = stub.reviews(Endpoint::SubjectAccessReview);
    let last = &sent[sent.len() - 1]["spec"]["resourceAttributes"];
    assert_eq!(
        last,
        &serde_json::json!({"namespace": "team-b", "verb": "get", "resource": "secrets", "name": "pull-secret"})
    );
}

fn leaf(pem: &str) -> CertificateDer<'static> {
    CertificateDer::from_pem_slice(pem.as_bytes()).expect("certificate PEM")
}

#[tokio::test]
async fn delegated_authentication_config_map_reaches_client_trust() {
    let stub = StubApiServer::start();
    let client = client(&stub).await;
    assert!(read_trust_anchors(&client).await.is_err(), "no ConfigMap yet");
    stub.publish_pki(&["front-proxy-client"]);
    let anchors = read_trust_anchors(&client).await.expect("anchors");
    assert_eq!(anchors.request_header.allowed_names, vec!["front-proxy-client".to_owned()]);
    assert_eq!(anchors.request_header.username_headers, vec!["X-Remote-User".to_owned()]);

    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let (trust, watcher) = AuthenticationConfigWatcher::start(client.clone(), provider, Duration::from_millis(100))
        .await
        .expect("start the watcher");
    let proxy = stub.request_header_ca().client_cert("front-proxy-client", &[]);
    let alice = stub.client_ca().client_cert("alice", &["dev"]);
    assert_eq!(
        trust.classify(&[leaf(&proxy.cert_pem)]),
        PeerCertificate::FrontProxy { common_name: "front-proxy-client".into() }
    );
    assert!(matches!(trust.classify(&[leaf(&alice.cert_pem)]), PeerCertificate::User(u) if u.name == "alice"));

    // The kube-apiserver changes the allowed names: the polling task applies it.
    stub.publish_pki(&["aggregator"]);
    eventually(Duration::from_secs(10), "the new allowed names are in force", || {
        let names = trust.request_header_config().allowed_names;
        async move {
            if names == ["aggregator"] {
                Ok(())
            } else {
                Err(format!("{names:?}"))
            }
        }
    })
    .await;
    assert_eq!(
        trust.classify(&[leaf(&proxy.cert_pem)]),
        PeerCertificate::None,
        "front-proxy-client is no longer allowed"
    );
    drop(watcher);

    // Errors keep the anchors in force.
    let manual = AuthenticationConfigWatcher::new(client, Arc::clone(&trust));
    assert_eq!(manual.reload().await, ReloadOutcome::Reloaded);
    assert_eq!(manual.reload().await, ReloadOutcome::Unchanged);
    let mut bad = std::collections::BTreeMap::new();
    bad.insert("requestheader-client-ca-file".to_owned(), "not a certificate".to_owned());
    stub.set_authentication_config(Some(bad));
    assert_eq!(manual.reload().await, ReloadOutcome::Failed);
    stub.set_authentication_config(None);
    assert_eq!(manual.reload().await, ReloadOutcome::Failed);
    assert_eq!(trust.request_header_config().allowed_names, vec!["aggregator".to_owned()]);
    assert!(matches!(trust.classify(&[leaf(&alice.cert_pem)]), PeerCertificate::User(_)));
}

/// What a cached or local answer costs (reported, not asserted: the request counts prove that no
/// answer needed the network).
#[tokio::test]
async fn delegated_cached_answers_cost_microseconds() {
    const N: u32 = 2000;
    let stub = StubApiServer::start();
    stub.add_token("alice-token", user("alice", &[]));
    stub.allow("alice", "get", "bundles/content", "team-a");
    let client = client(&stub).await;
    let long = Duration::from_secs(600);
    let auth = DelegatedTokenAuthenticator::new(
        Some(ServiceAccountVerifier::new(client.clone(), ServiceAccountConfig::default())),
        TokenReviewer::new(client.clone(), TokenReviewConfig { success_ttl: long, ..Default::default() }),
    );
    let sar = SarAuthorizer::new(client.clone(), SarConfig { allow_ttl: long, ..Default::default() });
    let issuer = stub.issuer();
    let jwt = stub.service_account_token("team-a", "builder", &[issuer.as_str()], now() + 600);
    let get = get_bundles("alice", "team-a");
    assert!(auth.authenticate("alice-token").await.expect("review").is_some());
    assert!(auth.authenticate(&jwt).await.expect("local").is_some());
    assert!(sar.authorize(&get).await.expect("review").is_allowed());

    let start = std::time::Instant::now();
    for _ in 0..N {
        assert!(auth.authenticate("alice-token").await.expect("cached").is_some());
    }
    let review = start.elapsed() / N;
    let start = std::time::Instant::now();
    for _ in 0..N {
        assert!(auth.authenticate(&jwt).await.expect("local").is_some());
    }
    let local = start.elapsed() / N;
    let uncached = ServiceAccountConfig { verified_cache_size: 0, ..Default::default() };
    let uncached = ServiceAccountVerifier::new(client.clone(), uncached);
    assert!(matches!(uncached.verify(&jwt).await, Verdict::Verified(_)));
    let start = std::time::Instant::now();
    for _ in 0..N {
        assert!(matches!(uncached.verify(&jwt).await, Verdict::Verified(_)));
    }
    let verify = start.elapsed() / N;
    let start = std::time::Instant::now();
    for _ in 0..N {
        assert!(sar.authorize(&get).await.expect("cached").is_allowed());
    }
    let authorize = start.elapsed() / N;
    crate::harness::report(&format!(
        "delegated auth per request: cached TokenReview {review:?}, remembered service-account JWT {local:?} \
         ({verify:?} to verify its signature and claims), cached SubjectAccessReview {authorize:?}"
    ));
    assert_eq!(stub.requests(Endpoint::TokenReview), 1);
    assert_eq!(stub.requests(Endpoint::SubjectAccessReview), 1);
}
