//! Server-side apply and `metadata.managedFields`, as kube-apiserver does them for custom resources
//! (structured-merge-diff semantics). Pure functions over JSON objects: no HTTP, no storage.
//!
//! - [`apply`]: a server-side apply (`PATCH` with `application/apply-patch+yaml`, the body already
//!   decoded) by a named field manager: conflicts, `force`, merge, pruning of what the manager no
//!   longer applies, ownership.
//! - [`update`]: the ownership a non-apply write (create, update, patch) gives its manager.
//! - [`manager_from_user_agent`]: the manager of a non-apply request without `fieldManager`.
//!
//! How values are walked (granular maps, atomic/set/map lists) comes from the resource's
//! structural schema; see [`types`]. The main resource never changes nor owns `status`; the
//! `status` subresource changes and owns only `status`.

mod compare;
mod fields_of;
mod fieldset;
mod managed;
mod merge;
mod path;
mod scope;
mod types;

#[cfg(test)]
mod tests;

use serde_json::{json, Value};

use compare::compare;
use fields_of::config_field_set;
use managed::{without_server_fields, Entry, ManagedFields, ManagerKey, Operation};
use merge::{merge, prune};
use path::path_to_string;
use scope::Scope;
use types::Ty;

/// The Update manager kube attributes an object's existing fields to when it is first applied to
/// and has no managedFields yet.
pub const BEFORE_FIRST_APPLY: &str = "before-first-apply";

/// Kube's limit on Update entries before the oldest are folded into `ancient-changes`.
const MAX_UPDATE_MANAGERS: usize = 10;

/// Kube's limit on a field manager's name (`FieldManagerMaxLength`).
pub const MAX_MANAGER_LENGTH: usize = 128;

/// Why an apply (or, for a malformed object or subresource, an update) was refused.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// Fields the apply would change that other managers own: `409 Conflict`, one
    /// `FieldManagerConflict` cause per conflict.
    #[error("{}", conflicts_message(.0))]
    Conflicts(Vec<Conflict>),
    /// Not an apply kube accepts (`metadata.managedFields` set, no `apiVersion`/`kind`/name, a
    /// version other than the live object's, an unsupported subresource): `400 Bad Request`.
    #[error("{0}")]
    BadRequest(String),
    /// The configuration does not fit the schema's list semantics (an associative-list item
    /// without its key, duplicate keys or set values, undeclared fields): `422`.
    #[error("{0}")]
    Invalid(String),
}

/// One field an apply would take from another manager.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conflict {
    /// The other manager's name.
    pub manager: String,
    /// The field, as kube prints it: `.spec.paused`, `.status.conditions[type="Ready"]`.
    pub field: String,
    /// The cause message: `conflict with "kubectl-edit" using content.stowage.dev/v1alpha1`.
    pub message: String,
}

/// Kube's message for a set of conflicts.
fn conflicts_message(conflicts: &[Conflict]) -> String {
    if let [only] = conflicts {
        return format!("Apply failed with 1 conflict: {}: {}", only.message, only.field);
    }
    let mut lines: Vec<String> = Vec::new();
    let mut current: Option<&str> = None;
    for conflict in conflicts {
        if current != Some(conflict.message.as_str()) {
            current = Some(conflict.message.as_str());
            lines.push(format!("conflicts{}:", conflict.message.trim_start_matches("conflict")));
        }
        lines.push(format!("- {}", conflict.field));
    }
    format!("Apply failed with {} conflicts: {}", conflicts.len(), lines.join("\n"))
}

fn managed_fields_of(object: Option<&Value>) -> Option<&Value> {
    object.and_then(|o| o.pointer("/metadata/managedFields"))
}

/// Writes `metadata.managedFields` (removed when there are none).
fn set_managed_fields(object: &mut Value, managed: &ManagedFields) {
    let Value::Object(root) = object else { return };
    match managed.encode() {
        Some(encoded) => {
            let metadata = root.entry("metadata").or_insert_with(|| json!({}));
            if !metadata.is_object() {
                *metadata = json!({});
            }
            if let Value::Object(metadata) = metadata {
                metadata.insert("managedFields".into(), encoded);
            }
        }
        None => {
            if let Some(Value::Object(metadata)) = root.get_mut("metadata") {
                metadata.remove("managedFields");
            }
        }
    }
}

