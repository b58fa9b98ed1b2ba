//! Sources that follow releases, end to end against a real `docker-registry`, a real git server
//! over smart HTTP and nginx: a version range picks the newest matching tag and moves when a newer
//! one is pushed, pre-releases count only when asked for, a range without a match says so, a
//! release asset follows a git tag range; a missing source is not retried before its spec changes
//! or its poll interval passes (nor after a restart), and Bundles failing together retry spread
//! out in time.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::git_server::GitServer;
use crate::harness::*;
use crate::http_server::{HttpAuth, HttpServer};
use crate::registry::Registry;
use crate::tarutil::{build_tar, file, gzip, parse_served_tar, Tree};

const NS: &str = "versions";
const WAIT: Duration = Duration::from_secs(60);

async fn create(server: &Server, name: &str, spec: Value) {
    server.create_bundle_with(NS, name, spec).await;
}

fn unpacked_condition(b: &Value) -> Value {
    let list = b.pointer("/status/conditions").and_then(Value::as_array).cloned().unwrap_or_default();
    list.into_iter().find(|c| c["type"] == "Unpacked").unwrap_or(Value::Null)
}

/// Waits until `check` holds for the Bundle; returns it.
async fn wait_for(server: &Server, name: &str, what: &str, check: impl Fn(&Value) -> bool) -> Value {
    eventually(WAIT, &format!("{name}: {what}"), || async {
        let b = server.get_json(&bundle(NS, name)).await;
        match check(&b) {
            true => Ok(b),
            false => Err(format!("{}", b["status"])),
        }
    })
    .await
}

/// Waits until the Bundle serves the content of `tag` (the source's kind given by `kind`).
async fn wait_serving(server: &Server, name: &str, kind: &str, tag: &str) -> Value {
    wait_for(server, name, &format!("serving {tag}"), |b| {
        b["status"]["resolvedSources"][0][kind]["tag"] == tag
            && unpacked_condition(b)["reason"] == "Unpacked"
            && unpacked_condition(b)["observedGeneration"] == b["metadata"]["generation"]
    })
    .await
}

async fn wait_reason(server: &Server, name: &str, reason: &str) -> Value {
    wait_for(server, name, reason, |b| {
        let c = unpacked_condition(b);
        c["reason"] == reason && c["observedGeneration"] == b["metadata"]["generation"]
    })
    .await
}

async fn served(server: &Server, name: &str) -> Tree {
    parse_served_tar(&server.download(&bundle_content(NS, name)).await)
}

/// A Helm chart `kps` at `version`, as `helm package` lays it out.
fn chart(version: &str) -> Tree {
    BTreeMap::from([
        ("kps/Chart.yaml".to_string(), file(format!("apiVersion: v2\nname: kps\nversion: {version}\n"))),
        ("kps/values.yaml".to_string(), file(format!("release: \"{version}\"\n"))),
    ])
}

fn available(b: &Value) -> Value {
    b["status"]["availableVersions"].clone()
}

