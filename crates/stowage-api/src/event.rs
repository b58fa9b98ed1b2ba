//! `events.k8s.io/v1` Events as stowage writes them about its own objects, and the core `v1` view
//! of the same Event that `kubectl describe` reads (`involvedObject`, `message`, `count`,
//! `firstTimestamp`, …, filled from the new fields as kube-apiserver converts them).

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// `reportingController` of every Event stowage writes.
pub const REPORTING_CONTROLLER: &str = "stowage";
pub const EVENTS_GROUP: &str = "events.k8s.io";
pub const EVENTS_API_VERSION: &str = "events.k8s.io/v1";

/// `Normal` or `Warning`, as kube's controllers write them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventType {
    Normal,
    Warning,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

/// The object an Event is about (`regarding`; `involvedObject` in the core view).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Regarding {
    pub api_version: String,
    pub kind: String,
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl Regarding {
    /// A Bundle of this group.
    pub fn bundle(namespace: &str, name: &str, uid: &str) -> Regarding {
        Regarding {
            api_version: super::API_VERSION.into(),
            kind: super::Bundle::KIND.into(),
            namespace: namespace.into(),
            name: name.into(),
            uid: uid.into(),
        }
    }
}

/// The longest `note` kube-apiserver accepts (1 kB); longer ones are cut.
pub const MAX_NOTE_BYTES: usize = 1024;

/// `note` cut to [`MAX_NOTE_BYTES`] at a character boundary.
pub fn bounded_note(note: &str) -> String {
    if note.len() <= MAX_NOTE_BYTES {
        return note.to_owned();
    }
    let mut end = MAX_NOTE_BYTES - 3;
    while !note.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", note.get(..end).unwrap_or(""))
}

/// The `events.k8s.io/v1` Event body: first occurrence (`series` absent) or a series of `count`
/// isomorphic ones, the last observed at `last`.
#[allow(clippy::too_many_arguments)]
pub fn event_object(
    name: &str,
    regarding: &Regarding,
    kind: EventType,
    reason: &str,
    action: &str,
    note: &str,
    instance: &str,
    first: &str,
    series: Option<(u64, &str)>,
) -> Value {
    let mut event = json!({
        "apiVersion": EVENTS_API_VERSION,
        "kind": "Event",
        "metadata": {"name": name, "namespace": regarding.namespace},
        "eventTime": first,
        "reportingController": REPORTING_CONTROLLER,
        "reportingInstance": instance,
        "action": action,
        "reason": reason,
        "regarding": regarding,
        "note": bounded_note(note),
        "type": kind.as_str(),
    });
    if let (Some((count, last)), Some(map)) = (series, event.as_object_mut()) {
        map.insert("series".into(), json!({"count": count, "lastObservedTime": last}));
    }
    event
}

/// The core `v1` Event of a stored `events.k8s.io/v1` one, as kube-apiserver converts it.
pub fn core_view(event: &Value) -> Value {
    let at = |pointer: &str| event.pointer(pointer).cloned().unwrap_or(Value::Null);
    let first = at("/eventTime");
    let (count, last) = match event.get("series") {
        Some(series) => (at("/series/count"), series.get("lastObservedTime").cloned().unwrap_or(first.clone())),
        None => (json!(1), first.clone()),
    };
    // `firstTimestamp`/`lastTimestamp` are whole seconds.
    let seconds = |time: &Value| match time.as_str() {
        Some(text) => json!(format!("{}Z", text.split('.').next().unwrap_or(text).trim_end_matches('Z'))),
        None => Value::Null,
    };
    json!({
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": at("/metadata"),
        "involvedObject": at("/regarding"),
        "reason": at("/reason"),
        "message": at("/note"),
        "source": {"component": at("/reportingController")},
        "firstTimestamp": seconds(&first),
        "lastTimestamp": seconds(&last),
        "count": count,
        "type": at("/type"),
        "eventTime": first,
        "series": at("/series"),
        "action": at("/action"),
        "reportingComponent": at("/reportingController"),
        "reportingInstance": at("/reportingInstance"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_core_view_carries_what_kubectl_describe_prints() {
        let regarding = Regarding::bundle("ns", "app", "u-1");
        let event = event_object(
            "app.1",
            &regarding,
            EventType::Warning,
            "PullFailed",
            "Unpack",
            "registry unreachable",
            "stowage-0",
            "2026-12-02T01:00:00.123456Z",
            Some((3, "2026-12-02T01:00:20.000001Z")),
        );
        let core = core_view(&event);
        assert_eq!(core["involvedObject"]["kind"], "Bundle");
        assert_eq!(core["involvedObject"]["uid"], "u-1");
        assert_eq!((core["message"].as_str(), core["count"].as_u64()), (Some("registry unreachable"), Some(3)));
        assert_eq!(core["firstTimestamp"], "2026-12-02T01:00:00Z");
        assert_eq!(core["lastTimestamp"], "2026-12-02T01:00:20Z");
        assert_eq!(core["source"]["component"], "stowage");
        assert_eq!(bounded_note(&"é".repeat(600)).len(), 1023);
    }
}
