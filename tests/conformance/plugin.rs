//! `kubectl stowage …`: the `kubectl-stowage` binary Cargo builds (what `cargo install` puts on
//! PATH), driven through the real kubectl with its usual flags: help and version, `push NAME
//! DIR|FILE` (checks before any request, `--create`, archives as is, resumed after a kill),
//! `pull`, `ls` (table, `-o json|name`, into a closed pipe), `diff`, progress bars only on a
//! terminal, and failures printed once, as kubectl prints them.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::harness::*;
use crate::tarutil::{assert_trees_equal, build_tar, file, gzip, tree_from_dir, zstd, Tree};

pub(crate) const NS: &str = "plugin";

/// kubectl with `kubectl-stowage` on its PATH, the server's kubeconfig and its own state dir.
pub(crate) struct Kubectl {
    bin_dir: tempfile::TempDir,
    state: tempfile::TempDir,
    kubeconfig: PathBuf,
}

impl Kubectl {
    pub(crate) fn new(server: &Server) -> Kubectl {
        let bin_dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_kubectl-stowage"), bin_dir.path().join("kubectl-stowage"))
            .unwrap();
        Kubectl { bin_dir, state: tempfile::tempdir().unwrap(), kubeconfig: server.kubeconfig() }
    }

    fn path_var(&self) -> String {
        format!("{}:{}", self.bin_dir.path().display(), std::env::var("PATH").unwrap_or_default())
    }

    /// `kubectl stowage ARGS --kubeconfig … -n plugin`.
    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new("kubectl");
        command
            .arg("stowage")
            .args(args)
            .args(["--kubeconfig", self.kubeconfig.to_str().unwrap(), "-n", NS])
            .env("PATH", self.path_var())
            .env("XDG_STATE_HOME", self.state.path())
            .env_remove("KUBECONFIG");
        command
    }

    pub(crate) fn run(&self, args: &[&str]) -> Output {
        self.command(args).output().expect("run kubectl (a missing kubectl is a failure)")
    }

    /// Succeeds, prints nothing on stderr (a pipe: no progress bar); returns stdout.
    pub(crate) fn ok(&self, args: &[&str]) -> String {
        let output = self.run(args);
        let (stdout, stderr) = texts(&output);
        assert!(output.status.success(), "kubectl stowage {args:?}: {stdout}\n{stderr}");
        assert_eq!(stderr, "", "kubectl stowage {args:?} wrote on stderr");
        stdout
    }

    /// Fails with exit code 1 and prints nothing on stdout; returns stderr.
    pub(crate) fn fails(&self, args: &[&str]) -> String {
        let output = self.run(args);
        let (stdout, stderr) = texts(&output);
        assert_eq!(output.status.code(), Some(1), "kubectl stowage {args:?}: {stdout}\n{stderr}");
        assert_eq!(stdout, "", "kubectl stowage {args:?}");
        stderr
    }
}

