//! Kubernetes object semantics of Bundles over plain HTTP, health endpoints, and storage that
//! is released when Bundles go.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::harness::*;
use crate::tarutil::*;

#[tokio::test(flavor = "multi_thread")]
async fn bundle_lifecycle_follows_kubernetes_semantics() {
    let server = Server::start_temp(&[]);
    let created = server.create_bundle("ns1", "b1").await;
    assert_eq!(created["apiVersion"], API_VERSION);
    assert_eq!(created["kind"], "Bundle");
    assert!(!str_at(&created, "/metadata/uid").is_empty());
    assert!(str_at(&created, "/metadata/creationTimestamp").ends_with('Z'), "{created:#}");
    assert_eq!(created["metadata"]["generation"], 1, "{created:#}");
    // Defaults are written into the stored spec, as kube-apiserver persists its defaults.
    assert_eq!(created["spec"]["revisionHistoryLimit"], 3, "{created:#}");
    let rv1 = str_at(&created, "/metadata/resourceVersion").to_owned();
    server.create_bundle("ns2", "b2").await;

    let b1: Value = eventually(Duration::from_secs(10), "phase Pending", || async {
        let b = server.get_json(&bundle("ns1", "b1")).await;
        match b.pointer("/status/phase") {
            Some(p) if p == "Pending" => Ok(b),
            _ => Err(b.to_string()),
        }
    })
    .await;
    assert_eq!(b1["metadata"]["uid"], created["metadata"]["uid"]);
    assert!(b1["status"].get("digest").is_none() || b1["status"]["digest"] == "", "{b1:#}");

    // Lists: one namespace, all namespaces.
    let list = server.get_json(&bundles("ns1")).await;
    assert_eq!(list["kind"], "BundleList");
    assert_eq!(list["apiVersion"], API_VERSION);
    assert!(list["metadata"]["resourceVersion"].is_string(), "{list:#}");
    let names = |l: &Value| -> Vec<String> {
        l["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| format!("{}/{}", str_at(i, "/metadata/namespace"), str_at(i, "/metadata/name")))
            .collect()
    };
    assert_eq!(names(&list), vec!["ns1/b1"]);
    let all = server.get_json(&format!("{API}/bundles")).await;
    let mut all_names = names(&all);
    all_names.sort();
    assert_eq!(all_names, vec!["ns1/b1", "ns2/b2"]);

    // A spec change bumps generation and resourceVersion; a label change only the latter.
    let mut update = b1.clone();
    update["spec"]["revisionHistoryLimit"] = json!(5);
    let resp = server.put_json(&bundle("ns1", "b1"), &update).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let updated: Value = resp.json().await.unwrap();
    assert_eq!(updated["metadata"]["generation"], 2, "{updated:#}");
    assert_eq!(updated["spec"]["revisionHistoryLimit"], 5);
    assert_ne!(str_at(&updated, "/metadata/resourceVersion"), rv1);
    // The server then brings the status to generation 2 (as a controller would): go on from the
    // object as it is after that write.
    let updated = eventually(Duration::from_secs(30), "status.observedGeneration 2", || async {
        let b = server.get_json(&bundle("ns1", "b1")).await;
        if b["status"]["observedGeneration"] == 2 {
            Ok(b)
        } else {
            Err(format!("{}", b["status"]))
        }
    })
    .await;
    let rv2 = str_at(&updated, "/metadata/resourceVersion").to_owned();

    let mut relabel = updated.clone();
    relabel["metadata"]["labels"] = json!({"tier": "gold"});
    let resp = server.put_json(&bundle("ns1", "b1"), &relabel).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let relabeled: Value = resp.json().await.unwrap();
    assert_eq!(relabeled["metadata"]["generation"], 2, "labels are not spec: {relabeled:#}");
    assert_ne!(str_at(&relabeled, "/metadata/resourceVersion"), rv2);
    assert_eq!(relabeled["metadata"]["uid"], created["metadata"]["uid"]);
    assert_eq!(relabeled["metadata"]["creationTimestamp"], created["metadata"]["creationTimestamp"]);

    // Delete.
    let resp = server.delete(&bundle("ns1", "b1")).await;
    assert!(resp.status().is_success(), "delete: {}", resp.status());
    expect_status(server.get(&bundle("ns1", "b1")).await, 404, "NotFound").await;
    let list = server.get_json(&bundles("ns1")).await;
    assert_eq!(list["items"], json!([]));
    server.get_json(&bundle("ns2", "b2")).await;
}

fn gauge(m: &std::collections::HashMap<String, f64>, key: &str) -> f64 {
    *m.get(key).unwrap_or_else(|| panic!("/metrics has no {key}; has {:?}", m.keys()))
}

#[tokio::test(flavor = "multi_thread")]
async fn deleting_bundles_releases_their_storage() {
    let server = Server::start_temp(&[]);
    let mut shared = Tree::new();
    for i in 0..8 {
        shared.insert(format!("data/part-{i}.bin"), file(random_bytes(100 + i, 300_000)));
    }
    let mut more = shared.clone();
    more.insert("data/extra.bin".into(), file(random_bytes(200, 500_000)));

    server.create_bundle("ns", "first").await;
    server.create_bundle("ns", "second").await;
    let b1 = server.upload_ok("ns", "first", build_tar(&shared), None).await;
    let b2 = server.upload_ok("ns", "second", build_tar(&more), None).await;
    let c1 = str_at(&b1, "/status/contentName").to_owned();
    let c2 = str_at(&b2, "/status/contentName").to_owned();
    let d2 = str_at(&b2, "/status/digest").to_owned();

    let m = server.metrics().await;
    assert_eq!(gauge(&m, r#"stowage_revisions{state="committed"}"#), 2.0);
    assert_eq!(gauge(&m, r#"stowage_revisions{state="staging"}"#), 0.0);
    // Two creates and two uploads (each attaching its content): four object writes at least, and
    // never more flushes than writes.
    let (writes, flushes) = (gauge(&m, "stowage_object_writes_total"), gauge(&m, "stowage_object_write_flushes_total"));
    assert!(writes >= 4.0 && flushes >= 1.0 && flushes <= writes, "writes {writes}, flushes {flushes}");
    let chunks_both = gauge(&m, "stowage_chunks");
    let stored_both = gauge(&m, "stowage_chunk_stored_bytes");
    assert!(chunks_both > 0.0 && stored_both > 0.0, "{m:?}");

    // Deleting the first keeps the chunks the second shares, frees the others (if any).
    let resp = server.delete(&bundle("ns", "first")).await;
    assert!(resp.status().is_success());
    eventually(Duration::from_secs(30), "first's BundleContent gone", || async {
        let names = server.bundlecontent_names("ns").await;
        if names == vec![c2.clone()] {
            Ok(())
        } else {
            Err(format!("{names:?}"))
        }
    })
    .await;
    expect_status(server.get(&bundlecontent("ns", &c1)).await, 404, "NotFound").await;
    let tar = server.download(&bundle_content("ns", "second")).await;
    assert_eq!(digest_of(&tar), d2, "second bundle damaged by deleting the first");
    assert_trees_equal(&more, &parse_served_tar(&tar), "second after deleting first");
    eventually(Duration::from_secs(30), "one committed revision", || async {
        let m = server.metrics().await;
        let committed = gauge(&m, r#"stowage_revisions{state="committed"}"#);
        if committed == 1.0 {
            Ok(())
        } else {
            Err(committed.to_string())
        }
    })
    .await;

    // Deleting the second frees everything.
    let resp = server.delete(&bundle("ns", "second")).await;
    assert!(resp.status().is_success());
    eventually(Duration::from_secs(30), "storage released", || async {
        let m = server.metrics().await;
        let now = (
            gauge(&m, "stowage_chunks"),
            gauge(&m, "stowage_chunk_stored_bytes"),
            gauge(&m, r#"stowage_revisions{state="committed"}"#),
            server.bundlecontent_names("ns").await,
        );
        if now == (0.0, 0.0, 0.0, vec![]) {
            Ok(())
        } else {
            Err(format!("{now:?}"))
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn health_and_metrics_endpoints() {
    let server = Server::start_temp(&[]);
    for path in ["/readyz", "/livez", "/healthz"] {
        let body = server.download(path).await;
        assert_eq!(String::from_utf8_lossy(&body).trim(), "ok", "{path}");
    }
    let m = server.metrics().await;
    for key in [
        "stowage_chunks",
        "stowage_chunk_stored_bytes",
        r#"stowage_revisions{state="committed"}"#,
        r#"stowage_revisions{state="staging"}"#,
    ] {
        assert_eq!(gauge(&m, key), 0.0, "{key} on an empty server");
    }
}

/// Deleting the BundleContent a Bundle serves: the Bundle says so (Pending, ContentDeleted) instead
/// of pointing at nothing, its content is 404, and a new upload serves again.
#[tokio::test(flavor = "multi_thread")]
async fn deleting_the_active_bundlecontent_updates_its_bundle() {
    let server = Server::start_temp(&[]);
    let mut tree = Tree::new();
    tree.insert("manifests/cm.yaml".into(), file(b"kind: ConfigMap\n".to_vec()));
    server.create_bundle("ns", "b").await;
    let uploaded = server.upload_ok("ns", "b", build_tar(&tree), None).await;
    let content = str_at(&uploaded, "/status/contentName").to_owned();

    let resp = server.delete(&bundlecontent("ns", &content)).await;
    assert!(resp.status().is_success(), "{}", resp.status());
    let b = server.get_json(&bundle("ns", "b")).await;
    assert_eq!(str_at(&b, "/status/phase"), "Pending");
    assert_eq!(str_at(&b, "/status/conditions/0/reason"), "ContentDeleted");
    assert_eq!(b.pointer("/status/contentName"), None);
    expect_status(server.get(&bundle_content("ns", "b")).await, 404, "NotFound").await;

    let again = server.upload_ok("ns", "b", build_tar(&tree), None).await;
    assert_eq!(str_at(&again, "/status/phase"), "Unpacked");
    let tar = server.download(&bundle_content("ns", "b")).await;
    assert_eq!(digest_of(&tar), str_at(&again, "/status/digest"));
}

/// The metadata client of the garbage collector and namespace controller: protobuf offered first,
/// `as=PartialObjectMetadata[List]` on get, list and watch — answered in JSON, every object (watch
/// events included) a PartialObjectMetadata; then the namespace controller's deletecollection.
#[tokio::test(flavor = "multi_thread")]
async fn metadata_client_and_deletecollection() {
    let server = Server::start_temp(&[]);
    for name in ["a", "b"] {
        server.create_bundle("meta", name).await;
    }
    let list_accept = "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,\
                       application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json";
    let one_accept = "application/vnd.kubernetes.protobuf;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,\
                      application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json";
    let get = |path: String, accept: &'static str| {
        let request = server.client().get(server.url(&path)).header("accept", accept);
        async move { request.send().await.unwrap() }
    };

    let resp = get(bundles("meta"), list_accept).await;
    assert_eq!(resp.status(), 200);
    let list = parse_json(&resp.bytes().await.unwrap(), "metadata list");
    assert_eq!(str_at(&list, "/kind"), "PartialObjectMetadataList");
    assert_eq!(list["items"].as_array().unwrap().len(), 2);
    assert_eq!(str_at(&list, "/items/0/kind"), "PartialObjectMetadata");
    assert!(list.pointer("/items/0/spec").is_none(), "metadata only: {list:#}");
    let rv = str_at(&list, "/metadata/resourceVersion").to_owned();

    let one = parse_json(&get(bundle("meta", "a"), one_accept).await.bytes().await.unwrap(), "metadata get");
    assert_eq!(str_at(&one, "/kind"), "PartialObjectMetadata");
    assert_eq!(str_at(&one, "/metadata/name"), "a");

    let watch =
        get(format!("{}?watch=true&resourceVersion={rv}&allowWatchBookmarks=true", bundles("meta")), list_accept).await;
    assert_eq!(watch.status(), 200);

    // The namespace controller: delete the collection.
    let resp = server.client().delete(server.url(&bundles("meta"))).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let listed = server.get_json(&bundles("meta")).await;
    assert_eq!(listed["items"].as_array().unwrap().len(), 0);

    let mut stream = futures_util::StreamExt::boxed(watch.bytes_stream());
    let mut text = String::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while text.matches('\n').count() < 2 {
        match tokio::time::timeout_at(deadline, futures_util::StreamExt::next(&mut stream)).await {
            Ok(Some(Ok(bytes))) => text.push_str(&String::from_utf8_lossy(&bytes)),
            other => panic!("watch ended early ({:?}): {text}", other.map(|o| o.map(|r| r.map(|b| b.len())))),
        }
    }
    for line in text.lines().take(2) {
        let event = parse_json(line.as_bytes(), "watch event");
        assert_eq!(str_at(&event, "/type"), "DELETED");
        assert_eq!(str_at(&event, "/object/kind"), "PartialObjectMetadata", "{event:#}");
    }
}
