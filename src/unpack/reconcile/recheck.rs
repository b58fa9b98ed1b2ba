//! A Bundle whose spec changed but not what it serves (an upload Bundle, or one whose sources are
//! all still pinned): its status is brought to the new generation by checking the content it
//! serves against the new spec ([`revisions::recheck_served`]), in one of the unpack slots (the
//! check reads the bundle's object files), retrying store failures with backoff.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::job::backoff;
use super::Shared;
use crate::unpack::revisions::{self, CommitError, Expect};

/// Returns once the status speaks for the new generation, or the Bundle moved on or went.
pub(super) async fn run(shared: &Arc<Shared>, expect: &Expect, cancel: &CancellationToken) {
    let mut failures = 0u32;
    loop {
        let permit = tokio::select! {
            _ = cancel.cancelled() => return,
            permit = shared.slots.acquire() => match permit { Ok(p) => p, Err(_) => return },
        };
        let (store, owned, events) = (shared.store.clone(), expect.clone(), shared.config.events.clone());
        let result = tokio::task::spawn_blocking(move || revisions::recheck_served(&store, &owned, &events))
            .await
            .unwrap_or(Err(CommitError::Gone));
        drop(permit);
        let error = match result {
            // Done, or gone / superseded: the loop starts what the new state needs.
            Ok(()) | Err(CommitError::Gone | CommitError::Superseded) => return,
            Err(CommitError::Storage(e)) => e,
        };
        failures += 1;
        let delay = backoff(failures);
        tracing::warn!(bundle = %expect.name, namespace = %expect.namespace, error = %error, "checking the uploaded content against the new spec failed; retrying in {delay:?}");
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(delay) => {}
        }
    }
}
