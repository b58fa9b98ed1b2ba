//! The read-only OCI registry view at `/v2/`, spoken to on the wire: the pull and content-discovery
//! checks of the distribution-spec conformance suite (its Go code cannot be fetched here; each
//! check below names the one it reimplements), the spec's error bodies, read-only refusals, the
//! artifacts by format (image config and manifest, registry+v1 labels, Helm's chart artifact),
//! whiteout names refused, and the same RBAC as the content subresource. Real clients (skopeo,
//! podman, ctr, Helm, oras) are in `oci_clients.rs`.

use std::collections::BTreeMap;
use std::io::Read;

use base64::Engine;
use reqwest::{Method, StatusCode};
use serde_json::Value;

use crate::harness::*;
use crate::tarutil::*;

pub const TOKENS: &str = "alice-token,alice,1001,\"readers\"\nbob-token,bob,1002,\"\"\n\
                          dora-token,dora,1004,\"\"\nadmin-token,root,1000,\"system:masters\"\n";

/// alice reads every Bundle's content in team-a; dora only `app`'s; bob nothing.
pub const POLICY: &str = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: content-reader}
rules:
- {apiGroups: [content.stowage.dev], resources: [bundles/content], verbs: [get]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: readers, namespace: team-a}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: content-reader}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: Group, name: readers}]
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

/// A registry client of the view: trusts the server's CA, presents no certificate, sends
/// `Authorization: Basic` with `token` as the password when given one.
pub struct Oci {
    pub http: reqwest::Client,
    pub base: String,
    pub token: Option<String>,
}

impl Oci {
    pub fn new(server: &Server, token: Option<&str>) -> Oci {
        Oci { http: server.anonymous_client(), base: server.url.clone(), token: token.map(str::to_string) }
    }

    pub async fn request(&self, method: Method, path: &str, headers: &[(&str, &str)]) -> reqwest::Response {
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if let Some(token) = &self.token {
            let basic = base64::engine::general_purpose::STANDARD.encode(format!("someone:{token}"));
            request = request.header("authorization", format!("Basic {basic}"));
        }
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request.send().await.expect("registry request")
    }

    pub async fn get(&self, path: &str) -> reqwest::Response {
        self.request(Method::GET, path, &[]).await
    }

    /// A GET that must succeed; its body.
    pub async fn get_ok(&self, path: &str) -> (reqwest::header::HeaderMap, Vec<u8>) {
        let response = self.get(path).await;
        let status = response.status();
        let headers = response.headers().clone();
        let body = response.bytes().await.expect("body").to_vec();
        assert_eq!(status, StatusCode::OK, "GET {path}: {}", String::from_utf8_lossy(&body));
        (headers, body)
    }
}

/// Asserts a distribution-spec error: status, the one error's code; returns its message.
pub async fn expect_oci_error(response: reqwest::Response, status: u16, code: &str) -> String {
    let got = response.status().as_u16();
    let content_type = header(response.headers(), "content-type").unwrap_or("").to_string();
    let body = response.bytes().await.expect("error body");
    assert_eq!(got, status, "status; body {}", String::from_utf8_lossy(&body));
    assert!(content_type.starts_with("application/json"), "error content type {content_type:?}");
    let v = parse_json(&body, "error body");
    assert_eq!(v["errors"][0]["code"], code, "error body {v}");
    let message = v["errors"][0]["message"].as_str().unwrap_or("").to_string();
    assert!(!message.is_empty(), "an error says what was wrong: {v}");
    message
}

/// A plain bundle: manifests, an empty directory, an executable, a symlink, a long path.
pub fn plain_tree() -> (Vec<u8>, Tree) {
    let mut tree = Tree::new();
    tree.insert("manifests/deploy.yaml".into(), file("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n"));
    tree.insert("scripts/run.sh".into(), Node::File { data: b"#!/bin/sh\necho hi\n".to_vec(), exec: true });
    tree.insert("manifests/link.yaml".into(), Node::Symlink("deploy.yaml".into()));
    tree.insert(format!("deep/{}/x.txt", "d".repeat(120)), file("long path\n"));
    let mut tar = build_tar(&tree);
    // An empty directory, which the served tar keeps.
    tar.truncate(tar.len() - 1024);
    tar.extend(raw_entry("empty/", b'5', b"", ""));
    tar.extend(vec![0u8; 1024]);
    (tar, tree)
}