#[tokio::test(flavor = "multi_thread")]
async fn an_image_range_follows_the_newest_matching_chart_and_ignores_prereleases_unless_asked() {
    let registry = Registry::start().await;
    let mut pushed = BTreeMap::new();
    for version in ["88.4.0", "88.5.0", "88.5.3", "88.6.0-rc.1", "89.0.0"] {
        let tgz = gzip(&build_tar(&chart(version)));
        pushed.insert(version, registry.push_helm_chart("charts/kps", version, &tgz, "kps", version).await);
    }
    let server = Server::start_temp(&["--insecure-registry", &registry.host()]);
    let repository = format!("{}/charts/kps", registry.host());
    let image = |range: &str| json!({"image": {"ref": repository, "semver": range}});
    create(&server, "kps", json!({"sources": [image(">=88.4.0 <89")], "pollInterval": "1s"})).await;
    create(&server, "kps-pre", json!({"sources": [image(">=88.4.0-0 <89")]})).await;
    create(&server, "kps-none", json!({"sources": [image(">=100")], "pollInterval": "1s"})).await;

    let b = wait_serving(&server, "kps", "image", "88.5.3").await;
    assert_eq!(b["status"]["resolvedSources"][0]["image"]["digest"], pushed["88.5.3"].digest.as_str(), "{b:#}");
    assert_eq!(available(&b), json!([{"source": 0, "versions": ["88.5.3", "88.5.0", "88.4.0"]}]));
    assert_eq!(served(&server, "kps").await, chart("88.5.3"));
    let pre = wait_serving(&server, "kps-pre", "image", "88.6.0-rc.1").await;
    assert_eq!(available(&pre)[0]["versions"][0], "88.6.0-rc.1", "a range naming a pre-release sees them");

    let none = wait_reason(&server, "kps-none", "NoMatchingVersion").await;
    let message = unpacked_condition(&none)["message"].as_str().unwrap_or_default().to_owned();
    assert!(message.contains("no tag matches the version range \">=100\""), "{message}");
    assert!(message.contains("the newest versions are 89.0.0, 88.6.0-rc.1, 88.5.3"), "{message}");

    // A newer release in range is followed by the polled Bundle; the old content stays kept.
    let tgz = gzip(&build_tar(&chart("88.5.4")));
    let newer = registry.push_helm_chart("charts/kps", "88.5.4", &tgz, "kps", "88.5.4").await;
    let b2 = wait_serving(&server, "kps", "image", "88.5.4").await;
    assert_eq!(b2["status"]["resolvedSources"][0]["image"]["digest"], newer.digest.as_str());
    assert_eq!(served(&server, "kps").await, chart("88.5.4"));
    let kept = server.bundlecontent_names(NS).await;
    assert!(kept.contains(&str_at(&b, "/status/contentName").to_owned()), "the previous release is kept: {kept:?}");
    assert_eq!(available(&b2)[0]["versions"][0], "88.5.4");
    // Without pollInterval a range is resolved once: kps-pre stays where it was.
    let pre_after = server.get_json(&bundle(NS, "kps-pre")).await;
    assert_eq!(pre_after["status"]["resolvedSources"], pre["status"]["resolvedSources"]);
    report(&format!("image range: 88.5.3 picked, then 88.5.4 followed; kps-none said: {message}"));
}

