//! `kubectl auth whoami` and `kubectl auth can-i` (with `--list`) against a standalone server, for
//! the admin kubeconfig and for token users of an RBAC policy file, printing what kube-apiserver
//! prints for the same RBAC; the reviews' refusals of bad bodies; `kubectl version` without a
//! version-skew warning; and a delegated server, which leaves the review groups to the cluster.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::{json, Value};

use crate::harness::*;

const TOKENS: &str = "alice-token,alice,1001,\"readers\"\nbob-token,bob,1002,\"\"\n";

/// The README's policy: group `readers` reads Bundles and their content in `default`.
pub(crate) const POLICY: &str = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: bundle-reader}
rules:
- {apiGroups: [content.stowage.dev], resources: [bundles, bundles/content], verbs: [get, list, watch]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: readers, namespace: default}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: bundle-reader}
subjects: [{kind: Group, name: readers}]
"#;

/// A server with the token file and the policy.
fn start() -> Server {
    Server::start_with_users(TOKENS, POLICY)
}

/// The real kubectl with `kubeconfig` (each request bounded by kubectl's own timeout).
pub(crate) fn kubectl(kubeconfig: &Path, args: &[&str]) -> Output {
    let cache = tempfile::tempdir().unwrap();
    Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .arg("--cache-dir")
        .arg(cache.path())
        .arg("--request-timeout=30s")
        .args(args)
        .env_remove("KUBECONFIG")
        .env_remove("HTTPS_PROXY")
        .env_remove("https_proxy")
        .output()
        .expect("run kubectl")
}

/// stdout of a kubectl run that must succeed.
pub(crate) fn ok(kubeconfig: &Path, args: &[&str]) -> String {
    let out = kubectl(kubeconfig, args);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "kubectl {args:?} failed ({}):\n{stdout}\n{stderr}", out.status);
    stdout.into_owned()
}

/// `kubectl auth can-i ARGS`: its answer line and whether it exited 0.
fn can_i(kubeconfig: &Path, args: &[&str]) -> (String, bool) {
    let out = kubectl(kubeconfig, &[&["auth", "can-i"], args].concat());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("rror") && !stderr.contains("arning"), "can-i {args:?}: {stderr}");
    (String::from_utf8_lossy(&out.stdout).trim().to_owned(), out.status.success())
}

/// The rows of `kubectl auth can-i --list`, columns split on runs of spaces.
fn rows(table: &str) -> Vec<Vec<String>> {
    table.lines().map(|l| l.split("  ").map(str::trim).filter(|c| !c.is_empty()).map(str::to_owned).collect()).collect()
}