fn texts(output: &Output) -> (String, String) {
    (String::from_utf8_lossy(&output.stdout).into_owned(), String::from_utf8_lossy(&output.stderr).into_owned())
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_stowage_pull_ls_and_diff() {
    let server = Server::start_temp(&[]);
    let kubectl = Kubectl::new(&server);
    let v1 = tree_from_dir(&corpus().join("rukpak-testdata/registry/valid"));
    let mut v2 = v1.clone();
    let (first, _) = v2.iter().find(|(p, _)| p.starts_with("manifests/")).map(|(p, n)| (p.clone(), n.clone())).unwrap();
    v2.remove(&first);
    v2.insert("manifests/added.yaml".into(), file("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: added\n"));
    server.create_bundle(NS, "app").await;
    let b1 = server.upload_ok(NS, "app", build_tar(&v1), None).await;
    let b2 = server.upload_ok(NS, "app", build_tar(&v2), None).await;

    // A header, then one row per file and per directory the uploaded tar named.
    let listing = kubectl.ok(&["ls", "app"]);
    let mut lines = listing.lines();
    let header: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["MODE", "SIZE", "SHA256", "PATH"], "{listing}");
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split_whitespace().collect()).collect();
    assert!(rows.iter().any(|r| r[3] == "manifests/added.yaml" && r[1].parse::<u64>().is_ok()), "{listing}");
    assert!(rows.iter().any(|r| r[2] == "-" && r[3] == "manifests/"), "{listing}");
    assert_eq!(rows.iter().filter(|r| !r[3].ends_with('/')).count(), v2.len(), "{listing}");
    let json: Value = serde_json::from_str(&kubectl.ok(&["ls", "app", "-o", "json"])).unwrap();
    assert_eq!(json["kind"], "BundleContentFileList");
    assert_eq!(json["digest"], b2["status"]["digest"]);
    assert_eq!(json["files"].as_array().unwrap().len(), rows.len());
    let names = kubectl.ok(&["ls", "app", "-o", "name"]);
    assert_eq!(names.lines().collect::<Vec<_>>(), rows.iter().map(|r| r[3]).collect::<Vec<_>>());

    let rev1 = str_at(&b1, "/status/contentName");
    let rev2_digest = str_at(&b2, "/status/digest").trim_start_matches("sha256:")[..12].to_owned();
    let diff = kubectl.ok(&["diff", "app", rev1, &rev2_digest]);
    assert!(diff.lines().any(|l| l == "A manifests/added.yaml"), "{diff}");
    assert!(diff.lines().any(|l| l == format!("D {first}")), "{diff}");
    assert_eq!(diff.lines().count(), 2, "{diff}");

    let out = tempfile::tempdir().unwrap();
    let dir = out.path().join("app");
    let pulled = kubectl.ok(&["pull", "app", dir.to_str().unwrap(), "--piece-bytes", "4096"]);
    assert!(pulled.contains(str_at(&b2, "/status/digest")), "{pulled}");
    assert_trees_equal(&v2, &tree_from_dir(&dir), "kubectl stowage pull");
}

/// A chart of two files.
fn small_chart() -> Tree {
    [("Chart.yaml", "apiVersion: v2\nname: a\nversion: 1.0.0\n"), ("templates/cm.yaml", "kind: A\n")]
        .into_iter()
        .map(|(p, c)| (p.to_string(), file(c)))
        .collect()
}

/// `pull` never deletes what it did not write: a directory of the user's is refused and left as
/// it was, `--force` replaces it; a repeated pull replaces its own earlier output, unless that
/// was changed since.
#[tokio::test(flavor = "multi_thread")]
async fn pull_replaces_only_its_own_earlier_output() {
    let server = Server::start_temp(&[]);
    let kubectl = Kubectl::new(&server);
    let v1 = small_chart();
    let mut v2 = v1.clone();
    v2.insert("templates/new.yaml".into(), file("kind: B\n"));
    server.create_bundle(NS, "app").await;
    server.create_bundle(NS, "other").await;
    server.upload_ok(NS, "app", build_tar(&v1), None).await;
    server.upload_ok(NS, "other", build_tar(&v2), None).await;

    // The user's directory: refused, untouched, and the message says what to do.
    let out = tempfile::tempdir().unwrap();
    let precious = out.path().join("precious");
    std::fs::create_dir(&precious).unwrap();
    std::fs::write(precious.join("notes.txt"), "mine").unwrap();
    let refused = kubectl.fails(&["pull", "app", precious.to_str().unwrap()]);
    assert!(refused.starts_with("error: ") && refused.contains("notes.txt"), "{refused}");
    assert!(refused.contains("--force"), "{refused}");
    assert_eq!(std::fs::read_dir(&precious).unwrap().count(), 1, "the refused pull wrote into the directory");
    assert_eq!(std::fs::read_to_string(precious.join("notes.txt")).unwrap(), "mine");
    assert_eq!(std::fs::read_dir(out.path()).unwrap().count(), 1, "the refused pull left something beside it");

    // A new directory, then the same pull again once the content changed: replaced.
    let dir = out.path().join("app");
    kubectl.ok(&["pull", "app", dir.to_str().unwrap()]);
    assert_trees_equal(&v1, &tree_from_dir(&dir), "first pull");
    server.upload_ok(NS, "app", build_tar(&v2), None).await;
    kubectl.ok(&["pull", "app", dir.to_str().unwrap()]);
    assert_trees_equal(&v2, &tree_from_dir(&dir), "the repeated pull");

    // Another Bundle's pull into it, or a file the user added since: refused.
    let other = kubectl.fails(&["pull", "other", dir.to_str().unwrap()]);
    assert!(other.contains(&format!("{NS}/app")), "{other}");
    std::fs::write(dir.join("templates/local.yaml"), "kind: Mine\n").unwrap();
    let changed = kubectl.fails(&["pull", "app", dir.to_str().unwrap()]);
    assert!(changed.contains("templates/local.yaml"), "{changed}");
    assert!(dir.join("templates/local.yaml").exists());

    // --force replaces what it holds, the user's files with it.
    kubectl.ok(&["pull", "app", precious.to_str().unwrap(), "--force"]);
    assert_trees_equal(&v2, &tree_from_dir(&precious), "forced pull");
    assert!(!precious.join("notes.txt").exists());
}

