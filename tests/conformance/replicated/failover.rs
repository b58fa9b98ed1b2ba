//! Failover under load: three replicas behind haproxy; clients upload, list, watch and download
//! while one replica is killed with `kill -9` every 20 s and restarted. No acknowledged write is
//! lost or corrupt; every failed request failed on a dead connection and succeeded on retry;
//! every watch resumed from its last resourceVersion without a 410 or a missing event; a kube-rs
//! reflector converges. `STOWAGE_FAILOVER_CLIENTS` (50) and `STOWAGE_FAILOVER_SECS` (300) size it.

use std::time::Duration;

use super::cluster::Cluster;
use super::load::{env_or, secs};
use super::scenario::{run, Disruption};
use crate::harness::report;

#[tokio::test(flavor = "multi_thread")]
async fn failover_under_load() {
    let clients = env_or("STOWAGE_FAILOVER_CLIENTS", 50) as usize;
    let duration = secs("STOWAGE_FAILOVER_SECS", 300);
    let mut cluster = Cluster::start("failover", 3, &[]).await.with_haproxy().await;
    let outcome = run(&mut cluster, clients, duration, Disruption::Kill9Every(Duration::from_secs(20))).await;
    report(&format!("failover_under_load: {}", outcome.summary));
    assert!(outcome.disruptions >= 1, "at least one replica was killed (duration {duration:?})");
    assert!(outcome.problems.is_empty(), "{} problems:\n{}", outcome.problems.len(), outcome.problems.join("\n"));
}
