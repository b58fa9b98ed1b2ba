//! A watch resumes on another replica: a client watching Bundles on replica 0 has handled events
//! up to some resourceVersion when replica 0 dies (kill -9); it resumes from that version on
//! replica 1 and gets every change made since — those made before the kill it had not read yet and
//! those made while it was away — in order, with no 410 and nothing missing.

use std::collections::BTreeMap;
use std::time::Duration;

use futures_util::StreamExt;
use reqwest::StatusCode;
use serde_json::{json, Value};

use super::api::At;
use super::cluster::Cluster;
use crate::harness::*;
use crate::tarutil::*;

const NS: &str = "resume";

/// A write the server acknowledged: the event a watcher must see for it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Acked {
    kind: &'static str,
    name: String,
    rv: Option<u64>,
}

fn rv_of(object: &Value) -> u64 {
    str_at(object, "/metadata/resourceVersion").parse().expect("resourceVersion is a number")
}

/// An open watch, read an event at a time.
struct Watch {
    stream: std::pin::Pin<Box<dyn futures_util::Stream<Item = reqwest::Result<bytes::Bytes>> + Send>>,
    buffer: Vec<u8>,
}

impl Watch {
    async fn open(at: &At<'_>, from: u64) -> Watch {
        let url = at.url(&format!("{}?watch=true&resourceVersion={from}&allowWatchBookmarks=true", bundles(NS)));
        let resp = at.client.get(url).send().await.expect("open the watch");
        let status = resp.status();
        assert_eq!(
            status,
            StatusCode::OK,
            "watch from {from} on {}: {}",
            at.base,
            resp.text().await.unwrap_or_default()
        );
        Watch { stream: Box::pin(resp.bytes_stream()), buffer: Vec::new() }
    }

