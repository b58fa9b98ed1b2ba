//! Bundles whose content comes from git and http sources, end to end through the API: the reconcile
//! loop unpacks them, pins what it resolved, keeps the last good content when a new spec fails,
//! re-resolves only when asked to, prunes old revisions, honours `paused` and limits, and resumes
//! after kill -9. Image sources: `unpack_image.rs`.

use std::time::Duration;

use serde_json::{json, Value};

use crate::git_server::GitServer;
use crate::harness::*;
use crate::http_server::{HttpAuth, HttpServer};
use crate::tarutil::{self, assert_trees_equal, build_tar, file, gzip, parse_served_tar, tree_from_dir, Tree};

const NS: &str = "unpack";
const WAIT: Duration = Duration::from_secs(60);

pub fn bundle_with(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "content.stowage.dev/v1alpha1", "kind": "Bundle",
        "metadata": {"name": name, "namespace": NS}, "spec": spec})
}

pub async fn create(server: &Server, name: &str, spec: Value) {
    let resp = server.post_json(&bundles(NS), &bundle_with(name, spec)).await;
    let status = resp.status();
    assert_eq!(status.as_u16(), 201, "create {name}: {}", resp.text().await.unwrap_or_default());
}

/// The `type` condition of a Bundle, or Null.
pub fn condition(bundle: &Value, kind: &str) -> Value {
    bundle
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|list| list.iter().find(|c| c["type"] == kind))
        .cloned()
        .unwrap_or(Value::Null)
}

/// Waits until the Bundle's `Unpacked` condition, for its current generation, has `reason`.
pub async fn wait_reason(server: &Server, name: &str, reason: &str) -> Value {
    eventually(WAIT, &format!("bundle {name} Unpacked reason {reason}"), || async {
        let b = server.get_json(&bundle(NS, name)).await;
        let c = condition(&b, "Unpacked");
        let current = c["observedGeneration"] == b["metadata"]["generation"];
        if current && c["reason"] == reason {
            Ok(b)
        } else {
            Err(format!("{c}"))
        }
    })
    .await
}

pub fn corpus_tree(relative: &str) -> Tree {
    tree_from_dir(&corpus().join(relative))
}

/// The served content of a Bundle, parsed.
pub async fn served(server: &Server, name: &str) -> Tree {
    parse_served_tar(&server.download(&bundle_content(NS, name)).await)
}

/// A merge patch of a Bundle, which must succeed.
pub async fn merge_patch(server: &Server, name: &str, patch: Value) {
    server.merge_patch_ok(&bundle(NS, name), &patch).await;
}

/// The plain corpus bundle plus 40 incompressible 4 MiB files (seeded from `seed`): big enough
/// that an unpack can be caught halfway.
fn big_tree(seed: u64) -> Tree {
    let mut tree = corpus_tree("rukpak-testdata/plain-v0/valid");
    for i in 0..40 {
        tree.insert(format!("data/blob-{i:02}.bin"), file(tarutil::random_bytes(seed + i, 4 << 20)));
    }
    tree
}

/// Waits until the Bundle's unpack is under way.
async fn wait_unpacking(server: &Server, name: &str) {
    eventually(WAIT, &format!("{name}: unpack started"), || async {
        let b = server.get_json(&bundle(NS, name)).await;
        match b["status"]["phase"] == "Unpacking" {
            true => Ok(()),
            false => Err(format!("{}", b["status"])),
        }
    })
    .await;
}

pub fn http_server_args(host: &str) -> Vec<String> {
    vec!["--insecure-source-host".into(), host.into()]
}

fn start(args: &[String]) -> Server {
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    Server::start_temp(&refs)
}

