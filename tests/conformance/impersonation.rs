//! Impersonation on a standalone server, as kube-apiserver does it: `kubectl --as`/`--as-group`
//! run a request as the user they name once the policy allows the caller to `impersonate` each
//! part, a part it does not allow is a 403 in kube-apiserver's words, groups without a user are a
//! 400, and nothing is ignored. Also the plugin's kubectl flags: before or after the subcommand,
//! each one taken against a server that needs it (`--token`, `--as`, `--server`,
//! `--certificate-authority`, `--insecure-skip-tls-verify`, `--user`, `--cluster`, `--context`,
//! `--request-timeout`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::harness::*;
use crate::kubectl_auth::{kubectl, ok, POLICY};

const TOKENS: &str = "alice-token,alice,1001,\"\"\nbob-token,bob,1002,\"\"\n";

/// Beside the README's policy (group `readers` reads Bundles in `default`): alice may impersonate
/// carol and the group readers.
const IMPERSONATION_POLICY: &str = r#"
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: impersonate-carol}
rules:
- {apiGroups: [""], resources: [users], resourceNames: [carol], verbs: [impersonate]}
- {apiGroups: [""], resources: [groups], resourceNames: [readers], verbs: [impersonate]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: alice-impersonates-carol}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: impersonate-carol}
subjects: [{kind: User, name: alice}]
"#;

fn start() -> Server {
    Server::start_with_users(TOKENS, &format!("{POLICY}{IMPERSONATION_POLICY}"))
}