#[tokio::test(flavor = "multi_thread")]
async fn an_image_range_sees_every_tag_of_a_repository_with_a_thousand() {
    let registry = Registry::start().await;
    let tgz = gzip(&build_tar(&chart("1.0.0")));
    let first = registry.push_helm_chart("charts/many", "1.0.0", &tgz, "kps", "1.0.0").await;
    // 1,001 tags, 9.0.0 last by name. Stowage asks for pages of 1,000 and follows `Link`; Debian's
    // docker-registry (distribution 2.8) answers the whole list at once, so the paging itself is
    // checked by a unit test of the `Link` header (registry.rs).
    let tags: Vec<String> = (1..=999).map(|patch| format!("1.0.{patch}")).chain(["9.0.0".to_string()]).collect();
    let url = format!("http://{}/v2/charts/many/manifests/{}", registry.host(), first.digest);
    let manifest = reqwest::Client::new().get(url).header("accept", &first.media_type).send().await.unwrap();
    let manifest = manifest.error_for_status().unwrap().bytes().await.unwrap();
    for tag in &tags {
        registry.push_manifest("charts/many", tag, &first.media_type, &manifest).await;
    }
    let server = Server::start_temp(&["--insecure-registry", &registry.host()]);
    let repository = format!("{}/charts/many", registry.host());
    create(&server, "many", json!({"sources": [{"image": {"ref": repository, "semver": ">=1"}}]})).await;
    let b = wait_serving(&server, "many", "image", "9.0.0").await;
    assert_eq!(available(&b)[0]["versions"], json!(["9.0.0", "1.0.999", "1.0.998", "1.0.997", "1.0.996"]));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_git_range_picks_the_newest_tag_and_records_it() {
    let git = GitServer::start().await;
    git.create("stack");
    let mut commits = BTreeMap::new();
    for (tag, annotated) in [("v1.0.0", false), ("v1.1.0", true), ("v1.2.0-rc.1", true), ("v2.0.0", true)] {
        let tree = BTreeMap::from([("manifests/release.yaml".to_string(), file(release_yaml(tag)))]);
        let commit = git.commit("stack", "main", &tree);
        git.tag("stack", tag, &commit, annotated);
        commits.insert(tag, commit);
    }
    let server = Server::start_temp(&["--insecure-source-host", &git.host_port()]);
    let spec = json!({"sources": [{"git": {"repository": git.url("stack"), "ref": {"semver": "^1"}}}],
        "pollInterval": "1s"});
    create(&server, "stack", spec).await;
    let b = wait_serving(&server, "stack", "git", "v1.1.0").await;
    assert_eq!(b["status"]["resolvedSources"][0]["git"]["commit"], commits["v1.1.0"].as_str(), "annotated tag peeled");
    assert_eq!(available(&b), json!([{"source": 0, "versions": ["v1.1.0", "v1.0.0"]}]));
    let tree = BTreeMap::from([("manifests/release.yaml".to_string(), file(release_yaml("v1.2.0")))]);
    let commit = git.commit("stack", "main", &tree);
    git.tag("stack", "v1.2.0", &commit, true);
    let b = wait_serving(&server, "stack", "git", "v1.2.0").await;
    assert_eq!(b["status"]["resolvedSources"][0]["git"]["commit"], commit.as_str());
    assert_eq!(served(&server, "stack").await, tree);
}

fn release_yaml(tag: &str) -> String {
    format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: release\ndata:\n  tag: \"{tag}\"\n")
}