pub const ANNOTATIONS: &str = "annotations:\n  operators.operatorframework.io.bundle.mediatype.v1: registry+v1\n  \
operators.operatorframework.io.bundle.manifests.v1: manifests/\n  operators.operatorframework.io.bundle.metadata.v1: metadata/\n  \
operators.operatorframework.io.bundle.package.v1: demo-operator\n  operators.operatorframework.io.bundle.channels.v1: alpha,stable\n  \
operators.operatorframework.io.bundle.channel.default.v1: stable\n";

/// A registry+v1 bundle: a CSV, a CRD and `metadata/annotations.yaml`.
pub fn registry_v1_tree() -> Tree {
    let mut tree = Tree::new();
    tree.insert(
        "manifests/demo.clusterserviceversion.yaml".into(),
        file("apiVersion: operators.coreos.com/v1alpha1\nkind: ClusterServiceVersion\nmetadata:\n  name: demo-operator.v0.1.0\nspec:\n  version: 0.1.0\n  displayName: Demo\n"),
    );
    tree.insert(
        "manifests/demos.example.com.crd.yaml".into(),
        file("apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  name: demos.example.com\n"),
    );
    tree.insert("metadata/annotations.yaml".into(), file(ANNOTATIONS));
    tree
}

/// A Helm chart (`helm create`'s shape, small), optionally inside a top-level directory.
pub fn chart_tree(prefix: &str, name: &str, version: &str) -> Tree {
    let mut tree = Tree::new();
    tree.insert(
        format!("{prefix}Chart.yaml"),
        file(format!("apiVersion: v2\nname: {name}\ndescription: A demo chart\ntype: application\nversion: {version}\nappVersion: \"1.0\"\n")),
    );
    tree.insert(format!("{prefix}values.yaml"), file("replicaCount: 1\nmessage: hello\n"));
    tree.insert(
        format!("{prefix}templates/configmap.yaml"),
        file("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-cm\ndata:\n  message: {{ .Values.message | quote }}\n"),
    );
    tree.insert(format!("{prefix}templates/NOTES.txt"), file("Installed {{ .Chart.Name }}.\n"));
    tree
}

/// The files of a gzipped (or plain) tar as a tree, paths as they are.
pub fn tree_of_tar(bytes: &[u8]) -> Tree {
    let mut data = Vec::new();
    if bytes.starts_with(&[0x1f, 0x8b]) {
        flate2::read::GzDecoder::new(bytes).read_to_end(&mut data).expect("gunzip layer");
    } else {
        data = bytes.to_vec();
    }
    parse_served_tar(&data)
}

