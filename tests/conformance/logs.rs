//! The server's log as operators read it: `--log-format json` lines that parse one by one, the
//! access line (`-v 3`, as kube-apiserver's httplog) written once per request and off by default,
//! `retry_after` on a throttled request's line, and denials and authentication failures at info
//! naming the user and what was refused, never the token.

use std::time::Duration;

use reqwest::header::USER_AGENT;
use serde_json::Value;
use tokio::io::AsyncWriteExt;

use crate::harness::*;
use crate::raw_client::RawTls;

const ACCESS: &str = "stowage::access";

/// Every line of the server's log, each of which must be a JSON object with an RFC 3339
/// `timestamp`, a `level` and a `message`.
fn json_lines(server: &Server) -> Vec<Value> {
    let log = server.log();
    log.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("log line is not JSON ({e}): {line}"));
            let timestamp = v["timestamp"].as_str().unwrap_or_else(|| panic!("no timestamp: {line}"));
            chrono::DateTime::parse_from_rfc3339(timestamp)
                .unwrap_or_else(|e| panic!("timestamp {timestamp:?} is not RFC 3339 ({e}): {line}"));
            let level = v["level"].as_str().unwrap_or_else(|| panic!("no level: {line}"));
            assert!(["TRACE", "DEBUG", "INFO", "WARN", "ERROR"].contains(&level), "level {level:?}: {line}");
            assert!(v["message"].is_string(), "no message: {line}");
            v
        })
        .collect()
}

/// The access lines of requests sent with User-Agent `agent`.
fn access_lines(server: &Server, agent: &str) -> Vec<Value> {
    json_lines(server).into_iter().filter(|v| v["target"] == ACCESS && v["user_agent"] == agent).collect()
}

/// Waits until `agent`'s requests have `count` access lines, then for the access line of a
/// marker request sent after them: the log is written in order, so a second line for one of
/// `agent`'s requests, written while it was answered, would be in the log by then.
async fn settled_access_lines(server: &Server, agent: &str, count: usize) -> Vec<Value> {
    wait_access_lines(server, agent, count).await;
    let marker = format!("{agent}/marker");
    let response = server.client().get(server.url("/version")).header(USER_AGENT, &marker).send().await.unwrap();
    response.bytes().await.unwrap();
    wait_access_lines(server, &marker, 1).await;
    access_lines(server, agent)
}

