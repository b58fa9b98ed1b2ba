//! The tree that comes back is the tree that went in: every file, symlink and directory (empty
//! ones too) with its permission bits, through the tar, subtrees and the listing; what is
//! normalised (owners, times, user names, setuid/setgid/sticky) is the same for any tar tool. An
//! archive without files is refused unless the Bundle says empty content is intended, and the
//! Bundle keeps serving what it served.

use std::process::Command;

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::harness::*;
use crate::http_server::{HttpAuth, HttpServer};
use crate::kubectl::Kubectl;
use crate::tarutil::*;
use crate::unpack::{condition, create, http_server_args, merge_patch, wait_reason};

fn file(data: &str, mode: u32) -> Entry {
    Entry::File { data: data.as_bytes().to_vec(), mode }
}

fn dir(mode: u32) -> Entry {
    Entry::Dir { mode }
}

/// What `helm create mychart` writes (files 0644, directories 0755), `charts/` empty.
fn helm_create_chart() -> Entries {
    let mut chart = Entries::new();
    chart.insert(".helmignore".into(), file("# Patterns to ignore when building packages.\n.DS_Store\n.git/\n", 0o644));
    chart.insert(
        "Chart.yaml".into(),
        file("apiVersion: v2\nname: mychart\ndescription: A Helm chart for Kubernetes\ntype: application\nversion: 0.1.0\nappVersion: \"1.16.0\"\n", 0o644),
    );
    chart.insert("values.yaml".into(), file("replicaCount: 1\nimage:\n  repository: nginx\n  tag: \"\"\n", 0o644));
    chart.insert("charts/".into(), dir(0o755));
    chart.insert("templates/".into(), dir(0o755));
    chart.insert("templates/tests/".into(), dir(0o755));
    for (name, body) in [
        ("NOTES.txt", "1. Get the application URL by running these commands:\n"),
        ("_helpers.tpl", "{{- define \"mychart.name\" -}}\n{{- .Chart.Name | trunc 63 }}\n{{- end }}\n"),
        ("deployment.yaml", "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: {{ include \"mychart.name\" . }}\n"),
        ("hpa.yaml", "{{- if .Values.autoscaling.enabled }}\napiVersion: autoscaling/v2\nkind: HorizontalPodAutoscaler\n{{- end }}\n"),
        ("ingress.yaml", "{{- if .Values.ingress.enabled -}}\napiVersion: networking.k8s.io/v1\nkind: Ingress\n{{- end }}\n"),
        ("service.yaml", "apiVersion: v1\nkind: Service\nmetadata:\n  name: {{ include \"mychart.name\" . }}\n"),
        ("serviceaccount.yaml", "{{- if .Values.serviceAccount.create -}}\napiVersion: v1\nkind: ServiceAccount\n{{- end }}\n"),
        ("tests/test-connection.yaml", "apiVersion: v1\nkind: Pod\nmetadata:\n  name: test-connection\n"),
    ] {
        chart.insert(format!("templates/{name}"), file(body, 0o644));
    }
    chart
}

/// Files 0755, 0700, 0600, 0644, 0444, directories 0700 and 0750 (empty), a symlink.
fn modes_tree() -> Entries {
    let mut tree = Entries::new();
    tree.insert("bin/".into(), dir(0o755));
    tree.insert("bin/run.sh".into(), file("#!/bin/sh\necho run\n", 0o755));
    tree.insert("bin/private.sh".into(), file("#!/bin/sh\necho private\n", 0o700));
    tree.insert("cache/".into(), dir(0o750));
    tree.insert("secrets/".into(), dir(0o700));
    tree.insert("secrets/key".into(), file("not really a key\n", 0o600));
    tree.insert("readonly.txt".into(), file("look, don't touch\n", 0o444));
    tree.insert("values.yaml".into(), file("a: 1\n", 0o644));
    tree.insert("latest".into(), Entry::Symlink("bin/run.sh".into()));
    tree
}

fn temp_dir() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

/// Extracts a tar with the system's GNU tar (as a provisioner would) into a new directory.
fn system_untar(tar: &[u8]) -> tempfile::TempDir {
    let out = temp_dir();
    let archive = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(archive.path(), tar).unwrap();
    let status = Command::new("tar").arg("-C").arg(out.path()).arg("-xpf").arg(archive.path()).status().unwrap();
    assert!(status.success(), "tar -x failed");
    out
}

async fn listing(server: &Server, path: &str) -> Vec<Value> {
    let resp = server.client().get(server.url(path)).header("Accept", "application/json").send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK, "listing {path}");
    let list = parse_json(&resp.bytes().await.unwrap(), "listing");
    list["files"].as_array().expect("files").clone()
}