#[tokio::test]
async fn distribution_pull_and_discovery_checks() {
    let server = Server::start_with_users(TOKENS, POLICY);
    let (tar, _tree) = plain_tree();
    server.create_bundle("team-a", "app").await;
    let bundle = server.upload_ok("team-a", "app", tar, None).await;
    let tar_digest = str_at(&bundle, "/status/digest").to_string();
    let content_name = str_at(&bundle, "/status/contentName").to_string();
    let served = server.download(&bundle_content("team-a", "app")).await;
    let oci = Oci::new(&server, Some("alice-token"));

    // end-1: the version check.
    let (headers, body) = oci.get_ok("/v2/").await;
    assert_eq!(header(&headers, "docker-distribution-api-version"), Some("registry/2.0"));
    assert_eq!(parse_json(&body, "/v2/"), serde_json::json!({}));

    // Pull manifests: by tag, then by the digest the tag's response names.
    let (headers, manifest_bytes) = oci.get_ok("/v2/team-a/app/manifests/latest").await;
    assert_eq!(header(&headers, "content-type"), Some("application/vnd.oci.image.manifest.v1+json"));
    let manifest_digest = header(&headers, "docker-content-digest").expect("Docker-Content-Digest").to_string();
    assert_eq!(manifest_digest, digest_of(&manifest_bytes), "the digest header names the bytes sent");
    let manifest = parse_json(&manifest_bytes, "manifest");
    assert_eq!(manifest["schemaVersion"], 2);
    assert_eq!(manifest["layers"].as_array().unwrap().len(), 1);
    assert_eq!(manifest["layers"][0]["mediaType"], "application/vnd.oci.image.layer.v1.tar");
    assert_eq!(manifest["layers"][0]["digest"], tar_digest.as_str(), "the layer is the served tar");
    assert_eq!(manifest["layers"][0]["size"], served.len() as u64);
    let (_, by_digest) = oci.get_ok(&format!("/v2/team-a/app/manifests/{manifest_digest}")).await;
    assert_eq!(by_digest, manifest_bytes);
    let (_, by_revision) = oci.get_ok(&format!("/v2/team-a/app/manifests/{content_name}")).await;
    assert_eq!(by_revision, manifest_bytes, "the revision's own tag names the same manifest");
    for path in ["/v2/team-a/app/manifests/latest".to_string(), format!("/v2/team-a/app/manifests/{manifest_digest}")] {
        let head = oci.request(Method::HEAD, &path, &[]).await;
        assert_eq!(head.status(), StatusCode::OK, "HEAD {path}");
        assert_eq!(
            header(head.headers(), "content-length"),
            Some(manifest_bytes.len().to_string().as_str()),
            "HEAD {path}"
        );
        assert_eq!(header(head.headers(), "docker-content-digest"), Some(manifest_digest.as_str()));
        assert!(head.bytes().await.unwrap().is_empty());
    }
    let missing = "sha256:0000000000000000000000000000000000000000000000000000000000000000";
    expect_oci_error(oci.get("/v2/team-a/app/manifests/no-such-tag").await, 404, "MANIFEST_UNKNOWN").await;
    expect_oci_error(oci.get(&format!("/v2/team-a/app/manifests/{missing}")).await, 404, "MANIFEST_UNKNOWN").await;
    let head = oci.request(Method::HEAD, "/v2/team-a/app/manifests/no-such-tag", &[]).await;
    assert_eq!(head.status(), StatusCode::NOT_FOUND);

    // Pull blobs: the config, then the layer (whole, ranged, HEAD).
    let config_digest = manifest["config"]["digest"].as_str().unwrap().to_string();
    assert_eq!(manifest["config"]["mediaType"], "application/vnd.oci.image.config.v1+json");
    let (headers, config_bytes) = oci.get_ok(&format!("/v2/team-a/app/blobs/{config_digest}")).await;
    assert_eq!(digest_of(&config_bytes), config_digest);
    assert_eq!(header(&headers, "docker-content-digest"), Some(config_digest.as_str()));
    assert_eq!(manifest["config"]["size"], config_bytes.len() as u64);
    let config = parse_json(&config_bytes, "config");
    assert_eq!(config["os"], "linux");
    assert_eq!(config["rootfs"], serde_json::json!({"type": "layers", "diff_ids": [tar_digest]}));
    let (headers, layer) = oci.get_ok(&format!("/v2/team-a/app/blobs/{tar_digest}")).await;
    assert_eq!(layer, served, "the layer is byte for byte the served tar");
    assert_eq!(header(&headers, "docker-content-digest"), Some(tar_digest.as_str()));
    let ranged =
        oci.request(Method::GET, &format!("/v2/team-a/app/blobs/{tar_digest}"), &[("range", "bytes=512-1023")]).await;
    assert_eq!(ranged.status(), StatusCode::PARTIAL_CONTENT);
    assert_eq!(ranged.bytes().await.unwrap().as_ref(), &served[512..1024]);
    let head = oci.request(Method::HEAD, &format!("/v2/team-a/app/blobs/{tar_digest}"), &[]).await;
    assert_eq!(head.status(), StatusCode::OK);
    assert_eq!(header(head.headers(), "content-length"), Some(served.len().to_string().as_str()));
    expect_oci_error(oci.get(&format!("/v2/team-a/app/blobs/{missing}")).await, 404, "BLOB_UNKNOWN").await;
    let head = oci.request(Method::HEAD, &format!("/v2/team-a/app/blobs/{missing}"), &[]).await;
    assert_eq!(head.status(), StatusCode::NOT_FOUND);
    expect_oci_error(oci.get("/v2/team-a/app/blobs/sha256:xyz").await, 400, "DIGEST_INVALID").await;
    let message = expect_oci_error(oci.get("/v2/team-a/nothing/manifests/latest").await, 404, "NAME_UNKNOWN").await;
    assert!(message.contains("team-a/nothing"), "{message}");
    expect_oci_error(oci.get("/v2/team-a/x/y/manifests/latest").await, 404, "NAME_UNKNOWN").await;

    // Content discovery: the tag list, and its paging.
    let (_, body) = oci.get_ok("/v2/team-a/app/tags/list").await;
    let list = parse_json(&body, "tags");
    assert_eq!(list["name"], "team-a/app");
    let tags: Vec<String> = serde_json::from_value(list["tags"].clone()).unwrap();
    let mut expected = vec!["latest".to_string(), content_name.clone()];
    expected.sort();
    assert_eq!(tags, expected);
    let response = oci.get("/v2/team-a/app/tags/list?n=1").await;
    let link = header(response.headers(), "link").expect("a Link to the next page").to_string();
    let first: Value = response.json().await.unwrap();
    assert_eq!(first["tags"], serde_json::json!([expected[0]]));
    assert!(link.contains(&format!("last={}", expected[0])) && link.ends_with("rel=\"next\""), "{link}");
    let (_, body) = oci.get_ok(&format!("/v2/team-a/app/tags/list?n=1&last={}", expected[0])).await;
    assert_eq!(parse_json(&body, "page 2")["tags"], serde_json::json!([expected[1]]));
    let (_, body) = oci.get_ok(&format!("/v2/team-a/app/tags/list?last={}", expected[1])).await;
    assert_eq!(parse_json(&body, "past the end")["tags"], serde_json::json!([]));

    // Read-only: pushes and deletes are UNSUPPORTED, and nothing changes.
    for (method, path) in [
        (Method::PUT, "/v2/team-a/app/manifests/latest".to_string()),
        (Method::DELETE, format!("/v2/team-a/app/manifests/{manifest_digest}")),
        (Method::POST, "/v2/team-a/app/blobs/uploads/".to_string()),
        (Method::DELETE, format!("/v2/team-a/app/blobs/{tar_digest}")),
        (Method::PATCH, "/v2/team-a/app/blobs/uploads/x".to_string()),
    ] {
        let message = expect_oci_error(oci.request(method.clone(), &path, &[]).await, 405, "UNSUPPORTED").await;
        assert!(message.contains("read-only"), "{method} {path}: {message}");
    }
    let (_, again) = oci.get_ok("/v2/team-a/app/manifests/latest").await;
    assert_eq!(again, manifest_bytes);
}

