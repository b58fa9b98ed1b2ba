//! What a Bundle needs, decided from the Bundle alone (its spec and the status the loop wrote).

use std::time::Duration;

use super::job::MAX_RETRY;
use crate::api::meta::time_until;
use crate::api::{Bundle, UNFINISHED_REASONS};

#[derive(Clone, Debug, PartialEq)]
pub enum Plan {
    /// Up to date, waiting for an upload, or being deleted.
    Nothing,
    /// An upload Bundle whose status speaks for an older generation: check what it serves
    /// against the current spec.
    RecheckUpload,
    /// `spec.paused` and not yet said so in the status for this generation.
    MarkPaused,
    /// The refresh annotation holds this new value: resolve every source again now.
    Refresh(String),
    /// Unpack the current generation after this long: at once, or when the retry of a transient
    /// failure was scheduled (`status.nextPollTime`, kept across restarts).
    Unpack(Duration),
    /// Up to date (or failed for good); re-resolve the sources after this long: the rest of the
    /// interval recorded in `status.nextPollTime`, else a whole `spec.pollInterval`.
    Poll(Duration),
}

/// `Unpacked` reasons retried after a delay (transient failures), as opposed to work that was
/// interrupted (`Pending`, `Unpacking`) and starts again at once.
const RETRIED_REASONS: [&str; 2] = ["PullFailed", "StorageFailed"];
/// Refused credentials are tried once more after a restart: they may have been replaced while
/// the server was down (a running job watches them instead).
const DENIED: &str = "AccessDenied";

