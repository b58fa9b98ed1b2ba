//! Bundles whose content is an OCI image or a Helm chart artifact in a real registry, end to end:
//! `kubectl apply` + `kubectl wait`, platform selection, a pull Secret read from the cluster (the
//! stand-in kube-apiserver) in delegated mode, a moved tag followed only with `pollInterval`, and
//! a tampered blob that stores nothing.

use std::time::Duration;

use serde_json::json;

use crate::harness::*;
use crate::kubectl::{write_yaml, Kubectl};
use crate::registry::{chart_tgz, Layer, Registry};
use crate::stub_apiserver::StubApiServer;
use crate::tarutil::{assert_trees_equal, file, parse_served_tar, tree_from_dir};
use crate::unpack::{condition, corpus_tree, create, served, wait_reason};

const NS: &str = "unpack";

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_waits_for_an_image_bundle_and_a_moved_tag_is_followed_only_when_polled() {
    let registry = Registry::start().await;
    let valid = corpus_tree("rukpak-testdata/registry/valid");
    let amd = registry.push_image("bundles/etcd", "amd64", &[Layer::gzip_tree(&valid)], "linux/amd64").await;
    let mut arm_tree = valid.clone();
    arm_tree
        .insert("manifests/arm-only.yaml".into(), file("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: arm\n"));
    let arm = registry.push_image("bundles/etcd", "arm64", &[Layer::gzip_tree(&arm_tree)], "linux/arm64").await;
    registry.push_index("bundles/etcd", "v1", &[("linux/amd64", &amd), ("linux/arm64", &arm)]).await;
    let server = Server::start_temp(&["--insecure-registry", &registry.host()]);
    let k = Kubectl::new(&server);
    let files = tempfile::tempdir().unwrap();
    let reference = registry.reference("bundles/etcd", "v1");
    let yaml = format!(
        "apiVersion: content.stowage.dev/v1alpha1\nkind: Bundle\nmetadata: {{name: etcd, namespace: {NS}}}\n\
         spec:\n  sources:\n  - image: {{ref: \"{reference}\", platform: linux/arm64}}\n  format: registry-v1\n\
         ---\napiVersion: content.stowage.dev/v1alpha1\nkind: Bundle\nmetadata: {{name: polled, namespace: {NS}}}\n\
         spec:\n  sources:\n  - image: {{ref: \"{reference}\"}}\n  pollInterval: 1s\n"
    );
    let path = write_yaml(files.path(), "bundles.yaml", &yaml);
    k.ok(&["apply", "-f", path.to_str().unwrap()]);
    k.ok(&["wait", "--for=condition=Unpacked", "-n", NS, "bundle/etcd", "bundle/polled", "--timeout=60s"]);
    let etcd = server.get_json(&bundle(NS, "etcd")).await;
    assert_unpacked(&etcd);
    assert_eq!(etcd["status"]["resolvedSources"][0]["image"]["manifest"], arm.digest.as_str(), "{etcd:#}");
    assert_trees_equal(&arm_tree, &served(&server, "etcd").await, "the arm64 image");
    assert_trees_equal(&valid, &served(&server, "polled").await, "the default platform");
    let table = k.ok(&["get", "bundles", "-n", NS]);
    assert!(
        table.lines().any(|l| l.starts_with("etcd") && l.contains("registry-v1") && l.contains("Unpacked")),
        "{table}"
    );

    // Move the tag: only the polled Bundle follows, and keeps its old revision.
    let etcd_before = server.get_json(&bundle(NS, "etcd")).await;
    let polled_before = server.get_json(&bundle(NS, "polled")).await;
    let mut v2 = valid.clone();
    v2.insert("manifests/v2.yaml".into(), file("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: v2\n"));
    let moved = registry.push_image("bundles/etcd", "v2-amd64", &[Layer::gzip_tree(&v2)], "linux/amd64").await;
    registry.move_tag("bundles/etcd", "v1", &moved).await;
    let polled = eventually(Duration::from_secs(60), "polled Bundle follows the moved tag", || async {
        let b = server.get_json(&bundle(NS, "polled")).await;
        match b["status"]["resolvedSources"][0]["image"]["digest"] == moved.digest.as_str()
            && b["status"]["phase"] == "Unpacked"
        {
            true => Ok(b),
            false => Err(format!("{}", b["status"])),
        }
    })
    .await;
    assert_trees_equal(&v2, &served(&server, "polled").await, "new revision served");
    let names = server.bundlecontent_names(NS).await;
    for old in [&polled_before, &polled] {
        assert!(names.contains(&str_at(old, "/status/contentName").to_owned()), "{names:?}");
    }
    // Over two more of its neighbour's polls (1 s), nothing moves it: it is not polled at all.
    holds_for(Duration::from_secs(2), Duration::from_millis(100), "no pollInterval: stays pinned", || async {
        let etcd_after = server.get_json(&bundle(NS, "etcd")).await;
        match etcd_after["status"] == etcd_before["status"] {
            true => Ok(()),
            false => Err(format!("{:#}", etcd_after["status"])),
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn helm_chart_artifacts_and_tampered_blobs() {
    let registry = Registry::start().await;
    let chart_dir = corpus().join("kube-prometheus-stack/88.5.3");
    let tgz = chart_tgz(&chart_dir, "kube-prometheus-stack");
    registry.push_helm_chart("charts/kps", "88.5.3", &tgz, "kube-prometheus-stack", "88.5.3").await;
    let tampered = registry
        .push_image(
            "bundles/plain",
            "v1",
            &[Layer::gzip_tree(&corpus_tree("rukpak-testdata/plain-v0/valid"))],
            "linux/amd64",
        )
        .await;
    let server = Server::start_temp(&["--insecure-registry", &registry.host()]);

    create(&server, "kps", json!({"sources": [{"image": {"ref": registry.reference("charts/kps", "88.5.3")}}]})).await;
    let b = wait_reason(&server, "kps", "Unpacked").await;
    assert_eq!(b["status"]["format"], "helm", "{b:#}");
    assert_eq!(b["status"]["formatDetails"]["chart"], "kube-prometheus-stack");
    assert_eq!(b["status"]["formatDetails"]["version"], "88.5.3");
    let chart: crate::tarutil::Tree = tree_from_dir(&chart_dir)
        .into_iter()
        .map(|(path, node)| (format!("kube-prometheus-stack/{path}"), node))
        .collect();
    let data = server.download(&bundle_content(NS, "kps")).await;
    assert_trees_equal(&chart, &parse_served_tar(&data), "chart artifact");

    // A blob changed in the registry after the push: caught, nothing stored, not retried.
    let manifest: serde_json::Value = {
        let url = format!("http://{}/v2/bundles/plain/manifests/{}", registry.host(), tampered.digest);
        let resp = reqwest::Client::new()
            .get(url)
            .header("Accept", "application/vnd.oci.image.manifest.v1+json")
            .send()
            .await
            .unwrap();
        resp.json().await.unwrap()
    };
    registry.tamper_blob(manifest["layers"][0]["digest"].as_str().unwrap());
    create(
        &server,
        "tampered",
        json!({"sources": [{"image": {"ref": registry.pinned("bundles/plain", &tampered.digest)}}]}),
    )
    .await;
    let b = wait_reason(&server, "tampered", "DigestMismatch").await;
    assert_eq!(condition(&b, "Unpacked")["status"], "False");
    let names = server.bundlecontent_names(NS).await;
    assert_eq!(names, vec![str_at(&server.get_json(&bundle(NS, "kps")).await, "/status/contentName").to_owned()]);
}

#[tokio::test(flavor = "multi_thread")]
async fn pull_secrets_are_read_from_the_cluster_in_delegated_mode() {
    let registry = Registry::start_with_auth("puller", "s3cret").await;
    let tree = corpus_tree("rukpak-testdata/plain-v0/valid");
    registry.push_image("private/app", "v1", &[Layer::gzip_tree(&tree)], "linux/amd64").await;
    let stub = StubApiServer::start();
    stub.publish_pki(&["front-proxy-client"]);
    stub.put_secret(
        NS,
        "pull",
        "kubernetes.io/dockerconfigjson",
        &[(".dockerconfigjson", &registry.docker_config("puller", "s3cret"))],
    );
    stub.put_secret(
        NS,
        "wrong",
        "kubernetes.io/dockerconfigjson",
        &[(".dockerconfigjson", &registry.docker_config("puller", "nope"))],
    );
    let kubeconfig = stub.kubeconfig().to_str().unwrap().to_owned();
    let server = Server::start_temp(&["--kubeconfig", &kubeconfig, "--insecure-registry", &registry.host()]);
    let key = stub.client_ca().client_cert("alice", &[]);
    let alice = crate::delegated_server::client(&server, Some(crate::delegated_server::identity(&key)));
    for verb in ["create", "get", "list"] {
        stub.allow("alice", verb, "bundles", NS);
    }
    stub.allow("alice", "get", "secrets", NS);
    let reference = registry.reference("private/app", "v1");
    for (name, secret) in [("private", "pull"), ("denied", "wrong")] {
        let body = json!({"apiVersion": "content.stowage.dev/v1alpha1", "kind": "Bundle",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"sources": [{"image": {"ref": reference, "pullSecret": secret}}]}});
        let resp = alice.post(server.url(&bundles(NS))).json(&body).send().await.unwrap();
        assert_eq!(resp.status().as_u16(), 201, "{}", resp.text().await.unwrap_or_default());
    }
    stub.allow("alice", "get", "bundles/content", NS);
    // The admin client of standalone mode is not trusted here: look as alice.
    let b = wait_as(&alice, &server, "private", "Unpacked").await;
    let data = alice.get(server.url(&bundle_content(NS, "private"))).send().await.unwrap().bytes().await.unwrap();
    assert_trees_equal(&tree, &parse_served_tar(&data), "pulled with the Secret's credentials");
    assert_eq!(digest_of(&data), str_at(&b, "/status/digest"));
    // Wrong credentials: refused, and not retried until the spec changes or the next poll.
    let b = wait_as(&alice, &server, "denied", "AccessDenied").await;
    let message = condition(&b, "Unpacked")["message"].as_str().unwrap().to_owned();
    assert!(message.contains("401") && message.ends_with("; tried again when its credentials change"), "{message}");
    assert!(!message.contains("nope"), "no secrets in messages: {message}");
}

/// [`wait_reason`] with another client.
async fn wait_as(client: &reqwest::Client, server: &Server, name: &str, reason: &str) -> serde_json::Value {
    let url = server.url(&bundle(NS, name));
    eventually(Duration::from_secs(60), &format!("{name}: {reason}"), || async {
        let resp = client.get(&url).send().await.map_err(|e| e.to_string())?;
        let b: serde_json::Value = resp.json().await.map_err(|e| e.to_string())?;
        let c = condition(&b, "Unpacked");
        match c["reason"] == reason && c["observedGeneration"] == b["metadata"]["generation"] {
            true => Ok(b),
            false => Err(format!("{c}")),
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn standalone_servers_take_registry_credentials_from_registry_config() {
    let registry = Registry::start_with_auth("puller", "s3cret").await;
    let tree = corpus_tree("rukpak-testdata/plain-v0/valid");
    registry.push_image("private/app", "v1", &[Layer::gzip_tree(&tree)], "linux/amd64").await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.json");
    std::fs::write(&config, registry.docker_config("puller", "s3cret")).unwrap();
    let server =
        Server::start_temp(&["--insecure-registry", &registry.host(), "--registry-config", config.to_str().unwrap()]);
    create(&server, "private", json!({"sources": [{"image": {"ref": registry.reference("private/app", "v1")}}]})).await;
    wait_reason(&server, "private", "Unpacked").await;
    assert_trees_equal(&tree, &served(&server, "private").await, "pulled with --registry-config");
    // A pullSecret needs a cluster to read it from: a clear, permanent failure standalone.
    create(
        &server,
        "secret",
        json!({"sources": [{"image": {"ref": registry.reference("private/app", "v1"), "pullSecret": "pull"}}]}),
    )
    .await;
    let b = wait_reason(&server, "secret", "InvalidSource").await;
    assert!(condition(&b, "Unpacked")["message"].as_str().unwrap().contains("standalone"), "{b:#}");
}