    /// The next ADDED/MODIFIED/DELETED event (bookmarks skipped), within `limit`.
    async fn next(&mut self, limit: Duration) -> Option<Value> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            while let Some(end) = self.buffer.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buffer.drain(..=end).collect();
                let event = parse_json(&line, "watch event");
                assert_ne!(event["type"], "ERROR", "the watch ended with an error: {event:#}");
                if event["type"] != "BOOKMARK" {
                    return Some(event);
                }
            }
            match tokio::time::timeout_at(deadline, self.stream.next()).await {
                Ok(Some(Ok(bytes))) => self.buffer.extend_from_slice(&bytes),
                _ => return None,
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn watch_resumes_on_another_replica_after_kill9() {
    let mut cluster = Cluster::start("resume", 2, &[]).await;
    let client = cluster.client().clone();
    let (r0, r1) = (At::new(&client, cluster.replicas[0].url()), At::new(&client, cluster.replicas[1].url()));
    r1.create_bundle(NS, "before").await;
    let list = r0.get_json(&bundles(NS)).await;
    let from: u64 = str_at(&list, "/metadata/resourceVersion").parse().unwrap();
    let mut watch = Watch::open(&r0, from).await;

    // Writes through replica 1; the client on replica 0 handles the first half of their events.
    let mut acked = Vec::new();
    for i in 0..6 {
        let name = format!("a{i}");
        let created = r1.create_bundle(NS, &name).await;
        acked.push(Acked { kind: "ADDED", name: name.clone(), rv: Some(rv_of(&created)) });
        let patch = r1
            .client
            .patch(r1.url(&bundle(NS, &name)))
            .header("Content-Type", "application/merge-patch+json")
            .body(json!({"metadata": {"labels": {"step": "1"}}}).to_string());
        let patched = parse_json(&r1.expect(patch, StatusCode::OK, "label").await, "patched");
        acked.push(Acked { kind: "MODIFIED", name, rv: Some(rv_of(&patched)) });
    }
    let mut last = from;
    let mut handled = 0;
    let mut before_kill = Vec::new();
    while handled < acked.len() / 2 {
        let event = watch.next(Duration::from_secs(20)).await.expect("events on replica 0 before the kill");
        last = rv_of(&event["object"]);
        handled += acked.iter().filter(|a| a.rv == Some(last)).count();
        before_kill.push(event);
    }

    cluster.replicas[0].kill9();
    drop(watch);
    // While the client is away: creates, an upload, label changes, a delete.
    for i in 0..3 {
        let name = format!("gap{i}");
        let created = r1.create_bundle(NS, &name).await;
        acked.push(Acked { kind: "ADDED", name, rv: Some(rv_of(&created)) });
    }
    let tree = Tree::from([("a.yaml".to_string(), file(b"kind: ConfigMap\n".to_vec()))]);
    let uploaded = r1.upload(NS, "gap0", build_tar(&tree)).await;
    acked.push(Acked { kind: "MODIFIED", name: "gap0".into(), rv: Some(rv_of(&uploaded)) });
    r1.delete(&bundle(NS, "a0")).await;
    acked.push(Acked { kind: "DELETED", name: "a0".into(), rv: None });

    // Resumed on replica 1 from the last version handled: every later acknowledged write arrives.
    let mut resumed = Watch::open(&r1, last).await;
    let expected: Vec<Acked> = acked.iter().filter(|a| a.rv.is_none_or(|rv| rv > last)).cloned().collect();
    let mut seen: Vec<Value> = Vec::new();
    let mut matched = 0;
    while matched < expected.len() {
        let Some(event) = resumed.next(Duration::from_secs(30)).await else {
            panic!(
                "resumed watch from {last}: {} of {} acknowledged writes arrived; missing from {:?}; events {:#?}",
                matched,
                expected.len(),
                expected.get(matched),
                seen.iter()
                    .map(|e| (
                        e["type"].clone(),
                        e["object"]["metadata"]["name"].clone(),
                        e["object"]["metadata"]["resourceVersion"].clone()
                    ))
                    .collect::<Vec<_>>()
            )
        };
        let rv = rv_of(&event["object"]);
        assert!(rv > last, "an event at {rv}, not after the resume point {last}: {event:#}");
        if let Some(prev) = seen.last() {
            assert!(rv > rv_of(&prev["object"]), "events out of order: {rv} after {}", rv_of(&prev["object"]));
        }
        let want = &expected[matched];
        let name = str_at(&event, "/object/metadata/name");
        if event["type"] == want.kind && name == want.name && want.rv.is_none_or(|w| w == rv) {
            matched += 1;
        } else if let Some(a) = expected[matched..].iter().find(|a| a.rv == Some(rv)) {
            panic!("the event of {a:?} came before that of {want:?}: one is missing or out of order");
        }
        seen.push(event);
    }

    // The state the watch built matches a final list on the surviving replica.
    let mut state: BTreeMap<String, u64> =
        list["items"].as_array().unwrap().iter().map(|o| (str_at(o, "/metadata/name").to_owned(), rv_of(o))).collect();
    let final_list = r1.get_json(&bundles(NS)).await;
    let at = str_at(&final_list, "/metadata/resourceVersion").parse::<u64>().unwrap();
    let marker = r1.create_bundle(NS, "marker").await;
    loop {
        let event = resumed.next(Duration::from_secs(30)).await.expect("the marker's event");
        if rv_of(&event["object"]) >= rv_of(&marker) {
            break;
        }
        seen.push(event);
    }
    for event in before_kill.iter().chain(seen.iter().filter(|e| rv_of(&e["object"]) <= at)) {
        let name = str_at(event, "/object/metadata/name").to_owned();
        match event["type"].as_str() {
            Some("DELETED") => state.remove(&name),
            _ => state.insert(name, rv_of(&event["object"])),
        };
    }
    let listed: BTreeMap<String, u64> = final_list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| (str_at(o, "/metadata/name").to_owned(), rv_of(o)))
        .collect();
    assert_eq!(state, listed, "what the watch saw (from the first list) equals the final list");
}
