//! `Bundle.status` as the unpacker writes it, following the API conventions: `observedGeneration`,
//! a `phase` for people, and two conditions for machines —
//!
//! - `Unpacked`: whether the *current* spec's content is unpacked (`True`/`Unpacked`; `False` with
//!   `Pending`, `Unpacking`, `AwaitingUpload`, `PullFailed`, `InvalidFormat`, …);
//! - `Available`: whether some content is served (`True` while the last good revision keeps being
//!   served after a newer spec failed — the status says both things).
//!
//! `lastTransitionTime` changes only when a condition's status does.

use serde_json::{json, Map, Value};

use super::error::UnpackError;
use super::format::FormatReport;
use super::source::Resolved;
use crate::apiserver::meta;
use crate::storage::RevisionRecord;

pub const UNPACKED: &str = "Unpacked";
pub const AVAILABLE: &str = "Available";
/// Reasons that mean "work in progress or waiting": not a final answer for this generation.
pub const UNFINISHED_REASONS: [&str; 4] = ["Pending", "Unpacking", "PullFailed", "StorageFailed"];

fn generation(bundle: &Value) -> u64 {
    bundle.pointer("/metadata/generation").and_then(Value::as_u64).unwrap_or(1)
}

/// The status as an object (fields are set on it without a way to fail).
fn current_status(bundle: &Value) -> Map<String, Value> {
    bundle.get("status").and_then(Value::as_object).cloned().unwrap_or_default()
}

/// Sets condition `kind`, keeping its `lastTransitionTime` unless its status flips.
fn set_condition(
    status: &mut Map<String, Value>,
    generation: u64,
    kind: &str,
    state: bool,
    reason: &str,
    message: &str,
) {
    let state = if state { "True" } else { "False" };
    let mut conditions: Vec<Value> = status.get("conditions").and_then(Value::as_array).cloned().unwrap_or_default();
    let previous = conditions.iter().position(|c| c.get("type").and_then(Value::as_str) == Some(kind));
    let transition = previous
        .and_then(|i| conditions.get(i))
        .filter(|c| c.get("status").and_then(Value::as_str) == Some(state))
        .and_then(|c| c.get("lastTransitionTime").cloned())
        .unwrap_or_else(|| json!(meta::now_timestamp()));
    let condition = json!({
        "type": kind,
        "status": state,
        "reason": reason,
        "message": message,
        "lastTransitionTime": transition,
        "observedGeneration": generation,
    });
    match previous.and_then(|i| conditions.get_mut(i)) {
        Some(slot) => *slot = condition,
        None => conditions.push(condition),
    }
    status.insert("conditions".into(), Value::Array(conditions));
}

fn remove_condition(status: &mut Map<String, Value>, kind: &str) {
    if let Some(list) = status.get_mut("conditions").and_then(Value::as_array_mut) {
        list.retain(|c| c.get("type").and_then(Value::as_str) != Some(kind));
    }
}

/// The `Unpacked` condition's reason, if it was written for the Bundle's current generation.
pub fn reason_for_current_generation(bundle: &Value) -> Option<String> {
    let generation = generation(bundle);
    let conditions = bundle.pointer("/status/conditions").and_then(Value::as_array)?;
    let unpacked = conditions.iter().find(|c| c.get("type").and_then(Value::as_str) == Some(UNPACKED))?;
    let observed = unpacked.get("observedGeneration").and_then(Value::as_u64);
    (observed == Some(generation)).then(|| unpacked.get("reason").and_then(Value::as_str).unwrap_or("").to_string())
}

fn serving_note(status: &Map<String, Value>) -> String {
    match status.get("contentName").and_then(Value::as_str).filter(|s| !s.is_empty()) {
        Some(content) => {
            let digest = status.get("digest").and_then(Value::as_str).unwrap_or("");
            format!("; still serving {content} ({digest})")
        }
        None => String::new(),
    }
}

/// Work on the current generation has started.
pub fn unpacking(bundle: &Value) -> Value {
    let generation = generation(bundle);
    let mut status = current_status(bundle);
    let note = serving_note(&status);
    status.insert("observedGeneration".into(), json!(generation));
    status.insert("phase".into(), json!("Unpacking"));
    remove_condition(&mut status, "Paused");
    set_condition(&mut status, generation, UNPACKED, false, "Unpacking", &format!("fetching the sources{note}"));
    Value::Object(status)
}

/// The current generation's content is served.
pub fn unpacked(
    bundle: &Value,
    content: &str,
    record: &RevisionRecord,
    report: &FormatReport,
    resolved: &[Resolved],
) -> Value {
    let generation = generation(bundle);
    let mut status = current_status(bundle);
    status.insert("observedGeneration".into(), json!(generation));
    status.insert("phase".into(), json!("Unpacked"));
    let summary = format!("{} ({} files, {} bytes)", record.digest, record.files, record.size);
    set_condition(&mut status, generation, UNPACKED, true, "Unpacked", &format!("unpacked {summary}"));
    set_condition(&mut status, generation, AVAILABLE, true, "Serving", &format!("serving {content}: {summary}"));
    status.insert("resolvedSources".into(), json!(resolved));
    status.insert("contentName".into(), json!(content));
    status.insert("digest".into(), json!(record.digest));
    status.insert("format".into(), json!(report.format));
    status.insert("formatDetails".into(), report.details());
    status.insert("files".into(), json!(record.files));
    status.insert("size".into(), json!(record.size));
    Value::Object(status)
}

/// The current generation failed; whatever was served before stays served.
pub fn failed(bundle: &Value, error: &UnpackError, retry_in: Option<std::time::Duration>) -> Value {
    let generation = generation(bundle);
    let mut status = current_status(bundle);
    let note = serving_note(&status);
    let retry = retry_in.map(|d| format!("; retrying in {}s", d.as_secs().max(1))).unwrap_or_default();
    status.insert("observedGeneration".into(), json!(generation));
    status.insert("phase".into(), json!("Failed"));
    set_condition(&mut status, generation, UNPACKED, false, error.reason(), &format!("{error}{retry}{note}"));
    Value::Object(status)
}

/// `spec.paused`: nothing is fetched; what is served stays served.
pub fn paused(bundle: &Value) -> Value {
    let generation = generation(bundle);
    let mut status = current_status(bundle);
    status.insert("observedGeneration".into(), json!(generation));
    set_condition(&mut status, generation, "Paused", true, "Paused", "spec.paused is true: sources are not fetched");
    Value::Object(status)
}

/// Whether the status says the Bundle is paused (so pausing writes once).
pub fn is_marked_paused(bundle: &Value) -> bool {
    bundle
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|list| list.iter().any(|c| c.get("type").and_then(Value::as_str) == Some("Paused")))
}