fn has_row(table: &str, row: &[&str]) -> bool {
    rows(table).iter().any(|r| r == row)
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_auth_whoami_for_the_admin_and_token_users() {
    let server = start();
    let alice = server.token_kubeconfig("alice", "default");
    let whoami = ok(&alice, &["auth", "whoami"]);
    report(&format!("kubectl auth whoami (alice):\n{whoami}"));
    assert!(has_row(&whoami, &["Username", "alice"]), "{whoami}");
    assert!(has_row(&whoami, &["UID", "1001"]), "{whoami}");
    assert!(has_row(&whoami, &["Groups", "[readers system:authenticated]"]), "{whoami}");
    let review: Value = serde_json::from_str(&ok(&alice, &["auth", "whoami", "-o", "json"])).unwrap();
    assert_eq!(review["kind"], "SelfSubjectReview");
    assert_eq!(
        review["status"]["userInfo"],
        json!({"username": "alice", "uid": "1001", "groups": ["readers", "system:authenticated"]})
    );
    assert!(str_at(&review, "/metadata/creationTimestamp").ends_with('Z'), "{review:#}");

    let admin = ok(&server.kubeconfig(), &["auth", "whoami"]);
    assert!(has_row(&admin, &["Username", "stowage-admin"]), "{admin}");
    assert!(has_row(&admin, &["Groups", "[system:masters system:authenticated]"]), "{admin}");
    // bob is bound to nothing and still learns who he is.
    let bob = server.token_kubeconfig("bob", "default");
    assert!(has_row(&ok(&bob, &["auth", "whoami"]), &["Username", "bob"]));
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_auth_can_i_answers_as_the_policy_decides() {
    let server = start();
    let alice = server.token_kubeconfig("alice", "default");
    // Namespace `default` from the kubeconfig; the RoleBinding grants nothing elsewhere.
    assert_eq!(can_i(&alice, &["get", "bundles"]), ("yes".into(), true));
    assert_eq!(can_i(&alice, &["list", "bundles", "-n", "default"]), ("yes".into(), true));
    assert_eq!(can_i(&alice, &["get", "bundles", "-n", "other"]), ("no".into(), false));
    assert_eq!(can_i(&alice, &["get", "bundles", "-A"]), ("no".into(), false));
    assert_eq!(can_i(&alice, &["get", "bundles", "--subresource=content"]), ("yes".into(), true));
    assert_eq!(can_i(&alice, &["update", "bundles", "--subresource=content"]), ("no".into(), false));
    assert_eq!(can_i(&alice, &["create", "bundles"]), ("no".into(), false));
    assert_eq!(can_i(&alice, &["get", "bundlecontents"]), ("no".into(), false));
    assert_eq!(can_i(&alice, &["get", "/apis"]), ("yes".into(), true));
    assert_eq!(can_i(&alice, &["get", "/metrics"]), ("no".into(), false));
    let bob = server.token_kubeconfig("bob", "default");
    assert_eq!(can_i(&bob, &["get", "bundles"]), ("no".into(), false));
    assert_eq!(can_i(&server.kubeconfig(), &["delete", "bundles", "-A"]), ("yes".into(), true));
    // kubectl's -q for scripts: the exit code alone.
    assert!(kubectl(&alice, &["auth", "can-i", "get", "bundles", "-q"]).status.success());

    // The same answers `kubectl get` gets.
    ok(&alice, &["get", "bundles"]);
    assert!(!kubectl(&alice, &["get", "bundles", "-n", "other"]).status.success());
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_auth_can_i_list_shows_the_rules_granted() {
    let server = start();
    let alice = server.token_kubeconfig("alice", "default");
    let list = ok(&alice, &["auth", "can-i", "--list"]);
    report(&format!("kubectl auth can-i --list (alice):\n{list}"));
    assert!(has_row(&list, &["Resources", "Non-Resource URLs", "Resource Names", "Verbs"]), "{list}");
    assert!(has_row(&list, &["bundles.content.stowage.dev", "[]", "[]", "[get list watch]"]), "{list}");
    assert!(has_row(&list, &["bundles.content.stowage.dev/content", "[]", "[]", "[get list watch]"]), "{list}");
    // What every authenticated user may do, as kube's bootstrap policy lists it.
    for review in [
        "selfsubjectreviews.authentication.k8s.io",
        "selfsubjectaccessreviews.authorization.k8s.io",
        "selfsubjectrulesreviews.authorization.k8s.io",
    ] {
        assert!(has_row(&list, &[review, "[]", "[]", "[create]"]), "{review}: {list}");
    }
    assert!(has_row(&list, &["[/apis]", "[]", "[get]"]), "{list}");
    assert!(!list.contains("[*]"), "alice may not do everything: {list}");
    // Elsewhere only what everybody may do.
    let other = ok(&alice, &["auth", "can-i", "--list", "-n", "other"]);
    assert!(!other.contains("bundles"), "{other}");
    assert!(other.contains("selfsubjectrulesreviews.authorization.k8s.io"), "{other}");
    // The admin may do everything.
    let admin = ok(&server.kubeconfig(), &["auth", "can-i", "--list"]);
    assert!(has_row(&admin, &["*.*", "[]", "[]", "[*]"]), "{admin}");
    assert!(has_row(&admin, &["[*]", "[]", "[*]"]), "{admin}");
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_version_does_not_warn_about_skew() {
    let server = Server::start_temp(&[]);
    let out = kubectl(&server.kubeconfig(), &["version"]);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    report(&format!("kubectl version:\n{stdout}{stderr}"));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(!stderr.contains("WARNING") && !stdout.contains("WARNING"), "{stdout}\n{stderr}");
    assert!(stdout.contains(&format!("Server Version: v1.33.0+stowage.{}", env!("CARGO_PKG_VERSION"))), "{stdout}");
    // kubectl's rule, whichever kubectl this is: same major, minors at most one apart.
    let versions: Value =
        serde_json::from_slice(&kubectl(&server.kubeconfig(), &["version", "-o", "json"]).stdout).unwrap();
    let minor = |side: &str| str_at(&versions, &format!("/{side}/minor")).trim_end_matches('+').parse::<i64>().unwrap();
    assert_eq!(str_at(&versions, "/clientVersion/major"), str_at(&versions, "/serverVersion/major"));
    assert!((minor("clientVersion") - minor("serverVersion")).abs() <= 1, "{versions:#}");
}

/// POSTs `body` (JSON) to a review as alice.
async fn review(server: &Server, resource: &str, body: &str, content_type: &str) -> reqwest::Response {
    let group = if resource == "selfsubjectreviews" { "authentication.k8s.io" } else { "authorization.k8s.io" };
    server
        .anonymous_client()
        .post(server.url(&format!("/apis/{group}/v1/{resource}")))
        .bearer_auth("alice-token")
        .header("content-type", content_type)
        .body(body.to_owned())
        .send()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn reviews_refuse_bad_bodies_in_plain_words() {
    let server = start();
    const SSAR: &str = "selfsubjectaccessreviews";
    let json = "application/json";
    // Neither kind of attributes, or both: 422 naming the field.
    let neither = review(&server, SSAR, r#"{"spec": {}}"#, json).await;
    let status = expect_status(neither, 422, "Invalid").await;
    assert_eq!(str_at(&status, "/details/causes/0/field"), "spec.resourceAttributes", "{status:#}");
    assert!(str_at(&status, "/message").starts_with("SelfSubjectAccessReview.authorization.k8s.io \"\" is invalid"));
    let both = r#"{"spec": {"resourceAttributes": {"verb": "get"}, "nonResourceAttributes": {"path": "/x"}}}"#;
    let status = expect_status(review(&server, SSAR, both, json).await, 422, "Invalid").await;
    assert_eq!(str_at(&status, "/details/causes/0/field"), "spec.nonResourceAttributes");
    let named = r#"{"metadata": {"name": "x"}, "spec": {"nonResourceAttributes": {"path": "/x", "verb": "get"}}}"#;
    expect_status(review(&server, SSAR, named, json).await, 422, "Invalid").await;
    // Not a review at all: 400, and nothing of the body repeated.
    for body in ["hunter2", r#"["hunter2"]"#, r#"{"spec": {"resourceAttributes": {"verb": ["hunter2"]}}}"#] {
        let status = expect_status(review(&server, SSAR, body, json).await, 400, "BadRequest").await;
        assert!(!str_at(&status, "/message").contains("hunter2"), "{status:#}");
    }
    let other_kind = r#"{"apiVersion": "v1", "kind": "Pod", "spec": {}}"#;
    let status = expect_status(review(&server, SSAR, other_kind, json).await, 400, "BadRequest").await;
    assert!(str_at(&status, "/message").contains("takes a SelfSubjectAccessReview"), "{status:#}");
    expect_status(review(&server, SSAR, "<a/>", "text/xml").await, 415, "UnsupportedMediaType").await;
    expect_status(
        review(&server, SSAR, "k8s\0hunter2", "application/vnd.kubernetes.protobuf").await,
        400,
        "BadRequest",
    )
    .await;
    // A rules review is for one namespace.
    let status =
        expect_status(review(&server, "selfsubjectrulesreviews", r#"{"spec": {}}"#, json).await, 400, "BadRequest")
            .await;
    assert!(str_at(&status, "/message").contains("spec.namespace is required"), "{status:#}");

    // Good bodies, JSON and YAML, without apiVersion and kind (the URL says what is meant).
    let resp =
        review(&server, SSAR, r#"{"spec": {"nonResourceAttributes": {"path": "/apis", "verb": "get"}}}"#, json).await;
    assert_eq!(resp.status(), 201);
    let answer: Value = resp.json().await.unwrap();
    assert_eq!((&answer["kind"], &answer["status"]["allowed"]), (&json!("SelfSubjectAccessReview"), &json!(true)));
    let yaml = "spec:\n  resourceAttributes: {verb: create, group: content.stowage.dev, resource: bundles, namespace: default}\n";
    let answer: Value = review(&server, SSAR, yaml, "application/yaml").await.json().await.unwrap();
    assert_eq!(answer["status"], json!({"allowed": false}), "{answer:#}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_delegated_server_leaves_the_review_groups_to_the_cluster() {
    use crate::stub_apiserver::StubApiServer;
    let stub = StubApiServer::start();
    stub.publish_pki(&[]);
    let server = Server::start_temp(&["--kubeconfig", stub.kubeconfig().to_str().unwrap()]);
    // A cluster admin (system:masters needs no SubjectAccessReview).
    let key = stub.client_ca().client_cert("root", &["system:masters"]);
    let ca = std::fs::read(server.data_dir().join("pki/ca.crt")).unwrap();
    let root = reqwest::Client::builder()
        .tls_certs_only([reqwest::Certificate::from_pem(&ca).unwrap()])
        .identity(reqwest::Identity::from_pem(format!("{}{}", key.cert_pem, key.key_pem).as_bytes()).unwrap())
        .no_proxy()
        .build()
        .unwrap();
    let groups: Value = root.get(server.url("/apis")).send().await.unwrap().json().await.unwrap();
    let names: Vec<&str> = groups["groups"].as_array().unwrap().iter().map(|g| g["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["content.stowage.dev"], "{groups:#}");
    let review = root
        .post(server.url("/apis/authorization.k8s.io/v1/selfsubjectrulesreviews"))
        .json(&json!({"spec": {"namespace": "default"}}))
        .send()
        .await
        .unwrap();
    expect_status(review, 404, "NotFound").await;
}
