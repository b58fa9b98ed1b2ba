//! What a Bundle needs, decided from the Bundle alone (its spec and the status the loop wrote).

use std::time::Duration;

use serde_json::Value;

use crate::apiserver::resources::bundle::parse_duration;
use crate::unpack::source::SourceSpec;
use crate::unpack::status::{self, UNFINISHED_REASONS};

#[derive(Clone, Debug, PartialEq)]
pub enum Plan {
    /// Up to date, uploaded by users, or being deleted.
    Nothing,
    /// `spec.paused` and not yet said so in the status.
    MarkPaused,
    /// Unpack the current generation.
    Unpack,
    /// Up to date; re-resolve the floating references after this long.
    Poll(Duration),
}

pub fn plan(bundle: &Value) -> Plan {
    if bundle.pointer("/metadata/deletionTimestamp").is_some() {
        return Plan::Nothing;
    }
    let Some(sources) = sources(bundle) else { return Plan::Nothing };
    // Uploads arrive by PUT on the content subresource; nothing to fetch.
    if sources.is_empty() || sources.iter().any(|s| s.upload.is_some()) {
        return Plan::Nothing;
    }
    if bundle.pointer("/spec/paused").and_then(Value::as_bool) == Some(true) {
        return if status::is_marked_paused(bundle) { Plan::Nothing } else { Plan::MarkPaused };
    }
    match status::reason_for_current_generation(bundle) {
        None => Plan::Unpack,
        Some(reason) if UNFINISHED_REASONS.contains(&reason.as_str()) => Plan::Unpack,
        Some(_) => match poll_interval(bundle) {
            Some(interval) => Plan::Poll(interval),
            None => Plan::Nothing,
        },
    }
}

/// `spec.sources`, or `None` when they do not parse (validation prevents that).
pub fn sources(bundle: &Value) -> Option<Vec<SourceSpec>> {
    serde_json::from_value(bundle.pointer("/spec/sources")?.clone()).ok()
}

/// `spec.pollInterval`, at least a few seconds (re-resolving is not free for the source).
pub fn poll_interval(bundle: &Value) -> Option<Duration> {
    let text = bundle.pointer("/spec/pollInterval").and_then(Value::as_str).filter(|s| !s.is_empty())?;
    parse_duration(text).map(|d| d.max(Duration::from_secs(1)))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn bundle(spec: Value, reason: Option<(&str, u64)>) -> Value {
        let mut b = json!({"metadata": {"name": "b", "namespace": "n", "generation": 2}, "spec": spec});
        if let Some((reason, generation)) = reason {
            b["status"] =
                json!({"conditions": [{"type": "Unpacked", "reason": reason, "observedGeneration": generation}]});
        }
        b
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
        assert_eq!(plan(&bundle(upload, None)), Plan::Nothing);
        let paused = json!({"sources": [{"git": {"repository": "https://x"}}], "paused": true});
        assert_eq!(plan(&bundle(paused, None)), Plan::MarkPaused);
    }
}