#[tokio::test]
async fn the_same_rbac_as_the_content_subresource() {
    let server = Server::start_with_users(TOKENS, POLICY);
    for (ns, name) in [("team-a", "app"), ("team-a", "other"), ("team-b", "app")] {
        server.create_bundle(ns, name).await;
        server.upload_ok(ns, name, build_tar(&chart_tree("", name, "1.0.0")), None).await;
    }
    // No credentials: a challenge the clients follow.
    let anonymous = Oci::new(&server, None);
    for path in ["/v2/", "/v2/team-a/app/manifests/latest", "/v2/_catalog"] {
        let response = anonymous.get(path).await;
        assert_eq!(header(response.headers(), "www-authenticate"), Some("Basic realm=\"stowage\""), "{path}");
        expect_oci_error(response, 401, "UNAUTHORIZED").await;
    }
    expect_oci_error(Oci::new(&server, Some("wrong-token")).get("/v2/").await, 401, "UNAUTHORIZED").await;
    // A bearer token works as well as Basic.
    let bearer = server
        .anonymous_client()
        .get(server.url("/v2/team-a/app/tags/list"))
        .bearer_auth("alice-token")
        .send()
        .await
        .unwrap();
    assert_eq!(bearer.status(), StatusCode::OK);

    // bob may read nothing: DENIED, for a Bundle that exists and one that does not alike.
    let bob = Oci::new(&server, Some("bob-token"));
    assert_eq!(bob.get("/v2/").await.status(), StatusCode::OK, "bob is authenticated");
    for path in ["/v2/team-a/app/manifests/latest", "/v2/team-a/nothing/manifests/latest", "/v2/team-a/app/tags/list"] {
        let message = expect_oci_error(bob.get(path).await, 403, "DENIED").await;
        assert!(message.contains("bob"), "{message}");
    }
    // alice reads team-a, not team-b.
    let alice = Oci::new(&server, Some("alice-token"));
    alice.get_ok("/v2/team-a/other/manifests/1.0.0").await;
    expect_oci_error(alice.get("/v2/team-b/app/manifests/latest").await, 403, "DENIED").await;
    // dora is bound by resourceNames to team-a/app.
    let dora = Oci::new(&server, Some("dora-token"));
    dora.get_ok("/v2/team-a/app/manifests/latest").await;
    expect_oci_error(dora.get("/v2/team-a/other/manifests/latest").await, 403, "DENIED").await;

    // The catalog lists only what the caller may read, and pages.
    let catalog = |oci: Oci, query: &'static str| async move {
        let (headers, body) = oci.get_ok(&format!("/v2/_catalog{query}")).await;
        (parse_json(&body, "catalog")["repositories"].clone(), header(&headers, "link").map(str::to_string))
    };
    assert_eq!(catalog(Oci::new(&server, Some("dora-token")), "").await.0, serde_json::json!(["team-a/app"]));
    assert_eq!(catalog(Oci::new(&server, Some("bob-token")), "").await.0, serde_json::json!([]));
    assert_eq!(
        catalog(Oci::new(&server, Some("alice-token")), "").await.0,
        serde_json::json!(["team-a/app", "team-a/other"])
    );
    let (all, _) = catalog(Oci::new(&server, Some("admin-token")), "").await;
    assert_eq!(all, serde_json::json!(["team-a/app", "team-a/other", "team-b/app"]));
    let (page, link) = catalog(Oci::new(&server, Some("admin-token")), "?n=2").await;
    assert_eq!(page, serde_json::json!(["team-a/app", "team-a/other"]));
    assert!(link.expect("next page").contains("last=team-a/other"));
    let (rest, link) = catalog(Oci::new(&server, Some("admin-token")), "?n=2&last=team-a/other").await;
    assert_eq!((rest, link), (serde_json::json!(["team-b/app"]), None));
}

