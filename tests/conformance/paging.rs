//! Chunked lists (`limit`/`continue`) and list `resourceVersion` semantics, as informers and
//! `kubectl get --chunk-size` use them: every page is consistent at the first page's
//! resourceVersion; a continuation the server can no longer serve consistently is 410 Expired
//! with a token to carry on inconsistently; an expired watch is 410 too.

use serde_json::{json, Value};

use crate::harness::*;
use crate::kubectl::Kubectl;

fn names(list: &Value) -> Vec<String> {
    list["items"].as_array().unwrap().iter().map(|o| str_at(o, "/metadata/name").to_owned()).collect()
}

async fn page(server: &Server, ns: &str, query: &str) -> Value {
    server.get_json(&format!("{}?{query}", bundles(ns))).await
}

#[tokio::test(flavor = "multi_thread")]
async fn pages_stay_at_the_first_pages_resource_version() {
    let server = Server::start_temp(&[]);
    for name in ["a", "b", "c", "d", "e", "f", "g"] {
        server.create_bundle("pg", name).await;
    }
    let first = page(&server, "pg", "limit=3").await;
    assert_eq!(names(&first), ["a", "b", "c"]);
    let token = str_at(&first, "/metadata/continue").to_owned();
    assert!(!token.is_empty(), "no continue token: {first:#}");
    let rv = str_at(&first, "/metadata/resourceVersion").to_owned();

    // Changes between pages must not show up in the rest of the list.
    assert!(server.delete(&bundle("pg", "e")).await.status().is_success());
    server.create_bundle("pg", "dd").await;
    let mut changed = server.get_json(&bundle("pg", "f")).await;
    changed["metadata"]["labels"] = json!({"changed": "yes"});
    assert_eq!(server.put_json(&bundle("pg", "f"), &changed).await.status(), 200);

    let second = page(&server, "pg", &format!("limit=3&continue={token}")).await;
    assert_eq!(names(&second), ["d", "e", "f"]);
    assert_eq!(str_at(&second, "/metadata/resourceVersion"), rv, "every page is at the first page's version");
    assert!(second["items"][2]["metadata"].get("labels").is_none(), "f as it was when the list started");
    let token = str_at(&second, "/metadata/continue").to_owned();
    let third = page(&server, "pg", &format!("limit=3&continue={token}")).await;
    assert_eq!(names(&third), ["g"]);
    assert!(third["metadata"].get("continue").is_none_or(|c| c == ""), "last page has no continue: {third:#}");

    // A fresh list sees the changes; a selector counts only matches toward the limit.
    assert_eq!(names(&page(&server, "pg", "").await), ["a", "b", "c", "d", "dd", "f", "g"]);
    assert_eq!(names(&page(&server, "pg", "limit=1&labelSelector=changed%3Dyes").await), ["f"]);

    // Exact: the list as it was at a version the log still covers.
    let exact = page(&server, "pg", &format!("resourceVersion={rv}&resourceVersionMatch=Exact")).await;
    assert_eq!(names(&exact), ["a", "b", "c", "d", "e", "f", "g"]);

    // Bad options are 400s that say what is wrong.
    let bad = server.get(&format!("{}?continue=not-a-token", bundles("pg"))).await;
    let status = expect_status(bad, 400, "BadRequest").await;
    assert!(str_at(&status, "/message").contains("continue key is not valid"), "{status:#}");
    let bad = server.get(&format!("{}?resourceVersionMatch=Exact", bundles("pg"))).await;
    expect_status(bad, 400, "BadRequest").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn expired_continuations_and_watches_are_410() {
    let server = Server::start_temp(&["--change-log-length", "4"]);
    for name in ["a", "b", "c"] {
        server.create_bundle("old", name).await;
    }
    let first = page(&server, "old", "limit=1").await;
    let token = str_at(&first, "/metadata/continue").to_owned();
    let rv = str_at(&first, "/metadata/resourceVersion").to_owned();
    for i in 0..12 {
        server.create_bundle("old", &format!("n{i}")).await;
    }
    let expired = server.get(&format!("{}?limit=1&continue={token}", bundles("old"))).await;
    let status = expect_status(expired, 410, "Expired").await;
    assert!(str_at(&status, "/message").contains("continue parameter is too old"), "{status:#}");
    // The Status carries a token that continues (inconsistently) where the list stopped.
    let carry_on = str_at(&status, "/metadata/continue").to_owned();
    assert!(!carry_on.is_empty(), "{status:#}");
    let rest = page(&server, "old", &format!("continue={carry_on}")).await;
    assert_eq!(names(&rest).first().map(String::as_str), Some("b"));

    let watch = server.get(&format!("{}?watch=true&resourceVersion={rv}", bundles("old"))).await;
    expect_status(watch, 410, "Expired").await;
    let exact = server.get(&format!("{}?resourceVersion={rv}&resourceVersionMatch=Exact", bundles("old"))).await;
    expect_status(exact, 410, "Expired").await;
    // A version the server has not reached: kube-apiserver's 504 after a short wait.
    let future = server.get(&format!("{}?resourceVersion=999999", bundles("old"))).await;
    let status = expect_status(future, 504, "Timeout").await;
    assert_eq!(str_at(&status, "/details/causes/0/reason"), "ResourceVersionTooLarge");
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_chunk_size_pages_through_everything() {
    let server = Server::start_temp(&[]);
    for i in 0..9 {
        server.create_bundle("chunks", &format!("b{i}")).await;
    }
    let kubectl = Kubectl::new(&server);
    let out = kubectl.run(&["-n", "chunks", "get", "bundles", "--chunk-size=2", "-o", "name", "-v=6"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let listed: Vec<&str> = stdout.lines().collect();
    let expected: Vec<String> = (0..9).map(|i| format!("bundle.content.stowage.dev/b{i}")).collect();
    assert_eq!(listed, expected);
    // kubectl logs each request at -v=6: five pages of at most two.
    let stderr = String::from_utf8_lossy(&out.stderr);
    let pages = stderr.lines().filter(|l| l.contains("/bundles?") && l.contains("limit=2")).count();
    assert_eq!(pages, 5, "kubectl requests:\n{stderr}");
}

/// Rust clients (reqwest, kube-rs: hyper and h2) end an HTTP/2 connection, and every request on
/// it, once the server has sent it 100 empty DATA frames. A list longer than one step (500
/// objects) used to end with one, and with a few lists in flight they reached the client: an
/// informer relisting over one connection (4 at a time) failed about one list in thirty.
#[tokio::test(flavor = "multi_thread")]
async fn one_http2_connection_serves_lists_without_end() {
    use futures_util::StreamExt as _;
    let server = Server::start_temp(&[]);
    let names: Vec<String> = (0..501).map(|i| format!("b{i:03}")).collect();
    let server = &server;
    futures_util::stream::iter(&names)
        .for_each_concurrent(16, |name| async move {
            server.create_bundle("many", name).await;
        })
        .await;
    let rounds: Vec<usize> = (0..400).collect();
    futures_util::stream::iter(&rounds)
        .for_each_concurrent(4, |&round| async move {
            let query = ["limit=500", "", "limit=250", "labelSelector=none%3Dmatches"][round % 4];
            let path = format!("{}?{query}", bundles("many"));
            let resp = server.client().get(server.url(&path)).send().await;
            let resp = resp.unwrap_or_else(|e| panic!("list {round} ({path}): {e}"));
            assert_eq!(resp.version(), reqwest::Version::HTTP_2, "the harness client speaks HTTP/2");
            let body = resp.bytes().await.unwrap_or_else(|e| panic!("list {round} ({path}) cut: {e}"));
            let list = parse_json(&body, &path);
            assert!(list["items"].is_array(), "{path}: {list:#}");
        })
        .await;
}
