//! The provisioner side: `examples/provisioner.rs` run against a standalone server keeps a
//! directory per unpacked Bundle of its kubeconfig's namespace and re-fetches only changed ones
//! (a refusal is one plain line); so does the 19-line
//! `examples/minimal_provisioner.rs` (kube-rs's watcher on `Api::<Bundle>`) as Bundles change
//! under it; the client library resumes a download whose connections are cut mid-piece and still
//! verifies the digest.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use kube::config::{KubeConfigOptions, Kubeconfig};
use stowage::client::{ContentClient, FetchOptions, Fetched};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::harness::*;
use crate::tarutil::{assert_trees_equal, build_tar, file, system_tar, tree_from_dir};

const NS: &str = "prov";

/// The example binary, as `cargo build --examples` leaves it (scripts/test.sh builds it first;
/// `cargo test` builds examples only as test harnesses).
fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let path = exe.parent().and_then(Path::parent).map(|d| d.join("examples").join(name)).expect("target dir");
    assert!(path.exists(), "{} missing: build it with `cargo build --examples`", path.display());
    path
}

fn run_provisioner(server: &Server, out: &Path) -> String {
    let output = Command::new(example("provisioner"))
        .arg(out)
        .args(["--namespace", NS, "--piece-bytes", "65536"])
        .env("KUBECONFIG", server.kubeconfig())
        .env_remove("HTTPS_PROXY")
        .output()
        .expect("run the provisioner example");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(output.status.success(), "provisioner failed: {stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    stdout
}

#[tokio::test(flavor = "multi_thread")]
async fn the_example_provisioner_syncs_and_refetches_only_changed_bundles() {
    let server = Server::start_temp(&[]);
    let etcd = corpus().join("rukpak-testdata/registry/valid");
    let plain = corpus().join("rukpak-testdata/plain-v0/valid");
    for (name, dir) in [("etcd", &etcd), ("plain", &plain)] {
        server.create_bundle(NS, name).await;
        server.upload_ok(NS, name, system_tar(dir), None).await;
    }
    let out = tempfile::tempdir().unwrap();
    let first = run_provisioner(&server, out.path());
    assert_eq!(first.matches(" updated ").count(), 2, "{first}");
    assert_trees_equal(&tree_from_dir(&etcd), &tree_from_dir(&out.path().join(NS).join("etcd")), "etcd synced");
    assert_trees_equal(&tree_from_dir(&plain), &tree_from_dir(&out.path().join(NS).join("plain")), "plain synced");

    let second = run_provisioner(&server, out.path());
    assert_eq!(second.matches(" unchanged ").count(), 2, "If-None-Match: nothing re-fetched: {second}");

    server.upload_ok(NS, "plain", system_tar(&etcd), None).await;
    let third = run_provisioner(&server, out.path());
    assert!(third.contains("prov/plain updated") && third.contains("prov/etcd unchanged"), "{third}");
    assert_trees_equal(&tree_from_dir(&etcd), &tree_from_dir(&out.path().join(NS).join("plain")), "replaced");
}

/// A user who may read Bundles in one namespace only: the example works in the kubeconfig's
/// namespace as kubectl does, and a refusal (asking for every namespace) is one plain line.
#[tokio::test(flavor = "multi_thread")]
async fn the_example_provisioner_works_in_the_kubeconfigs_namespace() {
    let files = tempfile::tempdir().unwrap();
    let policy = format!(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {{name: reader}}\nrules:\n\
         - {{apiGroups: [content.stowage.dev], resources: [bundles, bundles/content], verbs: [get, list, watch]}}\n\
         ---\napiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\n\
         metadata: {{name: readers, namespace: {NS}}}\n\
         roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: reader}}\n\
         subjects: [{{kind: Group, name: readers}}]\n"
    );
    let server = Server::start_with_users("alice-token,alice,1001,\"readers\"\n", &policy);
    let etcd = corpus().join("rukpak-testdata/registry/valid");
    for ns in [NS, "elsewhere"] {
        server.create_bundle(ns, "etcd").await;
        server.upload_ok(ns, "etcd", system_tar(&etcd), None).await;
    }
    let kubeconfig = server.token_kubeconfig("alice", NS);
    let run = |extra: &[&str]| {
        let out = files.path().join("out");
        let output = Command::new(example("provisioner"))
            .arg(&out)
            .args(extra)
            .env("KUBECONFIG", &kubeconfig)
            .env_remove("HTTPS_PROXY")
            .output()
            .expect("run the provisioner example");
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    let (code, stdout, stderr) = run(&[]);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert_eq!(stdout.lines().collect::<Vec<_>>().len(), 1, "only its namespace: {stdout}");
    assert!(stdout.starts_with(&format!("{NS}/etcd updated ")), "{stdout}");
    assert_trees_equal(
        &tree_from_dir(&etcd),
        &tree_from_dir(&files.path().join("out").join(NS).join("etcd")),
        "synced",
    );

    let (code, stdout, stderr) = run(&["--all-namespaces"]);
    assert_eq!((code, stdout.as_str()), (Some(1), ""), "{stderr}");
    assert!(stderr.starts_with("provisioner: Error from server (Forbidden): "), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(!stderr.contains("Status {") && !stderr.contains("Api("), "no debug structures: {stderr}");
}

/// Lines the minimal provisioner prints (`NAME DIGEST`), read on a thread as they come.
struct Printed {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Printed {
    fn start(server: &Server, out: &Path) -> Printed {
        let mut child = Command::new(example("minimal_provisioner"))
            .arg(out)
            .env("KUBECONFIG", server.kubeconfig())
            .env_remove("HTTPS_PROXY")
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("start the minimal provisioner");
        let stdout = child.stdout.take().expect("stdout");
        let (send, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = send.send(line);
            }
        });
        Printed { child, lines, seen: Vec::new() }
    }

    /// Waits (at most 30 s) until `line` was printed.
    fn expect(&mut self, line: &str) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !self.seen.iter().any(|l| l == line) {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => self.seen.push(l),
                Err(_) => panic!("the provisioner never printed {line:?}; it printed {:?}", self.seen),
            }
        }
    }
}

