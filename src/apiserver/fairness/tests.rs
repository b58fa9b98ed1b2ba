//! Admission: shares, queues, forgetting idle users, classes.

use super::*;

fn limits(per_user: usize, total: usize) -> FairnessLimits {
    FairnessLimits {
        max_read_only: total,
        max_mutating: total,
        max_per_user: per_user,
        max_content_streams: total,
        max_content_streams_per_user: per_user,
        queue_wait: Duration::from_millis(50),
    }
}

/// Yields to the spawned waiters until `n` requests of class `kind` wait in a queue.
async fn wait_queued(fairness: &Fairness, kind: &str, n: i64) {
    for _ in 0..10_000 {
        if fairness.counts().iter().any(|(k, c)| *k == kind && c.waiting == n) {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("{n} {kind} request(s) never queued: {:?}", fairness.counts());
}

// On the current-thread runtime of `#[tokio::test]` a spawned waiter runs only when the test
// yields: `wait_queued` yields until it waits in its queue, and the seat is then freed with no await
// in between, so the waiter's queue wait cannot run out first.
#[tokio::test]
async fn one_user_fills_only_their_share() {
    let fairness = Fairness::new(limits(2, 3));
    let a1 = fairness.admit(Class::Content, Some("attacker")).await.unwrap();
    let _a2 = fairness.admit(Class::Content, Some("attacker")).await.unwrap();
    // The third waits in the queue and times out.
    assert_eq!(fairness.admit(Class::Content, Some("attacker")).await.err(), Some(Rejection::TimedOut));
    let _victim = fairness.admit(Class::Content, Some("victim")).await.unwrap();
    // The total is reached: another user waits for a seat and gets it when one frees.
    let waiter = {
        let fairness = fairness.clone();
        tokio::spawn(async move { fairness.admit(Class::Content, Some("third")).await.is_ok() })
    };
    wait_queued(&fairness, "content", 1).await;
    drop(a1);
    assert!(waiter.await.unwrap());
    // The admin has no per-user share, only the total.
    assert!(fairness.admit(Class::ReadOnly, None).await.is_ok());
    // Other classes are not affected.
    assert!(fairness.admit(Class::ReadOnly, Some("attacker")).await.is_ok());
}

#[tokio::test]
async fn a_full_queue_refuses_at_once_and_idle_users_are_forgotten() {
    let fairness = Fairness::new(FairnessLimits { queue_wait: Duration::from_secs(5), ..limits(1, 10) });
    let seat = fairness.admit(Class::Mutating, Some("u")).await.unwrap();
    let queued = {
        let fairness = fairness.clone();
        tokio::spawn(async move { fairness.admit(Class::Mutating, Some("u")).await.is_ok() })
    };
    wait_queued(&fairness, "mutating", 1).await;
    let started = std::time::Instant::now();
    assert_eq!(fairness.admit(Class::Mutating, Some("u")).await.err(), Some(Rejection::QueueFull));
    assert!(started.elapsed() < Duration::from_secs(1), "refused without waiting out the 5 s queue wait");
    drop(seat);
    assert!(queued.await.unwrap());
    assert!(fairness.users.lock().unwrap().is_empty());
    // A waiter whose client went away leaves nothing behind either.
    let seat = fairness.admit(Class::Mutating, Some("gone")).await.unwrap();
    let waiter = {
        let fairness = fairness.clone();
        tokio::spawn(async move { fairness.admit(Class::Mutating, Some("gone")).await.is_ok() })
    };
    wait_queued(&fairness, "mutating", 1).await;
    // The seat goes while the waiter still queues; the waiter goes before it runs again.
    drop(seat);
    waiter.abort();
    let _ = waiter.await;
    assert!(fairness.users.lock().unwrap().is_empty());
    let mutating = fairness.counts().into_iter().find(|(kind, _)| *kind == "mutating").unwrap().1;
    assert_eq!(mutating.rejected[0], ("queue-full", 1));
    assert_eq!(mutating.inflight, 0);
}

#[test]
fn classes() {
    let info = |method: &str, path: &str, query: Option<&str>| RequestInfo::new(&method.parse().unwrap(), path, query);
    let base = "/apis/content.stowage.dev/v1alpha1/namespaces/ns/bundles";
    assert_eq!(Class::of(&info("GET", "/apis", None)), None);
    assert_eq!(Class::of(&info("GET", "/apis/content.stowage.dev/v1alpha1", None)), None);
    assert_eq!(Class::of(&info("GET", base, Some("watch=1"))), Some(Class::ReadOnly));
    assert_eq!(Class::of(&info("POST", base, None)), Some(Class::Mutating));
    assert_eq!(Class::of(&info("GET", &format!("{base}/b/content"), None)), Some(Class::Content));
    assert_eq!(Class::of(&info("PUT", &format!("{base}/b/content"), None)), Some(Class::Content));
}
