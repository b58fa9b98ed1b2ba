//! What a Bundle needs, decided from the Bundle alone (its spec and the status the loop wrote).

use std::time::Duration;

use crate::api::{Bundle, UNFINISHED_REASONS};

#[derive(Clone, Debug, PartialEq)]
pub enum Plan {
    /// Up to date, waiting for an upload, or being deleted.
    Nothing,
    /// An upload Bundle whose status speaks for an older generation: check what it serves
    /// against the current spec.
    RecheckUpload,
    /// `spec.paused` and not yet said so in the status.
    MarkPaused,
    /// Unpack the current generation.
    Unpack,
    /// Up to date; re-resolve the floating references after this long.
    Poll(Duration),
}

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
        let marked = bundle.status.as_ref().is_some_and(|s| s.is_marked_paused());
        return if marked { Plan::Nothing } else { Plan::MarkPaused };
    }
    match bundle.unpacked_reason() {
        None => Plan::Unpack,
        Some(reason) if UNFINISHED_REASONS.contains(&reason) => Plan::Unpack,
        Some(_) => match bundle.spec.poll_interval() {
            Some(interval) => Plan::Poll(interval),
            None => Plan::Nothing,
        },
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::*;

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
        assert_eq!(plan(&bundle(image.clone(), None)), Plan::Unpack);
        assert_eq!(plan(&bundle(image.clone(), Some(("Unpacked", 1)))), Plan::Unpack, "older generation");
        assert_eq!(plan(&bundle(image.clone(), Some(("Unpacking", 2)))), Plan::Unpack, "resumed after a crash");
        assert_eq!(plan(&bundle(image.clone(), Some(("PullFailed", 2)))), Plan::Unpack, "transient: retried");
        assert_eq!(plan(&bundle(image.clone(), Some(("InvalidFormat", 2)))), Plan::Nothing, "permanent");
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
        let paused = json!({"sources": [{"git": {"repository": "https://x"}}], "paused": true});
        assert_eq!(plan(&bundle(paused, None)), Plan::MarkPaused);
    }
}