pub fn plan(bundle: &Bundle) -> Plan {
    if bundle.is_deleting() {
        return Plan::Nothing;
    }
    if bundle.spec.sources.is_empty() {
        return Plan::Nothing;
    }
    // Uploads arrive by PUT on the content subresource; nothing to fetch, but the status must
    // follow every spec change.
    if bundle.takes_uploads() {
        let current = bundle.status.as_ref().is_some_and(|s| s.observed_generation == Some(bundle.generation()));
        return if current { Plan::Nothing } else { Plan::RecheckUpload };
    }
    if bundle.spec.is_paused() {
        let marked = bundle.status.as_ref().is_some_and(|s| s.is_marked_paused(bundle.generation()));
        return if marked { Plan::Nothing } else { Plan::MarkPaused };
    }
    if let Some(value) = bundle.refresh_requested() {
        return Plan::Refresh(value.to_owned());
    }
    let scheduled = bundle.status.as_ref().and_then(|s| s.next_poll_time.as_deref()).and_then(time_until);
    match bundle.unpacked_reason() {
        None => Plan::Unpack(Duration::ZERO),
        Some(reason) if RETRIED_REASONS.contains(&reason) => Plan::Unpack(scheduled.unwrap_or_default().min(MAX_RETRY)),
        Some(reason) if UNFINISHED_REASONS.contains(&reason) || reason == DENIED => Plan::Unpack(Duration::ZERO),
        Some(_) => match bundle.spec.poll_interval() {
            Some(interval) => Plan::Poll(scheduled.unwrap_or(interval).min(interval)),
            None => Plan::Nothing,
        },
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::*;
    use crate::api::meta::timestamp_after;

    fn bundle(spec: Value, reason: Option<(&str, u64)>) -> Bundle {
        let mut b = json!({"metadata": {"name": "b", "namespace": "n", "generation": 2}, "spec": spec});
        if let Some((reason, generation)) = reason {
            b["status"] = json!({"conditions": [{"type": "Unpacked", "status": "False", "reason": reason, "observedGeneration": generation}]});
        }
        serde_json::from_value(b).unwrap()
    }

    #[test]
    fn what_each_bundle_needs() {
        let image = json!({"sources": [{"image": {"ref": "r/x:1"}}]});
        let now = Plan::Unpack(Duration::ZERO);
        assert_eq!(plan(&bundle(image.clone(), None)), now);
        assert_eq!(plan(&bundle(image.clone(), Some(("Unpacked", 1)))), now, "older generation");
        assert_eq!(plan(&bundle(image.clone(), Some(("Unpacking", 2)))), now, "resumed after a crash");
        assert_eq!(plan(&bundle(image.clone(), Some(("PullFailed", 2)))), now, "transient: retried");
        assert_eq!(plan(&bundle(image.clone(), Some(("InvalidFormat", 2)))), Plan::Nothing, "permanent");
        assert_eq!(plan(&bundle(image.clone(), Some(("AccessDenied", 2)))), now, "credentials may be new since");
        for reason in ["SourceNotFound", "NoMatchingVersion"] {
            assert_eq!(plan(&bundle(image.clone(), Some((reason, 2)))), Plan::Nothing, "{reason}: waits for the spec");
        }
        assert_eq!(plan(&bundle(image, Some(("Unpacked", 2)))), Plan::Nothing);
        let polled = json!({"sources": [{"image": {"ref": "r/x:1"}}], "pollInterval": "1m"});
        assert_eq!(plan(&bundle(polled, Some(("Unpacked", 2)))), Plan::Poll(Duration::from_secs(60)));
        let upload = json!({"sources": [{"upload": {}}]});
        assert_eq!(plan(&bundle(upload.clone(), None)), Plan::RecheckUpload, "no status for this generation");
        let mut current = bundle(upload.clone(), Some(("Unpacked", 2)));
        current.status.as_mut().unwrap().observed_generation = Some(2);
        assert_eq!(plan(&current), Plan::Nothing);
        current.status.as_mut().unwrap().observed_generation = Some(1);
        assert_eq!(plan(&current), Plan::RecheckUpload, "the spec changed since");
        let missing = json!({"sources": [{"http": {"url": "https://x/a.tgz"}}], "pollInterval": "1h"});
        assert_eq!(plan(&bundle(missing.clone(), Some(("SourceNotFound", 2)))), Plan::Poll(Duration::from_secs(3600)));
        let scheduled = |reason: &str, at: &str| {
            let mut b = bundle(missing.clone(), Some((reason, 2)));
            b.status.as_mut().unwrap().next_poll_time = Some(at.into());
            plan(&b)
        };
        let Plan::Poll(left) = scheduled("SourceNotFound", &timestamp_after(Duration::from_secs(600))) else {
            panic!("a poll")
        };
        assert!(
            left > Duration::from_secs(590) && left <= Duration::from_secs(600),
            "the rest of the interval: {left:?}"
        );
        assert_eq!(scheduled("Unpacked", "2020-01-01T00:00:00Z"), Plan::Poll(Duration::ZERO), "overdue: at once");
        let Plan::Unpack(left) = scheduled("PullFailed", &timestamp_after(Duration::from_secs(40))) else {
            panic!("an unpack")
        };
        assert!(left > Duration::from_secs(30), "a retry keeps its time across a restart: {left:?}");
        let paused = json!({"sources": [{"git": {"repository": "https://x"}}], "paused": true});
        assert_eq!(plan(&bundle(paused.clone(), None)), Plan::MarkPaused);
        let mut marked = bundle(paused, None);
        marked.status = Some(crate::api::BundleStatus::initial(1, false, true));
        assert_eq!(plan(&marked), Plan::MarkPaused, "marked for generation 1, now at 2");
        marked.status.as_mut().unwrap().paused(2);
        assert_eq!(plan(&marked), Plan::Nothing);
        let mut refreshed = bundle(json!({"sources": [{"git": {"repository": "https://x"}}]}), Some(("Unpacked", 2)));
        let annotate = |b: &mut Bundle, value: &str| {
            b.metadata.annotations =
                Some([(crate::api::REFRESH_ANNOTATION.to_owned(), value.to_owned())].into_iter().collect());
        };
        annotate(&mut refreshed, "2026-11-27T10:00:00Z");
        assert_eq!(plan(&refreshed), Plan::Refresh("2026-11-27T10:00:00Z".into()));
        refreshed.status.as_mut().unwrap().refreshed("2026-11-27T10:00:00Z");
        assert_eq!(plan(&refreshed), Plan::Nothing, "acted on");
        annotate(&mut refreshed, "again");
        assert_eq!(plan(&refreshed), Plan::Refresh("again".into()));
    }
}
