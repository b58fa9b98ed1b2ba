//! The real kubectl against a standalone server, with only the kubeconfig the server wrote.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::harness::*;
use crate::tarutil::*;

const KUBECTL_TIMEOUT: Duration = Duration::from_secs(90);

pub(crate) struct Kubectl {
    kubeconfig: PathBuf,
    cache_dir: tempfile::TempDir,
}

impl Kubectl {
    pub(crate) fn new(server: &Server) -> Kubectl {
        let found = Command::new("kubectl").args(["version", "--client"]).output();
        assert!(
            matches!(&found, Ok(o) if o.status.success()),
            "kubectl not found on PATH (a missing tool is a failure): {found:?}"
        );
        Kubectl { kubeconfig: server.kubeconfig(), cache_dir: tempfile::tempdir().unwrap() }
    }

    /// Runs kubectl with `args` (stdin from `stdin`, stdout to `stdout_to` if given).
    fn run_with(&self, args: &[&str], stdin: Option<&Path>, stdout_to: Option<&Path>) -> Output {
        let mut cmd = Command::new("kubectl");
        cmd.arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--cache-dir")
            .arg(self.cache_dir.path())
            .arg("--request-timeout=60s")
            .args(args)
            .env_remove("KUBECONFIG")
            .env_remove("HTTPS_PROXY")
            .env_remove("https_proxy")
            .env_remove("HTTP_PROXY")
            .env_remove("http_proxy")
            .stdin(match stdin {
                Some(p) => Stdio::from(std::fs::File::open(p).unwrap()),
                None => Stdio::null(),
            })
            .stdout(match stdout_to {
                Some(p) => Stdio::from(std::fs::File::create(p).unwrap()),
                None => Stdio::piped(),
            })
            .stderr(Stdio::piped());
        let child = cmd.spawn().expect("spawn kubectl");
        let pid = child.id();
        // A watchdog: kubectl must never hang the suite.
        let (tx, rx) = std::sync::mpsc::channel();
        let watchdog = std::thread::spawn(move || {
            let start = Instant::now();
            while start.elapsed() < KUBECTL_TIMEOUT {
                if rx.recv_timeout(Duration::from_millis(200)).is_ok() {
                    return false;
                }
            }
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            true
        });
        let out = child.wait_with_output().expect("wait for kubectl");
        let _ = tx.send(());
        let killed = watchdog.join().unwrap();
        assert!(!killed, "kubectl {args:?} hung for {KUBECTL_TIMEOUT:?} and was killed");
        out
    }

    pub(crate) fn run(&self, args: &[&str]) -> Output {
        self.run_with(args, None, None)
    }

    /// Runs kubectl, asserts success, returns stdout.
    pub(crate) fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "kubectl {args:?} failed ({}):\nstdout: {}\nstderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// Runs kubectl, asserts failure, returns stderr.
    fn fails(&self, args: &[&str], stdin: Option<&Path>) -> String {
        let out = self.run_with(args, stdin, None);
        assert!(
            !out.status.success(),
            "kubectl {args:?} succeeded but should have failed:\n{}",
            String::from_utf8_lossy(&out.stdout)
        );
        String::from_utf8(out.stderr).unwrap()
    }
}

fn write_yaml(dir: &Path, name: &str, yaml: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, yaml).unwrap();
    p
}

