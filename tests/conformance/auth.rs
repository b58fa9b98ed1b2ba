//! Standalone authentication and authorization, as operators configure them: static tokens and an
//! RBAC policy file (re-read when it changes), the front proxy's headers believed only from its
//! certificate, kube-apiserver's Forbidden messages, no Bundle naming a Secret its author may not
//! read, a serving certificate replaced in place, and `SelfSubjectReview`s of front-proxy and
//! anonymous users (kubectl's own reviews are in kubectl_auth.rs).

use std::path::Path;
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair};
use serde_json::{json, Value};

use crate::harness::*;
use crate::tarutil::*;

const TOKENS: &str = "alice-token,alice,1001,\"readers\"\nbob-token,bob,1002,\"\"\n\
                      carl-token,carl,1003,\"\"\ndora-token,dora,1004,\"\"\n";

const POLICY: &str = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: bundle-reader}
rules:
- apiGroups: [content.stowage.dev]
  resources: [bundles, bundles/content, bundlecontents]
  verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: readers, namespace: team-a}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: bundle-reader}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: Group, name: readers}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: author, namespace: team-a}
rules:
- apiGroups: [content.stowage.dev]
  resources: [bundles]
  verbs: [create, get, update, patch]
- apiGroups: [""]
  resources: [secrets]
  resourceNames: [regcred]
  verbs: [get]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: bob-authors, namespace: team-a}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: author}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: User, name: bob}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: metadata-only, namespace: team-a}
rules:
- {apiGroups: [content.stowage.dev], resources: [bundles], verbs: [get, list]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: carl-metadata, namespace: team-a}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: metadata-only}
subjects: [{kind: User, name: carl}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: one-content, namespace: team-a}
rules:
- {apiGroups: [content.stowage.dev], resources: [bundles/content], resourceNames: [app], verbs: [get]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: dora-one-content, namespace: team-a}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: one-content}
subjects: [{kind: User, name: dora}]
"#;

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_owned()
}

async fn as_user(
    server: &Server,
    token: &str,
    method: reqwest::Method,
    path: &str,
    body: Option<&Value>,
) -> reqwest::Response {
    let mut request = server.anonymous_client().request(method, server.url(path)).bearer_auth(token);
    if let Some(body) = body {
        request = request.json(body);
    }
    request.send().await.unwrap()
}

