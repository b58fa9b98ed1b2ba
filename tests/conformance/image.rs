//! The server image (`scripts/image.sh`), built from this build's binary and run the way a kubelet
//! runs the pod of `deploy/apiservice`: under podman with runc, read-only root filesystem, uid/gid
//! 65532, every capability dropped, no new privileges, the data directory a volume, `/tmp` a
//! tmpfs, the serving certificate mounted read-only as its Secret would be (group 65532, 0440).
//! Against it: the README's quick start with kubectl and the plugin, kill -9 and a restart on the
//! same volume, SIGTERM ending well within the grace period, and the probes' endpoints answering a
//! client without credentials, as the kubelet's probes are. Also: the same binary gives the same
//! image digest, and the image is little more than the binary.
//!
//! Needs `podman`, `buildah` and `runc` (scripts/test.sh installs them) and root, as CI runs; a
//! missing tool fails these tests, it never skips them. Start-to-ready, RSS and sizes are printed
//! (`--nocapture`) for the notes and benchmarks, not asserted.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::harness::wait_until;

const TAG: &str = "localhost/stowage:conformance";
/// The serving certificate's name, as the kube-apiserver dials the Service.
const SERVICE_NAME: &str = "stowage.stowage.svc";

fn run(program: &str, args: &[&str]) -> Output {
    Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program} is needed for the image tests (scripts/test.sh installs it): {e}"))
}

fn ok(program: &str, args: &[&str]) -> String {
    let out = run(program, args);
    assert!(
        out.status.success(),
        "{program} {args:?}: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// What `scripts/image.sh` printed and wrote for one build.
struct Built {
    digest: String,
    archive: PathBuf,
    report: String,
}

fn build_image(tag: &str, out: &Path) -> Built {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/image.sh");
    let printed = ok(
        "bash",
        &[
            script.to_str().unwrap(),
            "--binary",
            env!("CARGO_BIN_EXE_stowage"),
            "--tag",
            tag,
            "--out",
            out.to_str().unwrap(),
        ],
    );
    let digest = printed
        .split("manifest ")
        .nth(1)
        .and_then(|rest| rest.split([',', ')']).next())
        .unwrap_or_else(|| panic!("no manifest digest in {printed}"))
        .to_owned();
    let archive = std::fs::read_dir(out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().ends_with(".oci.tar"))
        .expect("an OCI archive");
    Built { digest, archive, report: printed }
}

/// The image every test runs: built once per test process.
fn image() -> &'static Built {
    static IMAGE: OnceLock<(tempfile::TempDir, Built)> = OnceLock::new();
    &IMAGE
        .get_or_init(|| {
            let dir = tempfile::Builder::new().prefix("stowage-image-").tempdir().unwrap();
            let built = build_image(TAG, dir.path());
            println!("{}", built.report.trim());
            (dir, built)
        })
        .1
}

#[test]
fn the_same_binary_gives_the_same_small_image() {
    let first = image();
    let dir = tempfile::tempdir().unwrap();
    let again = build_image("localhost/stowage:conformance-again", dir.path());
    let _ = run("podman", &["rmi", "localhost/stowage:conformance-again"]);
    assert_eq!(again.digest, first.digest, "two builds of one binary differ:\n{}\n{}", first.report, again.report);

    // Little more than the binary: what goes beside it (libraries, CA roots, /etc) stays small.
    let stripped = {
        let copy = dir.path().join("stowage");
        ok("strip", &["--strip-all", "-o", copy.to_str().unwrap(), env!("CARGO_BIN_EXE_stowage")]);
        std::fs::metadata(copy).unwrap().len()
    };
    let inspect = ok("podman", &["image", "inspect", TAG, "--format", "{{.Size}} {{.Config.User}}"]);
    let (size, user) = inspect.trim().split_once(' ').unwrap();
    let size: u64 = size.parse().unwrap();
    println!(
        "image {} bytes, stripped binary {stripped} bytes, archive {} bytes",
        size,
        std::fs::metadata(&first.archive).unwrap().len()
    );
    assert!(size < stripped + 16 * 1024 * 1024, "image {size} bytes for a {stripped}-byte binary");
    assert_eq!(user, "65532:65532");
    // The archive is what podman and containerd import: it names the image it holds.
    let index = ok("tar", &["-xOf", first.archive.to_str().unwrap(), "index.json"]);
    assert!(index.contains(TAG), "index.json names {TAG}: {index}");
}

/// The server's arguments in deploy/apiservice/base/statefulset.yaml: the container runs as the
/// StatefulSet would run it.
fn statefulset_args() -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/apiservice/base/statefulset.yaml");
    let manifest: serde_json::Value = serde_yaml_ng::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let args = manifest["spec"]["template"]["spec"]["containers"][0]["args"].as_array().expect("args");
    args.iter().map(|a| a.as_str().unwrap().to_owned()).collect()
}