#[tokio::test(flavor = "multi_thread")]
async fn http_tarballs_unpack_verified_and_a_wrong_sha256_stores_nothing() {
    let web = HttpServer::start(HttpAuth::None);
    let tree = corpus_tree("rukpak-testdata/registry/valid");
    let tar_gz = gzip(&build_tar(&tree));
    web.put("valid.tar.gz", &tar_gz);
    let server = start(&http_server_args(&web.host_port()));
    let sha = sha256_hex(&tar_gz);

    create(&server, "good", json!({"sources": [{"http": {"url": web.url("valid.tar.gz"), "sha256": sha}}]})).await;
    let b = wait_reason(&server, "good", "Unpacked").await;
    assert_unpacked(&b);
    assert_eq!(b["status"]["format"], "registry-v1", "{b:#}");
    assert_eq!(b["status"]["resolvedSources"][0]["http"]["sha256"], sha);
    assert!(u64_at(&b, "/status/formatDetails/objects/ClusterServiceVersion") >= 1, "{b:#}");
    assert_eq!(condition(&b, "Available")["status"], "True");
    assert_trees_equal(&tree, &served(&server, "good").await, "http source");
    // The BundleContent says where it came from and is owned by the Bundle.
    let content = server.get_json(&bundlecontent(NS, str_at(&b, "/status/contentName"))).await;
    assert_eq!(content["spec"]["sources"][0]["http"]["sha256"], sha);
    assert_eq!(content["metadata"]["ownerReferences"][0]["uid"], b["metadata"]["uid"]);

    // The same bytes under a name of its own, so that the source's log shows this Bundle's fetches.
    web.put("tampered.tar.gz", &tar_gz);
    let wrong = "0".repeat(64);
    create(&server, "tampered", json!({"sources": [{"http": {"url": web.url("tampered.tar.gz"), "sha256": wrong}}]}))
        .await;
    let b = wait_reason(&server, "tampered", "DigestMismatch").await;
    assert_eq!(condition(&b, "Unpacked")["status"], "False");
    assert!(b["status"].get("contentName").is_none(), "nothing served: {b:#}");
    let names = server.bundlecontent_names(NS).await;
    assert_eq!(names.len(), 1, "only the good bundle's content exists: {names:?}");
    assert_not_retried(&server, &web, &b, "tampered.tar.gz").await;
}

/// The longest a transient failure waits for its first retry: the unpacker's backoff draws it
/// from 2.5–5 s (`FIRST_RETRY` 5 s, from its upper half).
pub const FIRST_RETRY_MAX: Duration = Duration::from_secs(5);

