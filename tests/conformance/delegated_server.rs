//! The whole server in delegated mode (`--kubeconfig` naming a stand-in kube-apiserver that speaks
//! the real TokenReview, SubjectAccessReview and ConfigMap JSON over TLS): client certificates
//! from the cluster's client CA, the front proxy from its request-header CA, service-account JWTs
//! checked locally (expired or foreign-audience ones refused), every decision a
//! SubjectAccessReview, Secrets a Bundle names checked, and a cluster that stops answering is a
//! 503, never an allow.

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::json;

use crate::harness::*;
use crate::stub_apiserver::pki::CertifiedKey;
use crate::stub_apiserver::{Endpoint, StubApiServer};

/// A client trusting the server's CA, with `identity_pem` (certificate and key) if given.
pub(crate) fn client(server: &Server, identity_pem: Option<String>) -> reqwest::Client {
    let ca = std::fs::read(server.data_dir().join("pki/ca.crt")).unwrap();
    let mut builder =
        reqwest::Client::builder().tls_certs_only([reqwest::Certificate::from_pem(&ca).unwrap()]).no_proxy();
    if let Some(pem) = identity_pem {
        builder = builder.identity(reqwest::Identity::from_pem(pem.as_bytes()).unwrap());
    }
    builder.build().unwrap()
}

/// A certified key as one PEM identity.
pub(crate) fn identity(key: &CertifiedKey) -> String {
    format!("{}{}", key.cert_pem, key.key_pem)
}

/// A stand-in cluster with its PKI published, and a server delegating to it.
fn delegated() -> (StubApiServer, Server) {
    let stub = StubApiServer::start();
    stub.publish_pki(&["front-proxy-client"]);
    let kubeconfig = stub.kubeconfig().to_str().unwrap().to_owned();
    let server = Server::start_temp(&["--kubeconfig", &kubeconfig]);
    (stub, server)
}

fn now() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() as i64
}