/// The listing names every entry with its type and permission bits.
fn assert_listing_matches(listed: &[Value], expected: &Entries, context: &str) {
    let paths: Vec<&str> = listed.iter().map(|e| str_at(e, "/path")).collect();
    let want: Vec<&str> = expected.keys().map(String::as_str).collect();
    assert_eq!(paths, want, "{context}: listing paths");
    for (item, (path, entry)) in listed.iter().zip(expected) {
        let (kind, mode, size) = match entry {
            Entry::File { data, mode } => ("file", *mode, data.len() as u64),
            Entry::Dir { mode } => ("directory", *mode, 0),
            Entry::Symlink(_) => ("symlink", 0o777, 0),
        };
        assert_eq!(item["type"], kind, "{context}: {path}: {item}");
        assert_eq!(u64_at(item, "/mode"), u64::from(mode), "{context}: {path}: mode {item}");
        assert_eq!(u64_at(item, "/size"), size, "{context}: {path}: size {item}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_helm_create_chart_round_trips_with_its_empty_charts_directory() {
    let server = Server::start_temp(&[]);
    let chart = helm_create_chart();
    let src = temp_dir();
    write_entries(src.path(), &chart);
    assert_entries_equal(&chart, &entries_from_dir(src.path()), "the chart on disk");

    server.create_bundle("fidelity", "mychart").await;
    let b = server.upload_ok("fidelity", "mychart", system_tar(src.path()), None).await;
    assert_eq!(b["status"]["format"], "helm", "{b:#}");
    assert_eq!(u64_at(&b, "/status/files"), 11, "files count, directories do not: {b:#}");
    let tar = server.download(&bundle_content("fidelity", "mychart")).await;
    assert_eq!(digest_of(&tar), str_at(&b, "/status/digest"));
    assert_entries_equal(&chart, &parse_served_entries(&tar), "served tar");
    let extracted = system_untar(&tar);
    assert_entries_equal(&chart, &entries_from_dir(extracted.path()), "extracted with tar -x");

    // The empty directory, asked for with or without its slash, is a subtree of itself.
    for path in ["charts", "charts/"] {
        let sub = server.download(&with_path(&bundle_content("fidelity", "mychart"), path)).await;
        let want = Entries::from([("charts/".to_string(), dir(0o755))]);
        assert_entries_equal(&want, &parse_served_entries(&sub), &format!("?path={path}"));
    }
    assert_listing_matches(&listing(&server, &bundle_content("fidelity", "mychart")).await, &chart, "listing");
}

#[tokio::test(flavor = "multi_thread")]
async fn permission_bits_round_trip_exactly_whatever_tars_them() {
    let server = Server::start_temp(&[]);
    let tree = modes_tree();
    // Through tar::Builder (owner 1000, an mtime, user names, contents before their directories),
    // with setuid and sticky bits that are not kept.
    let mut uploaded = tree.clone();
    uploaded.insert("bin/run.sh".into(), file("#!/bin/sh\necho run\n", 0o4755));
    uploaded.insert("cache/".into(), dir(0o1750));
    server.create_bundle("fidelity", "modes").await;
    let b = server.upload_ok("fidelity", "modes", tar_of_entries(&uploaded), None).await;
    let content = bundle_content("fidelity", "modes");
    let tar = server.download(&content).await;
    assert_entries_equal(&tree, &parse_served_entries(&tar), "served tar");
    assert_entries_equal(&tree, &entries_from_dir(system_untar(&tar).path()), "extracted with tar -x");
    assert_listing_matches(&listing(&server, &content).await, &tree, "listing");

    // The same tree tarred by GNU tar from disk is the same revision: the tar stays deterministic.
    let src = temp_dir();
    write_entries(src.path(), &tree);
    let again = server.upload_ok("fidelity", "modes", system_tar(src.path()), None).await;
    assert_eq!(again["status"]["digest"], b["status"]["digest"], "GNU tar and tar::Builder of one tree");

    // Subtrees carry their directory; single files, ranges and other modes stay as they were.
    let secrets = parse_served_entries(&server.download(&with_path(&content, "secrets")).await);
    let want = Entries::from([
        ("secrets/".to_string(), dir(0o700)),
        ("secrets/key".to_string(), file("not really a key\n", 0o600)),
    ]);
    assert_entries_equal(&want, &secrets, "?path=secrets");
    assert_eq!(server.download(&with_path(&content, "secrets/key")).await, b"not really a key\n");
    let resp = server.client().get(server.url(&content)).header("Range", "bytes=0-1535").send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::PARTIAL_CONTENT);
    assert!(resp.bytes().await.unwrap()[..] == tar[..1536], "a range is the slice of the whole");
}

/// Uploads `body` expecting 422 `archive holds no files`.
async fn expect_no_files(server: &Server, name: &str, body: Vec<u8>, what: &str) {
    let resp = server.upload("fidelity", name, body, None).await;
    let status = expect_status(resp, 422, "Invalid").await;
    let message = str_at(&status, "/message");
    assert!(message.contains("archive holds no files"), "{what}: {status:#}");
    assert!(message.contains("spec.allowEmpty"), "{what}: says how to mean it: {status:#}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_upload_without_files_is_refused_unless_empty_content_is_intended() {
    let server = Server::start_temp(&[]);
    server.create_bundle("fidelity", "app").await;
    let good = server.upload_ok("fidelity", "app", tar_of_entries(&modes_tree()), None).await;
    let digest = str_at(&good, "/status/digest").to_owned();

    let end_marker_only = vec![0u8; 1024];
    let only_dirs = Entries::from([("charts/".to_string(), dir(0o755)), ("charts/sub/".to_string(), dir(0o700))]);
    expect_no_files(&server, "app", end_marker_only.clone(), "an archive of nothing").await;
    expect_no_files(&server, "app", tar_of_entries(&only_dirs), "an archive of directories").await;
    let b = server.get_json(&bundle("fidelity", "app")).await;
    assert_eq!(str_at(&b, "/status/digest"), digest, "the Bundle still serves its content: {b:#}");
    assert_eq!(b["status"]["phase"], "Unpacked", "{b:#}");
    assert_eq!(digest_of(&server.download(&bundle_content("fidelity", "app")).await), digest);
    assert_eq!(server.bundlecontent_names("fidelity").await.len(), 1, "nothing stored");

    // Meant to be empty: a spec field kubectl knows about; then accepted, and served as it came.
    let kubectl = Kubectl::new(&server);
    let explained = kubectl.ok(&["explain", "bundle.spec.allowEmpty"]);
    assert!(explained.contains("boolean") && explained.contains("archive holds no files"), "{explained}");
    kubectl.ok(&[
        "patch",
        "bundle",
        "app",
        "-n",
        "fidelity",
        "--type",
        "merge",
        "-p",
        r#"{"spec":{"allowEmpty":true}}"#,
    ]);
    let b = server.upload_ok("fidelity", "app", tar_of_entries(&only_dirs), None).await;
    assert_eq!((u64_at(&b, "/status/files"), u64_at(&b, "/status/size")), (0, 0), "{b:#}");
    let served = server.download(&bundle_content("fidelity", "app")).await;
    assert_entries_equal(&only_dirs, &parse_served_entries(&served), "directories only");
    server.upload_ok("fidelity", "app", end_marker_only, None).await;
    assert_eq!(server.download(&bundle_content("fidelity", "app")).await, vec![0u8; 1024], "an empty tar");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_source_gone_empty_keeps_the_last_good_content_served() {
    let web = HttpServer::start(HttpAuth::None);
    let chart = helm_create_chart();
    web.put("chart.tar", &tar_of_entries(&chart));
    web.put("empty.tar", &[0u8; 1024]);
    let args = http_server_args(&web.host_port());
    let server = Server::start_temp(&args.iter().map(String::as_str).collect::<Vec<_>>());

    create(&server, "chart", json!({"sources": [{"http": {"url": web.url("chart.tar")}}]})).await;
    let good = wait_reason(&server, "chart", "Unpacked").await;
    let served = server.download(&bundle_content("unpack", "chart")).await;
    assert_entries_equal(&chart, &parse_served_entries(&served), "chart from an http source");

    merge_patch(&server, "chart", json!({"spec": {"sources": [{"http": {"url": web.url("empty.tar")}}]}})).await;
    let b = wait_reason(&server, "chart", "EmptyContent").await;
    let unpacked = condition(&b, "Unpacked");
    assert!(unpacked["message"].as_str().unwrap().contains("archive holds no files"), "{unpacked}");
    assert_eq!(condition(&b, "Available")["status"], "True", "{b:#}");
    assert_eq!(b["status"]["contentName"], good["status"]["contentName"], "{b:#}");
    assert_eq!(server.download(&bundle_content("unpack", "chart")).await, served, "the last good content");

    merge_patch(&server, "chart", json!({"spec": {"allowEmpty": true}})).await;
    let b = wait_reason(&server, "chart", "Unpacked").await;
    assert_eq!(u64_at(&b, "/status/files"), 0, "{b:#}");
    assert_eq!(server.download(&bundle_content("unpack", "chart")).await, vec![0u8; 1024]);
}