/// A permanent failure (`b`, as it was recorded) is not retried: its status schedules nothing, and
/// from the failure until past the longest first retry of a transient one nothing happens — no
/// new request for `file` at the source, no new status.
pub async fn assert_not_retried(server: &Server, web: &HttpServer, b: &Value, file: &str) {
    let name = str_at(b, "/metadata/name");
    let message = condition(b, "Unpacked")["message"].as_str().unwrap_or_default().to_owned();
    assert!(!message.contains("retrying"), "{name}: a permanent failure says it is retried: {message}");
    assert!(b["status"].get("nextPollTime").is_none(), "{name}: a retry is scheduled: {:#}", b["status"]);
    let rv = str_at(b, "/metadata/resourceVersion").to_owned();
    let fetched = web.requests_for(file);
    assert!(fetched > 0, "{name}: {file} was never fetched");
    // Counted from now, which is after the failure: the window covers every moment a first retry
    // could come at (one before now shows in the first look).
    let what = format!("{name}: its failure is not retried");
    holds_for(FIRST_RETRY_MAX + Duration::from_millis(500), Duration::from_millis(100), &what, || async {
        let later = server.get_json(&bundle(NS, name)).await;
        match (web.requests_for(file), str_at(&later, "/metadata/resourceVersion")) {
            (n, now) if n == fetched && now == rv => Ok(()),
            (n, now) => Err(format!("requests for {file}: {fetched} → {n}; resourceVersion {rv} → {now}")),
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failing_new_spec_keeps_serving_the_last_good_content() {
    let web = HttpServer::start(HttpAuth::None);
    let tree = corpus_tree("rukpak-testdata/plain-v0/valid");
    web.put("plain.tar", &build_tar(&tree));
    let mut bad: Tree = Tree::new();
    bad.insert("manifests/broken.yaml".into(), file("apiVersion: v1\nkind: [unclosed\n"));
    web.put("bad.tar", &build_tar(&bad));
    let server = start(&http_server_args(&web.host_port()));

    create(&server, "app", json!({"sources": [{"http": {"url": web.url("plain.tar")}}]})).await;
    let good = wait_reason(&server, "app", "Unpacked").await;
    assert_eq!(good["status"]["format"], "plain");
    merge_patch(&server, "app", json!({"spec": {"sources": [{"http": {"url": web.url("bad.tar")}}]}})).await;
    let b = wait_reason(&server, "app", "InvalidFormat").await;
    let unpacked = condition(&b, "Unpacked");
    assert!(unpacked["message"].as_str().unwrap().contains("manifests/broken.yaml"), "names the file: {unpacked}");
    assert!(unpacked["message"].as_str().unwrap().contains("still serving"), "says what is served: {unpacked}");
    assert_eq!(condition(&b, "Available")["status"], "True", "{b:#}");
    assert_eq!(b["status"]["contentName"], good["status"]["contentName"]);
    assert_eq!(b["status"]["phase"], "Failed");
    assert_trees_equal(&tree, &served(&server, "app").await, "last good content");
}

#[tokio::test(flavor = "multi_thread")]
async fn git_branches_stay_pinned_unless_polled_and_history_is_pruned() {
    let git = GitServer::start().await;
    git.create("repo");
    let plain = corpus().join("rukpak-testdata/plain-v0/valid");
    let first = git.commit_dir("repo", "main", &plain);
    let server = start(&http_server_args(&git.host_port()));
    let source = json!({"git": {"repository": git.url("repo"), "ref": {"branch": "main"}}});
    create(&server, "pinned", json!({"sources": [source.clone()]})).await;
    create(&server, "polled", json!({"sources": [source], "pollInterval": "1s", "revisionHistoryLimit": 1})).await;
    for name in ["pinned", "polled"] {
        let b = wait_reason(&server, name, "Unpacked").await;
        assert_eq!(b["status"]["resolvedSources"][0]["git"]["commit"], first.as_str(), "{b:#}");
    }
    let pinned_before = server.get_json(&bundle(NS, "pinned")).await;

    // Two more commits on the branch: the polled Bundle follows, keeping one old revision.
    let mut digests = vec![str_at(&pinned_before, "/status/digest").to_owned()];
    for i in 0..2 {
        let mut tree = tree_from_dir(&plain);
        tree.insert(
            format!("manifests/extra-{i}.yaml"),
            file(format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: extra-{i}\n")),
        );
        let commit = git.commit("repo", "main", &tree);
        let b = eventually(WAIT, "polled bundle follows the branch", || async {
            let b = server.get_json(&bundle(NS, "polled")).await;
            match b["status"]["resolvedSources"][0]["git"]["commit"] == commit.as_str()
                && b["status"]["phase"] == "Unpacked"
            {
                true => Ok(b),
                false => Err(format!("{}", b["status"])),
            }
        })
        .await;
        assert_trees_equal(&tree, &served(&server, "polled").await, "new commit served");
        digests.push(str_at(&b, "/status/digest").to_owned());
    }
    let polled = server.get_json(&bundle(NS, "polled")).await;
    let owned: Vec<String> = server
        .get_json(&format!("{}?labelSelector=content.stowage.dev/bundle%3Dpolled", bundlecontents(NS)))
        .await["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| str_at(i, "/spec/digest").to_owned())
        .collect();
    assert_eq!(owned.len(), 2, "the served revision and revisionHistoryLimit=1 old one: {owned:?}");
    assert!(owned.contains(&digests[2]) && owned.contains(&digests[1]), "newest kept: {owned:?} of {digests:?}");
    assert_eq!(str_at(&polled, "/status/digest"), digests[2]);

    // Without pollInterval nothing moved.
    let pinned = server.get_json(&bundle(NS, "pinned")).await;
    assert_eq!(pinned["status"], pinned_before["status"], "a Bundle without pollInterval stays pinned");
}

#[tokio::test(flavor = "multi_thread")]
async fn git_subdirectory_and_tag() {
    let git = GitServer::start().await;
    git.create("mono");
    let mut tree = Tree::new();
    for (path, node) in corpus_tree("rukpak-testdata/plain-v0/valid") {
        tree.insert(format!("deploy/app/{path}"), node);
    }
    tree.insert("README.md".into(), file("not part of the bundle"));
    let commit = git.commit("mono", "main", &tree);
    git.tag("mono", "v1.0.0", &commit, true);
    let server = start(&http_server_args(&git.host_port()));
    create(
        &server,
        "sub",
        json!({"sources": [{"git": {"repository": git.url("mono"), "ref": {"tag": "v1.0.0"}, "directory": "deploy/app"}}],
            "format": "plain"}),
    )
    .await;
    let b = wait_reason(&server, "sub", "Unpacked").await;
    assert_eq!(b["status"]["resolvedSources"][0]["git"]["commit"], commit.as_str());
    assert_trees_equal(&corpus_tree("rukpak-testdata/plain-v0/valid"), &served(&server, "sub").await, "subdirectory");
}

#[tokio::test(flavor = "multi_thread")]
async fn paused_bundles_are_not_fetched_and_limits_store_nothing() {
    let web = HttpServer::start(HttpAuth::None);
    let tree = corpus_tree("rukpak-testdata/plain-v0/valid");
    web.put("plain.tar", &build_tar(&tree));
    let mut args = http_server_args(&web.host_port());
    args.extend(["--max-files".to_string(), "3".to_string()]);
    let server = start(&args);
    let (files, _) = tarutil::file_count_and_size(&tree);
    assert!(files > 3, "the corpus bundle has more files than the limit");

    create(&server, "paused", json!({"sources": [{"http": {"url": web.url("plain.tar")}}], "paused": true})).await;
    let b = eventually(WAIT, "Paused condition", || async {
        let b = server.get_json(&bundle(NS, "paused")).await;
        match condition(&b, "Paused")["status"] == "True" {
            true => Ok(b),
            false => Err(format!("{}", b["status"])),
        }
    })
    .await;
    assert!(b["status"].get("contentName").is_none(), "{b:#}");

    create(&server, "big", json!({"sources": [{"http": {"url": web.url("plain.tar")}}]})).await;
    let b = wait_reason(&server, "big", "LimitExceeded").await;
    assert!(condition(&b, "Unpacked")["message"].as_str().unwrap().contains("more than 3 files"), "{b:#}");
    assert!(server.bundlecontent_names(NS).await.is_empty());
    let metrics = server.metrics().await;
    assert_eq!(metrics.get("stowage_revisions{state=\"committed\"}").copied().unwrap_or(0.0), 0.0);
}

#[tokio::test(flavor = "multi_thread")]
async fn kill9_mid_unpack_resumes_after_restart() {
    let web = HttpServer::start(HttpAuth::None);
    // ~160 MB of incompressible files: long enough to be caught mid-unpack.
    let tree = big_tree(0);
    web.put("big.tar", &build_tar(&tree));
    let mut server = start(&http_server_args(&web.host_port()));
    create(&server, "resumed", json!({"sources": [{"http": {"url": web.url("big.tar")}}]})).await;
    wait_unpacking(&server, "resumed").await;
    server.kill9();
    server.restart();
    let b = wait_reason(&server, "resumed", "Unpacked").await;
    assert_unpacked(&b);
    let data = server.download(&bundle_content(NS, "resumed")).await;
    assert_eq!(digest_of(&data), str_at(&b, "/status/digest"), "served bytes match the digest");
    assert_trees_equal(&tree, &parse_served_tar(&data), "resumed unpack");
    eventually(WAIT, "no half-written revision left", || async {
        let m = server.metrics().await;
        let staging = m.get("stowage_revisions{state=\"staging\"}").copied().unwrap_or(0.0);
        let committed = m.get("stowage_revisions{state=\"committed\"}").copied().unwrap_or(0.0);
        match (staging, committed) {
            (s, c) if s == 0.0 && c == 1.0 => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_spec_change_cancels_the_running_unpack_and_the_new_spec_wins() {
    let web = HttpServer::start(HttpAuth::None);
    let big = big_tree(100);
    web.put("big.tar", &build_tar(&big));
    let small = corpus_tree("rukpak-testdata/registry/valid");
    web.put("small.tar", &build_tar(&small));
    let server = start(&http_server_args(&web.host_port()));
    create(&server, "switch", json!({"sources": [{"http": {"url": web.url("big.tar")}}]})).await;
    wait_unpacking(&server, "switch").await;
    merge_patch(&server, "switch", json!({"spec": {"sources": [{"http": {"url": web.url("small.tar")}}]}})).await;
    let b = wait_reason(&server, "switch", "Unpacked").await;
    assert_eq!(b["metadata"]["generation"], 2);
    assert_eq!(b["status"]["format"], "registry-v1");
    assert_trees_equal(&small, &served(&server, "switch").await, "the new spec's content");
    // The cancelled unpack left nothing behind (its revision was released, never attached).
    assert_eq!(server.bundlecontent_names(NS).await.len(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_ends_watches_and_unpacks_promptly_and_the_unpack_resumes() {
    let web = HttpServer::start(HttpAuth::None);
    let tree = big_tree(200);
    web.put("big.tar", &build_tar(&tree));
    let mut server = start(&http_server_args(&web.host_port()));
    let mut watch = server.get(&format!("{}?watch=true", bundles(NS))).await;
    assert_eq!(watch.status().as_u16(), 200);
    create(&server, "term", json!({"sources": [{"http": {"url": web.url("big.tar")}}]})).await;
    wait_unpacking(&server, "term").await;
    let took = server.terminate(Duration::from_secs(15)).expect("the server exits on SIGTERM");
    report(&format!("SIGTERM with an open watch and a running unpack: exited in {took:?}"));
    assert!(took < Duration::from_secs(8), "exit within seconds, not a minute: {took:?}");
    // The watch ended (cleanly or cut), so its client re-lists elsewhere.
    let ended = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match watch.chunk().await {
                Ok(Some(_)) => continue,
                _ => return,
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "the watch stream ended with the server");
    server.restart();
    let b = wait_reason(&server, "term", "Unpacked").await;
    assert_eq!(digest_of(&server.download(&bundle_content(NS, "term")).await), str_at(&b, "/status/digest"));
}
