//! Going back to an earlier revision (`spec.revision`, `kubectl stowage rollback`) and pulling
//! one revision or one directory (`pull --revision`, `pull --path`): the chosen revision is served
//! byte for byte through polls of a floating source that keep recording new content, through a
//! restart and new uploads; the history limit never prunes it; `status` says which revision is
//! served and why; a revision that is not there is refused in plain words while the last one
//! stays served; and clearing the field serves the newest again.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{json, Value};

use crate::git_server::GitServer;
use crate::harness::*;
use crate::plugin::{Kubectl as Plugin, NS};
use crate::tarutil::{assert_trees_equal, build_tar, file, parse_served_tar, tree_from_dir, Tree};

const WAIT: Duration = Duration::from_secs(60);

fn deployed(version: &str) -> Tree {
    let manifest =
        format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: app\ndata:\n  version: \"{version}\"\n");
    BTreeMap::from([("manifests/app.yaml".to_string(), file(manifest))])
}

/// Waits until `check` holds for the Bundle, with `Unpacked` answered for its generation.
async fn wait_for(server: &Server, name: &str, what: &str, check: impl Fn(&Value) -> bool) -> Value {
    eventually(WAIT, what, || async {
        let b = server.get_json(&bundle(NS, name)).await;
        let answered = b["status"]["observedGeneration"] == b["metadata"]["generation"];
        match answered && check(&b) {
            true => Ok(b),
            false => Err(format!("{}", b["status"])),
        }
    })
    .await
}

fn served_name(b: &Value) -> &str {
    str_at(b, "/status/contentName")
}

fn unpacked(b: &Value) -> Value {
    let conditions = b["status"]["conditions"].as_array().cloned().unwrap_or_default();
    conditions.into_iter().find(|c| c["type"] == "Unpacked").unwrap_or(Value::Null)
}

