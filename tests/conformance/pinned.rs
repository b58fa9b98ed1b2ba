//! Pinned means pinned, end to end against a real git server over smart HTTP and nginx: a branch
//! stays on the commit it was resolved to through unrelated spec changes and a restart, and moves
//! when its own ref changes or the refresh annotation asks; every condition is there from the
//! first status write and speaks for the current generation, paused included; and format
//! detection says where each source was placed and what was expected, in the exact words a user
//! reads in `kubectl get`.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{json, Value};

use crate::git_server::GitServer;
use crate::harness::*;
use crate::http_server::{HttpAuth, HttpServer};
use crate::kubectl::Kubectl;
use crate::tarutil::{build_tar, file, parse_served_tar, Tree};

const NS: &str = "pinned";
const WAIT: Duration = Duration::from_secs(60);

async fn create(server: &Server, name: &str, spec: Value) {
    server.create_bundle_with(NS, name, spec).await;
}

fn condition(b: &Value, kind: &str) -> Value {
    let list = b.pointer("/status/conditions").and_then(Value::as_array).cloned().unwrap_or_default();
    list.into_iter().find(|c| c["type"] == kind).unwrap_or(Value::Null)
}

/// Waits until `Unpacked` has `reason` for the current generation; returns the Bundle.
async fn wait_reason(server: &Server, name: &str, reason: &str) -> Value {
    eventually(WAIT, &format!("{name}: {reason}"), || async {
        let b = server.get_json(&bundle(NS, name)).await;
        let c = condition(&b, "Unpacked");
        match c["reason"] == reason && c["observedGeneration"] == b["metadata"]["generation"] {
            true => Ok(b),
            false => Err(format!("{}", b["status"])),
        }
    })
    .await
}

/// Every condition, and the status, speak for the Bundle's current generation.
fn assert_current(b: &Value) {
    let generation = &b["metadata"]["generation"];
    assert_eq!(&b["status"]["observedGeneration"], generation, "{:#}", b["status"]);
    for kind in ["Unpacked", "Available", "Paused"] {
        let c = condition(b, kind);
        assert_eq!(&c["observedGeneration"], generation, "{kind}: {:#}", b["status"]);
    }
}

fn message(b: &Value) -> String {
    condition(b, "Unpacked")["message"].as_str().unwrap_or_default().to_owned()
}

fn commit_of(b: &Value) -> &str {
    b["status"]["resolvedSources"][0]["git"]["commit"].as_str().unwrap_or_default()
}

async fn served(server: &Server, name: &str) -> Tree {
    parse_served_tar(&server.download(&bundle_content(NS, name)).await)
}

fn config_map(version: &str) -> String {
    format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: app\ndata:\n  version: \"{version}\"\n")
}

/// A repository tree whose `deploy/` directory is a plain bundle of `version`.
fn app(version: &str) -> Tree {
    BTreeMap::from([
        ("deploy/manifests/app.yaml".to_string(), file(config_map(version))),
        ("README.md".to_string(), file(format!("release {version}\n"))),
    ])
}

