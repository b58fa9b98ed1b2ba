//! Watches, as informers and `kubectl get -w` / `kubectl wait` use them: a watch from a list's
//! resourceVersion sees every later change of the objects it selects, in order, as ADDED, MODIFIED
//! and DELETED events; `resourceVersion=0` starts with the current objects; `timeoutSeconds` ends it.

use std::process::Command;
use std::time::Duration;

use futures_util::StreamExt;
use serde_json::Value;

use crate::harness::*;
use crate::tarutil::*;

/// Reads newline-delimited watch events until `count` arrived (or the stream ends / 20 s pass).
async fn read_events(resp: reqwest::Response, count: usize) -> Vec<Value> {
    let mut stream = resp.bytes_stream();
    let mut buffer = Vec::new();
    let mut events = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while events.len() < count {
        let next = tokio::time::timeout_at(deadline, stream.next()).await;
        let Ok(Some(Ok(bytes))) = next else { break };
        buffer.extend_from_slice(&bytes);
        while let Some(end) = buffer.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buffer.drain(..=end).collect();
            events.push(parse_json(&line, "watch event"));
        }
    }
    events
}

fn kinds_and_names(events: &[Value]) -> Vec<(String, String)> {
    events.iter().map(|e| (str_at(e, "/type").to_owned(), str_at(e, "/object/metadata/name").to_owned())).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn watch_from_a_list_sees_every_later_change_in_order() {
    let server = Server::start_temp(&[]);
    server.create_bundle("w", "before").await;
    let list = server.get_json(&bundles("w")).await;
    let rv = str_at(&list, "/metadata/resourceVersion").to_owned();

    let url = server.url(&format!("{}?watch=true&resourceVersion={rv}&labelSelector=app%3Dweb", bundles("w")));
    let watch = server.client().get(url).send().await.unwrap();
    assert_eq!(watch.status(), 200);

    let mut labelled = upload_bundle("w", "web");
    labelled["metadata"]["labels"] = serde_json::json!({"app": "web"});
    assert_eq!(server.post_json(&bundles("w"), &labelled).await.status(), 201);
    server.create_bundle("w", "unlabelled").await; // not selected
    let mut tree = Tree::new();
    tree.insert("manifests/a.yaml".into(), file(b"kind: ConfigMap\n".to_vec()));
    let uploaded = server.upload_ok("w", "web", build_tar(&tree), None).await;
    assert!(server.delete(&bundle("w", "web")).await.status().is_success());

    let events = read_events(watch, 3).await;
    assert_eq!(
        kinds_and_names(&events),
        vec![("ADDED".into(), "web".into()), ("MODIFIED".into(), "web".into()), ("DELETED".into(), "web".into())]
    );
    assert_eq!(str_at(&events[1], "/object/status/digest"), str_at(&uploaded, "/status/digest"));
    let rvs: Vec<u64> = events.iter().map(|e| str_at(e, "/object/metadata/resourceVersion").parse().unwrap()).collect();
    assert!(rvs.windows(2).all(|w| w[0] < w[1]), "resourceVersions not increasing: {rvs:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn watch_from_zero_starts_with_current_objects_and_times_out() {
    let server = Server::start_temp(&[]);
    server.create_bundle("z", "one").await;
    server.create_bundle("z", "two").await;
    let url = server.url(&format!("{}?watch=true&resourceVersion=0&timeoutSeconds=2", bundles("z")));
    let started = std::time::Instant::now();
    let watch = server.client().get(url).send().await.unwrap();
    let events = read_events(watch, 10).await;
    assert_eq!(kinds_and_names(&events), vec![("ADDED".into(), "one".into()), ("ADDED".into(), "two".into())]);
    let elapsed = started.elapsed();
    assert!(elapsed >= Duration::from_secs(2) && elapsed < Duration::from_secs(15), "watch ended after {elapsed:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_wait_returns_when_the_upload_lands() {
    let server = Server::start_temp(&[]);
    server.create_bundle("kw", "app").await;
    let kubeconfig = server.kubeconfig();
    let wait = std::thread::spawn(move || {
        Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(["-n", "kw", "wait", "--for=condition=Unpacked", "bundle/app", "--timeout=60s"])
            .output()
            .expect("run kubectl wait")
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut tree = Tree::new();
    tree.insert("Chart.yaml".into(), file(b"name: app\n".to_vec()));
    server.upload_ok("kw", "app", build_tar(&tree), None).await;
    let out = tokio::task::spawn_blocking(move || wait.join().unwrap()).await.unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "kubectl wait failed: {stdout} {}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("condition met"), "{stdout}");
}

/// WatchList (streaming lists), as informers with the WatchListClient feature use it: the current
/// objects as ADDED events, then a BOOKMARK annotated `k8s.io/initial-events-end`, then live changes.
#[tokio::test(flavor = "multi_thread")]
async fn watchlist_ends_initial_events_with_a_bookmark() {
    let server = Server::start_temp(&[]);
    server.create_bundle("wl", "existing").await;
    let query = "watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true";
    let watch = server.client().get(server.url(&format!("{}?{query}", bundles("wl")))).send().await.unwrap();
    assert_eq!(watch.status(), 200);
    server.create_bundle("wl", "later").await;
    let events = read_events(watch, 3).await;
    assert_eq!(str_at(&events[0], "/type"), "ADDED");
    assert_eq!(str_at(&events[0], "/object/metadata/name"), "existing");
    assert_eq!(str_at(&events[1], "/type"), "BOOKMARK");
    assert_eq!(str_at(&events[1], "/object/metadata/annotations/k8s.io~1initial-events-end"), "true");
    assert_eq!(kinds_and_names(&events[2..]), vec![("ADDED".into(), "later".into())]);

    let bad = server
        .client()
        .get(server.url(&format!("{}?watch=true&sendInitialEvents=true", bundles("wl"))))
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 422);
}

/// A label change that moves an object into a watch's selector is ADDED, one that moves it out is
/// DELETED (as kube-apiserver's watch cache reports them), so an informer's cache stays exact.
#[tokio::test(flavor = "multi_thread")]
async fn selector_transitions_are_added_and_deleted() {
    let server = Server::start_temp(&[]);
    server.create_bundle("sel", "app").await;
    let url = server.url(&format!("{}?watch=true&labelSelector=tier%3Dfront", bundles("sel")));
    let watch = server.client().get(url).send().await.unwrap();
    async fn relabel(server: &Server, tier: &str, note: &str) {
        let mut obj = server.get_json(&bundle("sel", "app")).await;
        obj["metadata"]["labels"] = serde_json::json!({"tier": tier, "note": note});
        assert_eq!(server.put_json(&bundle("sel", "app"), &obj).await.status(), 200);
    }
    relabel(&server, "front", "1").await; // into the selection
    relabel(&server, "front", "2").await; // stays
    relabel(&server, "back", "2").await; // out of it
    let events = read_events(watch, 3).await;
    assert_eq!(
        kinds_and_names(&events),
        vec![("ADDED".into(), "app".into()), ("MODIFIED".into(), "app".into()), ("DELETED".into(), "app".into())]
    );
    // The DELETED event carries the last selected state, at the version of the change.
    assert_eq!(str_at(&events[2], "/object/metadata/labels/tier"), "front");
    let current = server.get_json(&bundle("sel", "app")).await;
    assert_eq!(str_at(&events[2], "/object/metadata/resourceVersion"), str_at(&current, "/metadata/resourceVersion"));
}

/// A watcher that never reads must not hold up writers or other watchers: they see every event,
/// in order, while the stalled one's buffers are full.
#[tokio::test(flavor = "multi_thread")]
async fn a_stalled_watcher_blocks_neither_writers_nor_other_watchers() {
    let server = Server::start_temp(&[]);
    let url = server.url(&format!("{}?watch=true&resourceVersion=0", bundles("slow")));
    let stalled = server.second_client().get(&url).send().await.unwrap();
    assert_eq!(stalled.status(), 200);
    let follower = server.client().get(&url).send().await.unwrap();
    const WRITES: usize = 300;
    let started = std::time::Instant::now();
    for i in 0..WRITES {
        // 16 KiB objects: 300 of them overflow every buffer between the server and the stalled client.
        let mut obj = upload_bundle("slow", &format!("b{i:03}"));
        obj["metadata"]["annotations"] = serde_json::json!({"filler": "x".repeat(16 << 10)});
        assert_eq!(server.post_json(&bundles("slow"), &obj).await.status(), 201);
    }
    let writing = started.elapsed();
    let events = read_events(follower, WRITES).await;
    assert_eq!(events.len(), WRITES, "the reading watcher missed events");
    let names: Vec<String> = events.iter().map(|e| str_at(e, "/object/metadata/name").to_owned()).collect();
    let expected: Vec<String> = (0..WRITES).map(|i| format!("b{i:03}")).collect();
    assert_eq!(names, expected);
    report(&format!("{WRITES} creates with a stalled watcher took {writing:?}"));
    drop(stalled);
}
