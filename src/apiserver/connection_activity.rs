//! What one connection is doing, for the listener's idle timeout: how many requests are in flight
//! on it, and a future that resolves once none has been for too long.
//!
//! A request counts from the moment hyper hands it to the service until its response body is
//! dropped, so a watch or a long download keeps its connection busy for as long as it streams, and
//! an idle timeout never cuts one. Partial request bytes do not count: a client trickling a
//! request's headers is idle until the request is complete.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

/// The in-flight request count of one connection.
pub struct ConnectionActivity {
    in_flight: watch::Sender<usize>,
}

/// One request in flight; dropping it ends the request.
pub struct InFlight(Arc<ConnectionActivity>);

impl ConnectionActivity {
    pub fn new() -> Arc<ConnectionActivity> {
        Arc::new(ConnectionActivity { in_flight: watch::Sender::new(0) })
    }

    pub fn begin(self: &Arc<Self>) -> InFlight {
        self.in_flight.send_modify(|n| *n += 1);
        InFlight(self.clone())
    }

    /// Resolves once no request has been in flight for `first` (counted from now, while nothing
    /// has happened yet) or, after a request ended, for `idle`.
    pub async fn idle_for(&self, first: Duration, idle: Duration) {
        let mut in_flight = self.in_flight.subscribe();
        let mut limit = first;
        loop {
            if *in_flight.borrow_and_update() == 0 {
                match tokio::time::timeout(limit, in_flight.changed()).await {
                    Err(_elapsed) => return,
                    // The sender lives in `self`, so it cannot be gone; treat it as idle anyway.
                    Ok(Err(_closed)) => return,
                    Ok(Ok(())) => {}
                }
            } else if in_flight.changed().await.is_err() {
                return;
            }
            limit = idle;
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.send_modify(|n| *n = n.saturating_sub(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    const FIRST: Duration = Duration::from_millis(100);
    const IDLE: Duration = Duration::from_millis(300);

    #[tokio::test]
    async fn idle_only_when_nothing_is_in_flight_for_the_limit() {
        let activity = ConnectionActivity::new();
        let started = Instant::now();
        activity.idle_for(FIRST, IDLE).await;
        let waited = started.elapsed();
        assert!(waited >= FIRST && waited < IDLE, "nothing ever arrived: the first limit applies ({waited:?})");

        let request = activity.begin();
        let idle = activity.idle_for(FIRST, IDLE);
        tokio::pin!(idle);
        // A request in flight (a watch) keeps the connection busy however long it runs.
        assert!(tokio::time::timeout(IDLE * 3, idle.as_mut()).await.is_err());
        let ended = Instant::now();
        drop(request);
        idle.await;
        assert!(ended.elapsed() >= IDLE, "after a request, the idle limit applies ({:?})", ended.elapsed());
    }
}
