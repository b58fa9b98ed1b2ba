//! Server-side apply and managedFields, as `kubectl apply --server-side` and controllers use them:
//! apply creates and updates, fields another manager owns conflict (409) unless forced, fields a
//! manager stops applying are removed, and every write records who owns what.

use serde_json::{json, Value};

use crate::harness::*;
use crate::kubectl::{bundle_yaml, write_yaml, Kubectl};

async fn apply(server: &Server, path: &str, manager: &str, force: bool, body: &str) -> reqwest::Response {
    let force = if force { "&force=true" } else { "" };
    server
        .client()
        .patch(server.url(&format!("{path}?fieldManager={manager}{force}")))
        .header("content-type", "application/apply-patch+yaml")
        .body(body.to_owned())
        .send()
        .await
        .unwrap()
}

fn managers(obj: &Value) -> Vec<(String, String)> {
    obj["metadata"]["managedFields"]
        .as_array()
        .map(|entries| {
            entries.iter().map(|e| (str_at(e, "/manager").to_owned(), str_at(e, "/operation").to_owned())).collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn apply_creates_updates_conflicts_and_forces() {
    let server = Server::start_temp(&[]);
    let path = bundle("ssa", "app");
    let config = "apiVersion: content.stowage.dev/v1alpha1\nkind: Bundle\nmetadata:\n  name: app\n  labels:\n    team: a\nspec:\n  sources:\n  - upload: {}\n  revisionHistoryLimit: 3\n";
    let resp = apply(&server, &path, "deployer", false, config).await;
    assert_eq!(resp.status(), 201, "apply creates");
    let created: Value = resp.json().await.unwrap();
    assert_eq!(managers(&created), [("deployer".to_owned(), "Apply".to_owned())]);
    let owned = &created["metadata"]["managedFields"][0]["fieldsV1"];
    assert!(owned["f:spec"].get("f:revisionHistoryLimit").is_some(), "{owned:#}");
    assert!(owned["f:metadata"]["f:labels"].get("f:team").is_some(), "{owned:#}");
    assert_eq!(str_at(&created, "/status/phase"), "Pending", "a created object gets its initial status");

    // Another writer (an Update manager) takes a field; re-applying a different value conflicts.
    let resp = server
        .client()
        .patch(server.url(&format!("{path}?fieldManager=operator")))
        .header("content-type", "application/merge-patch+json")
        .body(json!({"spec": {"revisionHistoryLimit": 5}}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let changed = config.replace("revisionHistoryLimit: 3", "revisionHistoryLimit: 4");
    let status = expect_status(apply(&server, &path, "deployer", false, &changed).await, 409, "Conflict").await;
    assert_eq!(
        str_at(&status, "/message"),
        "Apply failed with 1 conflict: conflict with \"operator\" using content.stowage.dev/v1alpha1: .spec.revisionHistoryLimit"
    );
    assert_eq!(str_at(&status, "/details/causes/0/reason"), "FieldManagerConflict");
    assert_eq!(str_at(&status, "/details/causes/0/field"), ".spec.revisionHistoryLimit");
    // Forced, the applier takes the field over.
    let resp = apply(&server, &path, "deployer", true, &changed).await;
    assert_eq!(resp.status(), 200);
    let forced: Value = resp.json().await.unwrap();
    assert_eq!(u64_at(&forced, "/spec/revisionHistoryLimit"), 4);

    // Applying without a field it applied before removes it (nobody else owns it).
    let without_label = changed.replace("  labels:\n    team: a\n", "");
    let resp = apply(&server, &path, "deployer", false, &without_label).await;
    assert_eq!(resp.status(), 200);
    let pruned: Value = resp.json().await.unwrap();
    assert!(pruned["metadata"].get("labels").is_none_or(|l| l.get("team").is_none()), "{pruned:#}");

    // Bad applies: no fieldManager (422), force on a non-apply patch (422), managedFields set (400).
    let resp = server
        .client()
        .patch(server.url(&path))
        .header("content-type", "application/apply-patch+yaml")
        .body(config.to_owned())
        .send()
        .await
        .unwrap();
    expect_status(resp, 422, "Invalid").await;
    let with_managed = json!({
        "apiVersion": "content.stowage.dev/v1alpha1",
        "kind": "Bundle",
        "metadata": {"name": "app", "managedFields": [{"manager": "x", "operation": "Apply"}]},
    });
    let resp = apply(&server, &path, "deployer", false, &with_managed.to_string()).await;
    let status = expect_status(resp, 400, "BadRequest").await;
    assert!(str_at(&status, "/message").contains("managedFields must be nil"), "{status:#}");
    let resp = server
        .client()
        .patch(server.url(&format!("{path}?force=true")))
        .header("content-type", "application/merge-patch+json")
        .body("{}")
        .send()
        .await
        .unwrap();
    expect_status(resp, 422, "Invalid").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_server_side_apply_and_managed_fields() {
    let server = Server::start_temp(&[]);
    let kubectl = Kubectl::new(&server);
    let dir = tempfile::tempdir().unwrap();
    let first = write_yaml(dir.path(), "b.yaml", &bundle_yaml("kssa", "app", "  revisionHistoryLimit: 2\n"));
    let out = kubectl.ok(&["apply", "--server-side", "-f", first.to_str().unwrap()]);
    assert!(out.contains("serverside-applied"), "{out}");
    let second = write_yaml(dir.path(), "b2.yaml", &bundle_yaml("kssa", "app", "  revisionHistoryLimit: 6\n"));
    kubectl.ok(&["apply", "--server-side", "-f", second.to_str().unwrap()]);
    let obj = server.get_json(&bundle("kssa", "app")).await;
    assert_eq!(u64_at(&obj, "/spec/revisionHistoryLimit"), 6);
    assert_eq!(managers(&obj), [("kubectl".to_owned(), "Apply".to_owned())]);

    // kubectl edit (an Update manager) takes the field; a plain server-side apply then conflicts.
    kubectl.ok(&[
        "-n",
        "kssa",
        "patch",
        "bundle",
        "app",
        "--type=merge",
        "-p",
        r#"{"spec":{"revisionHistoryLimit":9}}"#,
    ]);
    let said = kubectl.fails(&["apply", "--server-side", "-f", first.to_str().unwrap()], None);
    assert!(said.contains("conflict") && said.contains(".spec.revisionHistoryLimit"), "{said}");
    kubectl.ok(&["apply", "--server-side", "--force-conflicts", "-f", first.to_str().unwrap()]);
    let obj = server.get_json(&bundle("kssa", "app")).await;
    assert_eq!(u64_at(&obj, "/spec/revisionHistoryLimit"), 2);

    // Client-side apply, create and label writes are tracked as Update managers.
    let cs = write_yaml(dir.path(), "c.yaml", &bundle_yaml("kssa", "other", ""));
    kubectl.ok(&["apply", "-f", cs.to_str().unwrap()]);
    kubectl.ok(&["-n", "kssa", "label", "bundle", "other", "x=y"]);
    let other = server.get_json(&bundle("kssa", "other")).await;
    let names: Vec<String> = managers(&other).into_iter().map(|(m, _)| m).collect();
    assert!(names.contains(&"kubectl-client-side-apply".to_owned()), "{names:?}");
    assert!(names.contains(&"kubectl-label".to_owned()), "{names:?}");
}