fn texts(out: &Output) -> (String, String) {
    (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn refused(kubeconfig: &Path, args: &[&str]) -> String {
    let out = kubectl(kubeconfig, args);
    let (stdout, stderr) = texts(&out);
    assert!(!out.status.success(), "kubectl {args:?} succeeded: {stdout}");
    stderr
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_as_runs_requests_as_the_impersonated_user_when_allowed() {
    let server = start();
    server.create_bundle("default", "app").await;
    let admin = server.kubeconfig();
    let alice = server.token_kubeconfig("alice", "default");
    let bob = server.token_kubeconfig("bob", "default");

    // The admin (system:masters) may impersonate anyone; whoami shows who the request ran as.
    let whoami = ok(&admin, &["auth", "whoami", "--as", "carol", "--as-group", "readers"]);
    assert!(whoami.contains("carol") && whoami.contains("[readers system:authenticated]"), "{whoami}");
    let sa = ok(&admin, &["auth", "whoami", "--as", "system:serviceaccount:team:builder"]);
    assert!(sa.contains("system:serviceaccounts:team"), "{sa}");

    // alice cannot list Bundles herself; as carol in readers she can.
    let own = refused(&alice, &["get", "bundles"]);
    assert!(own.contains("User \"alice\" cannot list resource \"bundles\""), "{own}");
    let listed = ok(&alice, &["get", "bundles", "--as", "carol", "--as-group", "readers"]);
    assert!(listed.contains("app"), "{listed}");
    // As carol alone (no group), the request is carol's, not alice's and not the readers'.
    let as_carol = refused(&alice, &["get", "bundles", "--as", "carol"]);
    assert!(as_carol.contains("User \"carol\" cannot list resource \"bundles\""), "{as_carol}");

    // What the policy does not allow is refused, in kube-apiserver's words, never ignored (raw
    // requests: kubectl's discovery, refused too, would hide the message).
    const BUNDLES: &str = "/apis/content.stowage.dev/v1alpha1/namespaces/default/bundles";
    let dave = refused(&alice, &["get", "--raw", BUNDLES, "--as", "dave"]);
    assert!(
        dave.contains(
            "users \"dave\" is forbidden: User \"alice\" cannot impersonate resource \"users\" in API group \"\" at \
             the cluster scope"
        ),
        "{dave}"
    );
    let group = refused(&alice, &["get", "--raw", BUNDLES, "--as", "carol", "--as-group", "system:masters"]);
    assert!(group.contains("groups \"system:masters\" is forbidden"), "{group}");
    let bob_as_carol = refused(&bob, &["get", "--raw", BUNDLES, "--as", "carol"]);
    assert!(bob_as_carol.contains("User \"bob\" cannot impersonate resource \"users\""), "{bob_as_carol}");

    // Groups without a user describe no one: 400.
    let response = server
        .client()
        .get(server.url("/apis/content.stowage.dev/v1alpha1/namespaces/default/bundles"))
        .header("Impersonate-Group", "readers")
        .send()
        .await
        .unwrap();
    let status = expect_status(response, 400, "BadRequest").await;
    assert!(str_at(&status, "/message").contains("Impersonate-User"), "{status}");
}

/// `kubectl stowage` with kubectl's flags before and after the subcommand.
struct Plugin {
    bin: tempfile::TempDir,
}

impl Plugin {
    fn new() -> Plugin {
        let bin = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_kubectl-stowage"), bin.path().join("kubectl-stowage")).unwrap();
        Plugin { bin }
    }

    fn run(&self, args: &[&str]) -> Output {
        Command::new("kubectl")
            .arg("stowage")
            .args(args)
            .env("PATH", format!("{}:{}", self.bin.path().display(), std::env::var("PATH").unwrap_or_default()))
            .env("XDG_STATE_HOME", self.bin.path())
            .env_remove("KUBECONFIG")
            .output()
            .expect("run kubectl")
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        let (stdout, stderr) = texts(&out);
        assert!(out.status.success(), "kubectl stowage {args:?}: {stdout}\n{stderr}");
        stdout
    }

    fn fails(&self, args: &[&str]) -> String {
        let out = self.run(args);
        let (stdout, stderr) = texts(&out);
        assert!(!out.status.success(), "kubectl stowage {args:?} succeeded: {stdout}");
        stderr
    }
}

/// A kubeconfig with two clusters (one unreachable), two users (admin, alice) and a context
/// whose namespace is `elsewhere`: each flag must pick the right one.
fn tangled_kubeconfig(server: &Server, dir: &Path) -> PathBuf {
    let pki = server.data_dir().join("pki");
    let config = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n\
         - {{name: real, cluster: {{server: \"{url}\", certificate-authority: \"{ca}\"}}}}\n\
         - {{name: nowhere, cluster: {{server: \"https://127.0.0.1:9\"}}}}\n\
         users:\n\
         - {{name: admin, user: {{client-certificate: \"{crt}\", client-key: \"{key}\"}}}}\n\
         - {{name: alice, user: {{token: alice-token}}}}\n\
         - {{name: nobody, user: {{}}}}\n\
         contexts:\n\
         - {{name: broken, context: {{cluster: nowhere, user: nobody, namespace: elsewhere}}}}\n\
         - {{name: working, context: {{cluster: real, user: admin, namespace: elsewhere}}}}\n\
         current-context: broken\n",
        url = server.url,
        ca = pki.join("ca.crt").display(),
        crt = pki.join("admin.crt").display(),
        key = pki.join("admin.key").display(),
    );
    let path = dir.join("tangled.kubeconfig");
    std::fs::write(&path, config).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread")]
async fn plugin_takes_kubectls_connection_flags_anywhere() {
    let server = start();
    server.create_bundle("default", "app").await;
    server.upload_ok("default", "app", crate::tarutil::build_tar(&single_file()), None).await;
    let tmp = tempfile::tempdir().unwrap();
    let config = tangled_kubeconfig(&server, tmp.path());
    let kc = config.to_str().unwrap();
    let plugin = Plugin::new();

    // Before the subcommand, as kubectl users write them, and after it.
    let before = plugin.ok(&["--kubeconfig", kc, "--context", "working", "-n", "default", "ls", "app", "-o", "name"]);
    assert_eq!(before.trim(), "Chart.yaml");
    let after = plugin.ok(&["ls", "app", "-o", "name", "--kubeconfig", kc, "--context", "working", "-n", "default"]);
    assert_eq!(after, before);
    // After wins over before.
    let wins = plugin.ok(&[
        "-n",
        "elsewhere",
        "--kubeconfig",
        kc,
        "ls",
        "app",
        "-o",
        "name",
        "-n",
        "default",
        "--context",
        "working",
    ]);
    assert_eq!(wins, before);
    // The context's namespace is `elsewhere`: without -n the Bundle is not found there.
    let missing = plugin.fails(&["--kubeconfig", kc, "--context", "working", "ls", "app"]);
    assert!(missing.contains("NotFound") && missing.contains("\"app\""), "{missing}");

    // --cluster and --user pick kubeconfig entries; --server, --certificate-authority and
    // --insecure-skip-tls-verify override the cluster's; --token the user's credentials.
    let ca = server.data_dir().join("pki/ca.crt");
    let ca = ca.to_str().unwrap();
    let base = ["--kubeconfig", kc, "-n", "default"];
    let run = |extra: &[&str]| plugin.ok(&[&base[..], extra, &["ls", "app", "-o", "name"]].concat());
    assert_eq!(run(&["--cluster", "real", "--user", "admin"]), before);
    assert_eq!(run(&["--server", &server.url, "--certificate-authority", ca, "--user", "admin"]), before);
    assert_eq!(run(&["--server", &server.url, "--insecure-skip-tls-verify", "--user", "admin"]), before);
    let untrusted = plugin.fails(&[&base[..], &["--server", &server.url, "--user", "admin", "ls", "app"]].concat());
    assert!(untrusted.contains("error:"), "{untrusted}");

    // --token authenticates as alice, who may not read Bundles; --as makes it carol in readers.
    let token = ["--cluster", "real", "--user", "nobody", "--token", "alice-token"];
    let as_alice = plugin.fails(&[&base[..], &token[..], &["ls", "app"]].concat());
    assert!(as_alice.contains("User \"alice\" cannot get resource \"bundles"), "{as_alice}");
    let impersonated = [&base[..], &token[..], &["--as", "carol", "--as-group", "readers", "ls", "app", "-o", "name"]];
    assert_eq!(plugin.ok(&impersonated.concat()), before);
    let not_allowed = plugin.fails(&[&base[..], &token[..], &["--as", "dave", "ls", "app"]].concat());
    assert!(not_allowed.contains("cannot impersonate resource \"users\""), "{not_allowed}");

    // --request-timeout bounds each request: a server that never answers fails within it.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_url = format!("https://{}", silent.local_addr().unwrap());
    let started = std::time::Instant::now();
    let timed_out = plugin.fails(
        &[&base[..], &["--server", &silent_url, "--insecure-skip-tls-verify", "--request-timeout", "2s", "ls", "app"]]
            .concat(),
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(20), "took {:?}: {timed_out}", started.elapsed());
    let bad = plugin.fails(&[&base[..], &["--request-timeout", "soon", "ls", "app"]].concat());
    assert!(bad.contains("--request-timeout"), "{bad}");
}

fn single_file() -> crate::tarutil::Tree {
    [("Chart.yaml".to_string(), crate::tarutil::file("apiVersion: v2\nname: app\nversion: 1.0.0\n"))].into()
}