fn api_version_of(object: &Value) -> &str {
    object.get("apiVersion").and_then(Value::as_str).unwrap_or("")
}

/// Records a non-apply change from `old_view` to `new_view` by `key`: what it added or modified
/// becomes `key`'s (and is taken from every other manager), what it removed leaves every set.
fn record_update(
    ty: Ty<'_>,
    old_view: &Value,
    new_view: &Value,
    managed: &mut ManagedFields,
    key: ManagerKey,
    now: &str,
) {
    let comparison = compare(ty, old_view, new_view);
    let changed = comparison.changed();
    managed.remove_from_others(None, &changed.union(&comparison.removed));
    let owned = without_server_fields(&changed);
    if !owned.is_empty() {
        managed.add(key, &owned, now);
    }
}

/// Records field ownership for a non-apply write (create: `old` is `None`; update; patch) by
/// `manager`, and returns `new` with `metadata.managedFields` set (removed when empty).
///
/// The object's values are not changed: the caller resets what the scope protects (status on the
/// main resource, all but status on `status`) before or after, as for any update; ownership is
/// only ever recorded inside the scope. On the main resource, a `metadata.managedFields` sent in
/// `new` replaces the tracked one (`[]` clears it) when it decodes; otherwise `old`'s is kept.
pub fn update(
    schema: &Value,
    old: Option<&Value>,
    new: Value,
    manager: &str,
    subresource: Option<&str>,
    now: &str,
) -> Result<Value, ApplyError> {
    let scope = Scope::of(subresource)?;
    if !new.is_object() {
        return Err(ApplyError::BadRequest("the object must be a JSON object".into()));
    }
    let ty = Ty::Schema(schema);
    let tracked = || managed::decode(managed_fields_of(old)).unwrap_or_default();
    let mut managed = match scope {
        Scope::Status => tracked(),
        Scope::Main => {
            let sent = new.pointer("/metadata/managedFields");
            if managed::is_reset(sent) {
                ManagedFields::default()
            } else {
                match managed::decode(sent) {
                    Ok(sent) if !sent.is_empty() => sent,
                    _ => tracked(),
                }
            }
        }
    };
    let empty = json!({});
    let old_view = scope.view(old.unwrap_or(&empty));
    let new_view = scope.view(&new);
    let api_version = match api_version_of(&new) {
        "" => old.map_or("", api_version_of),
        version => version,
    };
    let key = ManagerKey::new(manager, Operation::Update, api_version, scope.subresource());
    record_update(ty, &old_view, &new_view, &mut managed, key, now);
    managed.cap_update_managers(MAX_UPDATE_MANAGERS);
    let mut out = new;
    set_managed_fields(&mut out, &managed);
    Ok(out)
}

/// Checks the envelope of an applied configuration as kube does before merging it.
fn check_applied(applied: &Value, live: Option<&Value>) -> Result<(), ApplyError> {
    let bad = |message: &str| Err(ApplyError::BadRequest(message.to_string()));
    if !applied.is_object() {
        return bad("the applied configuration must be a JSON object");
    }
    if api_version_of(applied).is_empty() {
        return bad("apiVersion must be set in the applied configuration");
    }
    if applied.get("kind").and_then(Value::as_str).unwrap_or("").is_empty() {
        return bad("kind must be set in the applied configuration");
    }
    if applied.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("").is_empty() {
        return bad("metadata.name must be set in the applied configuration");
    }
    if managed_fields_of(Some(applied)).is_some_and(|m| !m.is_null()) {
        return bad("metadata.managedFields must be nil");
    }
    if let Some(expected) = live.map(api_version_of).filter(|v| !v.is_empty()) {
        let specified = api_version_of(applied);
        if specified != expected {
            return Err(ApplyError::BadRequest(format!(
                "Incorrect version specified in apply patch. Specified patch version: {specified}, expected: {expected}"
            )));
        }
    }
    Ok(())
}

