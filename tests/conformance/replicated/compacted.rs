//! The change log is shared and bounded in the replicated mode too: once writes through one
//! replica moved it past a resourceVersion, another replica answers a watch, an exact list or a
//! continue token at that version with 410 Expired and kube-apiserver's words, so clients relist.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::Value;

use super::api::At;
use super::cluster::Cluster;
use crate::harness::*;

const NS: &str = "compacted";

#[tokio::test(flavor = "multi_thread")]
async fn a_version_the_shared_change_log_dropped_is_410_on_every_replica() {
    let cluster = Cluster::start("compacted", 2, &["--change-log-length", "8"]).await;
    let client = cluster.client().clone();
    let (first, second) = (At::new(&client, cluster.replicas[0].url()), At::new(&client, cluster.replicas[1].url()));
    first.create_bundle(NS, "b00").await;
    first.create_bundle(NS, "b01").await;
    let page = first.get_json(&format!("{}?limit=1", bundles(NS))).await;
    let old = str_at(&page, "/metadata/resourceVersion").to_owned();
    let token = str_at(&page, "/metadata/continue").to_owned();
    for i in 2..40 {
        let at = if i % 2 == 0 { &first } else { &second };
        at.create_bundle(NS, &format!("b{i:02}")).await;
    }

    for (i, at) in [&first, &second].into_iter().enumerate() {
        let exact = format!("{}?resourceVersion={old}&resourceVersionMatch=Exact", bundles(NS));
        let status = expect_410(at, &exact).await;
        assert!(str_at(&status, "/message").contains("too old resource version"), "replica {i}: {status}");
        let cont = format!("{}?limit=1&continue={token}", bundles(NS));
        let status = expect_410(at, &cont).await;
        assert!(str_at(&status, "/message").contains("continue"), "replica {i}: {status}");

        // A watch from there ends at once with an ERROR event carrying the 410.
        let url = at.url(&format!("{}?watch=true&resourceVersion={old}", bundles(NS)));
        let mut resp = at.client.get(url).send().await.expect("watch");
        let event: Value = if resp.status() == StatusCode::GONE {
            serde_json::json!({"type": "ERROR", "object": resp.json::<Value>().await.expect("Status")})
        } else {
            assert_eq!(resp.status(), StatusCode::OK, "replica {i}: the watch");
            let chunk = tokio::time::timeout(Duration::from_secs(10), resp.chunk())
                .await
                .expect("an event within 10 s")
                .expect("reading the watch")
                .expect("the watch ended without an event");
            parse_json(&chunk, "the watch's first event")
        };
        assert_eq!(str_at(&event, "/type"), "ERROR", "replica {i}: {event}");
        assert_eq!(event["object"]["code"], 410, "replica {i}: {event}");
        assert_eq!(str_at(&event, "/object/reason"), "Expired", "replica {i}: {event}");
        assert!(str_at(&event, "/object/message").contains("too old resource version"), "replica {i}: {event}");
    }
    // The current state lists in full on either replica.
    for at in [&first, &second] {
        let all = at.get_json(&bundles(NS)).await;
        assert_eq!(all["items"].as_array().map(Vec::len), Some(40));
    }
}

/// The Status of a request that must answer 410 Expired.
async fn expect_410(at: &At<'_>, path: &str) -> Value {
    let body = at.expect(at.client.get(at.url(path)), StatusCode::GONE, &format!("GET {path}")).await;
    let status = parse_json(&body, "Status");
    assert_eq!(str_at(&status, "/kind"), "Status", "{status}");
    assert_eq!(str_at(&status, "/reason"), "Expired", "{status}");
    status
}