fn deployed(version: &str) -> Tree {
    BTreeMap::from([("manifests/app.yaml".to_string(), file(config_map(version)))])
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pinned_branch_stays_on_its_commit_until_its_ref_changes_or_a_refresh_is_asked() {
    let git = GitServer::start().await;
    git.create("app");
    let first = git.commit("app", "main", &app("1"));
    let mut server = Server::start_temp(&["--insecure-source-host", &git.host_port()]);
    let source = json!({"repository": git.url("app"), "ref": {"branch": "main"}, "directory": "deploy"});
    create(&server, "pin", json!({"sources": [{"git": source}]})).await;
    let b = wait_reason(&server, "pin", "Unpacked").await;
    assert_eq!(
        b["status"]["resolvedSources"],
        json!([{"git": {"repository": git.url("app"), "ref": {"branch": "main"}, "directory": "deploy",
            "commit": first}}]),
        "the pin records what it was resolved from"
    );
    let content = str_at(&b, "/status/contentName").to_owned();

    // A push, then spec changes that leave the source alone: the branch stays where it was.
    let second = git.commit("app", "main", &app("2"));
    let kubectl = Kubectl::new(&server);
    let patch = |p: &str| kubectl.ok(&["-n", NS, "patch", "bundle", "pin", "--type", "merge", "-p", p]);
    patch(r#"{"spec":{"revisionHistoryLimit":4}}"#);
    let b = wait_reason(&server, "pin", "Unpacked").await;
    assert_eq!((commit_of(&b), str_at(&b, "/status/contentName")), (first.as_str(), content.as_str()));
    assert_current(&b);
    patch(r#"{"spec":{"format":"plain"}}"#);
    let b = wait_reason(&server, "pin", "Unpacked").await;
    assert_eq!((commit_of(&b), str_at(&b, "/status/format")), (first.as_str(), "plain"));
    assert_eq!(b["metadata"]["generation"], 3);
    assert_current(&b);
    let asked = git.ref_requests("app");
    server.restart();
    // The loop lists every Bundle when it starts and plans each at once: a Bundle created after
    // the restart that gets unpacked shows it has run since. Had the restart dropped the pin,
    // "pin" would have been resolved at once too: a moment more covers one in flight.
    git.create("canary");
    git.commit("canary", "main", &app("0"));
    let canary = json!({"repository": git.url("canary"), "ref": {"branch": "main"}, "directory": "deploy"});
    create(&server, "canary", json!({"sources": [{"git": canary}]})).await;
    wait_reason(&server, "canary", "Unpacked").await;
    holds_for(
        Duration::from_secs(1),
        Duration::from_millis(100),
        "a restart asks nothing of a pinned source",
        || async {
            match git.ref_requests("app") {
                n if n == asked => Ok(()),
                n => Err(format!("{asked} → {n} requests for the app repository")),
            }
        },
    )
    .await;
    let b = wait_reason(&server, "pin", "Unpacked").await;
    assert_eq!(commit_of(&b), first, "a restart keeps the pin");
    assert_eq!(served(&server, "pin").await, deployed("1"));

    // Asked for: the refresh annotation resolves the branch again, once per value.
    let kubectl = Kubectl::new(&server);
    kubectl.ok(&["-n", NS, "annotate", "bundle", "pin", "content.stowage.dev/refresh=2026-11-27T10:00:00Z"]);
    let b = eventually(WAIT, "refreshed to the branch's head", || async {
        let b = server.get_json(&bundle(NS, "pin")).await;
        let done = commit_of(&b) == second && b["status"]["lastHandledRefresh"] == "2026-11-27T10:00:00Z";
        if done {
            Ok(b)
        } else {
            Err(format!("{}", b["status"]))
        }
    })
    .await;
    assert_eq!(b["metadata"]["generation"], 3, "an annotation is no spec change");
    assert_eq!(served(&server, "pin").await, deployed("2"));

    // The source's own ref changed: resolved again.
    let third = git.commit("app", "release", &app("3"));
    let kubectl = Kubectl::new(&server);
    kubectl.ok(&[
        "-n",
        NS,
        "patch",
        "bundle",
        "pin",
        "--type",
        "merge",
        "-p",
        r#"{"spec":{"sources":[{"git":
        {"repository":"URL","ref":{"branch":"release"},"directory":"deploy"}}]}}"#
            .replace("URL", &git.url("app"))
            .as_str(),
    ]);
    let b = wait_reason(&server, "pin", "Unpacked").await;
    assert_eq!(commit_of(&b), third);
    assert_eq!(b["status"]["resolvedSources"][0]["git"]["ref"], json!({"branch": "release"}));
    assert_eq!(served(&server, "pin").await, deployed("3"));
}

