//! The seams of the cluster install (`deploy/`), checked without a cluster as `deploy.rs` does: the
//! image is set in one place (`deploy/components/image`) and every overlay renders exactly the
//! reference `scripts/image.sh` tags; `deploy/ha` composes with cert-manager; the opt-in components
//! (priority, network policy, metrics reader, ServiceMonitor) render onto the single-replica and
//! the replicated overlays, reach the workload they are meant for, and pass a dry run.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use serde_json::{json, Value};

use crate::deploy::{
    copy_deploy, dry_run_apply, find, kinds, kubectl, parse_docs, repo_deploy, selects, stowage_certs,
};

/// The reference `scripts/image.sh` tags when run without `--tag`.
fn image_script_ref() -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/image.sh");
    let out = Command::new("bash").arg(script).arg("--print-ref").output().unwrap();
    assert!(out.status.success(), "image.sh --print-ref: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// Every container image of every pod template.
fn images(objects: &[Value]) -> Vec<String> {
    objects
        .iter()
        .filter_map(|o| o["spec"]["template"]["spec"].as_object())
        .flat_map(|pod| {
            ["containers", "initContainers"].into_iter().flat_map(|list| pod.get(list).and_then(Value::as_array))
        })
        .flatten()
        .map(|c| c["image"].as_str().unwrap().to_owned())
        .collect()
}

/// The workload of a rendered overlay: the StatefulSet or the Deployment.
fn workload(objects: &[Value]) -> &Value {
    let found: Vec<&Value> =
        objects.iter().filter(|o| o["kind"] == "StatefulSet" || o["kind"] == "Deployment").collect();
    assert_eq!(found.len(), 1, "one workload");
    found[0]
}

/// Renders `deploy/<overlay>` of a copy in which `stowage certs` ran.
fn render(deploy: &Path, overlay: &str) -> (String, Vec<Value>) {
    let rendered = kubectl(&["kustomize", deploy.join(overlay).to_str().unwrap()], None, None);
    let objects = parse_docs(&rendered);
    (rendered, objects)
}

#[test]
fn every_overlay_renders_the_image_the_image_script_tags() {
    let reference = image_script_ref();
    assert_eq!(
        reference,
        format!("localhost/stowage:{}", env!("CARGO_PKG_VERSION")),
        "image.sh tags the crate version"
    );
    let tmp = tempfile::tempdir().unwrap();
    let deploy = copy_deploy(tmp.path());
    stowage_certs(&["--out", deploy.join("apiservice/generated").to_str().unwrap()]);
    for overlay in ["apiservice", "cert-manager", "ha", "ha/cert-manager"] {
        let (_, objects) = render(&deploy, overlay);
        let found = images(&objects);
        assert!(!found.is_empty(), "{overlay}: no container");
        for image in found {
            assert_eq!(image, reference, "deploy/{overlay} renders another image than scripts/image.sh tags");
        }
    }
    // One place: no other file of deploy/ sets an image.
    let mut setting = Vec::new();
    let mut stack = vec![repo_deploy()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                if path.file_name().is_some_and(|n| n != "generated") {
                    stack.push(path);
                }
            } else if std::fs::read_to_string(&path).is_ok_and(|t| t.lines().any(|l| l.starts_with("images:"))) {
                setting.push(path.strip_prefix(repo_deploy()).unwrap().display().to_string());
            }
        }
    }
    assert_eq!(setting, ["components/image/kustomization.yaml"], "files of deploy/ with an images: entry");
}

#[test]
fn ha_composes_with_cert_manager() {
    let (rendered, objects) = render(&repo_deploy(), "ha/cert-manager");
    let (registration, apiservice) = render(&repo_deploy(), "cert-manager/registration");
    assert!(!objects.iter().any(|o| o["kind"] == "StatefulSet" || o["kind"] == "APIService"), "{rendered}");
    assert!(!objects.iter().any(|o| o["kind"] == "Secret"), "cert-manager writes stowage-tls, no static Secret");
    let deployment = find(&objects, "Deployment", "stowage");
    assert_eq!(deployment["spec"]["replicas"], 3);
    let certificate = find(&objects, "Certificate", "stowage-tls");
    let volumes = deployment["spec"]["template"]["spec"]["volumes"].as_array().unwrap();
    assert!(
        volumes.iter().any(|v| v["secret"]["secretName"] == certificate["spec"]["secretName"]),
        "the replicas mount the Secret cert-manager issues"
    );
    assert_eq!(
        find(&apiservice, "APIService", "v1alpha1.content.stowage.dev")["metadata"]["annotations"]
            ["cert-manager.io/inject-ca-from"],
        "stowage/stowage-tls"
    );
    let tmp = tempfile::tempdir().unwrap();
    let mut all = objects.clone();
    all.extend(apiservice.iter().cloned());
    dry_run_apply(tmp.path(), &format!("{rendered}---\n{registration}"), &all);
}

