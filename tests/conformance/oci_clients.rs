//! Real OCI clients pull from the registry view, each the way its users run it: `skopeo inspect` and
//! `skopeo copy` of a plain, a registry+v1 and a Helm Bundle; `podman pull` of the bundle image with
//! its OLM labels; `ctr pull` through a private containerd; Helm (`helm-python-sdk`, Helm v4's own
//! Go SDK) pulling and linting the chart; the `oras` Python SDK fetching it. Credentials are a user
//! name and a Kubernetes token as the password, as `podman login` and pull Secrets carry them.
//!
//! Needs skopeo, podman, runc, containerd and the two PyPI packages (scripts/test.sh installs
//! them) and root, as CI runs. Every client keeps its state in the test's own directory.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

use crate::harness::*;
use crate::oci_view::{chart_tree, registry_v1_tree, Oci, POLICY, TOKENS};
use crate::tarutil::*;

/// Runs a client; its stdout, or a failure with everything it said.
fn ok(command: &mut Command) -> String {
    let output = command.stdin(Stdio::null()).output().unwrap_or_else(|e| panic!("run {command:?}: {e}"));
    assert!(
        output.status.success(),
        "{command:?} failed ({}):\n{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The server with readers, and what clients need to reach it: `127.0.0.1:PORT` and a directory
/// holding its CA as `ca.crt` (what `--cert-dir` reads).
struct Setup {
    server: Server,
    host: String,
    work: tempfile::TempDir,
}

impl Setup {
    fn new() -> Setup {
        let server = Server::start_with_users(TOKENS, POLICY);
        let host = server.url.trim_start_matches("https://").to_string();
        let work = tempfile::tempdir().unwrap();
        std::fs::create_dir(work.path().join("certs")).unwrap();
        std::fs::copy(server.data_dir().join("pki/ca.crt"), work.path().join("certs/ca.crt")).unwrap();
        Setup { server, host, work }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.work.path().join(name)
    }

    fn certs(&self) -> String {
        self.path("certs").display().to_string()
    }

    fn ca(&self) -> String {
        self.path("certs/ca.crt").display().to_string()
    }

    fn reference(&self, repository: &str, tag: &str) -> String {
        format!("{}/{repository}:{tag}", self.host)
    }

    /// Uploads `entries` as Bundle `team-a/name`; the Bundle.
    async fn bundle(&self, name: &str, entries: &Entries) -> Value {
        self.server.create_bundle("team-a", name).await;
        self.server.upload_ok("team-a", name, tar_of_entries(entries), None).await
    }

    /// The manifest digest the view gives `repository:tag`.
    async fn manifest_digest(&self, repository: &str, tag: &str) -> String {
        let oci = Oci::new(&self.server, Some("alice-token"));
        let (headers, _) = oci.get_ok(&format!("/v2/{repository}/manifests/{tag}")).await;
        header(&headers, "docker-content-digest").unwrap().to_string()
    }
}

/// A tree with what a layer must carry: modes, an empty directory, a symlink, nested paths.
fn plain_entries() -> Entries {
    let mut entries = Entries::new();
    entries.insert("manifests/".into(), Entry::Dir { mode: 0o755 });
    entries.insert(
        "manifests/deploy.yaml".into(),
        Entry::File { data: b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n".to_vec(), mode: 0o644 },
    );
    entries.insert("manifests/link.yaml".into(), Entry::Symlink("deploy.yaml".into()));
    entries.insert("bin/".into(), Entry::Dir { mode: 0o750 });
    entries.insert("bin/run.sh".into(), Entry::File { data: b"#!/bin/sh\necho hi\n".to_vec(), mode: 0o755 });
    entries.insert("empty/".into(), Entry::Dir { mode: 0o700 });
    entries
}

/// `tree` with every directory spelled out (mode 0755), as a served tar holds them.
fn with_dirs(tree: &Tree) -> Entries {
    let mut entries = Entries::new();
    for (path, node) in tree {
        let mut at = 0;
        while let Some(slash) = path[at..].find('/') {
            at += slash + 1;
            entries.entry(path[..at].to_string()).or_insert(Entry::Dir { mode: 0o755 });
        }
        let entry = match node {
            Node::File { data, exec } => Entry::File { data: data.clone(), mode: if *exec { 0o755 } else { 0o644 } },
            Node::Symlink(target) => Entry::Symlink(target.clone()),
        };
        entries.insert(path.clone(), entry);
    }
    entries
}

/// The files of an OCI layout's image: its manifest, config and layer blobs.
fn layout_image(dir: &Path) -> (Value, Value, Vec<PathBuf>) {
    let blob = |digest: &str| dir.join("blobs/sha256").join(digest.trim_start_matches("sha256:"));
    let index: Value = serde_json::from_slice(&std::fs::read(dir.join("index.json")).unwrap()).unwrap();
    let manifest_digest = index["manifests"][0]["digest"].as_str().unwrap().to_string();
    let manifest: Value = serde_json::from_slice(&std::fs::read(blob(&manifest_digest)).unwrap()).unwrap();
    let config: Value =
        serde_json::from_slice(&std::fs::read(blob(manifest["config"]["digest"].as_str().unwrap())).unwrap()).unwrap();
    let layers = manifest["layers"].as_array().unwrap().iter().map(|l| blob(l["digest"].as_str().unwrap())).collect();
    (manifest, config, layers)
}

/// The regular files of `entries` and their bytes (what a chart is made of).
fn regular_files(entries: &Entries) -> Vec<(String, Vec<u8>)> {
    entries
        .iter()
        .filter_map(|(path, entry)| match entry {
            Entry::File { data, .. } => Some((path.clone(), data.clone())),
            _ => None,
        })
        .collect()
}

/// Unpacks `layer` (tar or tar.gz) with the system tar into a new directory; its entries.
fn unpack(layer: &Path, into: &Path) -> Entries {
    std::fs::create_dir_all(into).unwrap();
    ok(Command::new("tar").arg("-xf").arg(layer).arg("-C").arg(into));
    entries_from_dir(into)
}

#[tokio::test]
async fn skopeo_inspects_and_copies_every_format() {
    let setup = Setup::new();
    let creds = "user:alice-token";
    let plain = plain_entries();
    setup.bundle("plain", &plain).await;
    let operator = with_dirs(&registry_v1_tree());
    setup.bundle("operator", &operator).await;
    let chart = with_dirs(&chart_tree("", "demo", "0.3.1"));
    setup.bundle("chart", &chart).await;

    for (name, expected) in [("plain", &plain), ("operator", &operator)] {
        let inspect = ok(Command::new("skopeo")
            .args(["inspect", "--creds", creds, "--cert-dir", &setup.certs()])
            .arg(format!("docker://{}", setup.reference(&format!("team-a/{name}"), "latest"))));
        let inspect: Value = serde_json::from_str(&inspect).unwrap();
        assert_eq!(inspect["Digest"], setup.manifest_digest(&format!("team-a/{name}"), "latest").await.as_str());
        assert_eq!((inspect["Os"].as_str(), inspect["Architecture"].as_str()), (Some("linux"), Some("amd64")));
        let tags = inspect["RepoTags"].as_array().unwrap();
        assert!(tags.contains(&Value::from("latest")), "{inspect}");
        if name == "operator" {
            assert_eq!(inspect["Labels"]["operators.operatorframework.io.bundle.mediatype.v1"], "registry+v1");
            assert_eq!(inspect["Labels"]["operators.operatorframework.io.bundle.package.v1"], "demo-operator");
        }
        let layout = setup.path(&format!("{name}-layout"));
        ok(Command::new("skopeo")
            .args(["copy", "--preserve-digests", "--src-creds", creds, "--src-cert-dir", &setup.certs()])
            .arg(format!("docker://{}", setup.reference(&format!("team-a/{name}"), "latest")))
            .arg(format!("oci:{}:latest", layout.display())));
        let (manifest, config, layers) = layout_image(&layout);
        assert_eq!(manifest["layers"][0]["mediaType"], "application/vnd.oci.image.layer.v1.tar");
        assert_eq!(config["rootfs"]["diff_ids"][0], manifest["layers"][0]["digest"]);
        assert_eq!(layers.len(), 1);
        let got = unpack(&layers[0], &setup.path(&format!("{name}-rootfs")));
        assert_entries_equal(expected, &got, &format!("{name}: the copied layer unpacked"));
    }

    // A client certificate instead of a token, as docs/registry.md's standalone example uses the
    // admin's: skopeo reads `*.cert` + `*.key` pairs from the cert dir.
    let admin = setup.path("admin-certs");
    std::fs::create_dir(&admin).unwrap();
    let pki = setup.server.data_dir().join("pki");
    for (from, to) in [("ca.crt", "ca.crt"), ("admin.crt", "admin.cert"), ("admin.key", "admin.key")] {
        std::fs::copy(pki.join(from), admin.join(to)).unwrap();
    }
    ok(Command::new("skopeo")
        .args(["inspect", "--cert-dir", admin.to_str().unwrap()])
        .arg(format!("docker://{}", setup.reference("team-a/plain", "latest"))));

    // skopeo inspects an artifact that is not an image only raw: the manifest as served.
    let raw = ok(Command::new("skopeo")
        .args(["inspect", "--raw", "--creds", creds, "--cert-dir", &setup.certs()])
        .arg(format!("docker://{}", setup.reference("team-a/chart", "0.3.1"))));
    assert_eq!(digest_of(raw.as_bytes()), setup.manifest_digest("team-a/chart", "0.3.1").await);

    // The chart: Helm's artifact, copied whole; its layer unpacks to `demo/…`.
    let layout = setup.path("chart-layout");
    ok(Command::new("skopeo")
        .args(["copy", "--preserve-digests", "--src-creds", creds, "--src-cert-dir", &setup.certs()])
        .arg(format!("docker://{}", setup.reference("team-a/chart", "0.3.1")))
        .arg(format!("oci:{}:0.3.1", layout.display())));
    let (manifest, config, layers) = layout_image(&layout);
    assert_eq!(manifest["config"]["mediaType"], "application/vnd.cncf.helm.config.v1+json");
    assert_eq!((config["name"].as_str(), config["version"].as_str()), (Some("demo"), Some("0.3.1")));
    let got = unpack(&layers[0], &setup.path("chart-files"));
    let expected: Vec<(String, Vec<u8>)> =
        regular_files(&chart).into_iter().map(|(p, d)| (format!("demo/{p}"), d)).collect();
    assert_eq!(regular_files(&got), expected, "the chart layer holds the chart as `helm package` lays it out");
}

/// Podman with storage of its own (rootful, vfs), so the test touches no other image store.
struct Podman {
    root: PathBuf,
}

impl Podman {
    fn new(dir: &Path) -> Podman {
        let root = dir.join("podman");
        std::fs::create_dir_all(root.join("tmp")).unwrap();
        let conf = format!(
            "[engine]\nruntime = \"runc\"\ncgroup_manager = \"cgroupfs\"\nevents_logger = \"file\"\n\
             events_logfile_path = \"{0}/events.log\"\ntmp_dir = \"{0}/tmp\"\n[containers]\nnetns = \"host\"\n",
            root.display()
        );
        std::fs::write(root.join("containers.conf"), conf).unwrap();
        Podman { root }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new("podman");
        command.env("CONTAINERS_CONF", self.root.join("containers.conf"));
        command.arg("--root").arg(self.root.join("root")).arg("--runroot").arg(self.root.join("runroot"));
        command.args(["--storage-driver", "vfs", "--tmpdir"]).arg(self.root.join("tmp"));
        command.args(args);
        command
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        let _ = self.command(&["rmi", "--all", "--force"]).output();
    }
}

#[tokio::test]
async fn podman_pulls_the_bundle_image_with_its_labels() {
    let setup = Setup::new();
    let operator = with_dirs(&registry_v1_tree());
    setup.bundle("operator", &operator).await;
    let podman = Podman::new(setup.work.path());
    let image = setup.reference("team-a/operator", "latest");
    ok(&mut podman.command(&["pull", "--quiet", "--creds", "user:alice-token", "--cert-dir", &setup.certs(), &image]));
    let labels = ok(&mut podman.command(&["image", "inspect", "--format", "{{json .Labels}}", &image]));
    let labels: Value = serde_json::from_str(labels.trim()).unwrap();
    for (key, value) in [
        ("operators.operatorframework.io.bundle.mediatype.v1", "registry+v1"),
        ("operators.operatorframework.io.bundle.manifests.v1", "manifests/"),
        ("operators.operatorframework.io.bundle.metadata.v1", "metadata/"),
        ("operators.operatorframework.io.bundle.package.v1", "demo-operator"),
        ("operators.operatorframework.io.bundle.channels.v1", "alpha,stable"),
    ] {
        assert_eq!(labels[key], value, "label {key}: {labels}");
    }
    let mounted = ok(&mut podman.command(&["image", "mount", &image]));
    let got = entries_from_dir(Path::new(mounted.trim()));
    ok(&mut podman.command(&["image", "unmount", &image]));
    assert_entries_equal(&operator, &got, "the mounted bundle image");
    // Without the token the pull is refused.
    let refused = podman.command(&["pull", "--quiet", "--cert-dir", &setup.certs(), &image]).output().unwrap();
    assert!(!refused.status.success());
}

/// A containerd of the test's own (its root, state and socket in `dir`), stopped on drop.
struct Containerd {
    child: std::process::Child,
    socket: PathBuf,
    dir: PathBuf,
}

impl Containerd {
    fn start(dir: &Path) -> Containerd {
        let dir = dir.join("containerd");
        std::fs::create_dir_all(&dir).unwrap();
        let socket = dir.join("containerd.sock");
        let config = format!(
            "version = 2\nroot = \"{d}/root\"\nstate = \"{d}/state\"\n\
             disabled_plugins = [\"io.containerd.grpc.v1.cri\", \"io.containerd.snapshotter.v1.aufs\", \"io.containerd.snapshotter.v1.btrfs\", \"io.containerd.snapshotter.v1.zfs\", \"io.containerd.snapshotter.v1.devmapper\"]\n\
             [grpc]\n  address = \"{s}\"\n[ttrpc]\n  address = \"{s}.ttrpc\"\n[debug]\n  address = \"{d}/debug.sock\"\n  level = \"info\"\n\
             [metrics]\n  address = \"\"\n[plugins.\"io.containerd.internal.v1.opt\"]\n  path = \"{d}/opt\"\n",
            d = dir.display(),
            s = socket.display()
        );
        std::fs::write(dir.join("config.toml"), config).unwrap();
        let log = std::fs::File::create(dir.join("containerd.log")).unwrap();
        let child = Command::new("containerd")
            .arg("--config")
            .arg(dir.join("config.toml"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start containerd (scripts/test.sh installs Debian's containerd)");
        let containerd = Containerd { child, socket, dir };
        wait_until(
            std::time::Duration::from_secs(20),
            std::time::Duration::from_millis(50),
            "containerd to listen",
            || {
                let version = containerd.ctr(&["version"]).output().map_err(|e| e.to_string())?;
                version
                    .status
                    .success()
                    .then_some(())
                    .ok_or_else(|| String::from_utf8_lossy(&version.stderr).into_owned())
            },
        );
        containerd
    }

    fn ctr(&self, args: &[&str]) -> Command {
        let mut command = Command::new("ctr");
        command.arg("--address").arg(&self.socket).args(["--namespace", "conformance"]).args(args);
        command
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        let _ = self.ctr(&["images", "rm", "--sync"]).output();
        let _ = Command::new("kill").arg("-TERM").arg(self.child.id().to_string()).status();
        let _ = terminate_child(&mut self.child, std::time::Duration::from_secs(10));
        let _ = std::fs::remove_dir_all(self.dir.join("state"));
    }
}

#[tokio::test]
async fn ctr_pulls_with_a_user_and_token() {
    let setup = Setup::new();
    let operator = with_dirs(&registry_v1_tree());
    setup.bundle("operator", &operator).await;
    let containerd = Containerd::start(setup.work.path());
    // containerd speaks plain HTTP to 127.0.0.1 unless a hosts file names https and the CA.
    let hosts = setup.path(&format!("hosts/{}", setup.host));
    std::fs::create_dir_all(&hosts).unwrap();
    std::fs::write(
        hosts.join("hosts.toml"),
        format!(
            "server = \"https://{0}\"\n[host.\"https://{0}\"]\n  capabilities = [\"pull\", \"resolve\"]\n  ca = \"{1}\"\n",
            setup.host,
            setup.ca()
        ),
    )
    .unwrap();
    let image = setup.reference("team-a/operator", "latest");
    let hosts_dir = setup.path("hosts").display().to_string();
    let refused = containerd.ctr(&["images", "pull", "--hosts-dir", &hosts_dir, &image]).output().unwrap();
    assert!(!refused.status.success(), "a pull without credentials is refused");
    ok(&mut containerd.ctr(&["images", "pull", "--user", "user:alice-token", "--hosts-dir", &hosts_dir, &image]));
    let mountpoint = setup.path("ctr-mount");
    std::fs::create_dir_all(&mountpoint).unwrap();
    ok(&mut containerd.ctr(&["images", "mount", &image, mountpoint.to_str().unwrap()]));
    let got = entries_from_dir(&mountpoint);
    ok(&mut containerd.ctr(&["images", "unmount", mountpoint.to_str().unwrap()]));
    assert_entries_equal(&operator, &got, "the image containerd unpacked");
}

#[tokio::test]
async fn helm_and_oras_pull_the_chart() {
    let setup = Setup::new();
    let chart = with_dirs(&chart_tree("", "demo", "0.3.1+meta"));
    setup.bundle("chart", &chart).await;
    let out = setup.path("helm-out");
    let script = r#"
import json, sys
import helm_python as helm
import oras.client
host, out, token, ca = sys.argv[1:5]
with helm.RegistryClient(credentials_file=out + "/registry.json") as client:
    client.login(host, "user", token)
    client.pull("oci://" + host + "/team-a/chart", version="0.3.1+meta", destination=out, untar=True, untar_dir=out)
lint = helm.lint(out + "/demo")
oras_client = oras.client.OrasClient(hostname=host, auth_backend="basic", tls_verify=ca)
oras_client.auth.set_basic_auth("user", token)
files = oras_client.pull(target=host + "/team-a/chart:0.3.1_meta", outdir=out + "/oras")
print(json.dumps({"lint": lint, "oras": files}))
"#;
    std::fs::create_dir_all(&out).unwrap();
    let homes = setup.path("helm-home");
    let result = ok(Command::new("python3")
        .arg("-c")
        .arg(script)
        .args([&setup.host, out.to_str().unwrap(), "alice-token", &setup.ca()])
        .current_dir(setup.work.path())
        // Helm's Go TLS reads the CA from here; its homes stay in the test's directory.
        .env("SSL_CERT_FILE", setup.ca())
        .env("HELM_CACHE_HOME", homes.join("cache"))
        .env("HELM_CONFIG_HOME", homes.join("config"))
        .env("HELM_DATA_HOME", homes.join("data"))
        .env("HOME", setup.work.path()));
    let result: Value = serde_json::from_str(result.lines().last().unwrap()).unwrap();
    assert_eq!(result["lint"]["errors"], serde_json::json!([]), "helm lint: {result}");
    assert_eq!(result["lint"]["total_charts_linted"], 1, "{result}");
    let pulled = entries_from_dir(&out.join("demo"));
    assert_eq!(regular_files(&pulled), regular_files(&chart), "Helm unpacked the chart stowage holds");
    // oras fetched the chart layer itself, byte for byte what the view serves.
    let fetched = result["oras"][0].as_str().expect("oras pulled a file");
    let oci = Oci::new(&setup.server, Some("alice-token"));
    let (_, manifest) = oci.get_ok("/v2/team-a/chart/manifests/0.3.1_meta").await;
    let layer_digest = parse_json(&manifest, "manifest")["layers"][0]["digest"].as_str().unwrap().to_string();
    assert_eq!(digest_of(&std::fs::read(fetched).unwrap()), layer_digest);
}