async fn served(server: &Server, name: &str) -> Tree {
    parse_served_tar(&server.download(&bundle_content(NS, name)).await)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rollback_holds_through_polls_restarts_and_pruning_until_cleared() {
    let git = GitServer::start().await;
    git.create("app");
    git.commit("app", "main", &deployed("1"));
    let mut server = Server::start_temp(&["--insecure-source-host", &git.host_port()]);
    let plugin = Plugin::new(&server);
    let source = json!({"git": {"repository": git.url("app"), "ref": {"branch": "main"}}});
    let spec = json!({"sources": [source], "pollInterval": "1s", "revisionHistoryLimit": 1});
    server.create_bundle_with(NS, "app", spec).await;
    let b = wait_for(&server, "app", "v1 served", |b| unpacked(b)["status"] == "True").await;
    let c1 = served_name(&b).to_owned();
    git.commit("app", "main", &deployed("2"));
    let b = wait_for(&server, "app", "the poll serves v2", |b| served_name(b) != c1).await;
    let c2 = served_name(&b).to_owned();

    // Back to the revision before the one served.
    let said = plugin.ok(&["rollback", "app"]);
    assert_eq!(said.trim(), format!("bundle.content.stowage.dev/app rolled back to {c1}"));
    let b = wait_for(&server, "app", "v1 served again", |b| served_name(b) == c1).await;
    assert_eq!(unpacked(&b)["status"], "True", "{:#}", b["status"]);
    assert_eq!(str_at(&b, "/status/latestContentName"), c2);
    assert_eq!(served(&server, "app").await, deployed("1"), "the chosen revision, byte for byte");
    let status = plugin.ok(&["status", "app"]);
    assert!(status.contains(&format!("Served:       {c1} (")), "{status}");
    let because = format!("Because:      spec.revision chooses it (rolled back; the newest is {c2})");
    assert!(status.contains(&because), "{status}");
    let kubectl = crate::kubectl::Kubectl::new(&server);
    let wide = kubectl.ok(&["-n", NS, "get", "bundle", "app", "-o", "wide"]);
    assert!(wide.lines().next().unwrap_or("").contains("REVISION"), "{wide}");
    assert!(wide.lines().nth(1).unwrap_or("").trim_end().ends_with(&c1), "{wide}");
    let explained = kubectl.ok(&["explain", "bundles.spec.revision"]);
    assert!(explained.contains("rollback") && explained.contains("latestContentName"), "{explained}");

    // New commits are still fetched and recorded, not served; the chosen revision is never
    // pruned (limit 1: the chosen, the newest, and one more are kept).
    git.commit("app", "main", &deployed("3"));
    let b =
        wait_for(&server, "app", "v3 recorded", |b| b["status"]["latestContentName"].as_str().is_some_and(|l| l != c2))
            .await;
    let c3 = str_at(&b, "/status/latestContentName").to_owned();
    git.commit("app", "main", &deployed("4"));
    let b =
        wait_for(&server, "app", "v4 recorded", |b| b["status"]["latestContentName"].as_str().is_some_and(|l| l != c3))
            .await;
    let c4 = str_at(&b, "/status/latestContentName").to_owned();
    assert_eq!(served_name(&b), c1);
    let mut kept = vec![c1.clone(), c3.clone(), c4.clone()];
    kept.sort();
    let names = eventually(WAIT, "v2 pruned", || async {
        let names = server.bundlecontent_names(NS).await;
        if names == kept {
            Ok(names)
        } else {
            Err(format!("{names:?}"))
        }
    })
    .await;
    assert_eq!(names, kept);
    assert_eq!(served(&server, "app").await, deployed("1"));

    // A restart, then polls: still the chosen one.
    let asked = git.ref_requests("app");
    server.restart();
    // Two polls (1 s apart) reach the repository after the restart.
    eventually(WAIT, "two polls after the restart", || async {
        match git.ref_requests("app") - asked {
            n if n >= 2 => Ok(()),
            n => Err(format!("{n} request(s) since the restart")),
        }
    })
    .await;
    let b = server.get_json(&bundle(NS, "app")).await;
    assert_eq!(served_name(&b), c1, "{:#}", b["status"]);
    assert_eq!(served(&server, "app").await, deployed("1"));

    // A revision by digest prefix, one that is not there, one that is not a name.
    let digest3 = server.get_json(&bundlecontent(NS, &c3)).await["spec"]["digest"].as_str().unwrap_or("").to_owned();
    let prefix = &digest3["sha256:".len().."sha256:".len() + 12];
    let plugin = Plugin::new(&server);
    assert_eq!(
        plugin.ok(&["rollback", "app", prefix]).trim(),
        format!("bundle.content.stowage.dev/app rolled back to {c3}")
    );
    wait_for(&server, "app", "v3 served", |b| served_name(b) == c3).await;
    assert_eq!(served(&server, "app").await, deployed("3"));
    let kubectl = crate::kubectl::Kubectl::new(&server);
    let refused = kubectl.fails(
        &["-n", NS, "patch", "bundle", "app", "--type", "merge", "-p", r#"{"spec":{"revision":"Not_A_Name"}}"#],
        None,
    );
    assert!(refused.contains("spec.revision") && refused.contains("RFC 1123"), "{refused}");
    kubectl.ok(&[
        "-n",
        NS,
        "patch",
        "bundle",
        "app",
        "--type",
        "merge",
        "-p",
        r#"{"spec":{"revision":"app-0000000000"}}"#,
    ]);
    let b =
        wait_for(&server, "app", "a missing revision refused", |b| unpacked(b)["reason"] == "RevisionNotFound").await;
    let message = unpacked(&b)["message"].as_str().unwrap_or("").to_owned();
    assert!(message.contains("\"app-0000000000\"") && message.contains(&format!("still serving {c3}")), "{message}");
    assert_eq!(served(&server, "app").await, deployed("3"), "what was served stays served");

    // Cleared: the newest is served again.
    let said = plugin.ok(&["rollback", "app", "--latest"]);
    assert_eq!(said.trim(), "bundle.content.stowage.dev/app serves its newest content again");
    let b = wait_for(&server, "app", "v4 served", |b| served_name(b) == c4).await;
    assert_eq!(unpacked(&b)["status"], "True");
    assert_eq!(served(&server, "app").await, deployed("4"));
    let status = plugin.ok(&["status", "app"]);
    assert!(status.contains("Because:      it is the newest content"), "{status}");
}

fn chart(version: &str) -> Tree {
    [
        ("Chart.yaml", format!("apiVersion: v2\nname: a\nversion: {version}\n")),
        ("templates/cm.yaml", format!("kind: ConfigMap\n# {version}\n")),
        ("templates/sub/deploy.yaml", "kind: Deployment\n".to_owned()),
        ("templatesx/other.yaml", "kind: Other\n".to_owned()),
    ]
    .into_iter()
    .map(|(p, c)| (p.to_string(), file(c)))
    .collect()
}

/// The subtree of `tree` under `prefix/`, its own path left out.
fn under(tree: &Tree, prefix: &str) -> Tree {
    let prefix = format!("{prefix}/");
    tree.iter().filter_map(|(p, n)| p.strip_prefix(&prefix).map(|rest| (rest.to_owned(), n.clone()))).collect()
}

/// An upload Bundle rolled back keeps serving the chosen revision while new pushes land (the push
/// says they are not served); `pull --revision` and `pull --path` fetch one revision or one
/// directory, verified, under the same rules for their target.
#[tokio::test(flavor = "multi_thread")]
async fn uploads_while_rolled_back_and_pulls_of_one_revision_or_directory() {
    let server = Server::start_temp(&[]);
    let plugin = Plugin::new(&server);
    let work = tempfile::tempdir().unwrap();
    let push = |version: &str| {
        let archive = work.path().join(format!("chart-{version}.tar"));
        std::fs::write(&archive, build_tar(&chart(version))).unwrap();
        plugin.ok(&["push", "app", archive.to_str().unwrap(), "--create"])
    };
    push("1.0.0");
    let b1 = server.get_json(&bundle(NS, "app")).await;
    push("2.0.0");
    plugin.ok(&["rollback", "app"]);
    wait_for(&server, "app", "v1 served", |b| served_name(b) == served_name(&b1)).await;
    let said = push("3.0.0");
    assert!(said.contains("not served") && said.contains(served_name(&b1)) && said.contains("--latest"), "{said}");
    let b = server.get_json(&bundle(NS, "app")).await;
    assert_eq!(served_name(&b), served_name(&b1));
    let c3 = str_at(&b, "/status/latestContentName").to_owned();
    assert_eq!(served(&server, "app").await, chart("1.0.0"));

    // One revision, one directory of the served content, one directory of a revision.
    let out = work.path().join("out");
    let (out_s, rev) = (out.to_str().unwrap(), c3.as_str());
    assert!(plugin.ok(&["pull", "app", out_s, "--revision", rev]).contains(rev));
    assert_trees_equal(&chart("3.0.0"), &tree_from_dir(&out), "pull --revision");
    plugin.ok(&["pull", "app", out_s, "--path", "templates"]);
    assert_trees_equal(&under(&chart("1.0.0"), "templates"), &tree_from_dir(&out), "pull --path");
    plugin.ok(&["pull", "app", out_s, "--path", "templates/", "--revision", rev]);
    assert_trees_equal(&under(&chart("3.0.0"), "templates"), &tree_from_dir(&out), "pull --path --revision");

    // A file or a missing directory is refused, and so is a target the user changed.
    let file = plugin.fails(&["pull", "app", out_s, "--path", "Chart.yaml"]);
    assert!(file.contains("is a file") && file.contains("cat"), "{file}");
    assert!(plugin.fails(&["pull", "app", out_s, "--path", "nothing"]).contains("no directory \"nothing\""));
    std::fs::write(out.join("mine.txt"), "mine").unwrap();
    let refused = plugin.fails(&["pull", "app", out_s, "--path", "templates"]);
    assert!(refused.contains("mine.txt") && refused.contains("--force"), "{refused}");
    assert!(out.join("mine.txt").exists());
    let unknown = plugin.fails(&["pull", "app", out_s, "--revision", "app-ffffffffff"]);
    assert!(unknown.contains("no revision \"app-ffffffffff\""), "{unknown}");
}