#[tokio::test(flavor = "multi_thread")]
async fn every_condition_is_there_from_the_start_and_speaks_for_the_current_generation() {
    let web = HttpServer::start(HttpAuth::None);
    let server = Server::start_temp(&["--insecure-source-host", &web.host_port()]);
    let kubectl = Kubectl::new(&server);
    create(&server, "missing", json!({"sources": [{"http": {"url": web.url("missing.tar")}}]})).await;
    let waited = kubectl.ok(&["-n", NS, "wait", "--for=condition=Available=false", "bundle/missing", "--timeout=60s"]);
    assert!(waited.contains("condition met"), "{waited}");
    let b = wait_reason(&server, "missing", "SourceNotFound").await;
    let available = condition(&b, "Available");
    assert_eq!((&available["status"], &available["reason"]), (&json!("False"), &json!("SourceNotFound")));
    let said = available["message"].as_str().unwrap_or_default();
    assert!(said.starts_with("nothing is served: ") && said.contains("404"), "{said}");
    assert_eq!(
        (&condition(&b, "Paused")["status"], &condition(&b, "Paused")["reason"]),
        (&json!("False"), &json!("Active"))
    );
    assert_current(&b);

    // Paused with the sources unchanged: still unpacked, every condition at the new generation.
    web.put("one.tar", &build_tar(&deployed("1")));
    web.put("two.tar", &build_tar(&deployed("2")));
    create(&server, "held", json!({"sources": [{"http": {"url": web.url("one.tar")}}]})).await;
    wait_reason(&server, "held", "Unpacked").await;
    server.merge_patch_ok(&bundle(NS, "held"), &json!({"spec": {"paused": true}})).await;
    let paused = |generation: u64| {
        let server = &server;
        async move {
            eventually(WAIT, &format!("paused at generation {generation}"), || async {
                let b = server.get_json(&bundle(NS, "held")).await;
                let marked = condition(&b, "Paused")["status"] == "True"
                    && condition(&b, "Paused")["observedGeneration"] == generation;
                if marked {
                    Ok(b)
                } else {
                    Err(format!("{}", b["status"]))
                }
            })
            .await
        }
    };
    let b = paused(2).await;
    assert_current(&b);
    assert_eq!(condition(&b, "Unpacked")["status"], "True", "nothing changed but the pause: {:#}", b["status"]);

    // Paused with a changed source: not unpacked, and says why; the old content stays served.
    server
        .merge_patch_ok(&bundle(NS, "held"), &json!({"spec": {"sources": [{"http": {"url": web.url("two.tar")}}]}}))
        .await;
    let b = paused(3).await;
    assert_current(&b);
    let unpacked = condition(&b, "Unpacked");
    assert_eq!((&unpacked["status"], &unpacked["reason"]), (&json!("False"), &json!("Paused")));
    let content = str_at(&b, "/status/contentName");
    let digest = str_at(&b, "/status/digest");
    assert_eq!(
        message(&b),
        format!("spec.paused is true: generation 3 is not unpacked; still serving {content} ({digest})")
    );
    assert_eq!(condition(&b, "Available")["status"], "True");
    assert_eq!(web.requests_for("two.tar"), 0, "paused: nothing fetched");
    assert_eq!(served(&server, "held").await, deployed("1"));

    server.merge_patch_ok(&bundle(NS, "held"), &json!({"spec": {"paused": false}})).await;
    let b = wait_reason(&server, "held", "Unpacked").await;
    assert_current(&b);
    assert_eq!(condition(&b, "Paused")["status"], "False");
    assert_eq!(served(&server, "held").await, deployed("2"));
}