#[tokio::test]
async fn artifacts_by_format() {
    let server = Server::start_with_users(TOKENS, POLICY);
    let oci = Oci::new(&server, Some("admin-token"));

    // registry+v1: the bundle's annotations are the image's labels (a valid bundle image).
    server.create_bundle("team-a", "operator").await;
    let b = server.upload_ok("team-a", "operator", build_tar(&registry_v1_tree()), None).await;
    assert_eq!(str_at(&b, "/status/format"), "registry-v1");
    let (_, manifest) = oci.get_ok("/v2/team-a/operator/manifests/latest").await;
    let manifest = parse_json(&manifest, "manifest");
    let (_, config) =
        oci.get_ok(&format!("/v2/team-a/operator/blobs/{}", manifest["config"]["digest"].as_str().unwrap())).await;
    let labels: BTreeMap<String, String> =
        serde_json::from_value(parse_json(&config, "config")["config"]["Labels"].clone()).unwrap();
    assert_eq!(labels["operators.operatorframework.io.bundle.mediatype.v1"], "registry+v1");
    assert_eq!(labels["operators.operatorframework.io.bundle.manifests.v1"], "manifests/");
    assert_eq!(labels["operators.operatorframework.io.bundle.metadata.v1"], "metadata/");
    assert_eq!(labels["operators.operatorframework.io.bundle.package.v1"], "demo-operator");
    assert_eq!(labels["operators.operatorframework.io.bundle.channels.v1"], "alpha,stable");

    // A tree with a name a layer would take for a whiteout is refused, saying which.
    server.create_bundle("team-a", "whiteouts").await;
    let mut tree = plain_tree().1;
    tree.insert("manifests/.wh.secret".into(), file("x"));
    server.upload_ok("team-a", "whiteouts", build_tar(&tree), None).await;
    let message =
        expect_oci_error(oci.get("/v2/team-a/whiteouts/manifests/latest").await, 404, "MANIFEST_UNKNOWN").await;
    assert!(message.contains("manifests/.wh.secret") && message.contains("whiteout"), "{message}");

    // Helm: the chart artifact, tagged with the chart version (`+` as `_`), laid out as
    // `helm package` lays it out, even when the chart sits in a top-level directory.
    server.create_bundle("team-a", "chart").await;
    let chart = chart_tree("wrapped/", "demo", "1.2.3+build.7");
    let b = server.upload_ok("team-a", "chart", build_tar(&chart), None).await;
    assert_eq!(str_at(&b, "/status/format"), "helm");
    let (_, body) = oci.get_ok("/v2/team-a/chart/tags/list").await;
    let tags = parse_json(&body, "tags")["tags"].clone();
    assert!(tags.as_array().unwrap().contains(&Value::from("1.2.3_build.7")), "{tags}");
    let (headers, manifest_bytes) = oci.get_ok("/v2/team-a/chart/manifests/1.2.3_build.7").await;
    let manifest_digest = header(&headers, "docker-content-digest").unwrap().to_string();
    let manifest = parse_json(&manifest_bytes, "helm manifest");
    assert_eq!(manifest["config"]["mediaType"], "application/vnd.cncf.helm.config.v1+json");
    assert_eq!(manifest["layers"][0]["mediaType"], "application/vnd.cncf.helm.chart.content.v1.tar+gzip");
    let (_, config) =
        oci.get_ok(&format!("/v2/team-a/chart/blobs/{}", manifest["config"]["digest"].as_str().unwrap())).await;
    let config = parse_json(&config, "helm config");
    assert_eq!((config["name"].as_str(), config["version"].as_str()), (Some("demo"), Some("1.2.3+build.7")));
    let layer_digest = manifest["layers"][0]["digest"].as_str().unwrap().to_string();
    let (_, layer) = oci.get_ok(&format!("/v2/team-a/chart/blobs/{layer_digest}")).await;
    assert_eq!(digest_of(&layer), layer_digest);
    assert_eq!(manifest["layers"][0]["size"], layer.len() as u64);
    let expected: Tree =
        chart.iter().map(|(path, node)| (path.replacen("wrapped/", "demo/", 1), node.clone())).collect();
    assert_trees_equal(&expected, &tree_of_tar(&layer), "the chart layer");
    let ranged =
        oci.request(Method::GET, &format!("/v2/team-a/chart/blobs/{layer_digest}"), &[("range", "bytes=10-99")]).await;
    assert_eq!(ranged.status(), StatusCode::PARTIAL_CONTENT);
    assert_eq!(ranged.bytes().await.unwrap().as_ref(), &layer[10..100]);

    // Digests are stable: the same after a restart.
    let mut server = server;
    server.restart();
    let oci = Oci::new(&server, Some("admin-token"));
    let (headers, again) = oci.get_ok("/v2/team-a/chart/manifests/1.2.3_build.7").await;
    assert_eq!((header(&headers, "docker-content-digest"), again), (Some(manifest_digest.as_str()), manifest_bytes));
    let (_, layer_again) = oci.get_ok(&format!("/v2/team-a/chart/blobs/{layer_digest}")).await;
    assert_eq!(layer_again, layer);
}
