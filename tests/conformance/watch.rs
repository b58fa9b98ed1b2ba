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
pub(crate) async fn read_events(resp: reqwest::Response, count: usize) -> Vec<Value> {
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
    // The upload comes once kubectl waits on a watch (in the long-running requests' gauge).
    eventually(Duration::from_secs(30), "kubectl wait watching", || async {
        let m = server.metrics().await;
        let watching: f64 = m
            .iter()
            .filter(|(k, _)| k.starts_with("apiserver_longrunning_requests{") && k.contains(r#"verb="WATCH""#))
            .map(|(_, v)| v)
            .sum();
        match watching >= 1.0 {
            true => Ok(()),
            false => Err(format!("{watching} open watches")),
        }
    })
    .await;
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

/// Watches of one namespace with different selectors and representations, open at once, share the
/// server's decoded changes: each still sees exactly its own view (full objects, a selector's
/// transitions, metadata only).
#[tokio::test(flavor = "multi_thread")]
async fn concurrent_watches_with_different_views_each_see_their_own() {
    let server = Server::start_temp(&[]);
    server.create_bundle("views", "first").await;
    let list = server.get_json(&bundles("views")).await;
    let rv = str_at(&list, "/metadata/resourceVersion").to_owned();
    let open = |query: String, accept: &'static str| {
        let request =
            server.client().get(server.url(&format!("{}?watch=true&resourceVersion={rv}{query}", bundles("views"))));
        async move { request.header("accept", accept).send().await.unwrap() }
    };
    let metadata = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1";
    let full = open(String::new(), "application/json").await;
    let selected = open("&labelSelector=app%3Dweb".into(), "application/json").await;
    let meta = open(String::new(), metadata).await;

    async fn set_labels(server: &Server, name: &str, labels: Value) {
        let mut obj = server.get_json(&bundle("views", name)).await;
        obj["metadata"]["labels"] = labels;
        assert_eq!(server.put_json(&bundle("views", name), &obj).await.status(), 200);
    }
    let mut web = upload_bundle("views", "web");
    web["metadata"]["labels"] = serde_json::json!({"app": "web"});
    assert_eq!(server.post_json(&bundles("views"), &web).await.status(), 201);
    set_labels(&server, "first", serde_json::json!({"app": "web"})).await; // into the selection
    set_labels(&server, "web", serde_json::json!({"app": "db"})).await; // out of it
    assert!(server.delete(&bundle("views", "first")).await.status().is_success());

    let all = [("ADDED", "web"), ("MODIFIED", "first"), ("MODIFIED", "web"), ("DELETED", "first")];
    let all: Vec<(String, String)> = all.iter().map(|(k, n)| (k.to_string(), n.to_string())).collect();
    let events = read_events(full, 4).await;
    assert_eq!(kinds_and_names(&events), all);
    assert!(events.iter().all(|e| str_at(e, "/object/kind") == "Bundle" && e["object"].get("spec").is_some()));

    let events = read_events(meta, 4).await;
    assert_eq!(kinds_and_names(&events), all);
    assert!(events.iter().all(|e| str_at(e, "/object/kind") == "PartialObjectMetadata"), "{events:#?}");
    assert!(events.iter().all(|e| e["object"].get("spec").is_none()));

    let events = read_events(selected, 4).await;
    let expected = [("ADDED", "web"), ("ADDED", "first"), ("DELETED", "web"), ("DELETED", "first")];
    let expected: Vec<(String, String)> = expected.iter().map(|(k, n)| (k.to_string(), n.to_string())).collect();
    assert_eq!(kinds_and_names(&events), expected);
    // Left the selection: its last selected state.
    assert_eq!(str_at(&events[2], "/object/metadata/labels/app"), "web");
}

/// A watch from a version older than any other watch has seen (but still in the change log) gets
/// every change after it, then follows live like the others.
#[tokio::test(flavor = "multi_thread")]
async fn a_watch_from_before_the_others_replays_the_log_then_follows() {
    let server = Server::start_temp(&[]);
    server.create_bundle("replay", "a").await;
    let old_rv = str_at(&server.get_json(&bundles("replay")).await, "/metadata/resourceVersion").to_owned();
    server.create_bundle("replay", "b").await;
    server.create_bundle("replay", "c").await;
    // A first watch, from now.
    let url = |rv: &str| server.url(&format!("{}?watch=true&resourceVersion={rv}", bundles("replay")));
    let current = str_at(&server.get_json(&bundles("replay")).await, "/metadata/resourceVersion").to_owned();
    let recent = server.client().get(url(&current)).send().await.unwrap();
    server.create_bundle("replay", "d").await;
    // Then one from before b and c.
    let old = server.client().get(url(&old_rv)).send().await.unwrap();
    server.create_bundle("replay", "e").await;
    let names = |events: &[Value]| kinds_and_names(events).into_iter().map(|(_, n)| n).collect::<Vec<_>>();
    assert_eq!(names(&read_events(recent, 2).await), ["d", "e"]);
    assert_eq!(names(&read_events(old, 4).await), ["b", "c", "d", "e"]);
}

/// A watcher that stops reading while the change log moves past its position cannot be served
/// consistently any more: once it reads again it gets what was buffered for it, in order and
/// without gaps, then a 410 Expired ERROR event (and the client lists again), as kube-apiserver
/// ends a watch that fell too far behind.
#[tokio::test(flavor = "multi_thread")]
async fn a_watcher_the_change_log_left_behind_ends_with_410() {
    let server = Server::start_temp(&["--change-log-length", "4"]);
    let url = server.url(&format!("{}?watch=true&resourceVersion=0", bundles("behind")));
    let stalled = server.second_client().get(&url).send().await.unwrap();
    assert_eq!(stalled.status(), 200);
    const WRITES: usize = 300;
    for i in 0..WRITES {
        // 200 KiB objects: more than the server's watch cache and every buffer in between hold.
        let mut obj = upload_bundle("behind", &format!("b{i:03}"));
        obj["metadata"]["annotations"] = serde_json::json!({"filler": "x".repeat(200 << 10)});
        assert_eq!(server.post_json(&bundles("behind"), &obj).await.status(), 201);
    }
    let events = read_events(stalled, WRITES + 1).await;
    let last = events.last().expect("no events");
    assert_eq!(str_at(last, "/type"), "ERROR", "the watch did not end with an error");
    assert_eq!(last["object"]["code"], 410);
    assert_eq!(str_at(last, "/object/reason"), "Expired");
    let names: Vec<String> =
        events[..events.len() - 1].iter().map(|e| str_at(e, "/object/metadata/name").to_owned()).collect();
    let expected: Vec<String> = (0..names.len()).map(|i| format!("b{i:03}")).collect();
    assert_eq!(names, expected, "events before the error are in order, without gaps");
    assert!(names.len() < WRITES);
    report(&format!("a stalled watcher got {} of {WRITES} events, then 410", names.len()));
}