/// A container of the image and its volume, removed when dropped (also when a test fails).
struct Container {
    name: String,
    volume: String,
    port: u16,
    tls: tempfile::TempDir,
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = run("podman", &["rm", "--force", "--time", "0", &self.name]);
        let _ = run("podman", &["volume", "rm", "--force", &self.volume]);
    }
}

impl Container {
    /// The pod of deploy/apiservice, as podman runs it (the flags the kubelet would set).
    fn create() -> Self {
        let image = image();
        let _ = &image.digest;
        let id = format!("stowage-conformance-{}", std::process::id());
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        // The serving certificate as the stowage-tls Secret: `stowage certs`, then the files as the
        // kubelet projects a Secret with defaultMode 0440 and the pod's fsGroup.
        let tls = tempfile::tempdir().unwrap();
        let generated = tls.path().join("generated");
        ok(env!("CARGO_BIN_EXE_stowage"), &["certs", "--out", generated.to_str().unwrap()]);
        let secret = tls.path().join("secret");
        std::fs::create_dir(&secret).unwrap();
        for file in ["tls.crt", "tls.key", "ca.crt"] {
            std::fs::copy(generated.join(file), secret.join(file)).unwrap();
            ok("chown", &["0:65532", secret.join(file).to_str().unwrap()]);
            ok("chmod", &["0440", secret.join(file).to_str().unwrap()]);
        }
        ok("chmod", &["0755", secret.to_str().unwrap()]);
        ok("podman", &["volume", "create", &id]);
        let publish = format!("127.0.0.1:{port}:8443");
        let data = format!("{id}:/var/lib/stowage");
        let tls_mount = format!("{}:/etc/stowage/tls:ro", secret.display());
        ok(
            "podman",
            &[
                "--runtime",
                "runc",
                "create",
                "--name",
                &id,
                "--read-only",
                "--user",
                "65532:65532",
                "--cap-drop",
                "ALL",
                "--security-opt",
                "no-new-privileges",
                "--tmpfs",
                "/tmp:rw,size=512m,mode=1777",
                // podman's default limits exceed what this machine lets a container have.
                "--ulimit",
                "nofile=20000:20000",
                "--ulimit",
                "nproc=4096:4096",
                "--stop-timeout",
                "30",
                "-v",
                &data,
                "-v",
                &tls_mount,
                "-p",
                &publish,
                TAG,
            ]
            .into_iter()
            .chain(statefulset_args().iter().map(String::as_str))
            .collect::<Vec<_>>(),
        );
        Container { name: id.clone(), volume: id, port, tls }
    }

    fn ca(&self) -> PathBuf {
        self.tls.path().join("secret/ca.crt")
    }

    /// `curl` of a path as the kubelet's probes ask: no client certificate.
    fn probe(&self, path: &str) -> Option<String> {
        let url = format!("https://{SERVICE_NAME}:{}{path}", self.port);
        let resolve = format!("{SERVICE_NAME}:{}:127.0.0.1", self.port);
        let out = run(
            "curl",
            &["-sS", "--fail", "--max-time", "5", "--cacert", self.ca().to_str().unwrap(), "--resolve", &resolve, &url],
        );
        out.status.success().then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Starts the container and waits for /readyz; the time it took.
    fn start(&self) -> Duration {
        let started = Instant::now();
        ok("podman", &["--runtime", "runc", "start", &self.name]);
        wait_until(Duration::from_secs(60), Duration::from_millis(50), "the container ready", || {
            if self.probe("/readyz").is_some() {
                return Ok(());
            }
            let state = ok("podman", &["inspect", "--format", "{{.State.Status}}", &self.name]);
            assert!(state.trim() == "running", "the container is {state}: {}", self.logs());
            Err(self.logs())
        });
        started.elapsed()
    }

    fn logs(&self) -> String {
        let out = run("podman", &["logs", &self.name]);
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
    }

    fn volume_path(&self) -> PathBuf {
        PathBuf::from(ok("podman", &["volume", "inspect", "--format", "{{.Mountpoint}}", &self.volume]).trim())
    }

    /// A kubeconfig for the admin credential the server wrote into its volume, through the
    /// published port, verifying the serving certificate by the Service's name.
    fn kubeconfig(&self, dir: &Path) -> PathBuf {
        let pki = self.volume_path().join("pki");
        let path = dir.join("kubeconfig");
        std::fs::write(
            &path,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:{}\n    \
                 certificate-authority: {}\n    tls-server-name: {SERVICE_NAME}\nusers:\n- name: u\n  user:\n    \
                 client-certificate: {}\n    client-key: {}\ncontexts:\n- name: c\n  context: {{cluster: c, user: u, \
                 namespace: default}}\ncurrent-context: c\n",
                self.port,
                self.ca().display(),
                pki.join("admin.crt").display(),
                pki.join("admin.key").display()
            ),
        )
        .unwrap();
        path
    }

    fn rss_kib(&self) -> u64 {
        let pid = ok("podman", &["inspect", "--format", "{{.State.Pid}}", &self.name]);
        let status = std::fs::read_to_string(format!("/proc/{}/status", pid.trim())).unwrap();
        let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }
}

