//! Events are bounded in the replicated mode too: a sweep that deletes more Events than one etcd
//! transaction holds (`--etcd-max-txn-ops`, 128 by default) splits them, so Events past their
//! TTL go however many expired between two sweeps.

use std::time::Duration;

use futures_util::future::join_all;

use super::api::At;
use super::cluster::Cluster;
use crate::harness::*;
use crate::tarutil::{build_tar, file, Tree};

const NS: &str = "swept";

#[tokio::test(flavor = "multi_thread")]
async fn events_past_their_ttl_go_even_more_than_one_etcd_transaction_holds() {
    // A sweep every 10 s (half the TTL): the Events of the uploads expire within a second or two
    // of each other, so one sweep has most of their 160 to delete, two etcd operations each.
    let cluster = Cluster::start("swept", 1, &["--event-ttl", "20s"]).await;
    let client = cluster.client().clone();
    let at = At::new(&client, cluster.replicas[0].url());
    let chart = Tree::from([("Chart.yaml".to_string(), file("apiVersion: v2\nname: a\nversion: 1.0.0\n"))]);
    let names: Vec<String> = (0..80).map(|i| format!("b{i:02}")).collect();
    for wave in names.chunks(16) {
        join_all(wave.iter().map(|name| {
            let (at, tar) = (at.clone(), build_tar(&chart));
            async move {
                at.create_bundle(NS, name).await;
                at.upload(NS, name, tar).await;
            }
        }))
        .await;
    }
    let events = format!("/api/v1/namespaces/{NS}/events");
    // Two per upload (Uploaded, Serving), written by a queue behind the uploads.
    let written = eventually(Duration::from_secs(10), "the uploads' Events stored", || async {
        match at.get_json(&events).await["items"].as_array().map_or(0, Vec::len) {
            n if n >= 100 => Ok(n),
            n => Err(format!("{n} Events stored")),
        }
    })
    .await;
    report(&format!("events_sweep: {written} Events stored after 80 uploads"));
    eventually(Duration::from_secs(60), "no Events past their TTL", || async {
        match at.get_json(&events).await["items"].as_array().map_or(0, Vec::len) {
            0 => Ok(()),
            n => Err(format!("{n} Events still stored")),
        }
    })
    .await;
}
