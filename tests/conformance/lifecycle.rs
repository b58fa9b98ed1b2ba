//! Deletion as Kubernetes does it: finalizers hold an object (with a deletionTimestamp) until the
//! last is removed; a Bundle's BundleContents are its dependents (ownerReferences) and go with it
//! in background or foreground, or stay behind when orphaned.

use std::time::Duration;

use serde_json::{json, Value};

use crate::harness::*;
use crate::kubectl::Kubectl;
use crate::tarutil::*;

/// A Bundle with uploaded content, so it has one BundleContent; returns the content's name.
async fn bundle_with_content(server: &Server, ns: &str, name: &str) -> String {
    server.create_bundle(ns, name).await;
    let mut tree = Tree::new();
    tree.insert("manifests/cm.yaml".into(), file(format!("kind: ConfigMap\nname: {name}\n").into_bytes()));
    let uploaded = server.upload_ok(ns, name, build_tar(&tree), None).await;
    str_at(&uploaded, "/status/contentName").to_owned()
}

async fn exists(server: &Server, path: &str) -> bool {
    match server.get(path).await.status().as_u16() {
        200 => true,
        404 => false,
        other => panic!("GET {path}: {other}"),
    }
}

async fn gone(server: &Server, path: &str, what: &str) {
    let path = path.to_owned();
    eventually(Duration::from_secs(20), what, || {
        let path = path.clone();
        async move {
            if exists(server, &path).await {
                Err("still there".to_string())
            } else {
                Ok(())
            }
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn finalizers_hold_an_object_until_removed() {
    let server = Server::start_temp(&[]);
    let mut obj = upload_bundle("fin", "held");
    obj["metadata"]["finalizers"] = json!(["example.com/cleanup"]);
    assert_eq!(server.post_json(&bundles("fin"), &obj).await.status(), 201);

    let resp = server.delete(&bundle("fin", "held")).await;
    assert_eq!(resp.status(), 200);
    let pending: Value = resp.json().await.unwrap();
    assert!(!str_at(&pending, "/metadata/deletionTimestamp").is_empty(), "{pending:#}");
    let current = server.get_json(&bundle("fin", "held")).await;
    assert!(!str_at(&current, "/metadata/deletionTimestamp").is_empty(), "still there, being deleted");

    // No new finalizers once deletion started; deletionTimestamp cannot be taken back.
    let mut add = current.clone();
    add["metadata"]["finalizers"] = json!(["example.com/cleanup", "example.com/other"]);
    let status = expect_status(server.put_json(&bundle("fin", "held"), &add).await, 422, "Invalid").await;
    assert!(str_at(&status, "/message").contains("no new finalizers"), "{status:#}");
    let mut undelete = current.clone();
    undelete["metadata"].as_object_mut().unwrap().remove("deletionTimestamp");
    let kept: Value = server.put_json(&bundle("fin", "held"), &undelete).await.json().await.unwrap();
    assert_eq!(kept["metadata"]["deletionTimestamp"], current["metadata"]["deletionTimestamp"]);

    // Removing the last finalizer completes the deletion.
    let patch = json!({"metadata": {"finalizers": null}});
    let resp = server
        .client()
        .patch(server.url(&bundle("fin", "held")))
        .header("content-type", "application/merge-patch+json")
        .body(patch.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert!(!exists(&server, &bundle("fin", "held")).await);

    // Finalizer names must be qualified.
    let mut bad = upload_bundle("fin", "bad");
    bad["metadata"]["finalizers"] = json!(["cleanup"]);
    let status = expect_status(server.post_json(&bundles("fin"), &bad).await, 422, "Invalid").await;
    assert_eq!(str_at(&status, "/details/causes/0/field"), "metadata.finalizers[0]");
}

#[tokio::test(flavor = "multi_thread")]
async fn background_deletion_collects_bundlecontents() {
    let server = Server::start_temp(&[]);
    let content = bundle_with_content(&server, "bg", "app").await;
    let owned = server.get_json(&bundlecontent("bg", &content)).await;
    assert_eq!(str_at(&owned, "/metadata/ownerReferences/0/kind"), "Bundle");
    assert!(server.delete(&bundle("bg", "app")).await.status().is_success());
    assert!(!exists(&server, &bundle("bg", "app")).await, "the owner goes at once");
    gone(&server, &bundlecontent("bg", &content), "BundleContent collected").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn orphaned_bundlecontents_stay_and_keep_serving() {
    let server = Server::start_temp(&[]);
    let content = bundle_with_content(&server, "orph", "app").await;
    let resp = server
        .client()
        .delete(server.url(&bundle("orph", "app")))
        .json(&json!({"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Orphan"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    gone(&server, &bundle("orph", "app"), "owner deleted after orphaning").await;
    let orphan = server.get_json(&bundlecontent("orph", &content)).await;
    assert!(orphan["metadata"].get("ownerReferences").is_none(), "owner reference removed: {orphan:#}");
    let tar = server.get(&bundlecontent_content("orph", &content)).await;
    assert_eq!(tar.status(), 200, "orphaned content is still served");
    // A BundleContent's metadata may change (labels, finalizers, owners), its spec never.
    let resp = server
        .client()
        .patch(server.url(&bundlecontent("orph", &content)))
        .header("content-type", "application/merge-patch+json")
        .body(json!({"spec": {"digest": "sha256:00"}}).to_string())
        .send()
        .await
        .unwrap();
    let status = expect_status(resp, 422, "Invalid").await;
    assert!(str_at(&status, "/message").contains("field is immutable"), "{status:#}");
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_delete_cascade_foreground_waits_for_dependents() {
    let server = Server::start_temp(&[]);
    let content = bundle_with_content(&server, "fg", "app").await;
    // A finalizer on the dependent keeps it, and so its owner, around.
    let patch = json!({"metadata": {"finalizers": ["example.com/keep"]}});
    let resp = server
        .client()
        .patch(server.url(&bundlecontent("fg", &content)))
        .header("content-type", "application/merge-patch+json")
        .body(patch.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "{}", resp.text().await.unwrap());

    let kubectl = Kubectl::new(&server);
    kubectl.ok(&["-n", "fg", "delete", "bundle", "app", "--cascade=foreground", "--wait=false"]);
    let owner = server.get_json(&bundle("fg", "app")).await;
    assert!(owner["metadata"]["finalizers"].as_array().unwrap().contains(&json!("foregroundDeletion")), "{owner:#}");
    eventually(Duration::from_secs(20), "dependent marked for deletion", || async {
        let dependent = server.get_json(&bundlecontent("fg", &content)).await;
        // Absent until the collector marks it (a first read may come before it does).
        match dependent.pointer("/metadata/deletionTimestamp").and_then(|t| t.as_str()) {
            Some(t) if !t.is_empty() => Ok(()),
            _ => Err("not yet".to_string()),
        }
    })
    .await;
    assert!(exists(&server, &bundle("fg", "app")).await, "owner waits for its blocking dependent");

    // Release the dependent: it goes, then its owner.
    let release = json!({"metadata": {"finalizers": null}});
    let resp = server
        .client()
        .patch(server.url(&bundlecontent("fg", &content)))
        .header("content-type", "application/merge-patch+json")
        .body(release.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    gone(&server, &bundle("fg", "app"), "owner deleted after its dependents").await;
}
