//! Rolling restart under load: the replicas behind haproxy are stopped (SIGTERM) and started again
//! one at a time, each ready before the next, while the failover test's clients run. No request
//! fails except on closed connections, every acknowledged write and watch event is there, and
//! haproxy's health check never sees zero ready replicas (sampled every 100 ms).
//! `STOWAGE_FAILOVER_CLIENTS` (50) and `STOWAGE_ROLLING_SECS` (120) size it.

use super::cluster::Cluster;
use super::load::{env_or, secs};
use super::scenario::{run, Disruption};
use crate::harness::report;

#[tokio::test(flavor = "multi_thread")]
async fn rolling_restart_under_load() {
    let clients = env_or("STOWAGE_FAILOVER_CLIENTS", 50) as usize;
    let duration = secs("STOWAGE_ROLLING_SECS", 120);
    let mut cluster = Cluster::start("rolling", 3, &[]).await.with_haproxy().await;
    let outcome = run(&mut cluster, clients, duration, Disruption::RollingRestart).await;
    report(&format!("rolling_restart_under_load: {}", outcome.summary));
    assert!(outcome.disruptions >= cluster.replicas.len(), "every replica was restarted at least once");
    assert!(outcome.sampler_errors.is_empty(), "haproxy's stats could not be read: {:?}", outcome.sampler_errors);
    assert!(outcome.fewest_up >= 1, "haproxy saw {} ready replicas at some point", outcome.fewest_up);
    assert!(outcome.problems.is_empty(), "{} problems:\n{}", outcome.problems.len(), outcome.problems.join("\n"));
}