impl Drop for Printed {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// docs/provisioners.md shows the minimal provisioner as it is compiled and tested here.
#[test]
fn the_documented_minimal_provisioner_is_the_example() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let example = std::fs::read_to_string(root.join("examples/minimal_provisioner.rs")).unwrap();
    let docs = std::fs::read_to_string(root.join("docs/provisioners.md")).unwrap();
    let code: String = example.lines().filter(|l| !l.starts_with("//!")).map(|l| format!("{l}\n")).collect();
    assert!(docs.contains(&format!("```rust\n{code}```")), "docs/provisioners.md shows another program");
    assert!(code.lines().filter(|l| !l.trim().is_empty()).count() < 20, "no longer under 20 lines");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_minimal_provisioner_follows_bundles_as_they_change() {
    let server = Server::start_temp(&[]);
    let etcd = corpus().join("rukpak-testdata/registry/valid");
    let plain = corpus().join("rukpak-testdata/plain-v0/valid");
    // The admin kubeconfig's context has no namespace: the example works in `default`.
    server.create_bundle("default", "etcd").await;
    let first = server.upload_ok("default", "etcd", system_tar(&etcd), None).await;
    server.create_bundle("default", "plain").await; // no content yet: not fetched
    let out = tempfile::tempdir().unwrap();
    let mut printed = Printed::start(&server, out.path());
    printed.expect(&format!("etcd {}", str_at(&first, "/status/digest")));
    assert_trees_equal(&tree_from_dir(&etcd), &tree_from_dir(&out.path().join("etcd")), "etcd synced");

    // Content arriving later, and new content replacing old, reach it through the watch.
    let second = server.upload_ok("default", "plain", system_tar(&plain), None).await;
    printed.expect(&format!("plain {}", str_at(&second, "/status/digest")));
    assert_trees_equal(&tree_from_dir(&plain), &tree_from_dir(&out.path().join("plain")), "plain synced");
    let third = server.upload_ok("default", "etcd", system_tar(&plain), None).await;
    printed.expect(&format!("etcd {}", str_at(&third, "/status/digest")));
    assert_trees_equal(&tree_from_dir(&plain), &tree_from_dir(&out.path().join("etcd")), "etcd replaced");
    // A change that leaves the content as it is (a label) fetches nothing: If-None-Match.
    let label = serde_json::json!({"metadata": {"labels": {"tier": "gold"}}});
    let patched = server
        .client()
        .patch(server.url(&bundle("default", "plain")))
        .header("content-type", "application/merge-patch+json")
        .body(label.to_string())
        .send()
        .await
        .unwrap();
    assert!(patched.status().is_success(), "label patch: {}", patched.status());
    // The next new content is printed next: the provisioner takes the watch's events in order,
    // so a fetch for the label change would have printed its line first.
    let chart = crate::tarutil::Tree::from([("Chart.yaml".to_string(), file(b"name: fourth\n".to_vec()))]);
    let fourth = server.upload_ok("default", "etcd", build_tar(&chart), None).await;
    printed.expect(&format!("etcd {}", str_at(&fourth, "/status/digest")));
    assert_eq!(printed.seen.len(), 4, "only changed content is fetched: {:?}", printed.seen);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_download_cut_mid_piece_resumes_and_is_verified() {
    let server = Server::start_temp(&[]);
    let kps = corpus().join("kube-prometheus-stack/88.5.3");
    server.create_bundle(NS, "kps").await;
    let b = server.upload_ok(NS, "kps", system_tar(&kps), None).await;
    // Every connection is cut after 300 KB from the server: each 1 MiB piece is cut at least once.
    let proxy = CuttingProxy::start(&server.url, 300_000).await;
    let client = kube_client(&server, &proxy.url()).await;
    let content = ContentClient::with_options(
        client,
        FetchOptions { piece_bytes: 1 << 20, attempts: 5, ..FetchOptions::default() },
    );
    let out = tempfile::tempdir().unwrap();
    let dir = out.path().join("kps");
    let fetched = content.fetch_into(NS, "kps", &dir, None).await.expect("fetch through cuts");
    assert_eq!(fetched, Fetched::Updated { digest: str_at(&b, "/status/digest").to_owned() });
    assert_trees_equal(&tree_from_dir(&kps), &tree_from_dir(&dir), "resumed download");
    assert!(proxy.cuts() >= 3, "the proxy really cut connections: {}", proxy.cuts());
    report(&format!("provisioner: kube-prometheus-stack fetched through {} cut connections", proxy.cuts()));
    let again = content.fetch_into(NS, "kps", &dir, Some(str_at(&b, "/status/digest"))).await.unwrap();
    assert_eq!(again, Fetched::Unchanged);
}

async fn kube_client(server: &Server, url: &str) -> kube::Client {
    let kubeconfig = Kubeconfig::read_from(server.kubeconfig()).unwrap();
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await.unwrap();
    config.cluster_url = url.parse().unwrap();
    kube::Client::try_from(config).unwrap()
}

/// A TCP proxy that closes each connection after `limit` bytes came back from the server.
struct CuttingProxy {
    addr: std::net::SocketAddr,
    cuts: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl CuttingProxy {
    async fn start(server_url: &str, limit: usize) -> CuttingProxy {
        let backend = server_url.trim_start_matches("https://").to_string();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let cuts = Arc::new(AtomicUsize::new(0));
        let counter = cuts.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (backend, counter) = (backend.clone(), counter.clone());
                tokio::spawn(async move {
                    let Ok(upstream) = TcpStream::connect(&backend).await else { return };
                    let (mut client_read, mut client_write) = client.into_split();
                    let (mut up_read, mut up_write) = upstream.into_split();
                    let upload = tokio::spawn(async move {
                        let _ = tokio::io::copy(&mut client_read, &mut up_write).await;
                    });
                    let mut sent = 0usize;
                    let mut buf = vec![0u8; 16 << 10];
                    loop {
                        let n = match up_read.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        let n = n.min(limit - sent);
                        if client_write.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                        sent += n;
                        if sent >= limit {
                            counter.fetch_add(1, Ordering::Relaxed);
                            break;
                        }
                    }
                    upload.abort();
                });
            }
        });
        CuttingProxy { addr, cuts, task }
    }

    fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    fn cuts(&self) -> usize {
        self.cuts.load(Ordering::Relaxed)
    }
}

impl Drop for CuttingProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}