/// A cluster-stack-like release: a tarball of manifests and a Helm chart, both release assets.
fn publish_release(web: &HttpServer, git: &GitServer, tag: &str) -> (Tree, Tree) {
    let version = tag.trim_start_matches('v');
    let manifests = BTreeMap::from([("manifests/release.yaml".to_string(), file(release_yaml(tag)))]);
    let chart = BTreeMap::from([
        ("stack/Chart.yaml".to_string(), file(format!("apiVersion: v2\nname: stack\nversion: {version}\n"))),
        ("stack/templates/cm.yaml".to_string(), file(release_yaml(tag))),
    ]);
    web.put(&format!("releases/download/{tag}/manifests-{version}.tar.gz"), &gzip(&build_tar(&manifests)));
    web.put(&format!("releases/download/{tag}/stack-{version}.tgz"), &gzip(&build_tar(&chart)));
    let commit = git.commit("stack", "main", &manifests);
    git.tag("stack", tag, &commit, true);
    (manifests, chart)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_release_asset_follows_a_tag_range() {
    let web = HttpServer::start(HttpAuth::None);
    let git = GitServer::start().await;
    git.create("stack");
    publish_release(&web, &git, "v1.0.0");
    let (manifests, chart) = publish_release(&web, &git, "v1.1.0");
    publish_release(&web, &git, "v2.0.0");
    let server =
        Server::start_temp(&["--insecure-source-host", &web.host_port(), "--insecure-source-host", &git.host_port()]);
    let releases = json!({"repository": git.url("stack"), "semver": ">=1.0 <2"});
    let asset = |name: &str| web.url(&format!("releases/download/{{tag}}/{name}-{{version}}"));
    let spec = json!({"sources": [
        {"http": {"url": asset("manifests") + ".tar.gz", "releases": releases}},
        {"http": {"url": asset("stack") + ".tgz", "releases": releases}, "destination": "charts"},
    ], "pollInterval": "1s"});
    create(&server, "stack", spec).await;
    let b = wait_serving(&server, "stack", "http", "v1.1.0").await;
    let pinned = &b["status"]["resolvedSources"];
    assert_eq!(pinned[0]["http"]["url"], web.url("releases/download/v1.1.0/manifests-1.1.0.tar.gz"), "{b:#}");
    assert_eq!(pinned[1]["http"]["tag"], "v1.1.0");
    let mut expected = manifests;
    expected.extend(chart.into_iter().map(|(path, node)| (format!("charts/{path}"), node)));
    assert_eq!(served(&server, "stack").await, expected);

    let (manifests, chart) = publish_release(&web, &git, "v1.2.0");
    let b = wait_serving(&server, "stack", "http", "v1.2.0").await;
    assert_eq!(b["status"]["resolvedSources"][1]["http"]["url"], web.url("releases/download/v1.2.0/stack-1.2.0.tgz"));
    let mut expected = manifests;
    expected.extend(chart.into_iter().map(|(path, node)| (format!("charts/{path}"), node)));
    assert_eq!(served(&server, "stack").await, expected);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_missing_source_waits_for_its_spec_or_its_poll_interval_even_across_a_restart() {
    let web = HttpServer::start(HttpAuth::None);
    let mut server = Server::start_temp(&["--insecure-source-host", &web.host_port()]);
    create(&server, "gone", json!({"sources": [{"http": {"url": web.url("gone.tar.gz")}}]})).await;
    let b = wait_reason(&server, "gone", "SourceNotFound").await;
    let message = unpacked_condition(&b)["message"].as_str().unwrap_or_default().to_owned();
    assert!(message.contains("404") && !message.contains("retrying"), "{message}");
    assert!(b["status"].get("nextPollTime").is_none(), "nothing scheduled: {:#}", b["status"]);
    // A transient failure's first retry would come within 5 s of it (2.5–5 s; a second one only
    // after a first).
    let bound = crate::unpack::FIRST_RETRY_MAX + Duration::from_millis(500);
    holds_for(bound, Duration::from_millis(100), "a 404 is not retried while the spec stays", || async {
        match web.requests_for("gone.tar.gz") {
            1 => Ok(()),
            n => Err(format!("{n} requests for gone.tar.gz")),
        }
    })
    .await;

    // A spec change is a new attempt; with a poll interval, it is tried again every interval
    // (2 s, each spread by ±5 %): that attempt and three polls take 5.7–6.3 s. Backoff would
    // space them 2.5–5 s, 5–10 s, 10–20 s apart; a loop that does not wait, not at all.
    let patched = Instant::now();
    server.merge_patch_ok(&bundle(NS, "gone"), &json!({"spec": {"pollInterval": "2s"}})).await;
    eventually_every(Duration::from_secs(9), Duration::from_millis(50), "the attempt and 3 polls", || async {
        match web.requests_for("gone.tar.gz") {
            n if n >= 5 => Ok(()),
            n => Err(format!("{n} requests for gone.tar.gz")),
        }
    })
    .await;
    let took = patched.elapsed();
    assert!(took >= Duration::from_millis(5400), "the attempt and 3 polls came within {took:?}: not every 2 s");
    assert_eq!(web.requests_for("gone.tar.gz"), 5, "one request per poll");

    // A long interval survives a restart: no attempt until it passes.
    server.merge_patch_ok(&bundle(NS, "gone"), &json!({"spec": {"pollInterval": "1h"}})).await;
    let b = wait_for(&server, "gone", "failed for generation 3", |b| {
        let c = unpacked_condition(b);
        c["reason"] == "SourceNotFound" && c["observedGeneration"] == 3 && b["status"]["nextPollTime"].is_string()
    })
    .await;
    let next = str_at(&b, "/status/nextPollTime").to_owned();
    let before = web.requests_for("gone.tar.gz");
    server.restart();
    // The loop lists every Bundle when it starts and plans each at once; a Bundle created after
    // the restart that gets unpacked shows the loop has run since. Had the restart forgotten the
    // schedule, "gone" would have been fetched at once too: a moment more covers one in flight.
    web.put("canary.tar.gz", &gzip(&build_tar(&chart("0.0.1"))));
    create(&server, "canary", json!({"sources": [{"http": {"url": web.url("canary.tar.gz")}}]})).await;
    wait_for(&server, "canary", "unpacked after the restart", |b| b["status"]["phase"] == "Unpacked").await;
    let every = Duration::from_millis(100);
    holds_for(
        Duration::from_secs(1),
        every,
        &format!("the poll scheduled for {next} is kept across a restart"),
        || async {
            match web.requests_for("gone.tar.gz") {
                n if n == before => Ok(()),
                n => Err(format!("{before} → {n} requests for gone.tar.gz")),
            }
        },
    )
    .await;
    let after = server.get_json(&bundle(NS, "gone")).await;
    assert_eq!(after["status"]["nextPollTime"], next.as_str());
}

/// A registry that is down behind its address (a crashed backend: every connection is accepted
/// and closed at once), recording when each connection came.
async fn down_registry() -> (String, Arc<Mutex<Vec<Instant>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let host = listener.local_addr().unwrap().to_string();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            record.lock().unwrap().push(Instant::now());
            drop(stream);
        }
    });
    (host, seen)
}