/// Applies `applied` (the partial object a client sent) as `manager` over `live` (`None`: the
/// object does not exist and apply creates it), returning the full new object with
/// `metadata.managedFields` set.
///
/// Fields of `applied` whose value would change and that another manager (Apply or Update) owns
/// are conflicts; `force` takes them over instead. Fields `manager` applied last time and no longer
/// applies are removed unless another manager owns them. On the main resource `status` is kept as
/// `live` has it; on `status` only `status` is merged (the caller returns 404 first when the object
/// does not exist). Server-owned metadata in `applied` (uid, resourceVersion...) is merged like any
/// value and never owned: the caller applies its own rules to it, as for an update.
pub fn apply(
    schema: &Value,
    live: Option<&Value>,
    applied: &Value,
    manager: &str,
    force: bool,
    subresource: Option<&str>,
    now: &str,
) -> Result<Value, ApplyError> {
    let scope = Scope::of(subresource)?;
    check_applied(applied, live)?;
    if scope == Scope::Status && live.is_none() {
        return Err(ApplyError::BadRequest("the status of an object that does not exist cannot be applied".into()));
    }
    let ty = Ty::Schema(schema);
    let config = scope.view(applied);
    let config_set = config_field_set(ty, &config).map_err(|errors| ApplyError::Invalid(errors.join("\n")))?;
    let empty = json!({});
    let live_view = scope.view(live.unwrap_or(&empty));
    let mut managed = managed::decode(managed_fields_of(live)).unwrap_or_default();
    let api_version = api_version_of(applied);
    if live.is_some() && managed.is_empty() {
        let key = ManagerKey::new(BEFORE_FIRST_APPLY, Operation::Update, api_version, scope.subresource());
        record_update(ty, &scope.view(&empty), &live_view, &mut managed, key, now);
    }

    let me = ManagerKey::new(manager, Operation::Apply, api_version, scope.subresource());
    let previous = managed.get(&me).cloned();
    let mut merged = merge(ty, Some(&live_view), &config).unwrap_or_else(|| json!({}));
    if let Some(previous) = &previous {
        let owned = managed.owned_by_others(&me).union(&config_set);
        merged = prune(ty, &merged, &previous.set, &owned);
    }

    let comparison = compare(ty, &live_view, &merged);
    let changed = comparison.changed();
    let conflicts = managed.conflicts(&me, &changed);
    if !force && !conflicts.is_empty() {
        let conflicts = conflicts
            .into_iter()
            .flat_map(|(key, paths)| {
                paths.into_iter().map(move |path| Conflict {
                    manager: key.manager.clone(),
                    field: path_to_string(&path),
                    message: format!("conflict with {}", key.describe()),
                })
            })
            .collect();
        return Err(ApplyError::Conflicts(conflicts));
    }
    managed.remove_from_others(Some(&me), &changed.union(&comparison.removed));

    let set = without_server_fields(&config_set);
    let entry_changed = previous.as_ref().is_none_or(|p| p.set != set);
    let time = if entry_changed || merged != live_view { Some(now.to_string()) } else { previous.and_then(|p| p.time) };
    managed.put(me, Entry { set, time });
    managed.cap_update_managers(MAX_UPDATE_MANAGERS);

    let mut out = scope.recombine(live, merged);
    set_managed_fields(&mut out, &managed);
    Ok(out)
}

/// The manager of a non-apply request without `fieldManager`: the User-Agent up to its first
/// `/`, without unprintable characters, at most [`MAX_MANAGER_LENGTH`] bytes.
pub fn manager_from_user_agent(user_agent: Option<&str>) -> String {
    let prefix = user_agent.unwrap_or("").split('/').next().unwrap_or("");
    let mut out = String::new();
    for c in prefix.chars().filter(|c| !c.is_control() && (*c == ' ' || !c.is_whitespace())) {
        if out.len() + c.len_utf8() > MAX_MANAGER_LENGTH {
            break;
        }
        out.push(c);
    }
    out
}