/// kubectl with this build's plugin on PATH, in `dir`.
fn kubectl(dir: &Path, kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> String {
    let bin = dir.join(".bin");
    if !bin.exists() {
        std::fs::create_dir_all(&bin).unwrap();
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_kubectl-stowage"), bin.join("kubectl-stowage")).unwrap();
    }
    let mut child = Command::new("kubectl")
        .args(args)
        .current_dir(dir)
        .env("KUBECONFIG", kubeconfig)
        .env("PATH", format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default()))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    if let Some(text) = stdin {
        use std::io::Write as _;
        child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    }
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A chart like the README's, with a few more files and one big enough to span several blocks.
fn write_chart(dir: &Path) {
    std::fs::create_dir_all(dir.join("templates")).unwrap();
    std::fs::write(dir.join("Chart.yaml"), "apiVersion: v2\nname: my-chart\nversion: 0.1.0\n").unwrap();
    std::fs::write(
        dir.join("templates/configmap.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: greeting}\ndata: {text: hello}\n",
    )
    .unwrap();
    let mut values = String::new();
    for i in 0..60_000 {
        values.push_str(&format!("key{i}: value {} of {}\n", i * 7919 % 10_007, i));
    }
    std::fs::write(dir.join("values.yaml"), values).unwrap();
}

#[test]
fn the_image_serves_the_quick_start_under_a_kubelets_restrictions() {
    let container = Container::create();
    let ready_after = container.start();
    let logs = container.logs();
    assert!(
        logs.contains("stowage ready on https://0.0.0.0:8443"),
        "the ready line names the address it listens on:\n{logs}"
    );
    for path in ["/livez", "/readyz", "/healthz"] {
        assert!(container.probe(path).is_some(), "{path} refused a probe without credentials:\n{logs}");
    }

    // The README's quick start, from outside the container.
    let work = tempfile::tempdir().unwrap();
    let kubeconfig = container.kubeconfig(work.path());
    write_chart(&work.path().join("my-chart"));
    let bundle = "apiVersion: content.stowage.dev/v1alpha1\nkind: Bundle\nmetadata: {name: my-chart, namespace: \
                  default}\nspec: {sources: [{upload: {}}]}\n";
    let k = |args: &[&str]| kubectl(work.path(), &kubeconfig, args, None);
    assert!(kubectl(work.path(), &kubeconfig, &["create", "-f", "-"], Some(bundle)).contains("created"));
    let pushed = k(&["stowage", "push", "my-chart", "./my-chart"]);
    assert!(pushed.contains("sha256:"), "{pushed}");
    k(&["wait", "--for=condition=Unpacked", "bundle/my-chart", "--timeout=60s"]);
    assert!(k(&["get", "bundles"]).contains("my-chart"));
    let listing = k(&["stowage", "ls", "my-chart"]);
    for file in ["Chart.yaml", "values.yaml", "templates/configmap.yaml"] {
        assert!(listing.contains(file), "{file} not listed: {listing}");
    }
    k(&["stowage", "pull", "my-chart", "./copy"]);
    ok("diff", &["-r", work.path().join("my-chart").to_str().unwrap(), work.path().join("copy").to_str().unwrap()]);
    let digest = k(&["get", "bundle", "my-chart", "-o", "jsonpath={.status.digest}"]);
    assert!(digest.starts_with("sha256:"), "{digest}");
    println!(
        "in the container: ready {} ms after start, RSS {} KiB after the quick start",
        ready_after.as_millis(),
        container.rss_kib()
    );

    // kill -9 and a restart on the same volume: the content is still served.
    ok("podman", &["kill", "--signal", "KILL", &container.name]);
    let _ = run("podman", &["wait", &container.name]);
    let ready_again = container.start();
    assert_eq!(k(&["get", "bundle", "my-chart", "-o", "jsonpath={.status.digest}"]), digest);
    k(&["stowage", "pull", "my-chart", "./copy-after-kill"]);
    ok(
        "diff",
        &["-r", work.path().join("my-chart").to_str().unwrap(), work.path().join("copy-after-kill").to_str().unwrap()],
    );
    println!("in the container: ready {} ms after a restart from kill -9", ready_again.as_millis());

    // SIGTERM (what the kubelet sends) ends the server well within the 30 s grace period, cleanly.
    let stopping = Instant::now();
    ok("podman", &["stop", "--time", "30", &container.name]);
    let took = stopping.elapsed();
    let exit = ok("podman", &["inspect", "--format", "{{.State.ExitCode}}", &container.name]);
    assert_eq!(exit.trim(), "0", "exit after SIGTERM (137 would be the grace period's SIGKILL):\n{}", container.logs());
    assert!(took < Duration::from_secs(15), "SIGTERM took {took:?}");
    assert!(container.logs().contains("shutting down"));
    println!("in the container: SIGTERM to exit {} ms", took.as_millis());
}