#[tokio::test(flavor = "multi_thread")]
async fn bundles_failing_together_retry_spread_out() {
    let (host, seen) = down_registry().await;
    let server = Server::start_temp(&["--insecure-registry", &host]);
    let creates = (0..100).map(|i| {
        let spec = json!({"sources": [{"image": {"ref": format!("{host}/app:v{i}")}}]});
        let server = &server;
        async move { create(server, &format!("b{i:03}"), spec).await }
    });
    futures_util::future::join_all(creates).await;
    let started = Instant::now();
    // The first attempts, then every first retry (2.5–5 s after its failure) and no second one
    // (5–10 s after the first retry).
    tokio::time::sleep(Duration::from_secs(7)).await;
    let times = seen.lock().unwrap().clone();
    let first = *times.first().expect("the registry was tried");
    let wave: Vec<f64> = times.iter().map(|t| t.duration_since(first).as_secs_f64()).collect();
    let first_wave = wave.iter().filter(|s| **s < 2.4).count();
    let mut retries: Vec<f64> = wave.iter().copied().filter(|s| *s >= 2.4).collect();
    retries.sort_by(f64::total_cmp);
    assert!(first_wave >= 100, "every Bundle tried once at first: {first_wave} (created in {:?})", started.elapsed());
    assert!(retries.len() >= 80, "most first retries came within 7 s: {}", retries.len());
    let at = |q: f64| retries.get(((retries.len() - 1) as f64 * q) as usize).copied().unwrap_or_default();
    let (p10, p90) = (at(0.1), at(0.9));
    let mut busiest = 0;
    for start in &retries {
        busiest = busiest.max(retries.iter().filter(|s| **s >= *start && **s < start + 0.25).count());
    }
    report(&format!(
        "100 Bundles, registry down: first wave {first_wave} connections; {} first retries from {:.2} s to {:.2} s \
         (p10 {p10:.2} s, p90 {p90:.2} s), at most {busiest} in any 250 ms",
        retries.len(),
        retries.first().copied().unwrap_or_default(),
        retries.last().copied().unwrap_or_default(),
    ));
    assert!(p90 - p10 >= 1.2, "retries spread over time, not in lockstep: p10 {p10:.2} s, p90 {p90:.2} s");
    assert!(busiest <= 30, "no burst: {busiest} retries within 250 ms");
    let b = server.get_json(&bundle(NS, "b000")).await;
    assert_eq!(unpacked_condition(&b)["reason"], "PullFailed", "{b:#}");
    assert!(b["status"]["nextPollTime"].is_string(), "the retry is scheduled in the status: {b:#}");
}