#[test]
fn opt_in_components_reach_the_workload_of_either_overlay() {
    let tmp = tempfile::tempdir().unwrap();
    let deploy = copy_deploy(tmp.path());
    stowage_certs(&["--out", deploy.join("apiservice/generated").to_str().unwrap()]);
    let components = ["priority", "network-policy", "metrics-reader", "service-monitor"];
    for overlay in ["apiservice", "ha"] {
        // An overlay the user owns, beside their copy of deploy/.
        let mine = tmp.path().join(format!("mine-{}", overlay.replace('/', "-")));
        std::fs::create_dir_all(&mine).unwrap();
        let listed: Vec<String> = components.iter().map(|c| format!("- ../deploy/components/{c}")).collect();
        std::fs::write(
            mine.join("kustomization.yaml"),
            format!(
                "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n- ../deploy/{overlay}\n\
                 components:\n{}\n",
                listed.join("\n")
            ),
        )
        .unwrap();
        let rendered = kubectl(&["kustomize", mine.to_str().unwrap()], None, None);
        let objects = parse_docs(&rendered);
        let workload = workload(&objects);
        let pod = &workload["spec"]["template"];
        let pod_labels = &pod["metadata"]["labels"];

        // Priority: a class of its own, above the default, below the system classes.
        let class = find(&objects, "PriorityClass", "stowage-critical");
        let value = class["value"].as_i64().unwrap();
        assert!(value > 0 && value < 1_000_000_000, "{overlay}: priority {value}");
        assert_eq!(class["globalDefault"], false);
        assert_eq!(pod["spec"]["priorityClassName"], "stowage-critical", "{overlay}: the workload's priority");

        // The NetworkPolicy admits the server's port, from in-cluster pods and by address.
        let policy = find(&objects, "NetworkPolicy", "stowage");
        assert_eq!(policy["metadata"]["namespace"], workload["metadata"]["namespace"]);
        assert!(
            selects(&policy["spec"]["podSelector"]["matchLabels"], pod_labels),
            "{overlay}: policy selects the pods"
        );
        let port = &pod["spec"]["containers"][0]["ports"][0];
        let ingress = &policy["spec"]["ingress"][0];
        assert_eq!(ingress["ports"][0]["port"], port["containerPort"], "{overlay}");
        let from = ingress["from"].as_array().unwrap();
        assert!(from.iter().any(|f| f["namespaceSelector"] == json!({})), "in-cluster clients: {from:?}");
        assert!(from.iter().any(|f| f["ipBlock"]["cidr"].is_string()), "the kube-apiserver by address: {from:?}");

        // Metrics: a role for /metrics, and a ServiceMonitor that reaches the Service over
        // verified TLS.
        let reader = find(&objects, "ClusterRole", "stowage-metrics-reader");
        let urls = ["/metrics", "/readyz", "/readyz/*", "/livez", "/livez/*", "/healthz"];
        assert_eq!(reader["rules"], json!([{"nonResourceURLs": urls, "verbs": ["get"]}]));
        let service = find(&objects, "Service", "stowage");
        let monitor = find(&objects, "ServiceMonitor", "stowage");
        assert_eq!(monitor["metadata"]["namespace"], service["metadata"]["namespace"]);
        assert!(selects(&monitor["spec"]["selector"]["matchLabels"], &service["metadata"]["labels"]));
        let endpoint = &monitor["spec"]["endpoints"][0];
        assert_eq!(endpoint["port"], service["spec"]["ports"][0]["name"]);
        assert_eq!(endpoint["scheme"], "https");
        assert_eq!(endpoint["path"], "/metrics");
        let ca = &endpoint["tlsConfig"]["ca"]["secret"];
        let secret = find(&objects, "Secret", ca["name"].as_str().unwrap());
        assert!(secret["data"][ca["key"].as_str().unwrap()].is_string(), "{overlay}: the CA the monitor trusts");
        assert!(endpoint["tlsConfig"].get("insecureSkipVerify").is_none());

        let added: BTreeSet<String> = ["PriorityClass", "NetworkPolicy", "ServiceMonitor"].map(String::from).into();
        assert!(added.is_subset(&kinds(&objects)));
        dry_run_apply(tmp.path(), &rendered, &objects);
    }
}