#[tokio::test(flavor = "multi_thread")]
async fn detection_says_where_each_source_went_and_what_was_expected() {
    let git = GitServer::start().await;
    git.create("repo");
    let chart = "apiVersion: v2\nname: kps\nversion: 1.0.0\n";
    let tree = BTreeMap::from([
        ("stack/manifests/app.yaml".to_string(), file(config_map("1"))),
        ("stack/manifests/extra.yaml".to_string(), file(config_map("x"))),
        ("more/manifests/other.yaml".to_string(), file(config_map("2"))),
        ("kps/Chart.yaml".to_string(), file(chart.to_owned())),
        ("kps/values.yaml".to_string(), file("a: 1\n".to_owned())),
        ("flat/a.yaml".to_string(), file(config_map("a"))),
        ("flat/b.yaml".to_string(), file(config_map("b"))),
    ]);
    git.commit("repo", "main", &tree);
    let server = Server::start_temp(&["--insecure-source-host", &git.host_port()]);
    let from = |directory: &str, destination: &str| {
        json!({"git": {"repository": git.url("repo"), "ref": {"branch": "main"}, "directory": directory},
            "destination": destination})
    };

    // Composed: each source under its own destination, no format asked for: served as it is.
    create(&server, "composed", json!({"sources": [from("stack", "from-git"), from("kps", "charts/kps")]})).await;
    let b = wait_reason(&server, "composed", "Unpacked").await;
    assert_eq!(b["status"]["format"], "");
    let paths: Vec<String> = served(&server, "composed").await.into_keys().collect();
    assert!(
        paths.contains(&"from-git/manifests/app.yaml".into()) && paths.contains(&"charts/kps/Chart.yaml".into()),
        "{paths:?}"
    );

    // One source under a destination: the root holds no bundle.
    create(&server, "nested", json!({"sources": [from("stack", "from-git")]})).await;
    let b = wait_reason(&server, "nested", "InvalidFormat").await;
    assert_eq!(
        message(&b),
        "no bundle format detected: found from-git/ at the root (spec.sources[0] under from-git/); expected \
         manifests/ (plain), metadata/annotations.yaml (registry-v1) or Chart.yaml (helm) at the root"
    );

    // Two sources at the root share manifests/, but not a file.
    create(&server, "layered", json!({"sources": [from("stack", ""), from("more", "")]})).await;
    let b = wait_reason(&server, "layered", "Unpacked").await;
    assert_eq!(b["status"]["format"], "plain");
    assert_eq!(b["status"]["formatDetails"]["objects"], json!({"ConfigMap": 3}));
    create(&server, "clash", json!({"sources": [from("stack", ""), from("stack", "")]})).await;
    let b = wait_reason(&server, "clash", "InvalidContent").await;
    assert_eq!(
        message(&b),
        "invalid entry \"manifests/app.yaml\": duplicate path: spec.sources[1] writes it, and spec.sources[0] \
         already did (give the sources destinations that do not overlap)"
    );

    // YAML files at the root: plain only under manifests/, and the message says how.
    create(&server, "flat", json!({"sources": [from("flat", "")]})).await;
    let b = wait_reason(&server, "flat", "InvalidFormat").await;
    assert_eq!(
        message(&b),
        "no bundle format detected: found a.yaml, b.yaml at the root; expected manifests/ (plain), \
         metadata/annotations.yaml (registry-v1) or Chart.yaml (helm) at the root; a plain bundle keeps its YAML \
         or JSON objects under manifests/, not at the root: set spec.sources[0].destination to manifests"
    );
    create(&server, "flat-plain", json!({"sources": [from("flat", "")], "format": "plain"})).await;
    let b = wait_reason(&server, "flat-plain", "InvalidFormat").await;
    assert_eq!(
        message(&b),
        "not a plain bundle: there is no manifests/ directory (found a.yaml, b.yaml at the root); a plain bundle \
         keeps its YAML or JSON objects under manifests/, not at the root: set spec.sources[0].destination to \
         manifests"
    );
    server.merge_patch_ok(&bundle(NS, "flat-plain"), &json!({"spec": {"sources": [from("flat", "manifests")]}})).await;
    let b = wait_reason(&server, "flat-plain", "Unpacked").await;
    assert_eq!(b["status"]["formatDetails"]["objects"], json!({"ConfigMap": 2}));
}
