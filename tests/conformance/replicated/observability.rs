//! What an operator sees of the replicated mode: `stowage_leader` 1 on exactly one replica, etcd
//! and object storage request latencies and errors and the lease's renewals in `/metrics`, and
//! `/readyz?verbose` naming the failing check while etcd or the bucket does not answer (each
//! frozen with SIGSTOP for a few seconds, then thawed), while `/livez` stays up.

use std::collections::HashMap;
use std::time::Duration;

use reqwest::Client;

use super::cluster::Cluster;
use crate::harness::*;
use crate::tarutil::{build_tar, file, random_bytes, Tree};

const WAIT: Duration = Duration::from_secs(30);

async fn scrape(client: &Client, url: &str) -> HashMap<String, f64> {
    let resp = client.get(format!("{url}/metrics")).timeout(WAIT).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    parse_metrics(&resp.text().await.unwrap())
}

async fn readyz(client: &Client, url: &str, path: &str) -> (u16, String) {
    let resp = client.get(format!("{url}{path}")).timeout(WAIT).send().await.unwrap();
    (resp.status().as_u16(), resp.text().await.unwrap())
}

/// Polls `/readyz?verbose` until `check` holds of its answer; returns it.
async fn readyz_until(client: &Client, url: &str, what: &str, check: impl Fn(u16, &str) -> bool) -> String {
    eventually(WAIT, what, || async {
        let (code, body) = readyz(client, url, "/readyz?verbose").await;
        match check(code, &body) {
            true => Ok(body),
            false => Err(format!("last /readyz?verbose {code}:\n{body}")),
        }
    })
    .await
}

fn count(m: &HashMap<String, f64>, key: &str) -> f64 {
    m.get(key).copied().unwrap_or_else(|| panic!("no {key} in /metrics: {m:?}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn leader_requests_and_failing_checks_are_visible() {
    let cluster = Cluster::start("observe", 3, &[]).await;
    let client = cluster.client().clone();
    let urls: Vec<String> = cluster.replicas.iter().map(|r| r.url()).collect();
    let at = super::api::At::new(&client, urls[0].clone());
    at.create_bundle("obs", "b").await;
    let mut tree = Tree::new();
    tree.insert("data.bin".into(), file(random_bytes(3, 1 << 20)));
    at.upload("obs", "b", build_tar(&tree)).await;

    // Exactly one leader (elections take a campaign round or two).
    eventually_every(WAIT, Duration::from_millis(500), "exactly one leader", || async {
        let mut leaders = Vec::new();
        for url in &urls {
            leaders.push(count(&scrape(&client, url).await, "stowage_leader"));
        }
        assert!(leaders.iter().all(|l| *l == 0.0 || *l == 1.0), "{leaders:?}");
        match leaders.iter().sum::<f64>() == 1.0 {
            true => Ok(()),
            false => Err(format!("{leaders:?}")),
        }
    })
    .await;
    let m = scrape(&client, &urls[0]).await;
    for key in [
        r#"etcd_request_duration_seconds_count{operation="txn",type="store"}"#,
        r#"etcd_request_duration_seconds_count{operation="get",type="replicas"}"#,
        r#"etcd_request_duration_seconds_count{operation="grant",type="lease"}"#,
        r#"stowage_object_storage_request_duration_seconds_count{operation="put"}"#,
        r#"stowage_object_storage_request_duration_seconds_count{operation="list"}"#,
    ] {
        assert!(count(&m, key) >= 1.0, "{key}: {m:?}");
    }
    assert_eq!(count(&m, r#"stowage_etcd_lease_renewals_total{result="failed"}"#), 0.0);
    assert!(m.contains_key(r#"stowage_etcd_lease_renewals_total{result="renewed"}"#), "{m:?}");
    assert!(m.keys().any(|k| k.starts_with("etcd_request_duration_seconds_bucket{")), "kube's histogram: {m:?}");

    let healthy = "[+]ping ok\n[+]shutdown ok\n[+]etcd ok\n[+]lease ok\n[+]object-storage ok\nreadyz check passed\n";
    assert_eq!(readyz(&client, &urls[0], "/readyz?verbose").await, (200, healthy.to_owned()));
    assert_eq!(readyz(&client, &urls[0], "/readyz/etcd").await, (200, "ok".to_owned()));

    // The bucket stops answering: object-storage fails, etcd does not; liveness holds.
    cluster.garage.process().pause();
    let body = readyz_until(&client, &urls[0], "object-storage failing", |code, body| {
        code == 503 && body.contains("[-]object-storage failed: reason withheld\n")
    })
    .await;
    assert!(body.contains("[+]etcd ok\n") && body.ends_with("readyz check failed\n"), "{body}");
    let (code, reason) = readyz(&client, &urls[0], "/readyz/object-storage").await;
    assert_eq!(code, 503, "{reason}");
    assert!(reason.starts_with("internal server error: ") && reason.contains("object storage"), "{reason}");
    assert_eq!(readyz(&client, &urls[0], "/livez").await, (200, "ok".to_owned()));
    cluster.garage.process().resume();
    readyz_until(&client, &urls[0], "ready again after the bucket", |code, _| code == 200).await;
    let m = scrape(&client, &urls[0]).await;
    assert!(count(&m, r#"stowage_object_storage_request_errors_total{operation="list"}"#) >= 1.0, "{m:?}");

    // etcd stops answering: the etcd check fails within its 2 s; liveness does not wait on etcd.
    cluster.etcd.process().pause();
    let body = readyz_until(&client, &urls[0], "etcd failing", |code, body| {
        code == 503 && body.contains("[-]etcd failed: reason withheld\n")
    })
    .await;
    assert!(body.contains("[+]object-storage ok\n"), "{body}");
    let (code, reason) = readyz(&client, &urls[0], "/readyz/etcd").await;
    let expected = "internal server error: the shared store is unavailable: etcd: no answer within 2 s\n";
    assert_eq!((code, reason.as_str()), (503, expected));
    assert_eq!(readyz(&client, &urls[0], "/livez?verbose").await, (200, "[+]ping ok\nlivez check passed\n".to_owned()));
    cluster.etcd.process().resume();
    readyz_until(&client, &urls[0], "ready again after etcd", |code, _| code == 200).await;
    let m = scrape(&client, &urls[0]).await;
    assert!(count(&m, r#"etcd_request_errors_total{operation="get",type="replicas"}"#) >= 1.0, "{m:?}");
}