/// `cat` writes one file, verified, also of an older revision; `status` says what is served and
/// how the work stands; `suspend`/`resume` flip `spec.paused`; `refresh` sets a new refresh
/// annotation each time.
#[tokio::test(flavor = "multi_thread")]
async fn cat_status_and_the_switches() {
    let server = Server::start_temp(&[]);
    let kubectl = Kubectl::new(&server);
    let v1 = small_chart();
    let mut v2 = v1.clone();
    v2.insert("Chart.yaml".into(), file("apiVersion: v2\nname: a\nversion: 2.0.0\n"));
    server.create_bundle(NS, "app").await;
    let b1 = server.upload_ok(NS, "app", build_tar(&v1), None).await;
    let b2 = server.upload_ok(NS, "app", build_tar(&v2), None).await;

    assert_eq!(kubectl.ok(&["cat", "app", "Chart.yaml"]), "apiVersion: v2\nname: a\nversion: 2.0.0\n");
    let old = kubectl.ok(&["cat", "app", "Chart.yaml", "--revision", str_at(&b1, "/status/contentName")]);
    assert_eq!(old, "apiVersion: v2\nname: a\nversion: 1.0.0\n");
    assert!(kubectl.fails(&["cat", "app", "nothing.yaml"]).contains("no file \"nothing.yaml\""));
    assert!(kubectl.fails(&["cat", "app", "templates"]).contains("not a file"));

    let status = kubectl.ok(&["status", "app"]);
    assert!(status.contains("Phase:        Unpacked"), "{status}");
    assert!(status.contains(str_at(&b2, "/status/digest")), "{status}");
    assert!(status.contains("Paused:       false"), "{status}");
    assert!(status.lines().any(|l| l.trim_start().starts_with("Unpacked True (")), "{status}");
    let json: Value = serde_json::from_str(&kubectl.ok(&["status", "app", "-o", "json"])).unwrap();
    assert_eq!(json["digest"], b2["status"]["digest"]);

    let bundle = format!("/apis/content.stowage.dev/v1alpha1/namespaces/{NS}/bundles/app");
    assert!(kubectl.ok(&["suspend", "app"]).contains("suspended"));
    assert_eq!(server.get_json(&bundle).await["spec"]["paused"], true);
    assert!(kubectl.ok(&["status", "app"]).contains("Paused:       true"));
    kubectl.ok(&["resume", "app"]);
    assert!(server.get_json(&bundle).await["spec"].get("paused").is_none());
    let annotation = "/metadata/annotations/content.stowage.dev~1refresh";
    kubectl.ok(&["refresh", "app"]);
    let first = server.get_json(&bundle).await.pointer(annotation).cloned().expect("refresh annotation");
    kubectl.ok(&["refresh", "app"]);
    assert_ne!(server.get_json(&bundle).await.pointer(annotation).cloned().unwrap(), first, "a new value each time");
    assert!(kubectl.fails(&["status", "absent"]).starts_with("Error from server (NotFound)"));
}