async fn wait_access_lines(server: &Server, agent: &str, count: usize) {
    eventually(Duration::from_secs(10), &format!("{count} access line(s) of {agent}"), || async {
        let lines = access_lines(server, agent);
        match lines.len() >= count {
            true => Ok(()),
            false => Err(format!("{} so far; log:\n{}", lines.len(), server.log())),
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn json_log_lines_and_one_access_line_per_request() {
    let server = Server::start_temp(&["--log-format", "json", "-v", "3"]);
    let agent = "stowage-logs-test/list";
    let response = server.client().get(server.url(&bundles("default"))).header(USER_AGENT, agent).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let body = response.bytes().await.unwrap();

    let lines = settled_access_lines(&server, agent, 1).await;
    assert_eq!(lines.len(), 1, "one request, one access line: {lines:#?}");
    let line = &lines[0];
    assert_eq!(line["level"], "INFO", "{line}");
    assert_eq!(line["message"], "HTTP", "{line}");
    assert_eq!(line["verb"], "list", "{line}");
    assert_eq!(line["path"], bundles("default"), "{line}");
    assert_eq!(line["user"], "stowage-admin", "{line}");
    assert_eq!(line["status"], 200, "{line}");
    assert!(line["latency_ms"].as_f64().is_some_and(|ms| ms >= 0.0), "{line}");
    assert_eq!(line["bytes"].as_u64(), Some(body.len() as u64), "{line}");
    assert!(line["remote"].as_str().is_some_and(|r| r.starts_with("127.0.0.1:")), "{line}");
    assert!(line.get("retry_after").is_none(), "not throttled: {line}");

    // A watch is logged once, when it ends, with its whole duration.
    let agent = "stowage-logs-test/watch";
    let watch = format!("{}?watch=1&timeoutSeconds=1", bundles("default"));
    let response = server.client().get(server.url(&watch)).header(USER_AGENT, agent).send().await.unwrap();
    assert_eq!(response.status(), 200);
    response.bytes().await.unwrap();
    let lines = settled_access_lines(&server, agent, 1).await;
    assert_eq!(lines.len(), 1, "one watch, one access line: {lines:#?}");
    assert_eq!(lines[0]["verb"], "watch", "{}", lines[0]);
    assert_eq!(lines[0]["path"], watch, "{}", lines[0]);
    assert!(lines[0]["latency_ms"].as_f64().is_some_and(|ms| ms >= 900.0), "logged before it ended: {}", lines[0]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_throttled_requests_access_line_carries_retry_after() {
    let server = Server::start_temp(&[
        "--log-format",
        "json",
        "-v=3",
        "--max-mutating-requests-inflight",
        "1",
        "--request-queue-wait",
        "100ms",
    ]);
    // The one mutating seat, held by a create whose body never finishes arriving.
    let mut held = RawTls::new(&server).connect().await.unwrap();
    let head = format!(
        "POST {} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\
         User-Agent: stowage-logs-test/holder\r\n\r\n{{",
        bundles("default")
    );
    held.write_all(head.as_bytes()).await.unwrap();
    held.flush().await.unwrap();

    let agent = "stowage-logs-test/throttled";
    eventually(Duration::from_secs(10), "a create answered 429", || async {
        let response = server
            .client()
            .post(server.url(&bundles("default")))
            .header(USER_AGENT, agent)
            .json(&upload_bundle("default", "throttled"))
            .send()
            .await
            .map_err(|e| e.to_string())?;
        match response.status().as_u16() {
            429 => Ok(()),
            other => Err(format!("answered {other}")),
        }
    })
    .await;
    drop(held);

    let lines = settled_access_lines(&server, agent, 1).await;
    let throttled: Vec<&Value> = lines.iter().filter(|l| l["status"] == 429).collect();
    assert!(!throttled.is_empty(), "no access line with status 429: {lines:#?}");
    for line in throttled {
        assert_eq!(line["verb"], "create", "{line}");
        assert_eq!(line["retry_after"], 1, "{line}");
    }
}

const TOKEN: &str = "logs-test-7f3a9c2e-token";
const BAD_TOKEN: &str = "not-a-token-5d81b6e0";
/// A policy that grants `nobody` nothing.
const POLICY: &str = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: bundle-reader}
rules:
- {apiGroups: [content.stowage.dev], resources: [bundles], verbs: [get, list, watch]}
"#;

#[tokio::test(flavor = "multi_thread")]
async fn denials_and_authentication_failures_at_info_without_the_token() {
    let tmp = tempfile::tempdir().unwrap();
    let (tokens, policy) = (tmp.path().join("tokens.csv"), tmp.path().join("policy.yaml"));
    std::fs::write(&tokens, format!("{TOKEN},nobody,2001,\"idle\"\n")).unwrap();
    std::fs::write(&policy, POLICY).unwrap();
    // The default verbosity: denials are logged, requests are not.
    let server = Server::start(
        &tmp.path().join("data"),
        &[
            "--log-format",
            "json",
            "--token-auth-file",
            tokens.to_str().unwrap(),
            "--authorization-policy-file",
            policy.to_str().unwrap(),
        ],
    );
    let url = server.url(&bundles("default"));
    let denied = server.anonymous_client().get(&url).bearer_auth(TOKEN).send().await.unwrap();
    assert_eq!(denied.status(), 403);
    let unauthenticated = server.anonymous_client().get(&url).bearer_auth(BAD_TOKEN).send().await.unwrap();
    assert_eq!(unauthenticated.status(), 401);
    assert_eq!(server.client().get(&url).send().await.unwrap().status(), 200);

    let find = |what: &str, pick: &dyn Fn(&Value) -> bool| {
        let lines: Vec<Value> = json_lines(&server).into_iter().filter(|l| pick(l)).collect();
        match lines.len() {
            1 => Ok(lines[0].clone()),
            n => Err(format!("{n} {what} lines; log:\n{}", server.log())),
        }
    };
    let denial = eventually(Duration::from_secs(10), "the denial's line", || async {
        find("denial", &|l| l["message"].as_str().is_some_and(|m| m.starts_with("forbidden")))
    })
    .await;
    assert_eq!(denial["level"], "INFO", "{denial}");
    assert_eq!(denial["user"], "nobody", "{denial}");
    assert!(denial["groups"].as_str().is_some_and(|g| g.split(',').any(|g| g == "idle")), "{denial}");
    assert_eq!(denial["verb"], "list", "{denial}");
    assert_eq!(denial["api_group"], "content.stowage.dev", "{denial}");
    assert_eq!(denial["resource"], "bundles", "{denial}");
    assert_eq!(denial["namespace"], "default", "{denial}");
    let failure = eventually(Duration::from_secs(10), "the authentication failure's line", || async {
        find("authentication failure", &|l| l["message"] == "authentication failed")
    })
    .await;
    assert_eq!(failure["level"], "INFO", "{failure}");
    assert_eq!(failure["path"], bundles("default"), "{failure}");

    // A marker: one more authentication failure, sent after the others were answered. Once its
    // line is in the log (written in order), so is whatever they logged.
    let marker = server.anonymous_client().get(&url).bearer_auth("marker-token").send().await.unwrap();
    assert_eq!(marker.status(), 401);
    eventually(Duration::from_secs(10), "the marker's line", || async {
        let failures = json_lines(&server).into_iter().filter(|l| l["message"] == "authentication failed").count();
        match failures {
            2 => Ok(()),
            n => Err(format!("{n} authentication failure lines")),
        }
    })
    .await;
    let log = server.log();
    assert!(!log.contains(TOKEN), "the token is in the log:\n{log}");
    assert!(!log.contains(BAD_TOKEN), "the refused token is in the log:\n{log}");
    let access: Vec<Value> = json_lines(&server).into_iter().filter(|l| l["target"] == ACCESS).collect();
    assert!(access.is_empty(), "access lines at the default verbosity: {access:#?}");
}
