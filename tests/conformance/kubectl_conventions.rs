//! kubectl's everyday verbs, each against a standalone server: `get -w`, `get -o wide`, `edit`
//! through `KUBE_EDITOR`, `patch` of every type (strategic is kubectl's default), `explain`.

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::Duration;

use crate::harness::*;
use crate::kubectl::{bundle_yaml, write_yaml, Kubectl};

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_get_watch_prints_changes_as_they_happen() {
    let server = Server::start_temp(&[]);
    server.create_bundle("gw", "first").await;
    let kubectl = Kubectl::new(&server);
    let mut child = kubectl
        .command(&["-n", "gw", "get", "bundles", "-w", "-o", "name", "--request-timeout=60s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn kubectl get -w");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let next_line = || rx.recv_timeout(Duration::from_secs(30)).expect("kubectl get -w printed nothing");
    assert_eq!(next_line(), "bundle.content.stowage.dev/first");
    server.create_bundle("gw", "second").await;
    assert_eq!(next_line(), "bundle.content.stowage.dev/second");
    assert!(server.delete(&bundle("gw", "first")).await.status().is_success());
    assert_eq!(next_line(), "bundle.content.stowage.dev/first");
    let _ = child.kill();
    let _ = child.wait();
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_get_wide_shows_the_extra_columns() {
    let server = Server::start_temp(&[]);
    server.create_bundle("wide", "app").await;
    let kubectl = Kubectl::new(&server);
    let normal = kubectl.ok(&["-n", "wide", "get", "bundles"]);
    let header: Vec<&str> = normal.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["NAME", "FORMAT", "PHASE", "FILES", "SIZE", "DIGEST", "AGE"]);
    let wide = kubectl.ok(&["-n", "wide", "get", "bundles", "-o", "wide"]);
    let header: Vec<&str> = wide.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["NAME", "FORMAT", "PHASE", "FILES", "SIZE", "DIGEST", "AGE", "CONTENT", "SOURCES", "REVISION"]);
    assert!(wide.lines().nth(1).unwrap().contains("upload"), "{wide}");
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_edit_with_an_editor_script() {
    let server = Server::start_temp(&[]);
    let kubectl = Kubectl::new(&server);
    let dir = tempfile::tempdir().unwrap();
    let yaml = write_yaml(dir.path(), "b.yaml", &bundle_yaml("ed", "app", "  revisionHistoryLimit: 2\n"));
    kubectl.ok(&["apply", "-f", yaml.to_str().unwrap()]);
    // The "editor" rewrites the file kubectl hands it, as a person would.
    let editor = dir.path().join("editor.sh");
    std::fs::write(&editor, "#!/bin/sh\nsed -i 's/revisionHistoryLimit: 2/revisionHistoryLimit: 7/' \"$1\"\n").unwrap();
    std::fs::set_permissions(&editor, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let editor = editor.to_str().unwrap();
    let out = kubectl.run_env(&["-n", "ed", "edit", "bundle", "app"], None, None, &[("KUBE_EDITOR", editor)]);
    assert!(out.status.success(), "kubectl edit: {}", String::from_utf8_lossy(&out.stderr));
    let obj = server.get_json(&bundle("ed", "app")).await;
    assert_eq!(u64_at(&obj, "/spec/revisionHistoryLimit"), 7);
    assert_eq!(u64_at(&obj, "/metadata/generation"), 2);

    // An edit the server rejects: kubectl keeps the edit in a file headed by the server's causes.
    std::fs::write(
        dir.path().join("editor.sh"),
        "#!/bin/sh\nsed -i 's/revisionHistoryLimit: 7/revisionHistoryLimit: -1/' \"$1\"\n",
    )
    .unwrap();
    let out = kubectl.run_env(&["-n", "ed", "edit", "bundle", "app"], None, None, &[("KUBE_EDITOR", editor)]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && said.contains("\"app\" is invalid"), "{said}");
    let copy = said.split('"').find(|part| part.starts_with('/') && part.ends_with(".yaml")).expect("copy path");
    let kept = std::fs::read_to_string(copy).unwrap();
    let _ = std::fs::remove_file(copy);
    assert!(kept.contains("spec.revisionHistoryLimit") && kept.contains("greater than or equal to 0"), "{kept}");
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_patch_of_every_type() {
    let server = Server::start_temp(&[]);
    server.create_bundle("pt", "app").await;
    let kubectl = Kubectl::new(&server);
    // No --type: kubectl sends a strategic merge patch.
    kubectl.ok(&["-n", "pt", "patch", "bundle", "app", "-p", r#"{"metadata":{"labels":{"a":"1"}}}"#]);
    kubectl.ok(&["-n", "pt", "patch", "bundle", "app", "--type=merge", "-p", r#"{"spec":{"paused":true}}"#]);
    let json_patch = r#"[{"op":"replace","path":"/spec/paused","value":false},{"op":"add","path":"/metadata/labels/b","value":"2"}]"#;
    kubectl.ok(&["-n", "pt", "patch", "bundle", "app", "--type=json", "-p", json_patch]);
    let obj = server.get_json(&bundle("pt", "app")).await;
    assert_eq!(obj["metadata"]["labels"], serde_json::json!({"a": "1", "b": "2"}));
    assert_eq!(obj["spec"]["paused"], false);
    // A JSON patch that cannot apply: 422 naming the problem.
    let failing = r#"[{"op":"test","path":"/spec/paused","value":true}]"#;
    let said = kubectl.fails(&["-n", "pt", "patch", "bundle", "app", "--type=json", "-p", failing], None);
    assert!(said.contains("JSON patch"), "{said}");
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_explain_walks_the_published_schema() {
    let server = Server::start_temp(&[]);
    let kubectl = Kubectl::new(&server);
    let out = kubectl.ok(&["explain", "bundles.spec.sources"]);
    assert!(out.contains("KIND:") && out.contains("Bundle"), "{out}");
    for field in ["image", "git", "http", "upload", "destination"] {
        assert!(out.contains(field), "explain lacks {field}: {out}");
    }
    let out = kubectl.ok(&["explain", "bundlecontent.spec", "--recursive"]);
    assert!(out.contains("digest"), "{out}");
}
