//! `kubectl stowage …`: the binary installed as `kubectl-stowage` on PATH, driven through the real
//! kubectl with its usual flags: `pull` (Range pieces, verified), `ls`, `diff` between revisions.

use std::path::Path;
use std::process::Command;

use crate::harness::*;
use crate::tarutil::{assert_trees_equal, build_tar, file, tree_from_dir};

const NS: &str = "plugin";

fn kubectl_stowage(server: &Server, bin_dir: &Path, args: &[&str]) -> String {
    let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap_or_default());
    let kubeconfig = server.kubeconfig();
    let output = Command::new("kubectl")
        .arg("stowage")
        .args(args)
        .args(["--kubeconfig", kubeconfig.to_str().unwrap(), "-n", NS])
        .env("PATH", path)
        .env_remove("KUBECONFIG")
        .output()
        .expect("run kubectl (a missing kubectl is a failure)");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(output.status.success(), "kubectl stowage {args:?}: {stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    stdout
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_stowage_pull_ls_and_diff() {
    let server = Server::start_temp(&[]);
    let bin_dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_stowage"), bin_dir.path().join("kubectl-stowage")).unwrap();
    let v1 = tree_from_dir(&corpus().join("rukpak-testdata/registry/valid"));
    let mut v2 = v1.clone();
    let (first, _) = v2.iter().find(|(p, _)| p.starts_with("manifests/")).map(|(p, n)| (p.clone(), n.clone())).unwrap();
    v2.remove(&first);
    v2.insert("manifests/added.yaml".into(), file("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: added\n"));
    server.create_bundle(NS, "app").await;
    let b1 = server.upload_ok(NS, "app", build_tar(&v1), None).await;
    let b2 = server.upload_ok(NS, "app", build_tar(&v2), None).await;

    let listing = kubectl_stowage(&server, bin_dir.path(), &["ls", "app"]);
    assert!(listing.lines().any(|l| l.ends_with(" manifests/added.yaml")), "{listing}");
    // Files and the directories the uploaded tar named (`build_tar` names them all).
    assert_eq!(listing.lines().filter(|l| !l.ends_with('/')).count(), v2.len(), "{listing}");
    assert!(listing.lines().any(|l| l.ends_with(" - manifests/")), "{listing}");

    let rev1 = str_at(&b1, "/status/contentName");
    let rev2_digest = str_at(&b2, "/status/digest").trim_start_matches("sha256:")[..12].to_owned();
    let diff = kubectl_stowage(&server, bin_dir.path(), &["diff", "app", rev1, &rev2_digest]);
    assert!(diff.lines().any(|l| l == "A manifests/added.yaml"), "{diff}");
    assert!(diff.lines().any(|l| l == format!("D {first}")), "{diff}");
    assert_eq!(diff.lines().count(), 2, "{diff}");

    let out = tempfile::tempdir().unwrap();
    let dir = out.path().join("app");
    let pulled =
        kubectl_stowage(&server, bin_dir.path(), &["pull", "app", dir.to_str().unwrap(), "--piece-bytes", "4096"]);
    assert!(pulled.contains(str_at(&b2, "/status/digest")), "{pulled}");
    assert_trees_equal(&v2, &tree_from_dir(&dir), "kubectl stowage pull");
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_stowage_push_uploads_in_pieces_and_round_trips() {
    let server = Server::start_temp(&[]);
    let bin_dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_stowage"), bin_dir.path().join("kubectl-stowage")).unwrap();
    let kps = corpus().join("kube-prometheus-stack/88.5.3");
    // 256 KiB pieces: the compressed chart takes several.
    let pushed = kubectl_stowage(
        &server,
        bin_dir.path(),
        &["push", kps.to_str().unwrap(), "--name", "kps", "--piece-bytes", "262144"],
    );
    let b = server.get_json(&bundle(NS, "kps")).await;
    assert_unpacked(&b);
    assert!(pushed.contains(str_at(&b, "/status/digest")), "{pushed}");
    assert_eq!(b["status"]["format"], "helm", "a chart detected from the upload: {b:#}");
    let out = tempfile::tempdir().unwrap();
    let dir = out.path().join("kps");
    kubectl_stowage(&server, bin_dir.path(), &["pull", "kps", dir.to_str().unwrap()]);
    assert_trees_equal(&tree_from_dir(&kps), &tree_from_dir(&dir), "push then pull");
    // Pushing the same tree again stores nothing new: the same revision is served.
    kubectl_stowage(&server, bin_dir.path(), &["push", kps.to_str().unwrap(), "--name", "kps"]);
    assert_eq!(server.bundlecontent_names(NS).await.len(), 1);
}