fn image_bundle(name: &str, secret: &str) -> Value {
    json!({
        "apiVersion": "content.stowage.dev/v1alpha1",
        "kind": "Bundle",
        "metadata": {"name": name, "namespace": "team-a"},
        "spec": {"sources": [{"image": {"ref": "registry.example/app:1", "pullSecret": secret}}]},
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn tokens_and_the_rbac_policy_file_decide_who_reads_what() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = write(dir.path(), "tokens.csv", TOKENS);
    let policy = write(dir.path(), "policy.yaml", POLICY);
    let server = Server::start_temp(&["--token-auth-file", &tokens, "--authorization-policy-file", &policy]);
    server.create_bundle("team-a", "app").await;
    let mut tree = Tree::new();
    tree.insert("manifests/cm.yaml".into(), file(b"kind: ConfigMap\n".to_vec()));
    server.upload_ok("team-a", "app", build_tar(&tree), None).await;
    server.create_bundle("team-b", "other").await;
    use reqwest::Method;

    // alice (group readers) reads team-a, content included…
    assert_eq!(as_user(&server, "alice-token", Method::GET, &bundles("team-a"), None).await.status(), 200);
    let content = as_user(&server, "alice-token", Method::GET, &bundle_content("team-a", "app"), None).await;
    assert_eq!(content.status(), 200);
    // …but not team-b, and she writes nothing: kube-apiserver's messages.
    let status =
        expect_status(as_user(&server, "alice-token", Method::GET, &bundles("team-b"), None).await, 403, "Forbidden")
            .await;
    assert_eq!(
        str_at(&status, "/message"),
        "bundles.content.stowage.dev is forbidden: User \"alice\" cannot list resource \"bundles\" in API group \
         \"content.stowage.dev\" in the namespace \"team-b\""
    );
    let create =
        as_user(&server, "alice-token", Method::POST, &bundles("team-a"), Some(&upload_bundle("team-a", "x"))).await;
    expect_status(create, 403, "Forbidden").await;
    // carl sees metadata but not content; dora reads the content of `app` only.
    assert_eq!(as_user(&server, "carl-token", Method::GET, &bundle("team-a", "app"), None).await.status(), 200);
    let status = expect_status(
        as_user(&server, "carl-token", Method::GET, &bundle_content("team-a", "app"), None).await,
        403,
        "Forbidden",
    )
    .await;
    assert!(str_at(&status, "/message").contains("cannot get resource \"bundles/content\""), "{status:#}");
    assert_eq!(as_user(&server, "dora-token", Method::GET, &bundle_content("team-a", "app"), None).await.status(), 200);
    server.create_bundle("team-a", "second").await;
    let other = as_user(&server, "dora-token", Method::GET, &bundle_content("team-a", "second"), None).await;
    expect_status(other, 403, "Forbidden").await;
    expect_status(as_user(&server, "dora-token", Method::GET, &bundle("team-a", "app"), None).await, 403, "Forbidden")
        .await;

    // Forged front-proxy headers on her own connection change nothing.
    let forged = server
        .anonymous_client()
        .post(server.url(&bundles("team-a")))
        .bearer_auth("alice-token")
        .header("X-Remote-User", "stowage-admin")
        .header("X-Remote-Group", "system:masters")
        .json(&upload_bundle("team-a", "x"))
        .send()
        .await
        .unwrap();
    let status = expect_status(forged, 403, "Forbidden").await;
    assert!(str_at(&status, "/message").contains("User \"alice\""), "{status:#}");

    // bob may create Bundles naming the Secret he may read, and no other.
    let ok =
        as_user(&server, "bob-token", Method::POST, &bundles("team-a"), Some(&image_bundle("pulls", "regcred"))).await;
    assert_eq!(ok.status(), 201, "{}", ok.text().await.unwrap());
    let denied =
        as_user(&server, "bob-token", Method::POST, &bundles("team-a"), Some(&image_bundle("steals", "prod-creds")))
            .await;
    let status = expect_status(denied, 403, "Forbidden").await;
    assert_eq!(
        str_at(&status, "/message"),
        "bundles.content.stowage.dev \"steals\" is forbidden: spec.sources[0].image.pullSecret names Secret \
         \"prod-creds\", but User \"bob\" cannot get resource \"secrets\" in API group \"\" in the namespace \"team-a\""
    );
    // A Secret is named, never namespaced: another namespace's Secret cannot even be written down.
    let elsewhere =
        as_user(&server, "bob-token", Method::POST, &bundles("team-a"), Some(&image_bundle("cross", "team-b/regcred")))
            .await;
    let status = expect_status(elsewhere, 422, "Invalid").await;
    assert_eq!(str_at(&status, "/details/causes/0/field"), "spec.sources[0].image.pullSecret");
    // Nor may he switch an existing Bundle to it.
    let patch =
        json!({"spec": {"sources": [{"image": {"ref": "registry.example/app:1", "pullSecret": "prod-creds"}}]}});
    let resp = server
        .anonymous_client()
        .patch(server.url(&bundle("team-a", "pulls")))
        .bearer_auth("bob-token")
        .header("content-type", "application/merge-patch+json")
        .body(patch.to_string())
        .send()
        .await
        .unwrap();
    expect_status(resp, 403, "Forbidden").await;

    // The policy file is re-read: granting alice the author role takes effect without a restart.
    let granted = format!(
        "{POLICY}---\napiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{name: alice-authors, namespace: team-a}}\n\
         roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: author}}\nsubjects:\n- {{kind: User, name: alice}}\n"
    );
    write(dir.path(), "policy.yaml", &granted);
    eventually(Duration::from_secs(20), "alice may create after the policy changed", || async {
        let resp = as_user(
            &server,
            "alice-token",
            Method::POST,
            &bundles("team-a"),
            Some(&upload_bundle("team-a", "by-alice")),
        )
        .await;
        match resp.status().as_u16() {
            201 => Ok(()),
            other => Err(format!("HTTP {other}")),
        }
    })
    .await;
    // A policy file that stops parsing keeps the last good policy.
    const NOT_RELOADED: &str = "authorization policy not reloaded; keeping the previous policy";
    let refused = server.log().matches(NOT_RELOADED).count();
    write(dir.path(), "policy.yaml", "kind: [not yaml");
    eventually(Duration::from_secs(20), "the server read the broken policy file", || async {
        match server.log().matches(NOT_RELOADED).count() > refused {
            true => Ok(()),
            false => Err(format!("no {NOT_RELOADED:?} in the log yet")),
        }
    })
    .await;
    assert_eq!(as_user(&server, "alice-token", Method::GET, &bundles("team-a"), None).await.status(), 200);
    let kept = upload_bundle("team-a", "kept");
    let again = as_user(&server, "alice-token", Method::POST, &bundles("team-a"), Some(&kept)).await;
    assert_eq!(again.status(), 201, "the grant of the last good policy holds");
}

/// A CA (PEM, and its issuer).
fn front_proxy_ca() -> (String, Issuer<'static, KeyPair>) {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::default();
    ca_params.distinguished_name.push(DnType::CommonName, "front-proxy-ca");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    (ca.pem(), Issuer::new(ca_params, ca_key))
}

/// A client certificate and key (PEM) from `issuer`.
fn client_cert(issuer: &Issuer<'static, KeyPair>, cn: &str) -> String {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::default();
    params.distinguished_name.push(DnType::CommonName, cn);
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let cert = params.signed_by(&key, issuer).unwrap();
    format!("{}{}", cert.pem(), key.serialize_pem())
}

fn client_with(server: &Server, identity_pem: &str) -> reqwest::Client {
    let ca = reqwest::Certificate::from_pem(&std::fs::read(server.data_dir().join("pki/ca.crt")).unwrap()).unwrap();
    reqwest::Client::builder()
        .tls_certs_only([ca])
        .identity(reqwest::Identity::from_pem(identity_pem.as_bytes()).unwrap())
        .no_proxy()
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn only_the_front_proxy_may_assert_users_in_headers() {
    let dir = tempfile::tempdir().unwrap();
    let (proxy_ca, issuer) = front_proxy_ca();
    let proxy_identity = client_cert(&issuer, "front-proxy-client");
    let ca_path = write(dir.path(), "front-proxy-ca.crt", &proxy_ca);
    let server = Server::start_temp(&[
        "--requestheader-client-ca-file",
        &ca_path,
        "--requestheader-allowed-names",
        "front-proxy-client",
    ]);
    let proxy = client_with(&server, &proxy_identity);
    let as_carol = |client: &reqwest::Client| {
        client
            .get(server.url(&bundles("fp")))
            .header("X-Remote-User", "carol")
            .header("X-Remote-Group", "system:masters")
            .send()
    };
    assert_eq!(as_carol(&proxy).await.unwrap().status(), 200, "the proxy asserts carol, a master");
    // The proxy without headers is nobody in particular.
    let bare = proxy.get(server.url(&bundles("fp"))).send().await.unwrap();
    let status = expect_status(bare, 403, "Forbidden").await;
    assert!(str_at(&status, "/message").contains("system:anonymous"), "{status:#}");
    // The same CA, a name not allowed: its headers are ignored.
    let intruder = client_with(&server, &client_cert(&issuer, "intruder"));
    let status = expect_status(as_carol(&intruder).await.unwrap(), 403, "Forbidden").await;
    assert!(str_at(&status, "/message").contains("system:anonymous"), "{status:#}");
    // A look-alike proxy certificate from another CA gets no identity either.
    let (_, other) = front_proxy_ca();
    let impostor = client_with(&server, &client_cert(&other, "front-proxy-client"));
    match as_carol(&impostor).await {
        Err(_) => {} // refused at the handshake
        Ok(resp) => assert_ne!(resp.status(), 200, "an untrusted certificate asserted a user"),
    }
    // Headers from an anonymous connection are ignored (and stripped).
    let status = expect_status(as_carol(&server.anonymous_client()).await.unwrap(), 403, "Forbidden").await;
    assert!(str_at(&status, "/message").contains("system:anonymous"), "{status:#}");
}

/// kube grants self reviews to authenticated users only; this policy lets anonymous ask who it is.
const ANONYMOUS_WHOAMI: &str = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: whoami}
rules: [{apiGroups: [authentication.k8s.io], resources: [selfsubjectreviews], verbs: [create]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: anonymous-whoami}
roleRef: {kind: ClusterRole, name: whoami}
subjects: [{kind: Group, name: "system:unauthenticated"}]
"#;

/// What a self review of `client` (with `headers`) answers: the HTTP code and the body.
async fn whoami(server: &Server, client: &reqwest::Client, headers: &[(&str, &str)]) -> (u16, Value) {
    let mut request = client
        .post(server.url("/apis/authentication.k8s.io/v1/selfsubjectreviews"))
        .json(&json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let resp = request.send().await.unwrap();
    (resp.status().as_u16(), resp.json().await.unwrap())
}

#[tokio::test(flavor = "multi_thread")]
async fn self_reviews_name_front_proxy_users_and_anonymous_when_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let (proxy_ca, issuer) = front_proxy_ca();
    let ca_path = write(dir.path(), "front-proxy-ca.crt", &proxy_ca);
    let policy = write(dir.path(), "policy.yaml", ANONYMOUS_WHOAMI);
    let server =
        Server::start_temp(&["--requestheader-client-ca-file", &ca_path, "--authorization-policy-file", &policy]);
    let proxy = client_with(&server, &client_cert(&issuer, "front-proxy-client"));
    let asserted = [("X-Remote-User", "carol"), ("X-Remote-Group", "team"), ("X-Remote-Extra-Scopes", "read")];
    let (code, review) = whoami(&server, &proxy, &asserted).await;
    assert_eq!(code, 201, "{review:#}");
    assert_eq!(
        review["status"]["userInfo"],
        json!({"username": "carol", "groups": ["team", "system:authenticated"], "extra": {"scopes": ["read"]}})
    );
    let (code, review) = whoami(&server, &server.anonymous_client(), &[]).await;
    assert_eq!(code, 201, "{review:#}");
    assert_eq!(
        review["status"]["userInfo"],
        json!({"username": "system:anonymous", "groups": ["system:unauthenticated"]})
    );
    // Asking what it may do is not granted to anonymous, as in kube.
    let resp = server
        .anonymous_client()
        .post(server.url("/apis/authorization.k8s.io/v1/selfsubjectrulesreviews"))
        .json(&json!({"spec": {"namespace": "default"}}))
        .send()
        .await
        .unwrap();
    let status = expect_status(resp, 403, "Forbidden").await;
    assert_eq!(
        str_at(&status, "/message"),
        "selfsubjectrulesreviews.authorization.k8s.io is forbidden: User \"system:anonymous\" cannot create resource \
         \"selfsubjectrulesreviews\" in API group \"authorization.k8s.io\" at the cluster scope"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_replaced_serving_certificate_is_used_without_a_restart() {
    let server = Server::start_temp(&[]);
    let pki = server.data_dir().join("pki");
    let ca_pem = std::fs::read_to_string(pki.join("ca.crt")).unwrap();
    let ca_key = KeyPair::from_pem(&std::fs::read_to_string(pki.join("ca.key")).unwrap()).unwrap();
    let issuer = Issuer::from_ca_cert_pem(&ca_pem, ca_key).unwrap();
    let port = server.url("").rsplit(':').next().unwrap().trim_end_matches('/').parse::<u16>().unwrap();
    let client = || {
        let ca = reqwest::Certificate::from_pem(ca_pem.as_bytes()).unwrap();
        reqwest::Client::builder()
            .tls_certs_only([ca])
            .resolve("rotated.stowage.test", std::net::SocketAddr::from(([127, 0, 0, 1], port)))
            .no_proxy()
            .build()
            .unwrap()
    };
    let url = format!("https://rotated.stowage.test:{port}/healthz");
    assert!(client().get(&url).send().await.is_err(), "the first certificate does not name rotated.stowage.test");
    let key = KeyPair::generate().unwrap();
    let params = CertificateParams::new(vec!["rotated.stowage.test".to_owned(), "127.0.0.1".to_owned()]).unwrap();
    let cert = params.signed_by(&key, &issuer).unwrap();
    std::fs::write(pki.join("serving.key"), key.serialize_pem()).unwrap();
    std::fs::write(pki.join("serving.crt"), cert.pem()).unwrap();
    eventually(Duration::from_secs(20), "the new serving certificate is served", || async {
        client().get(&url).send().await.map(drop).map_err(|e| e.to_string())
    })
    .await;
}
