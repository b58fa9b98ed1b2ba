//! The Event strategies of a standalone server: `events.k8s.io/v1` Events as the store holds them
//! ([`EVENT`]), and the core `v1` view of the same objects ([`CORE_EVENT`], what `kubectl
//! describe` and `kubectl get events` read). Both are read-only to users (get, list, watch): only
//! the server writes Events (`crate::events`). Field selectors name the fields each view calls
//! them by, pointing into the stored shape.

use serde_json::{json, Value};

use super::{Column, ResourceDef};
use crate::api::event::{core_view, EVENTS_API_VERSION};
use crate::api::meta;
use crate::api::Cause;

const VERBS: &[&str] = &["get", "list", "watch"];

const COLUMNS: &[Column] = &[
    Column { name: "Last Seen", kind: "string", format: "", description: "When it was last observed.", priority: 0 },
    Column { name: "Type", kind: "string", format: "", description: "Normal or Warning.", priority: 0 },
    Column { name: "Reason", kind: "string", format: "", description: "Why it happened.", priority: 0 },
    Column { name: "Object", kind: "string", format: "", description: "What it is about.", priority: 0 },
    Column { name: "Message", kind: "string", format: "", description: "What happened.", priority: 0 },
    Column { name: "Name", kind: "string", format: "name", description: "The Event's name.", priority: 1 },
];

pub static EVENT: ResourceDef = EVENTS_V1;

const EVENTS_V1: ResourceDef = ResourceDef {
    api_version: EVENTS_API_VERSION,
    plural: "events",
    singular: "event",
    kind: "Event",
    list_kind: "EventList",
    short_names: &["ev"],
    user_writable: false,
    verbs: VERBS,
    subresources: &[],
    takes_uploads: false,
    schema,
    default: |_| {},
    validate,
    initial_status: |_| None,
    columns: COLUMNS,
    row,
    selectable_fields: &[
        ("regarding.apiVersion", "/regarding/apiVersion"),
        ("regarding.kind", "/regarding/kind"),
        ("regarding.name", "/regarding/name"),
        ("regarding.namespace", "/regarding/namespace"),
        ("regarding.uid", "/regarding/uid"),
        ("reason", "/reason"),
        ("type", "/type"),
        ("reportingController", "/reportingController"),
    ],
    secret_refs: |_| Vec::new(),
    on_delete: None,
    view: None,
};

pub static CORE_EVENT: ResourceDef = ResourceDef {
    api_version: "v1",
    view: Some(core_view),
    selectable_fields: &[
        ("involvedObject.apiVersion", "/regarding/apiVersion"),
        ("involvedObject.kind", "/regarding/kind"),
        ("involvedObject.name", "/regarding/name"),
        ("involvedObject.namespace", "/regarding/namespace"),
        ("involvedObject.uid", "/regarding/uid"),
        ("involvedObject.resourceVersion", "/regarding/resourceVersion"),
        ("involvedObject.fieldPath", "/regarding/fieldPath"),
        ("reason", "/reason"),
        ("type", "/type"),
        ("source", "/reportingController"),
        ("reportingComponent", "/reportingController"),
    ],
    ..EVENTS_V1
};

fn schema() -> Value {
    json!({"type": "object", "description": "An Event about a stowage object.", "x-kubernetes-preserve-unknown-fields": true})
}

fn validate(_: &Value) -> Vec<Cause> {
    vec![Cause::invalid("", &Value::Null, "Events are written by the server only")]
}

fn row(obj: &Value) -> Vec<Value> {
    let text = |pointer: &str| obj.pointer(pointer).and_then(Value::as_str).unwrap_or("").to_owned();
    let last = obj.pointer("/series/lastObservedTime").or_else(|| obj.get("eventTime")).and_then(Value::as_str);
    let object = format!("{}/{}", text("/regarding/kind").to_lowercase(), text("/regarding/name"));
    vec![
        json!(meta::human_age(last)),
        json!(text("/type")),
        json!(text("/reason")),
        json!(object),
        json!(text("/note")),
        json!(text("/metadata/name")),
    ]
}
