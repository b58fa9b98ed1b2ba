//! A leader stopped gracefully (SIGTERM: a rollout, a node drain) gives up its etcd lease as it
//! exits, so another replica takes over the reconcile loop and collection within a few seconds,
//! not after the lease's 10 s TTL as after a kill -9.

use std::time::{Duration, Instant};

use super::cluster::Cluster;
use crate::harness::report;

const LEADS: &str = "leads=true";

#[tokio::test(flavor = "multi_thread")]
async fn a_leader_stopped_gracefully_hands_over_at_once() {
    let mut cluster = Cluster::start("handover", 2, &[]).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cluster.replicas[0].log().contains(LEADS) {
        assert!(Instant::now() < deadline, "replica 0, started first, did not lead:\n{}", cluster.replicas[0].log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!cluster.replicas[1].log().contains(LEADS), "replica 1 leads beside replica 0");
    let stopped = Instant::now();
    let took = cluster.replicas[0].terminate(Duration::from_secs(30));
    assert!(took.is_some(), "replica 0 did not stop within 30 s of SIGTERM");
    loop {
        if cluster.replicas[1].log().contains(LEADS) {
            break;
        }
        assert!(
            stopped.elapsed() < Duration::from_secs(5),
            "replica 1 did not lead within 5 s of replica 0's SIGTERM (the lease's TTL is 10 s):\n{}",
            cluster.replicas[1].log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    report(&format!("handover: replica 1 led {:?} after replica 0's SIGTERM", stopped.elapsed()));
}
