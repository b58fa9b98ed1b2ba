//! Hostile request parameters: durations, timeouts, resourceVersions, limits, continue tokens,
//! ranges and paths at and past the edges of their types. Each gets an answer a client can act on
//! (a Kubernetes `Status` for a refusal, the kube-apiserver behaviour otherwise), never a panic,
//! a reset stream or an empty 200. `kubectl stowage ls | head` ends quietly.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use base64::Engine;
use reqwest::Method;
use serde_json::{json, Value};

use crate::harness::*;
use crate::tarutil::*;
use crate::watch::read_events;

const NS: &str = "hostile";
const MAX: u64 = u64::MAX;

/// No worker, watch task or blocking task of the server panicked.
fn assert_no_panic(server: &Server) {
    let log = server.log();
    assert!(!log.contains("panicked"), "the server panicked:\n{log}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_poll_interval_beyond_any_duration_is_422_naming_the_field() {
    let server = Server::start_temp(&[]);
    for interval in ["100000000000000000000h", "2562048h", "-1s", "1h-5s", "10x"] {
        let mut b = upload_bundle(NS, "polled");
        b["spec"]["pollInterval"] = json!(interval);
        let resp = server.post_json(&bundles(NS), &b).await;
        let status = expect_status(resp, 422, "Invalid").await;
        let causes = status.pointer("/details/causes").and_then(Value::as_array).expect("causes");
        assert_eq!(causes.len(), 1, "{status:#}");
        assert_eq!(causes[0]["field"], "spec.pollInterval", "{status:#}");
        assert!(str_at(&status, "/message").contains("2562047h"), "says the maximum: {status:#}");
    }
    // The longest a Go client can write is taken.
    let mut b = upload_bundle(NS, "polled");
    b["spec"]["pollInterval"] = json!("2562047h");
    assert_eq!(server.post_json(&bundles(NS), &b).await.status(), 201);
    // Go's other spellings too (kube-core's `Duration`): a fraction, microseconds, a bare 0.
    for (name, interval) in [("fraction", "1.5h"), ("micros", "2us"), ("zero", "0")] {
        let mut b = upload_bundle(NS, name);
        b["spec"]["pollInterval"] = json!(interval);
        assert_eq!(server.post_json(&bundles(NS), &b).await.status(), 201, "{interval}");
    }
    assert_no_panic(&server);
}

#[tokio::test(flavor = "multi_thread")]
async fn watch_timeouts_past_int64_are_400_and_huge_ones_watch() {
    let server = Server::start_temp(&[]);
    // kube-apiserver reads timeoutSeconds as an int64: past it, 400.
    let resp = server.get(&format!("{}?watch=1&timeoutSeconds={MAX}", bundles(NS))).await;
    let status = expect_status(resp, 400, "BadRequest").await;
    assert!(str_at(&status, "/message").contains("timeoutSeconds"), "{status:#}");
    let resp = server.get(&format!("{}?watch=1&timeoutSeconds=soon", bundles(NS))).await;
    expect_status(resp, 400, "BadRequest").await;

    // The largest int64 is a watch that lasts: it delivers the next change.
    let url = server.url(&format!("{}?watch=1&timeoutSeconds={}", bundles(NS), i64::MAX));
    let watch = server.client().get(url).send().await.unwrap();
    assert_eq!(watch.status(), 200);
    server.create_bundle(NS, "after").await;
    let events = read_events(watch, 1).await;
    assert_eq!(events.len(), 1, "the watch ended without the change: {events:?}");
    assert_eq!(str_at(&events[0], "/object/metadata/name"), "after");

    // A negative one ends the watch at once, as in kube-apiserver (an expired deadline).
    let url = server.url(&format!("{}?watch=1&resourceVersion=0&timeoutSeconds=-1", bundles(NS)));
    let watch = server.client().get(url).send().await.unwrap();
    assert_eq!(watch.status(), 200);
    let body = tokio::time::timeout(Duration::from_secs(20), watch.bytes()).await.expect("watch ended").unwrap();
    // At most the initial state; then the stream ended.
    assert!(body.split(|b| *b == b'\n').filter(|l| !l.is_empty()).count() <= 1, "{body:?}");
    assert_no_panic(&server);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_watch_from_a_future_resource_version_waits_for_later_changes() {
    let server = Server::start_temp(&[]);
    // kube-apiserver's watch cache takes a resourceVersion it has not reached and sends only what
    // comes after it: for the largest one, nothing, until the timeout ends the watch cleanly.
    let url = server.url(&format!("{}?watch=1&resourceVersion={MAX}&timeoutSeconds=3", bundles(NS)));
    let watch = server.client().get(url).send().await.unwrap();
    let code = watch.status();
    if code != 200 {
        panic!("watch at resourceVersion {MAX}: {code}: {}", watch.text().await.unwrap_or_default());
    }
    server.create_bundle(NS, "older").await;
    let events = read_events(watch, 1).await;
    assert!(events.is_empty(), "a change older than the resourceVersion asked for was sent: {events:?}");

    // Lists at it are kube's 504 "Too large resource version" once the short wait ran out.
    for query in [format!("resourceVersion={MAX}"), format!("resourceVersion={MAX}&resourceVersionMatch=Exact")] {
        let resp = server.get(&format!("{}?{query}", bundles(NS))).await;
        let status = expect_status(resp, 504, "Timeout").await;
        assert_eq!(status["details"]["causes"][0]["reason"], "ResourceVersionTooLarge", "{query}: {status:#}");
    }
    assert_no_panic(&server);
}

/// A continue token as the server writes them, with any resourceVersion and start.
fn token(rv: &str, start: &str) -> String {
    let json = format!(r#"{{"v":"meta.k8s.io/v1","rv":{rv},"start":"{start}"}}"#);
    base64::engine::general_purpose::URL_SAFE.encode(json)
}

#[tokio::test(flavor = "multi_thread")]
async fn list_parameters_at_the_edges_get_answers() {
    let server = Server::start_temp(&[]);
    server.create_bundle(NS, "one").await;
    let list = bundles(NS);
    let cases: Vec<(String, u16)> = vec![
        // limit: an int64 as in kube; zero or negative is "no limit".
        (format!("{list}?limit=-5"), 200),
        (format!("{list}?limit={}", i64::MAX), 200),
        (format!("{list}?limit={MAX}"), 400),
        (format!("{list}?limit=1.5"), 400),
        // resourceVersion: a uint64.
        (format!("{list}?resourceVersion=18446744073709551616"), 400),
        (format!("{list}?resourceVersion=-1"), 400),
        (format!("{list}?resourceVersion=0&resourceVersionMatch=Newest"), 400),
        // continue tokens the server never wrote.
        (format!("{list}?continue={}", token("0", "")), 200),
        (format!("{list}?continue={}", token(&MAX.to_string(), "")), 504),
        (format!("{list}?continue={}", token("-1", "")), 400),
        (format!("{list}?continue={}", token("1e400", "")), 400),
        (format!("{list}?limit=1&continue={}", token("0", &"\u{7f}".repeat(4000))), 200),
        // watches.
        (format!("{list}?watch=1&resourceVersion=-1"), 400),
        (format!("{list}?watch=1&resourceVersion=18446744073709551616"), 400),
        // a single object.
        (format!("{}?resourceVersion={MAX}", bundle(NS, "one")), 200),
    ];
    for (path, code) in cases {
        let resp = server.get(&path).await;
        if code == 200 {
            let got = resp.status();
            assert_eq!(got, 200, "GET {path}: {}", resp.text().await.unwrap_or_default());
        } else {
            let reason = match code {
                400 => "BadRequest",
                504 => "Timeout",
                _ => unreachable!(),
            };
            expect_status(resp, code, reason).await;
        }
    }
    assert_no_panic(&server);
}

#[tokio::test(flavor = "multi_thread")]
async fn label_selectors_are_read_as_kube_reads_them() {
    let server = Server::start_temp(&[]);
    for (name, tier) in [("web", "front"), ("db", "back"), ("cache", "edge")] {
        let mut b = upload_bundle(NS, name);
        b["metadata"]["labels"] = json!({"tier": tier});
        assert_eq!(server.post_json(&bundles(NS), &b).await.status(), 201);
    }
    let names = |list: &Value| -> Vec<String> {
        let items = list["items"].as_array().cloned().unwrap_or_default();
        items.iter().map(|o| str_at(o, "/metadata/name").to_owned()).collect()
    };
    // `in(` and `notin(` without a space, as client-go's parser takes them.
    let list = server.get_json(&format!("{}?labelSelector=tier%20in(front,edge)", bundles(NS))).await;
    assert_eq!(names(&list), ["cache", "web"], "{list:#}");
    let list = server.get_json(&format!("{}?labelSelector=tier%20notin(front,edge)", bundles(NS))).await;
    assert_eq!(names(&list), ["db"], "{list:#}");

    // Bad keys, values and syntax: 400 BadRequest in apimachinery's words.
    for (selector, message) in [
        ("-tier=front", "unable to parse requirement: <nil>: Invalid value: \"-tier\": name part must consist of"),
        (
            "tier=front_",
            "unable to parse requirement: values[0][tier]: Invalid value: \"front_\": a valid label must be",
        ),
        ("tier%20in%20(front", "unable to parse requirement: found '', expected: ',' or ')'"),
        ("tierin(front)", "unable to parse requirement: found '(', expected: in, notin, =, ==, !=, gt, lt"),
        ("tier=front%20back", "found 'back', expected: ',' or 'end of string'"),
    ] {
        let resp = server.get(&format!("{}?labelSelector={selector}", bundles(NS))).await;
        let status = expect_status(resp, 400, "BadRequest").await;
        let text = str_at(&status, "/message");
        assert!(text.starts_with(message), "{selector}: {status:#}");
        assert!(text.is_ascii() && !text.contains('{') && !text.contains("Err("), "plain: {text}");
    }
    assert_no_panic(&server);
}

#[tokio::test(flavor = "multi_thread")]
async fn write_and_content_parameters_at_the_edges_get_answers() {
    let server = Server::start_temp(&[]);
    server.create_bundle(NS, "b").await;
    let mut tree = Tree::new();
    tree.insert("a.txt".into(), file(b"hello\n".to_vec()));
    server.upload_ok(NS, "b", build_tar(&tree), None).await;
    let client = server.client();
    let send = |method: Method, path: String, headers: Vec<(&'static str, String)>, body: String| {
        let mut req = client.request(method, server.url(&path)).timeout(Duration::from_secs(60)).body(body);
        for (name, value) in headers {
            req = req.header(name, value);
        }
        req.send()
    };
    let json_type = || vec![("Content-Type", "application/json".to_string())];

    // A precondition or pinned resourceVersion past the store's: a conflict, not an overflow.
    let mut stale = server.get_json(&bundle(NS, "b")).await;
    stale["metadata"]["resourceVersion"] = json!(MAX.to_string());
    let resp = send(Method::PUT, bundle(NS, "b"), json_type(), stale.to_string()).await.unwrap();
    expect_status(resp, 409, "Conflict").await;
    let merge = json!({"metadata": {"resourceVersion": MAX.to_string(), "labels": {"a": "b"}}});
    let patch_type = vec![("Content-Type", "application/merge-patch+json".to_string())];
    let resp = send(Method::PATCH, bundle(NS, "b"), patch_type, merge.to_string()).await.unwrap();
    expect_status(resp, 409, "Conflict").await;
    let options = json!({"preconditions": {"resourceVersion": MAX.to_string()}, "gracePeriodSeconds": i64::MAX});
    let resp = send(Method::DELETE, bundle(NS, "b"), json_type(), options.to_string()).await.unwrap();
    expect_status(resp, 409, "Conflict").await;

    // Ranges and paths.
    let content = bundle_content(NS, "b");
    let range = |r: String| vec![("Range", r)];
    let resp = send(Method::GET, content.clone(), range(format!("bytes={MAX}-{MAX}")), String::new()).await.unwrap();
    assert_eq!(resp.status(), 416);
    let resp = send(Method::GET, content.clone(), range(format!("bytes=-{MAX}")), String::new()).await.unwrap();
    assert_eq!(resp.status(), 206);
    for path in ["../../../../etc/passwd", &"a/".repeat(3000), "a\0b", "a.txt/../a.txt"] {
        let resp = server.get(&with_path(&content, path)).await;
        expect_status(resp, 404, "NotFound").await;
    }

    // Chunked upload sessions: pieces at the end of u64.
    let resp = send(Method::POST, format!("{content}?uploads"), vec![], String::new()).await.unwrap();
    assert_eq!(resp.status(), 202);
    let id = str_at(&resp.json::<Value>().await.unwrap(), "/uploadID").to_owned();
    let piece = format!("{content}?upload={id}");
    for (range, code, reason) in [
        (format!("bytes {MAX}-{MAX}/*"), 416, "RequestedRangeNotSatisfiable"),
        (format!("bytes 0-{MAX}/*"), 413, "RequestEntityTooLarge"),
        ("bytes 0-18446744073709551616/*".to_string(), 400, "BadRequest"),
        ("bytes 5-1/*".to_string(), 400, "BadRequest"),
    ] {
        let resp =
            send(Method::PATCH, piece.clone(), vec![("Content-Range", range.clone())], "x".into()).await.unwrap();
        expect_status(resp, code, reason).await;
    }
    let resp = server.get(&format!("{content}?upload={}", "9".repeat(500))).await;
    assert!(resp.status().is_client_error(), "{}", resp.status());
    assert_no_panic(&server);
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_stowage_ls_into_head_ends_quietly() {
    let server = Server::start_temp(&[]);
    // Far more listing than a pipe holds, so the plugin is still writing when `head` leaves.
    let mut tree = Tree::new();
    for i in 0..4000 {
        tree.insert(format!("manifests/file-{i:05}.yaml"), file(format!("n: {i}\n").into_bytes()));
    }
    server.create_bundle(NS, "many").await;
    server.upload_ok(NS, "many", build_tar(&tree), None).await;
    let bin_dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_stowage"), bin_dir.path().join("kubectl-stowage")).unwrap();
    let path = format!("{}:{}", bin_dir.path().display(), std::env::var("PATH").unwrap_or_default());

    let mut plugin = Command::new("kubectl")
        .args(["stowage", "ls", "many", "--kubeconfig", server.kubeconfig().to_str().unwrap(), "-n", NS])
        .env("PATH", path)
        .env_remove("KUBECONFIG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run kubectl (a missing kubectl is a failure)");
    let head = Command::new("head")
        .arg("-1")
        .stdin(plugin.stdout.take().unwrap())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run head");
    let head = head.wait_with_output().unwrap();
    let first = String::from_utf8_lossy(&head.stdout).into_owned();
    assert!(first.starts_with("MODE ") && first.ends_with(" PATH\n"), "the header comes first: {first:?}");
    let mut stderr = String::new();
    for line in BufReader::new(plugin.stderr.take().unwrap()).lines() {
        stderr.push_str(&line.unwrap());
        stderr.push('\n');
    }
    let status = plugin.wait().unwrap();
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(stderr.trim().is_empty(), "a broken pipe is not an error to report: {stderr}");
    assert_ne!(status.code(), Some(101), "exit status of a panic: {stderr}");
}