fn bundle_yaml(ns: &str, name: &str, extra_spec: &str) -> String {
    format!(
        "apiVersion: content.stowage.dev/v1alpha1\n\
         kind: Bundle\n\
         metadata:\n  name: {name}\n  namespace: {ns}\n\
         spec:\n  sources:\n  - upload: {{}}\n{extra_spec}"
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_create_get_describe_download_delete() {
    let server = Server::start_temp(&[]);
    let k = Kubectl::new(&server);
    let files = tempfile::tempdir().unwrap();
    let yaml = write_yaml(files.path(), "b1.yaml", &bundle_yaml("ns1", "web-app", ""));

    // create -f FILE
    let out = k.ok(&["create", "-f", yaml.to_str().unwrap()]);
    assert!(out.contains("web-app") && out.contains("created"), "create said: {out}");

    // create -f - (stdin), another namespace
    let other = write_yaml(files.path(), "b2.yaml", &bundle_yaml("ns2", "other-app", ""));
    let out = k.run_with(&["create", "-f", "-"], Some(&other), None);
    assert!(out.status.success(), "create -f - failed: {out:?}");

    // get, in one namespace, all namespaces, by short name, as JSON
    let out = k.ok(&["get", "bundles", "-n", "ns1"]);
    assert!(out.contains("web-app"), "get bundles -n ns1:\n{out}");
    assert!(!out.contains("other-app"), "ns2's bundle listed in ns1:\n{out}");
    let out = k.ok(&["get", "bundles", "-A"]);
    for want in ["ns1", "web-app", "ns2", "other-app"] {
        assert!(out.contains(want), "get bundles -A lacks {want}:\n{out}");
    }
    let out = k.ok(&["get", "bdl", "-n", "ns1"]);
    assert!(out.contains("web-app"), "get bdl:\n{out}");
    let json: Value = serde_json::from_str(&k.ok(&["get", "bundle", "web-app", "-n", "ns1", "-o", "json"])).unwrap();
    assert_eq!(str_at(&json, "/metadata/namespace"), "ns1");
    assert_eq!(json["metadata"]["generation"], 1, "{json:#}");
    assert!(!str_at(&json, "/metadata/uid").is_empty());

    // upload (HTTP), then kubectl sees the result
    let tree = tree_from_dir(&corpus().join("operator-registry/etcd"));
    let b = server.upload_ok("ns1", "web-app", build_tar(&tree), None).await;
    let digest = str_at(&b, "/status/digest").to_owned();
    let content_name = str_at(&b, "/status/contentName").to_owned();

    let out = k.ok(&["describe", "bundle", "web-app", "-n", "ns1"]);
    assert!(out.contains("web-app"), "describe:\n{out}");
    assert!(out.contains("Unpacked"), "describe shows no Unpacked phase/condition:\n{out}");
    assert!(out.contains(&digest), "describe shows no digest:\n{out}");

    for resource in ["bundlecontents", "bc"] {
        let out = k.ok(&["get", resource, "-n", "ns1"]);
        assert!(out.contains(&content_name), "get {resource} -n ns1:\n{out}");
    }
    let out = k.ok(&["get", "bundlecontents", "-A"]);
    assert!(out.contains(&content_name) && out.contains("ns1"), "get bc -A:\n{out}");

    // get --raw …/content > file
    let tar_file = files.path().join("download.tar");
    let raw = bundle_content("ns1", "web-app");
    let out = k.run_with(&["get", "--raw", &raw], None, Some(&tar_file));
    assert!(out.status.success(), "get --raw {raw}: {out:?}");
    let downloaded = std::fs::read(&tar_file).unwrap();
    assert_eq!(digest_of(&downloaded), digest, "kubectl get --raw content");
    assert_trees_equal(&tree, &parse_served_tar(&downloaded), "kubectl get --raw");

    // errors as kubectl prints them
    let err = k.fails(&["create", "-f", yaml.to_str().unwrap()], None);
    assert!(err.contains("AlreadyExists"), "second create:\n{err}");

    let bad_name = write_yaml(files.path(), "bad.yaml", &bundle_yaml("ns1", "Bad_Name", ""));
    let err = k.fails(&["create", "-f", bad_name.to_str().unwrap()], None);
    assert!(err.contains("Bad_Name"), "invalid name not named:\n{err}");
    assert!(err.contains("Invalid") || err.contains("invalid"), "{err}");

    let bogus = write_yaml(files.path(), "bogus.yaml", &bundle_yaml("ns1", "bogus", "  bogus: true\n"));
    let err = k.fails(&["create", "-f", bogus.to_str().unwrap()], None);
    assert!(err.contains(r#"strict decoding error: unknown field "spec.bogus""#), "unknown field:\n{err}");
    let err = k.fails(&["get", "bundle", "bogus", "-n", "ns1"], None);
    assert!(err.contains("NotFound"), "the rejected bundle exists:\n{err}");

    // delete
    let out = k.ok(&["delete", "bundle", "web-app", "-n", "ns1"]);
    assert!(out.contains("web-app") && out.contains("deleted"), "delete said: {out}");
    let err = k.fails(&["get", "bundle", "web-app", "-n", "ns1"], None);
    assert!(err.contains("NotFound"), "get after delete:\n{err}");
    eventually(Duration::from_secs(30), "BundleContent deleted with its Bundle", || {
        let k = &k;
        let content_name = &content_name;
        async move {
            let out = k.ok(&["get", "bundlecontents", "-n", "ns1"]);
            if out.contains(content_name.as_str()) {
                Err(out)
            } else {
                Ok(())
            }
        }
    })
    .await;
    let out = k.ok(&["get", "bundles", "-A"]);
    assert!(out.contains("other-app"), "the other bundle went too:\n{out}");
}

/// The everyday edits: `apply` (create, then change), `label`, `annotate`, `patch` (JSON and merge),
/// label selectors on `get`; each visible in the stored object, with generation bumped only by spec
/// changes.
#[tokio::test(flavor = "multi_thread")]
async fn kubectl_apply_label_annotate_patch() {
    let server = Server::start_temp(&[]);
    let kubectl = Kubectl::new(&server);
    let dir = tempfile::tempdir().unwrap();
    let first = write_yaml(dir.path(), "b.yaml", &bundle_yaml("edits", "app", ""));
    kubectl.ok(&["apply", "-f", first.to_str().unwrap()]);
    let changed = write_yaml(dir.path(), "b2.yaml", &bundle_yaml("edits", "app", "  revisionHistoryLimit: 4\n"));
    kubectl.ok(&["apply", "-f", changed.to_str().unwrap()]);
    kubectl.ok(&["-n", "edits", "label", "bundle", "app", "team=payments"]);
    kubectl.ok(&["-n", "edits", "annotate", "bundle", "app", "owner=alice"]);
    kubectl.ok(&[
        "-n",
        "edits",
        "patch",
        "bundle",
        "app",
        "--type=json",
        "-p",
        r#"[{"op":"add","path":"/spec/paused","value":true}]"#,
    ]);
    kubectl.ok(&[
        "-n",
        "edits",
        "patch",
        "bundle",
        "app",
        "--type=merge",
        "-p",
        r#"{"metadata":{"labels":{"tier":"gold"}}}"#,
    ]);

    let obj = server.get_json(&bundle("edits", "app")).await;
    assert_eq!(u64_at(&obj, "/spec/revisionHistoryLimit"), 4);
    assert_eq!(obj.pointer("/spec/paused"), Some(&Value::Bool(true)));
    assert_eq!(str_at(&obj, "/metadata/labels/team"), "payments");
    assert_eq!(str_at(&obj, "/metadata/labels/tier"), "gold");
    assert_eq!(str_at(&obj, "/metadata/annotations/owner"), "alice");
    assert_eq!(u64_at(&obj, "/metadata/generation"), 3, "two spec changes after create; label/annotate don't count");

    let selected = kubectl.ok(&["-n", "edits", "get", "bundles", "-l", "team=payments,tier in (gold)", "-o", "name"]);
    assert_eq!(selected.trim(), "bundle.content.stowage.dev/app");
    let none = kubectl.ok(&["-n", "edits", "get", "bundles", "-l", "team!=payments", "-o", "name"]);
    assert_eq!(none.trim(), "");
    let bad = kubectl
        .fails(&["-n", "edits", "patch", "bundle", "app", "--type=merge", "-p", r#"{"spec":{"paused":"yes"}}"#], None);
    assert!(bad.contains("spec.paused") && bad.contains("boolean"), "{bad}");
}
