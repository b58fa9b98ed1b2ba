//! Kubernetes Events about stowage's objects: standalone, an image source that fails while its
//! registry is down and then succeeds shows `Warning PullFailed` once, with a count, then
//! `Normal Unpacked`, through the real `kubectl describe`; the Events are served as core `v1`
//! (list, field selectors, watch) and `events.k8s.io/v1`, survive a restart and are bounded by
//! count and age; in delegated mode the same Events reach the cluster's API server (the stub) in
//! the `events.k8s.io/v1` wire format.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{json, Value};

use crate::harness::*;
use crate::kubectl::Kubectl;
use crate::registry::{Layer, Registry};
use crate::stub_apiserver::StubApiServer;
use crate::tarutil::{build_tar, file};

const NS: &str = "events";
const WAIT: Duration = Duration::from_secs(90);

fn core_events(ns: &str) -> String {
    format!("/api/v1/namespaces/{ns}/events")
}

/// The core Events about Bundle `name` (as `kubectl describe` asks for them).
async fn events_of(server: &Server, name: &str) -> Vec<Value> {
    let b = server.get_json(&bundle(NS, name)).await;
    let selector = format!(
        "involvedObject.kind=Bundle,involvedObject.name={name},involvedObject.namespace={NS},involvedObject.uid={}",
        str_at(&b, "/metadata/uid")
    );
    let list = server.get_json(&format!("{}?fieldSelector={selector}&limit=500", core_events(NS))).await;
    assert_eq!((list["kind"].as_str(), list["apiVersion"].as_str()), (Some("EventList"), Some("v1")), "{list:#}");
    list["items"].as_array().cloned().unwrap_or_default()
}

fn with_reason<'a>(events: &'a [Value], reason: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["reason"] == reason).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failing_then_succeeding_source_is_one_warning_with_a_count_then_unpacked() {
    let mut registry = Registry::start().await;
    let tree = BTreeMap::from([(
        "manifests/cm.yaml".to_string(),
        file("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n"),
    )]);
    registry.push_image("team/app", "v1", &[Layer::gzip_tree(&tree)], "linux/amd64").await;
    registry.stop();
    let mut server = Server::start_temp(&["--insecure-registry", &registry.host()]);
    let source = json!({"image": {"ref": registry.reference("team/app", "v1")}});
    server.create_bundle_with(NS, "app", json!({"sources": [source]})).await;

    // Refused connections: retried, and the retries are one Event whose count grows.
    let failed = eventually(WAIT, "two failed pulls in one Event", || async {
        let events = events_of(&server, "app").await;
        let failed = with_reason(&events, "PullFailed");
        match failed.as_slice() {
            [one] if one["count"].as_u64() >= Some(2) => Ok((*one).clone()),
            _ => Err(format!("{events:#?}")),
        }
    })
    .await;
    assert_eq!(failed["type"], "Warning");
    assert_eq!(failed["involvedObject"]["apiVersion"], "content.stowage.dev/v1alpha1");
    assert_eq!(
        (failed["source"]["component"].as_str(), failed["reportingComponent"].as_str()),
        (Some("stowage"), Some("stowage"))
    );
    assert!(failed["message"].as_str().unwrap_or("").contains("retrying in"), "{failed:#}");

    registry.restart().await;
    eventually(WAIT, "unpacked once the registry is back", || async {
        let events = events_of(&server, "app").await;
        match with_reason(&events, "Unpacked").len() {
            1 => Ok(()),
            _ => Err(format!("{events:#?}")),
        }
    })
    .await;
    let described = Kubectl::new(&server).ok(&["-n", NS, "describe", "bundle", "app"]);
    let events_part = described.split("Events:").nth(1).unwrap_or("");
    let warning = events_part.lines().find(|l| l.contains("PullFailed")).unwrap_or("");
    assert!(warning.trim_start().starts_with("Warning") && warning.contains("(x"), "{described}");
    assert_eq!(events_part.matches("PullFailed").count(), 1, "one line for all the retries: {described}");
    let unpacked = events_part.lines().find(|l| l.contains("Unpacked")).unwrap_or("");
    assert!(unpacked.trim_start().starts_with("Normal") && unpacked.contains("stowage"), "{described}");

    // The events.k8s.io view of the same Events, by `regarding`.
    let list = server
        .get_json("/apis/events.k8s.io/v1/namespaces/events/events?fieldSelector=regarding.name=app,reason=PullFailed")
        .await;
    let items = list["items"].as_array().cloned().unwrap_or_default();
    assert_eq!(items.len(), 1, "{list:#}");
    assert_eq!(
        (items[0]["apiVersion"].as_str(), items[0]["reportingController"].as_str()),
        (Some("events.k8s.io/v1"), Some("stowage"))
    );
    assert!(items[0]["series"]["count"].as_u64() >= Some(2), "{:#}", items[0]);
    assert_eq!(items[0]["regarding"]["kind"], "Bundle");
    assert!(!items[0]["eventTime"].as_str().unwrap_or("").is_empty());

    // Watched in the core shape; kept across a restart.
    let watched = server.get(&format!("{}?watch=true&timeoutSeconds=1", core_events(NS))).await.text().await.unwrap();
    let first: Value = serde_json::from_str(watched.lines().next().unwrap_or("null")).unwrap();
    assert_eq!(
        (first["type"].as_str(), first["object"]["apiVersion"].as_str()),
        (Some("ADDED"), Some("v1")),
        "{watched}"
    );
    assert!(first["object"]["involvedObject"]["name"].is_string(), "{watched}");
    let before = events_of(&server, "app").await.len();
    server.restart();
    assert!(events_of(&server, "app").await.len() >= before, "the Events survive a restart");
    let table = Kubectl::new(&server).ok(&["-n", NS, "get", "events"]);
    let header: Vec<&str> = table.lines().next().unwrap_or("").split_whitespace().collect();
    assert_eq!(header, ["LAST", "SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"], "{table}");
    assert!(table.contains("bundle/app"), "{table}");
    let refused = server.post_json(&core_events(NS), &json!({"apiVersion": "v1", "kind": "Event"})).await;
    assert_eq!(refused.status(), 405, "Events are the server's to write");
}