#[tokio::test(flavor = "multi_thread")]
async fn delegated_mode_authenticates_and_authorizes_through_the_cluster() {
    let (stub, server) = delegated();
    // No admin credentials in a cluster: users bring the cluster's, and a key on the volume would
    // only be something to steal.
    for file in ["admin.kubeconfig", "pki/admin.crt", "pki/admin.key"] {
        assert!(!server.data_dir().join(file).exists(), "{file} written in a cluster");
    }
    // In-cluster start: the authentication ConfigMap was read, and the server reports ready.
    assert!(
        stub.requests(Endpoint::AuthenticationConfigMap) >= 1,
        "reads kube-system/extension-apiserver-authentication"
    );
    let ready = client(&server, None).get(server.url("/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), 200, "ready once serving");

    // A user certificate from the cluster's client CA; the SubjectAccessReview decides.
    let alice = client(&server, Some(identity(&stub.client_ca().client_cert("alice", &["devs"]))));
    stub.allow("alice", "list", "bundles", "team-a");
    assert_eq!(alice.get(server.url(&bundles("team-a"))).send().await.unwrap().status(), 200);
    let status = expect_status(alice.get(server.url(&bundles("team-b"))).send().await.unwrap(), 403, "Forbidden").await;
    assert!(
        str_at(&status, "/message").starts_with(
            "bundles.content.stowage.dev is forbidden: User \"alice\" cannot list resource \"bundles\" in API group \
             \"content.stowage.dev\" in the namespace \"team-b\""
        ),
        "{status:#}"
    );
    let review = stub.reviews(Endpoint::SubjectAccessReview).into_iter().last().unwrap();
    assert_eq!(review["spec"]["user"], "alice");
    assert!(review["spec"]["groups"].as_array().unwrap().contains(&json!("devs")), "{review:#}");

    // The front proxy's headers, from its certificate only.
    let proxy = client(&server, Some(identity(&stub.request_header_ca().client_cert("front-proxy-client", &[]))));
    stub.allow("bob", "list", "bundles", "team-a");
    let as_bob = proxy.get(server.url(&bundles("team-a"))).header("X-Remote-User", "bob").send().await.unwrap();
    assert_eq!(as_bob.status(), 200);
    let forged = alice.get(server.url(&bundles("team-c"))).header("X-Remote-User", "bob").send().await.unwrap();
    let status = expect_status(forged, 403, "Forbidden").await;
    assert!(str_at(&status, "/message").contains("User \"alice\""), "a forged header became the identity: {status:#}");

    // Service-account tokens are verified locally: no TokenReview for a good one.
    let anonymous = client(&server, None);
    let robot = "system:serviceaccount:team-a:robot";
    stub.allow(robot, "get", "bundles", "team-a");
    let token = stub.service_account_token("team-a", "robot", &["https://kubernetes.default.svc"], now() + 600);
    stub.reset_counts();
    let resp = anonymous.get(server.url(&bundle("team-a", "app"))).bearer_auth(&token).send().await.unwrap();
    assert!(resp.status() == 200 || resp.status() == 404, "robot: {}", resp.status());
    assert_eq!(stub.requests(Endpoint::TokenReview), 0, "verified locally");
    let expired = stub.service_account_token("team-a", "robot", &["https://kubernetes.default.svc"], now() - 600);
    let resp = anonymous.get(server.url(&bundle("team-a", "app"))).bearer_auth(&expired).send().await.unwrap();
    expect_status(resp, 401, "Unauthorized").await;
    let foreign = stub.service_account_token("team-a", "robot", &["https://elsewhere.example"], now() + 600);
    let resp = anonymous.get(server.url(&bundle("team-a", "app"))).bearer_auth(&foreign).send().await.unwrap();
    expect_status(resp, 401, "Unauthorized").await;

    // A Bundle may only name a Secret its author may read.
    stub.allow("alice", "create", "bundles", "team-a");
    let with_secret = json!({
        "apiVersion": "content.stowage.dev/v1alpha1", "kind": "Bundle",
        "metadata": {"name": "pulls", "namespace": "team-a"},
        "spec": {"sources": [{"image": {"ref": "registry.example/app:1", "pullSecret": "regcred"}}]},
    });
    let resp = alice.post(server.url(&bundles("team-a"))).json(&with_secret).send().await.unwrap();
    let status = expect_status(resp, 403, "Forbidden").await;
    assert!(str_at(&status, "/message").contains("names Secret \"regcred\""), "{status:#}");
    // Once the cluster lets her read Secrets, she may (a new name: the refusal above stays cached
    // for the deny TTL, as kube's webhook authorizer caches it).
    stub.allow("alice", "get", "secrets", "team-a");
    let mut readable = with_secret.clone();
    readable["metadata"]["name"] = json!("pulls-too");
    readable["spec"]["sources"][0]["image"]["pullSecret"] = json!("team-cred");
    let resp = alice.post(server.url(&bundles("team-a"))).json(&readable).send().await.unwrap();
    assert_eq!(resp.status(), 201);

    // The cluster stops answering: an uncached question is a 503, never an allow.
    stub.set_failure(Some(500));
    let resp = alice.get(server.url(&bundles("team-z"))).send().await.unwrap();
    expect_status(resp, 503, "ServiceUnavailable").await;
}

/// A request that reaches the server directly (through the Service, not the aggregator) with
/// `Impersonate-*` headers is impersonated only as far as SubjectAccessReviews allow: never
/// ignored.
#[tokio::test(flavor = "multi_thread")]
async fn direct_impersonation_is_asked_of_the_cluster() {
    let (stub, server) = delegated();
    let alice = client(&server, Some(identity(&stub.client_ca().client_cert("alice", &[]))));
    stub.allow("carol", "list", "bundles", "team-a");

    // Not allowed to impersonate: 403 naming what was asked, and the request does not run as alice
    // (who may list) nor as dave. (Another name than below: the server caches denials.)
    stub.allow("alice", "list", "bundles", "team-a");
    let refused = alice.get(server.url(&bundles("team-a"))).header("Impersonate-User", "dave").send().await.unwrap();
    let status = expect_status(refused, 403, "Forbidden").await;
    assert!(
        str_at(&status, "/message")
            .starts_with("users \"dave\" is forbidden: User \"alice\" cannot impersonate resource \"users\""),
        "{status:#}"
    );

    // Allowed: the request runs as carol, whom the cluster then authorizes.
    stub.allow("alice", "impersonate", "users", "");
    let listed = alice.get(server.url(&bundles("team-a"))).header("Impersonate-User", "carol").send().await.unwrap();
    assert_eq!(listed.status(), 200);
    let reviews = stub.reviews(Endpoint::SubjectAccessReview);
    let asked = |user: &str, verb: &str| {
        reviews.iter().any(|r| r["spec"]["user"] == user && r["spec"]["resourceAttributes"]["verb"] == verb)
    };
    assert!(asked("alice", "impersonate"), "no impersonate review: {reviews:#?}");
    assert!(asked("carol", "list"), "the list was not asked for carol: {reviews:#?}");
    let carol = reviews.iter().rfind(|r| r["spec"]["user"] == "carol").unwrap();
    assert_eq!(carol["spec"]["groups"], json!(["system:authenticated"]), "{carol:#}");
}

/// TokenReviews and SubjectAccessReviews in `/metrics` under kube's names, by the code the cluster
/// answered, and the caches' hits and misses.
#[tokio::test(flavor = "multi_thread")]
async fn delegated_reviews_are_in_metrics() {
    let (stub, server) = delegated();
    let user = stowage::auth::UserInfo { name: "prom".into(), uid: "uid-prom".into(), ..Default::default() };
    stub.add_token("prom-token", user.clone());
    stub.add_token("other-token", user);
    stub.allow_path("prom", "get", "/metrics");
    let anonymous = client(&server, None);
    let scrape = || async {
        let resp = anonymous.get(server.url("/metrics")).bearer_auth("prom-token").send().await.unwrap();
        assert_eq!(resp.status(), 200);
        parse_metrics(&resp.text().await.unwrap())
    };
    let first = scrape().await;
    // Asked once each, then answered from the caches.
    let second = scrape().await;
    let at = |m: &std::collections::HashMap<String, f64>, key: &str| {
        m.get(key).copied().unwrap_or_else(|| panic!("no {key} in {m:?}"))
    };
    for m in [&first, &second] {
        assert_eq!(at(m, r#"apiserver_delegated_authn_request_total{code="201"}"#), 1.0);
        assert_eq!(at(m, r#"apiserver_delegated_authz_request_total{code="201"}"#), 1.0);
        assert_eq!(at(m, r#"apiserver_delegated_authn_request_duration_seconds_count{code="201"}"#), 1.0);
        assert_eq!(at(m, r#"apiserver_delegated_authz_request_duration_seconds_count{code="201"}"#), 1.0);
    }
    assert_eq!(at(&first, r#"stowage_delegated_auth_cache_lookups_total{kind="authn",result="miss"}"#), 1.0);
    assert_eq!(at(&second, r#"stowage_delegated_auth_cache_lookups_total{kind="authn",result="hit"}"#), 1.0);
    assert_eq!(at(&second, r#"stowage_delegated_auth_cache_lookups_total{kind="authz",result="hit"}"#), 1.0);
    assert_eq!(at(&second, r#"stowage_delegated_auth_cache_lookups_total{kind="authz",result="miss"}"#), 1.0);
    let le = r#"apiserver_delegated_authn_request_duration_seconds_bucket{code="201",le="10"}"#;
    assert_eq!(at(&second, le), 1.0, "kube's buckets");

    // The cluster failing: counted by its code.
    stub.set_failure(Some(500));
    let resp = anonymous.get(server.url("/metrics")).bearer_auth("other-token").send().await.unwrap();
    assert_eq!(resp.status(), 503);
    stub.set_failure(None);
    let failed = scrape().await;
    assert_eq!(at(&failed, r#"apiserver_delegated_authn_request_total{code="500"}"#), 1.0);
    // Standalone-only and replicated series are not here; the process ones are.
    assert!(at(&failed, "process_open_fds") > 0.0);
    assert!(!failed.contains_key("stowage_leader"));
}
