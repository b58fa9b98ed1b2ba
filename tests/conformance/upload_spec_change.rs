//! An upload Bundle's status follows every change of its spec, as the real kubectl sees it: after
//! `kubectl patch`, `observedGeneration` (top-level and on the conditions) reaches the new
//! generation; a new `format` re-checks the served content (Unpacked True with the new details, or
//! False InvalidFormat while the content stays served and downloadable); a change that does not
//! concern the content only moves the generation along.

use serde_json::Value;

use crate::harness::*;
use crate::kubectl::Kubectl;
use crate::tarutil::*;

const NS: &str = "respec";
const NAME: &str = "app";

/// A tree that is both a valid chart (detected first) and a valid plain bundle.
fn chart_with_manifests() -> Tree {
    let mut tree = Tree::new();
    tree.insert("Chart.yaml".into(), file(b"apiVersion: v2\nname: demo\nversion: 1.2.3\n".to_vec()));
    tree.insert("manifests/cm.yaml".into(), file(b"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n".to_vec()));
    tree
}

fn patch_spec(k: &Kubectl, spec: &str) {
    k.ok(&["-n", NS, "patch", "bundle", NAME, "--type", "merge", "-p", &format!("{{\"spec\":{spec}}}")]);
}

/// `kubectl wait` for `condition` at the Bundle's current generation, then the Bundle as kubectl
/// gets it.
fn wait_for(k: &Kubectl, generation: u64, condition: &str) -> Value {
    let observed = format!("--for=jsonpath={{.status.observedGeneration}}={generation}");
    k.ok(&["-n", NS, "wait", &format!("bundle/{NAME}"), &observed, "--timeout=30s"]);
    k.ok(&["-n", NS, "wait", &format!("bundle/{NAME}"), &format!("--for=condition={condition}"), "--timeout=30s"]);
    let b: Value = serde_json::from_str(&k.ok(&["-n", NS, "get", "bundle", NAME, "-o", "json"])).unwrap();
    assert_eq!(u64_at(&b, "/metadata/generation"), generation, "{b:#}");
    for c in b["status"]["conditions"].as_array().unwrap() {
        assert_eq!(c["observedGeneration"], generation, "every condition is for the new spec: {b:#}");
    }
    b
}

fn unpacked(b: &Value) -> &Value {
    b["status"]["conditions"].as_array().unwrap().iter().find(|c| c["type"] == "Unpacked").unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn spec_changes_of_an_upload_bundle_reach_its_status() {
    let server = Server::start_temp(&[]);
    let k = Kubectl::new(&server);
    server.create_bundle(NS, NAME).await;
    let tree = chart_with_manifests();
    let tar = build_tar(&tree);
    let first = server.upload_ok(NS, NAME, tar.clone(), None).await;
    assert_eq!(first["status"]["format"], "helm", "{first:#}");
    let digest = str_at(&first, "/status/digest").to_owned();
    let content = str_at(&first, "/status/contentName").to_owned();

    // A format the served content is: Unpacked again, with the new details.
    patch_spec(&k, r#"{"format":"plain"}"#);
    let b = wait_for(&k, 2, "Unpacked");
    assert_eq!(b["status"]["format"], "plain", "{b:#}");
    assert_eq!(b["status"]["formatDetails"]["objects"]["ConfigMap"], 1, "{b:#}");
    assert_eq!(str_at(&b, "/status/digest"), digest);
    assert_eq!(b["status"]["phase"], "Unpacked");

    // A format it is not: Unpacked=False InvalidFormat, in plain words, and still served.
    patch_spec(&k, r#"{"format":"registry-v1"}"#);
    let b = wait_for(&k, 3, "Unpacked=False");
    let c = unpacked(&b);
    assert_eq!(c["reason"], "InvalidFormat", "{b:#}");
    assert_eq!(
        c["message"],
        format!(
            "not a registry-v1 bundle: metadata/annotations.yaml is missing (found Chart.yaml, manifests/ at the \
             root); still serving {content} ({digest})"
        ),
    );
    assert_eq!(b["status"]["phase"], "Failed");
    k.ok(&["-n", NS, "wait", &format!("bundle/{NAME}"), "--for=condition=Available", "--timeout=30s"]);
    assert_eq!(str_at(&b, "/status/contentName"), content);
    let served = server.download(&bundle_content(NS, NAME)).await;
    assert_eq!(digest_of(&served), digest, "the content stays served");
    assert_trees_equal(&tree, &parse_served_tar(&served), "still served");

    // Back to a format it is, then a change that does not concern the content.
    patch_spec(&k, r#"{"format":"helm"}"#);
    let b = wait_for(&k, 4, "Unpacked");
    assert_eq!((&b["status"]["format"], &b["status"]["formatDetails"]["chart"]), (&"helm".into(), &"demo".into()));
    patch_spec(&k, r#"{"revisionHistoryLimit":5}"#);
    let b = wait_for(&k, 5, "Unpacked");
    assert_eq!(str_at(&b, "/status/digest"), digest);
    assert_eq!(b["status"]["format"], "helm");

    // Empty content, allowed when it was uploaded, no longer allowed.
    let mut object = upload_bundle(NS, "empty");
    object["spec"]["allowEmpty"] = true.into();
    assert_eq!(server.post_json(&bundles(NS), &object).await.status().as_u16(), 201);
    let uploaded = server.upload_ok(NS, "empty", build_tar(&Tree::new()), None).await;
    k.ok(&["-n", NS, "patch", "bundle", "empty", "--type", "merge", "-p", r#"{"spec":{"allowEmpty":false}}"#]);
    k.ok(&["-n", NS, "wait", "bundle/empty", "--for=jsonpath={.status.observedGeneration}=2", "--timeout=30s"]);
    k.ok(&["-n", NS, "wait", "bundle/empty", "--for=condition=Unpacked=False", "--timeout=30s"]);
    let b = server.get_json(&bundle(NS, "empty")).await;
    let c = unpacked(&b);
    assert_eq!(c["reason"], "EmptyContent", "{b:#}");
    let still = format!(
        "; still serving {} ({})",
        str_at(&uploaded, "/status/contentName"),
        str_at(&uploaded, "/status/digest")
    );
    assert!(c["message"].as_str().unwrap().ends_with(&still), "{b:#}");

    // Nothing served yet: the generation moves, the Bundle keeps waiting for an upload.
    let fresh = "fresh";
    server.create_bundle(NS, fresh).await;
    k.ok(&["-n", NS, "patch", "bundle", fresh, "--type", "merge", "-p", r#"{"spec":{"format":"helm"}}"#]);
    k.ok(&["-n", NS, "wait", "bundle/fresh", "--for=jsonpath={.status.observedGeneration}=2", "--timeout=30s"]);
    let b = server.get_json(&bundle(NS, fresh)).await;
    let c = unpacked(&b);
    assert_eq!((&c["reason"], &c["observedGeneration"]), (&"AwaitingUpload".into(), &2.into()), "{b:#}");
}