/// `push --create` takes the Bundle's format, allowEmpty and labels: no YAML needed.
#[tokio::test(flavor = "multi_thread")]
async fn push_create_takes_the_bundles_settings() {
    let server = Server::start_temp(&[]);
    let kubectl = Kubectl::new(&server);
    let chart = tempfile::tempdir().unwrap();
    std::fs::write(chart.path().join("Chart.yaml"), "apiVersion: v2\nname: c\nversion: 0.1.0\n").unwrap();
    let dir = chart.path().to_str().unwrap();
    kubectl.ok(&["push", "c", dir, "--create", "--format", "helm", "--label", "team=a", "-l", "tier=web"]);
    let bundle = server.get_json(&format!("/apis/content.stowage.dev/v1alpha1/namespaces/{NS}/bundles/c")).await;
    assert_eq!(bundle["spec"]["format"], "helm", "{bundle}");
    assert_eq!(bundle["metadata"]["labels"]["team"], "a");
    assert_eq!(bundle["metadata"]["labels"]["tier"], "web");
    assert_eq!(bundle["status"]["format"], "helm");

    let empty = tempfile::tempdir().unwrap();
    std::fs::create_dir(empty.path().join("nothing")).unwrap();
    kubectl.ok(&["push", "e", empty.path().to_str().unwrap(), "--create", "--allow-empty"]);
    let bundle = server.get_json(&format!("/apis/content.stowage.dev/v1alpha1/namespaces/{NS}/bundles/e")).await;
    assert_eq!(bundle["spec"]["allowEmpty"], true, "{bundle}");

    let bad = kubectl.fails(&["push", "x", dir, "--create", "--format", "zip"]);
    assert!(bad.contains("plain, registry-v1, helm"), "{bad}");
    let without = kubectl.fails(&["push", "x", dir, "--label", "a=b"]);
    assert!(without.contains("--create"), "{without}");
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_stowage_push_uploads_in_pieces_and_round_trips() {
    let server = Server::start_temp(&[]);
    let kubectl = Kubectl::new(&server);
    let kps = corpus().join("kube-prometheus-stack/88.5.3");
    // 256 KiB pieces: the compressed chart takes several.
    let pushed = kubectl.ok(&["push", "kps", kps.to_str().unwrap(), "--create", "--piece-bytes", "262144"]);
    let b = server.get_json(&bundle(NS, "kps")).await;
    assert_unpacked(&b);
    assert!(pushed.contains(&format!("pushed {}", str_at(&b, "/status/digest"))), "{pushed}");
    assert_eq!(b["status"]["format"], "helm", "a chart detected from the upload: {b:#}");
    let out = tempfile::tempdir().unwrap();
    let dir = out.path().join("kps");
    kubectl.ok(&["pull", "kps", dir.to_str().unwrap()]);
    assert_trees_equal(&tree_from_dir(&kps), &tree_from_dir(&dir), "push then pull");
    // Pushing the same tree again stores nothing new: the same revision is served.
    kubectl.ok(&["push", "kps", kps.to_str().unwrap()]);
    assert_eq!(server.bundlecontent_names(NS).await.len(), 1);
}

/// tar.gz and tar.zst files go up as they are, with the Content-Encoding their first bytes name, a
/// plain tar compressed with zstd as it is sent; anything else is refused before a request is made.
#[tokio::test(flavor = "multi_thread")]
async fn push_takes_tar_files_plain_or_compressed() {
    let server = Server::start_temp(&[]);
    let kubectl = Kubectl::new(&server);
    let tree = tree_from_dir(&corpus().join("rukpak-testdata/registry/valid"));
    let files = tempfile::tempdir().unwrap();
    let tar = build_tar(&tree);
    for (name, bytes) in [("plain.tar", tar.clone()), ("gz.tar.gz", gzip(&tar)), ("zst.tar.zst", zstd(&tar))] {
        let path = files.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        let bundle_name = name.split('.').next().unwrap();
        let pushed = kubectl.ok(&["push", bundle_name, path.to_str().unwrap(), "--create"]);
        let b = server.get_json(&bundle(NS, bundle_name)).await;
        assert_unpacked(&b);
        assert!(pushed.contains(str_at(&b, "/status/digest")), "{pushed}");
        let dir = files.path().join(format!("{bundle_name}-pulled"));
        kubectl.ok(&["pull", bundle_name, dir.to_str().unwrap()]);
        assert_trees_equal(&tree, &tree_from_dir(&dir), name);
    }
    let readme = files.path().join("README.md");
    std::fs::write(&readme, "# not an archive\n").unwrap();
    let refused = kubectl.fails(&["push", "readme", readme.to_str().unwrap(), "--create"]);
    assert_eq!(refused, format!("error: {}: not a tar archive (expected tar, tar.gz or tar.zst)\n", readme.display()));
    assert_eq!(server.get(&bundle(NS, "readme")).await.status(), 404, "nothing was created");
}

/// A mistyped path or a missing Bundle changes nothing on the server; the refusal reads as
/// kubectl's, once, with a hint about --create.
#[tokio::test(flavor = "multi_thread")]
async fn push_checks_before_it_writes_and_errors_read_like_kubectl() {
    let server = Server::start_temp(&[]);
    let kubectl = Kubectl::new(&server);
    let missing = kubectl.fails(&["push", "x", "./does-not-exist", "--create"]);
    assert_eq!(missing, "error: the path \"./does-not-exist\" does not exist\n");
    let dir = corpus().join("rukpak-testdata/registry/valid");
    let not_found = kubectl.fails(&["push", "x", dir.to_str().unwrap()]);
    assert_eq!(
        not_found,
        "Error from server (NotFound): bundles.content.stowage.dev \"x\" not found\n\
         hint: add --create to create Bundle \"x\" with an upload source\n"
    );
    let list = server.get_json(&bundles(NS)).await;
    assert_eq!(list["items"].as_array().unwrap().len(), 0, "no Bundle was created: {list:#}");

    for args in [&["ls", "nope"][..], &["pull", "nope", "/tmp/never-written"], &["diff", "nope", "a", "b"]] {
        let stderr = kubectl.fails(args);
        assert_eq!(
            stderr, "Error from server (NotFound): bundles.content.stowage.dev \"nope\" not found\n",
            "{args:?}"
        );
    }
    // Without a server: kubectl's `error: …`, one line, no library internals.
    let config = std::fs::read_to_string(server.kubeconfig()).unwrap();
    let port = server.url.rsplit(':').next().unwrap();
    let unreachable = kubectl.state.path().join("unreachable.kubeconfig");
    std::fs::write(&unreachable, config.replace(&format!(":{port}"), ":1")).unwrap();
    let output = Kubectl { kubeconfig: unreachable, ..kubectl }.run(&["ls", "x"]);
    let (_, stderr) = texts(&output);
    assert_eq!(output.status.code(), Some(1));
    assert!(stderr.starts_with("error: cannot reach the server: ") && stderr.lines().count() == 1, "{stderr}");
    assert!(stderr.contains("Connection refused") && !stderr.contains("Error {"), "{stderr}");
}

/// A push killed midway is taken up where the server's bytes end when run again with the same
/// content (a directory or a plain tar, packed as they are sent; a tar.gz sent as it is, hashed as
/// its pieces are read); a session the server no longer has is replaced by a new one.
#[tokio::test(flavor = "multi_thread")]
async fn an_interrupted_push_resumes_when_run_again() {
    let server = Server::start_temp(&[]);
    let kubectl = Kubectl::new(&server);
    let kps = corpus().join("kube-prometheus-stack/88.5.3");
    let tar_file = kubectl.state.path().join("kps.tar");
    std::fs::write(&tar_file, crate::tarutil::system_tar(&kps)).unwrap();
    let gz_file = kubectl.state.path().join("kps.tar.gz");
    std::fs::write(&gz_file, gzip(&std::fs::read(&tar_file).unwrap())).unwrap();
    let (kps, tar_file, gz_file) = (kps.to_str().unwrap(), tar_file.to_str().unwrap(), gz_file.to_str().unwrap());
    let sessions = kubectl.state.path().join("stowage/uploads");

    for (name, source, forget_on_server) in [
        ("resumed", kps, false),
        ("restarted", kps, true),
        ("resumed-file", tar_file, false),
        ("resumed-gz", gz_file, false),
    ] {
        // 1 KiB pieces: hundreds of requests, time enough to kill it in the middle.
        let mut push = kubectl.command(&["push", name, source, "--create", "--piece-bytes", "1024"]);
        let mut child = push.stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
        let child = std::cell::RefCell::new(&mut child);
        // Looked for often: the push must be caught between its first piece and its last.
        let every = Duration::from_millis(20);
        let (id, held) = eventually_every(Duration::from_secs(60), every, "a piece arrived", || async {
            assert!(child.borrow_mut().try_wait().unwrap().is_none(), "the push ended before it could be interrupted");
            let remembered = std::fs::read_dir(&sessions).into_iter().flatten().flatten().next();
            let Some(record) = remembered.and_then(|e| std::fs::read(e.path()).ok()) else {
                return Err("no session record yet".to_owned());
            };
            let id = str_at(&parse_json(&record, "session record"), "/uploadID").to_owned();
            let state = server.get_json(&format!("{}?upload={id}", bundle_content(NS, name))).await;
            match u64_at(&state, "/offset") {
                0 => Err(format!("session {id} at offset 0")),
                offset => Ok((id, offset)),
            }
        })
        .await;
        let child = child.into_inner();
        child.kill().unwrap(); // SIGKILL: nothing is cleaned up
        child.wait().unwrap();
        if forget_on_server {
            let session = format!("{}?upload={id}", bundle_content(NS, name));
            assert_eq!(server.delete(&session).await.status(), 204);
        }
        let pushed = kubectl.ok(&["push", name, source]);
        let b = server.get_json(&bundle(NS, name)).await;
        assert_unpacked(&b);
        assert!(pushed.contains(str_at(&b, "/status/digest")), "{pushed}");
        let resumed_at: Option<u64> =
            pushed.split(", resumed at byte ").nth(1).map(|rest| rest.split(' ').next().unwrap().parse().unwrap());
        match forget_on_server {
            false => assert!(resumed_at.is_some_and(|at| at >= held), "resumed from the server's {held}: {pushed}"),
            true => assert_eq!(resumed_at, None, "a fresh session: {pushed}"),
        }
        assert_eq!(std::fs::read_dir(&sessions).unwrap().count(), 0, "a finished push forgets its session");
    }
    assert_eq!(server.bundlecontent_names(NS).await.len(), 4);
}

/// `ls | head -1` with more output than a pipe holds: the header, nothing on stderr, success.
#[tokio::test(flavor = "multi_thread")]
async fn ls_into_a_pipe_closed_early_ends_quietly() {
    let server = Server::start_temp(&[]);
    let kubectl = Kubectl::new(&server);
    let tree = (0..3000).map(|i| (format!("dir/a-file-with-a-rather-long-name-{i:05}.yaml"), file("x"))).collect();
    server.create_bundle(NS, "many").await;
    server.upload_ok(NS, "many", build_tar(&tree), None).await;
    let kubeconfig = kubectl.kubeconfig.to_str().unwrap().to_owned();
    let script =
        format!("kubectl stowage ls many --kubeconfig {kubeconfig} -n {NS} | head -1; exit ${{PIPESTATUS[0]}}");
    let output = Command::new("bash")
        .args(["-c", &script])
        .env("PATH", kubectl.path_var())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let (stdout, stderr) = texts(&output);
    assert_eq!(stderr, "", "nothing but the data: no panic, no error");
    assert!(output.status.success(), "exit status {:?}", output.status);
    assert_eq!(stdout.split_whitespace().collect::<Vec<_>>(), ["MODE", "SIZE", "SHA256", "PATH"]);
}

/// Bars (bytes, rate, ETA) on a terminal's stderr; piped, nothing (checked by `Kubectl::ok`
/// everywhere else).
#[tokio::test(flavor = "multi_thread")]
async fn progress_bars_are_drawn_on_a_terminal_only() {
    let server = Server::start_temp(&[]);
    let kubectl = Kubectl::new(&server);
    let kps = corpus().join("kube-prometheus-stack/88.5.3");
    let out = tempfile::tempdir().unwrap();
    let kubeconfig = kubectl.kubeconfig.display();
    let commands = format!(
        "kubectl stowage push kps {} --create --piece-bytes 65536 --kubeconfig {kubeconfig} -n {NS} && \
         kubectl stowage pull kps {} --piece-bytes 65536 --kubeconfig {kubeconfig} -n {NS}",
        kps.display(),
        out.path().join("kps").display()
    );
    // util-linux's script runs the commands on a pseudo-terminal (a missing one is a failure).
    let output = Command::new("script")
        .args(["-qec", &commands, "/dev/null"])
        .env("PATH", kubectl.path_var())
        .env("XDG_STATE_HOME", kubectl.state.path())
        .env("TERM", "xterm")
        .stdin(Stdio::null())
        .output()
        .expect("run script (util-linux)");
    let (terminal, _) = texts(&output);
    assert!(output.status.success(), "{terminal}");
    for what in ["pushing kps [", "pulling kps ["] {
        let frames: Vec<&str> = terminal.split('\r').filter(|l| l.contains(what)).collect();
        // The last frame: full, with the bytes moved, the rate and the ETA.
        let last = frames.last().unwrap_or_else(|| panic!("no bar {what:?}: {terminal:?}"));
        assert!(last.contains("[=====") && last.contains("iB/s") && last.contains("ETA"), "{last:?}");
    }
    assert_trees_equal(&tree_from_dir(&kps), &tree_from_dir(&out.path().join("kps")), "pulled on a terminal");
}

#[test]
fn kubectl_stowage_help_and_version() {
    let bin_dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_kubectl-stowage"), bin_dir.path().join("kubectl-stowage")).unwrap();
    let path = format!("{}:{}", bin_dir.path().display(), std::env::var("PATH").unwrap_or_default());
    let run = |args: &[&str]| {
        let output = Command::new("kubectl").arg("stowage").args(args).env("PATH", &path).output().unwrap();
        assert!(output.status.success(), "kubectl stowage {args:?}: {output:?}");
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    for flag in ["--help", "-h"] {
        let help = run(&[flag]);
        // [OPTIONS]: kubectl's connection flags may come before the command.
        assert!(help.contains("Usage: kubectl stowage [OPTIONS] <COMMAND>"), "{help}");
        assert!(help.contains("--namespace") && help.contains("--as "), "{help}");
        for command in ["push", "pull", "ls", "diff", "cat", "status", "refresh", "suspend", "resume", "version"] {
            assert!(help.lines().any(|l| l.trim_start().starts_with(command)), "{command} in {help}");
        }
        let server_side = help.lines().any(|l| ["serve ", "certs "].iter().any(|c| l.trim_start().starts_with(c)));
        assert!(!server_side, "server commands are not the plugin's: {help}");
    }
    assert!(run(&["push", "--help"]).contains("Usage: kubectl stowage push [OPTIONS] <NAME> <DIR|FILE>"));
    assert_eq!(run(&["version"]), format!("kubectl-stowage {}\n", env!("CARGO_PKG_VERSION")));
}
