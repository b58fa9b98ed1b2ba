//! A leader stopped gracefully (SIGTERM: a rollout, a node drain) gives up its etcd lease as it
//! exits, so another replica takes over the reconcile loop and collection within a few seconds,
//! not after the lease's 10 s TTL as after a kill -9.

use std::time::{Duration, Instant};

use super::cluster::Cluster;
use crate::harness::{eventually_every, report};

const LEADS: &str = "leads=true";
/// How often the replicas' logs are read.
const POLL_LOG: Duration = Duration::from_millis(50);

#[tokio::test(flavor = "multi_thread")]
async fn a_leader_stopped_gracefully_hands_over_at_once() {
    let mut cluster = Cluster::start("handover", 2, &[]).await;
    eventually_every(Duration::from_secs(10), POLL_LOG, "replica 0, started first, leads", || async {
        let log = cluster.replicas[0].log();
        if log.contains(LEADS) {
            Ok(())
        } else {
            Err(log)
        }
    })
    .await;
    assert!(!cluster.replicas[1].log().contains(LEADS), "replica 1 leads beside replica 0");
    let stopped = Instant::now();
    let took = cluster.replicas[0].terminate(Duration::from_secs(30));
    assert!(took.is_some(), "replica 0 did not stop within 30 s of SIGTERM");
    // Within 5 s of the SIGTERM: half the lease's TTL (10 s), so not by the lease expiring.
    let left = Duration::from_secs(5).saturating_sub(stopped.elapsed());
    eventually_every(left, POLL_LOG, "replica 1 leads within 5 s of replica 0's SIGTERM", || async {
        let log = cluster.replicas[1].log();
        if log.contains(LEADS) {
            Ok(())
        } else {
            Err(log)
        }
    })
    .await;
    report(&format!("handover: replica 1 led {:?} after replica 0's SIGTERM", stopped.elapsed()));
}