#[tokio::test(flavor = "multi_thread")]
async fn stored_events_are_bounded_by_count_and_age() {
    let server = Server::start_temp(&["--max-events", "3", "--event-ttl", "8s"]);
    let chart = BTreeMap::from([("Chart.yaml".to_string(), file("apiVersion: v2\nname: a\nversion: 1.0.0\n"))]);
    for name in ["one", "two", "three"] {
        server.create_bundle(NS, name).await;
        server.upload_ok(NS, name, build_tar(&chart), None).await;
    }
    // Two Events per upload (Uploaded, Serving): six written, the newest three kept.
    let kept = eventually(WAIT, "at most 3 Events", || async {
        let list = server.get_json(&core_events(NS)).await;
        let items = list["items"].as_array().cloned().unwrap_or_default();
        let newest = items.iter().any(|e| e["involvedObject"]["name"] == "three" && e["reason"] == "Uploaded");
        match (items.len(), newest) {
            (3, true) => Ok(items),
            (n, _) => Err(format!("{n} events: {items:#?}")),
        }
    })
    .await;
    assert!(kept.iter().any(|e| e["involvedObject"]["name"] == "three"), "the newest stay: {kept:#?}");
    assert!(kept.iter().all(|e| e["involvedObject"]["name"] != "one"), "the oldest go: {kept:#?}");
    // Past their TTL they go too.
    eventually(WAIT, "no Events past the TTL", || async {
        let list = server.get_json(&core_events(NS)).await;
        match list["items"].as_array().map_or(0, Vec::len) {
            0 => Ok(()),
            n => Err(format!("{n} events")),
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn in_a_cluster_events_go_to_its_api_server() {
    let stub = StubApiServer::start();
    stub.publish_pki(&["front-proxy-client"]);
    let kubeconfig = stub.kubeconfig().to_str().unwrap().to_owned();
    let server = Server::start_temp(&["--kubeconfig", &kubeconfig]);
    let key = stub.client_ca().client_cert("alice", &["devs"]);
    let alice = crate::delegated_server::client(&server, Some(crate::delegated_server::identity(&key)));
    stub.allow("alice", "*", "*", NS);
    let created = alice.post(server.url(&bundles(NS))).json(&upload_bundle(NS, "app")).send().await.unwrap();
    assert_eq!(created.status(), 201);
    let chart = BTreeMap::from([("Chart.yaml".to_string(), file("apiVersion: v2\nname: a\nversion: 1.0.0\n"))]);
    let put = |body: Vec<u8>| {
        alice.put(server.url(&bundle_content(NS, "app"))).header("Content-Type", "application/x-tar").body(body).send()
    };
    assert_eq!(put(build_tar(&chart)).await.unwrap().status(), 200);
    assert!(!put(build_tar(&BTreeMap::new())).await.unwrap().status().is_success(), "an archive without files");

    let events = eventually(WAIT, "the cluster received the Events", || async {
        let events = stub.events();
        let reasons: Vec<&str> = events.iter().filter_map(|e| e["reason"].as_str()).collect();
        match ["Uploaded", "Serving", "UploadRefused"].iter().all(|r| reasons.contains(r)) {
            true => Ok(events),
            false => Err(format!("{reasons:?}")),
        }
    })
    .await;
    // Refused again: the cluster's Event gets a series (a merge PATCH of `series` alone, which
    // kube-apiserver accepts: the rest of an Event is immutable).
    assert!(!put(build_tar(&BTreeMap::new())).await.unwrap().status().is_success());
    let series = eventually(WAIT, "a series of two refusals", || async {
        let refusals: Vec<Value> = stub.events().into_iter().filter(|e| e["reason"] == "UploadRefused").collect();
        match refusals.as_slice() {
            [one] if one["series"]["count"] == 2 => Ok(one.clone()),
            _ => Err(format!("{refusals:#?}")),
        }
    })
    .await;
    assert!(!series["series"]["lastObservedTime"].as_str().unwrap_or("").is_empty(), "{series:#}");
    for event in &events {
        assert_eq!((event["apiVersion"].as_str(), event["kind"].as_str()), (Some("events.k8s.io/v1"), Some("Event")));
        assert_eq!(event["reportingController"], "stowage");
        assert_eq!(
            (event["regarding"]["kind"].as_str(), event["regarding"]["name"].as_str()),
            (Some("Bundle"), Some("app"))
        );
        assert_eq!(event["metadata"]["namespace"], NS);
    }
    let refused = events.iter().find(|e| e["reason"] == "UploadRefused").unwrap();
    assert_eq!(refused["type"], "Warning");
    assert!(refused["note"].as_str().unwrap_or("").contains("no files"), "{refused:#}");
    let local = alice.get(server.url(&core_events(NS))).send().await.unwrap();
    assert_eq!(local.status(), 404, "in a cluster the cluster serves Events");
}
