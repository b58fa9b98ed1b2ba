//! Tests of server-side apply and managedFields tracking against the Bundle schema.

use serde_json::{json, Value};

use super::fieldset::FieldSet;
use super::{apply, manager_from_user_agent, update, ApplyError, Conflict};
use crate::strategy::bundle::BUNDLE;

const API: &str = "content.stowage.dev/v1alpha1";
const T1: &str = "2024-01-01T00:00:00Z";
const T2: &str = "2024-01-02T00:00:00Z";
const T3: &str = "2024-01-03T00:00:00Z";

fn schema() -> Value {
    (BUNDLE.schema)()
}

/// A Bundle configuration with `spec` and extra `metadata` fields.
fn config(metadata: Value, spec: Value) -> Value {
    let mut meta = json!({"name": "b", "namespace": "ns"});
    if let (Some(meta), Some(extra)) = (meta.as_object_mut(), metadata.as_object()) {
        meta.extend(extra.clone());
    }
    json!({"apiVersion": API, "kind": "Bundle", "metadata": meta, "spec": spec})
}

fn status_config(status: Value) -> Value {
    json!({"apiVersion": API, "kind": "Bundle", "metadata": {"name": "b", "namespace": "ns"}, "status": status})
}

fn apply_ok(live: Option<&Value>, applied: &Value, manager: &str, now: &str) -> Value {
    match apply(&schema(), live, applied, manager, false, None, now) {
        Ok(object) => object,
        Err(e) => panic!("apply by {manager} failed: {e}"),
    }
}

fn apply_err(live: &Value, applied: &Value, manager: &str) -> ApplyError {
    match apply(&schema(), Some(live), applied, manager, false, None, T2) {
        Ok(object) => panic!("apply by {manager} should fail, got {object}"),
        Err(e) => e,
    }
}

fn update_ok(old: Option<&Value>, new: Value, manager: &str, subresource: Option<&str>, now: &str) -> Value {
    match update(&schema(), old, new, manager, subresource, now) {
        Ok(object) => object,
        Err(e) => panic!("update by {manager} failed: {e}"),
    }
}

fn entries(object: &Value) -> Vec<Value> {
    object.pointer("/metadata/managedFields").and_then(Value::as_array).cloned().unwrap_or_default()
}

/// The fieldsV1 of `manager`'s `operation` entry, as compact JSON (key order included).
fn fields(object: &Value, manager: &str, operation: &str) -> Option<String> {
    entries(object)
        .into_iter()
        .find(|e| e["manager"] == manager && e["operation"] == operation)
        .map(|e| e["fieldsV1"].to_string())
}

fn entry(object: &Value, manager: &str, operation: &str) -> Value {
    entries(object).into_iter().find(|e| e["manager"] == manager && e["operation"] == operation).unwrap_or(Value::Null)
}

fn conflicts(error: ApplyError) -> Vec<Conflict> {
    match error {
        ApplyError::Conflicts(conflicts) => conflicts,
        other => panic!("expected conflicts, got {other:?}"),
    }
}

#[test]
fn apply_creates_the_object_and_owns_what_it_applied() {
    let applied = config(json!({"labels": {"app": "web"}}), json!({"paused": true, "sources": [{"upload": {}}]}));
    let object = apply_ok(None, &applied, "mgr", T1);
    assert_eq!(object["spec"], json!({"paused": true, "sources": [{"upload": {}}]}));
    assert_eq!(object["metadata"]["labels"], json!({"app": "web"}));
    assert_eq!(object["metadata"]["name"], "b");
    assert_eq!(
        object["metadata"]["managedFields"].to_string(),
        json!([{
            "manager": "mgr", "operation": "Apply", "apiVersion": API, "time": T1, "fieldsType": "FieldsV1",
            "fieldsV1": {"f:metadata": {"f:labels": {"f:app": {}}}, "f:spec": {"f:paused": {}, "f:sources": {}}},
        }])
        .to_string()
    );
}

#[test]
fn fields_v1_of_an_apply_matches_what_kube_writes() {
    let applied = config(json!({"labels": {"app": "web"}}), json!({"paused": true}));
    let object = apply_ok(None, &applied, "mgr", T1);
    assert_eq!(
        fields(&object, "mgr", "Apply").as_deref(),
        Some(r#"{"f:metadata":{"f:labels":{"f:app":{}}},"f:spec":{"f:paused":{}}}"#)
    );
}

#[test]
fn reapplying_without_a_field_removes_it() {
    let first = apply_ok(None, &config(json!({}), json!({"paused": true, "format": "helm"})), "mgr", T1);
    let second = apply_ok(Some(&first), &config(json!({}), json!({"format": "helm"})), "mgr", T2);
    assert_eq!(second["spec"], json!({"format": "helm"}));
    assert_eq!(fields(&second, "mgr", "Apply").as_deref(), Some(r#"{"f:spec":{"f:format":{}}}"#));
    assert_eq!(entry(&second, "mgr", "Apply")["time"], T2);
}

#[test]
fn reapplying_the_same_configuration_changes_nothing() {
    let applied = config(json!({}), json!({"paused": true}));
    let first = apply_ok(None, &applied, "mgr", T1);
    let second = apply_ok(Some(&first), &applied, "mgr", T2);
    assert_eq!(first, second);
    assert_eq!(entry(&second, "mgr", "Apply")["time"], T1);
}

#[test]
fn applying_an_empty_configuration_removes_everything_the_manager_applied() {
    let first = apply_ok(None, &config(json!({"labels": {"a": "1"}}), json!({"paused": true})), "mgr", T1);
    let empty = json!({"apiVersion": API, "kind": "Bundle", "metadata": {"name": "b"}});
    let second = apply_ok(Some(&first), &empty, "mgr", T2);
    assert_eq!(second.get("spec"), None);
    assert_eq!(second["metadata"].get("labels"), None);
    assert_eq!(second["metadata"]["name"], "b");
    assert_eq!(second["metadata"].get("managedFields"), None);
}

#[test]
fn applying_null_removes_the_field_and_keeps_owning_it() {
    let first = apply_ok(None, &config(json!({}), json!({"paused": true, "format": "helm"})), "mgr", T1);
    let second = apply_ok(Some(&first), &config(json!({}), json!({"paused": null, "format": "helm"})), "mgr", T2);
    assert_eq!(second["spec"], json!({"format": "helm"}));
    assert_eq!(fields(&second, "mgr", "Apply").as_deref(), Some(r#"{"f:spec":{"f:format":{},"f:paused":{}}}"#));
}

#[test]
fn two_appliers_share_a_field_with_the_same_value() {
    let a = apply_ok(None, &config(json!({}), json!({"paused": true, "format": "helm"})), "a", T1);
    let b = apply_ok(Some(&a), &config(json!({}), json!({"paused": true})), "b", T2);
    assert_eq!(fields(&b, "a", "Apply").as_deref(), Some(r#"{"f:spec":{"f:format":{},"f:paused":{}}}"#));
    assert_eq!(fields(&b, "b", "Apply").as_deref(), Some(r#"{"f:spec":{"f:paused":{}}}"#));
    // a stops applying paused: b still owns it, so it stays.
    let a2 = apply_ok(Some(&b), &config(json!({}), json!({"format": "helm"})), "a", T3);
    assert_eq!(a2["spec"], json!({"paused": true, "format": "helm"}));
    // Once a no longer owns it, b changes it freely.
    let b2 = apply_ok(Some(&a2), &config(json!({}), json!({"paused": false})), "b", T3);
    assert_eq!(b2["spec"]["paused"], false);
    // While both own it, changing it conflicts with the other applier.
    let conflicts = conflicts(apply_err(&b, &config(json!({}), json!({"paused": false})), "b"));
    assert_eq!(
        conflicts,
        vec![Conflict { manager: "a".into(), field: ".spec.paused".into(), message: "conflict with \"a\"".into() }]
    );
}

/// An object created with `paused: false` by a non-apply write of `manager`.
fn created_by_update(manager: &str) -> Value {
    update_ok(None, config(json!({}), json!({"paused": false, "format": "helm"})), manager, None, T1)
}

#[test]
fn conflict_with_an_update_manager_has_kubes_message() {
    let live = created_by_update("kubectl-client-side-apply");
    let error = apply_err(&live, &config(json!({}), json!({"paused": true})), "kubectl");
    assert_eq!(
        error.to_string(),
        format!("Apply failed with 1 conflict: conflict with \"kubectl-client-side-apply\" using {API}: .spec.paused")
    );
    let conflicts = conflicts(error);
    assert_eq!(conflicts[0].field, ".spec.paused");
    assert_eq!(conflicts[0].message, format!("conflict with \"kubectl-client-side-apply\" using {API}"));
    assert_eq!(conflicts[0].manager, "kubectl-client-side-apply");
}

#[test]
fn applying_an_equal_value_is_no_conflict_and_shares_ownership() {
    let live = created_by_update("kubectl-edit");
    let object = apply_ok(Some(&live), &config(json!({}), json!({"paused": false})), "kubectl", T2);
    assert_eq!(fields(&object, "kubectl", "Apply").as_deref(), Some(r#"{"f:spec":{"f:paused":{}}}"#));
    assert_eq!(
        fields(&object, "kubectl-edit", "Update").as_deref(),
        Some(r#"{"f:spec":{".":{},"f:format":{},"f:paused":{}}}"#)
    );
}

#[test]
fn several_conflicts_are_listed_by_manager() {
    let live = created_by_update("editor");
    let live = apply_ok(Some(&live), &config(json!({"labels": {"team": "x"}}), json!({})), "labeller", T2);
    let applied = config(json!({"labels": {"team": "y"}}), json!({"paused": true, "format": "plain"}));
    let error = apply_err(&live, &applied, "kubectl");
    assert_eq!(
        error.to_string(),
        format!(
            "Apply failed with 3 conflicts: conflicts with \"editor\" using {API}:\n- .spec.format\n- .spec.paused\n\
             conflicts with \"labeller\":\n- .metadata.labels.team"
        )
    );
    assert_eq!(conflicts(error).len(), 3);
}

#[test]
fn force_takes_conflicting_fields_over() {
    let live = created_by_update("kubectl-edit");
    let applied = config(json!({}), json!({"paused": true}));
    let object = match apply(&schema(), Some(&live), &applied, "kubectl", true, None, T2) {
        Ok(object) => object,
        Err(e) => panic!("forced apply failed: {e}"),
    };
    assert_eq!(object["spec"], json!({"paused": true, "format": "helm"}));
    assert_eq!(fields(&object, "kubectl", "Apply").as_deref(), Some(r#"{"f:spec":{"f:paused":{}}}"#));
    assert_eq!(fields(&object, "kubectl-edit", "Update").as_deref(), Some(r#"{"f:spec":{".":{},"f:format":{}}}"#));
    // The Update entry lost a field to another manager: its time does not change.
    assert_eq!(entry(&object, "kubectl-edit", "Update")["time"], T1);
}

/// A Bundle whose status the server wrote through `update` on the status subresource.
fn with_status(conditions: Value) -> Value {
    let live = apply_ok(None, &config(json!({}), json!({"sources": [{"upload": {}}]})), "user", T1);
    let mut new = live.clone();
    new["status"] = json!({"phase": "Ready", "conditions": conditions});
    update_ok(Some(&live), new, "stowage", Some("status"), T1)
}

fn status_apply(live: &Value, status: Value, manager: &str, now: &str) -> Result<Value, ApplyError> {
    apply(&schema(), Some(live), &status_config(status), manager, false, Some("status"), now)
}

#[test]
fn conditions_merge_by_type() {
    let live = with_status(json!([{"type": "Unpacked", "status": "True"}]));
    let applied = json!({"conditions": [{"type": "Ready", "status": "True"}]});
    let object = match status_apply(&live, applied, "controller", T2) {
        Ok(object) => object,
        Err(e) => panic!("{e}"),
    };
    assert_eq!(
        object["status"]["conditions"],
        json!([{"type": "Unpacked", "status": "True"}, {"type": "Ready", "status": "True"}])
    );
    assert_eq!(
        fields(&object, "controller", "Apply").as_deref(),
        Some(r#"{"f:status":{"f:conditions":{"k:{\"type\":\"Ready\"}":{".":{},"f:status":{},"f:type":{}}}}}"#)
    );
    assert_eq!(entry(&object, "controller", "Apply")["subresource"], "status");
    assert_eq!(object["spec"], live["spec"]);
    // Changing a condition another manager wrote conflicts on that condition's field only.
    let error =
        match status_apply(&object, json!({"conditions": [{"type": "Unpacked", "status": "False"}]}), "controller", T3)
        {
            Ok(o) => panic!("expected a conflict, got {o}"),
            Err(e) => e,
        };
    assert_eq!(
        error.to_string(),
        format!(
            "Apply failed with 1 conflict: conflict with \"stowage\" with subresource \"status\" using {API}: \
             .status.conditions[type=\"Unpacked\"].status"
        )
    );
    // The applier dropping its condition removes it; the other manager's stays.
    let object = match status_apply(&object, json!({"phase": "Ready"}), "controller", T3) {
        Ok(object) => object,
        Err(e) => panic!("{e}"),
    };
    assert_eq!(object["status"]["conditions"], json!([{"type": "Unpacked", "status": "True"}]));
}

#[test]
fn update_of_status_creates_fields_v1_with_item_markers() {
    let live = with_status(json!([{"type": "Unpacked", "status": "True"}]));
    assert_eq!(
        fields(&live, "stowage", "Update").as_deref(),
        Some(
            r#"{"f:status":{".":{},"f:conditions":{".":{},"k:{\"type\":\"Unpacked\"}":{".":{},"f:status":{},"f:type":{}}},"f:phase":{}}}"#
        )
    );
    assert_eq!(entry(&live, "stowage", "Update")["subresource"], "status");
}

#[test]
fn finalizers_are_a_set() {
    let a = apply_ok(None, &config(json!({"finalizers": ["a"]}), json!({})), "a", T1);
    let b = apply_ok(Some(&a), &config(json!({"finalizers": ["b"]}), json!({})), "b", T2);
    assert_eq!(b["metadata"]["finalizers"], json!(["a", "b"]));
    assert_eq!(
        fields(&b, "a", "Apply").as_deref(),
        Some(r#"{"f:metadata":{"f:finalizers":{"v:\"a\"":{}}},"f:spec":{}}"#)
    );
    assert_eq!(
        fields(&b, "b", "Apply").as_deref(),
        Some(r#"{"f:metadata":{"f:finalizers":{"v:\"b\"":{}}},"f:spec":{}}"#)
    );
    let a2 = apply_ok(Some(&b), &config(json!({}), json!({})), "a", T3);
    assert_eq!(a2["metadata"]["finalizers"], json!(["b"]));
}

#[test]
fn owner_references_merge_by_uid() {
    let owner = |uid: &str| json!({"apiVersion": "v1", "kind": "ConfigMap", "name": uid, "uid": uid});
    let a = apply_ok(None, &config(json!({"ownerReferences": [owner("u1")]}), json!({})), "a", T1);
    let b = apply_ok(Some(&a), &config(json!({"ownerReferences": [owner("u2")]}), json!({})), "b", T2);
    assert_eq!(b["metadata"]["ownerReferences"], json!([owner("u1"), owner("u2")]));
    assert_eq!(
        fields(&b, "b", "Apply").as_deref(),
        Some(
            r#"{"f:metadata":{"f:ownerReferences":{"k:{\"uid\":\"u2\"}":{".":{},"f:apiVersion":{},"f:kind":{},"f:name":{},"f:uid":{}}}},"f:spec":{}}"#
        )
    );
}

#[test]
fn atomic_lists_are_replaced_and_owned_whole() {
    let a = apply_ok(None, &config(json!({}), json!({"sources": [{"image": {"ref": "x"}}, {"upload": {}}]})), "a", T1);
    let a2 = apply_ok(Some(&a), &config(json!({}), json!({"sources": [{"git": {"repository": "r"}}]})), "a", T2);
    assert_eq!(a2["spec"]["sources"], json!([{"git": {"repository": "r"}}]));
    assert_eq!(fields(&a2, "a", "Apply").as_deref(), Some(r#"{"f:spec":{"f:sources":{}}}"#));
    let conflicts = conflicts(apply_err(&a2, &config(json!({}), json!({"sources": [{"upload": {}}]})), "b"));
    assert_eq!(conflicts[0].field, ".spec.sources");
}

#[test]
fn labels_are_owned_one_by_one() {
    let a = apply_ok(None, &config(json!({"labels": {"a": "1"}}), json!({})), "a", T1);
    let b = apply_ok(Some(&a), &config(json!({"labels": {"b": "2"}}), json!({})), "b", T2);
    assert_eq!(b["metadata"]["labels"], json!({"a": "1", "b": "2"}));
    assert_eq!(fields(&b, "b", "Apply").as_deref(), Some(r#"{"f:metadata":{"f:labels":{"f:b":{}}},"f:spec":{}}"#));
    let a2 = apply_ok(Some(&b), &config(json!({"labels": {}}), json!({})), "a", T3);
    assert_eq!(a2["metadata"]["labels"], json!({"b": "2"}));
}

#[test]
fn the_main_resource_neither_changes_nor_owns_status() {
    let live = with_status(json!([{"type": "Unpacked", "status": "True"}]));
    let mut applied = config(json!({}), json!({"paused": true}));
    applied["status"] = json!({"phase": "Hacked"});
    let object = apply_ok(Some(&live), &applied, "user", T2);
    assert_eq!(object["status"], live["status"]);
    assert_eq!(fields(&object, "user", "Apply").as_deref(), Some(r#"{"f:spec":{"f:paused":{}}}"#));
    // An update of the main resource that (wrongly) carries a status change owns none of it.
    let mut new = object.clone();
    new["status"]["phase"] = json!("Other");
    new["spec"]["format"] = json!("helm");
    let updated = update_ok(Some(&object), new, "editor", None, T3);
    assert_eq!(fields(&updated, "editor", "Update").as_deref(), Some(r#"{"f:spec":{"f:format":{}}}"#));
}

#[test]
fn the_status_subresource_changes_and_owns_only_status() {
    let live = with_status(json!([]));
    let mut applied = status_config(json!({"phase": "Done"}));
    applied["spec"] = json!({"paused": true});
    applied["metadata"]["labels"] = json!({"x": "y"});
    let object = match apply(&schema(), Some(&live), &applied, "controller", true, Some("status"), T2) {
        Ok(object) => object,
        Err(e) => panic!("{e}"),
    };
    assert_eq!(object["spec"], live["spec"]);
    assert_eq!(object["metadata"].get("labels"), None);
    assert_eq!(object["status"]["phase"], "Done");
    assert_eq!(fields(&object, "controller", "Apply").as_deref(), Some(r#"{"f:status":{"f:phase":{}}}"#));
    assert!(apply(&schema(), None, &applied, "controller", false, Some("status"), T2).is_err());
}

#[test]
fn update_takes_ownership_of_what_it_changes() {
    let applied = apply_ok(None, &config(json!({}), json!({"paused": true, "format": "helm"})), "kubectl", T1);
    let mut new = applied.clone();
    new["spec"]["paused"] = json!(false);
    let edited = update_ok(Some(&applied), new, "kubectl-edit", None, T2);
    assert_eq!(fields(&edited, "kubectl", "Apply").as_deref(), Some(r#"{"f:spec":{"f:format":{}}}"#));
    assert_eq!(fields(&edited, "kubectl-edit", "Update").as_deref(), Some(r#"{"f:spec":{"f:paused":{}}}"#));
    assert_eq!(entry(&edited, "kubectl-edit", "Update")["time"], T2);
    // Apply entries come first.
    let managers: Vec<Value> = entries(&edited).iter().map(|e| e["manager"].clone()).collect();
    assert_eq!(managers, vec![json!("kubectl"), json!("kubectl-edit")]);
    // Removing a field takes it out of every set.
    let mut new = edited.clone();
    if let Some(spec) = new["spec"].as_object_mut() {
        spec.remove("format");
    }
    let removed = update_ok(Some(&edited), new, "kubectl-edit", None, T3);
    assert_eq!(fields(&removed, "kubectl", "Apply"), None);
    // The entry kept its set: nothing it owns changed, so its time did not either.
    assert_eq!(entry(&removed, "kubectl-edit", "Update")["time"], T2);
}

#[test]
fn update_on_create_marks_created_containers() {
    let new = config(json!({"labels": {"app": "web"}}), json!({"paused": true, "sources": [{"upload": {}}]}));
    let created = update_ok(None, new, "kubectl-create", None, T1);
    assert_eq!(
        fields(&created, "kubectl-create", "Update").as_deref(),
        Some(r#"{"f:metadata":{"f:labels":{".":{},"f:app":{}}},"f:spec":{".":{},"f:paused":{},"f:sources":{}}}"#)
    );
    assert_eq!(
        entry(&created, "kubectl-create", "Update").to_string(),
        json!({
            "manager": "kubectl-create", "operation": "Update", "apiVersion": API, "time": T1, "fieldsType": "FieldsV1",
            "fieldsV1": {"f:metadata": {"f:labels": {".": {}, "f:app": {}}}, "f:spec": {".": {}, "f:paused": {}, "f:sources": {}}},
        })
        .to_string()
    );
}

#[test]
fn an_update_that_changes_nothing_records_nothing() {
    let created = created_by_update("a");
    let same = update_ok(Some(&created), created.clone(), "b", None, T2);
    assert_eq!(same["metadata"]["managedFields"], created["metadata"]["managedFields"]);
}

#[test]
fn clients_can_reset_managed_fields() {
    let created = created_by_update("a");
    // Sent back unchanged (or not at all): kept.
    let mut without = created.clone();
    if let Some(meta) = without["metadata"].as_object_mut() {
        meta.remove("managedFields");
    }
    let kept = update_ok(Some(&created), without, "b", None, T2);
    assert_eq!(kept["metadata"]["managedFields"], created["metadata"]["managedFields"]);
    // An empty list clears them.
    let mut cleared = created.clone();
    cleared["metadata"]["managedFields"] = json!([]);
    let cleared = update_ok(Some(&created), cleared, "b", None, T2);
    assert_eq!(cleared["metadata"].get("managedFields"), None);
    // Other entries replace them.
    let mut replaced = created.clone();
    let custom = json!([{"manager": "x", "operation": "Apply", "apiVersion": API, "time": T1, "fieldsType": "FieldsV1",
        "fieldsV1": {"f:spec": {"f:paused": {}}}}]);
    replaced["metadata"]["managedFields"] = custom.clone();
    let replaced = update_ok(Some(&created), replaced, "b", None, T2);
    assert_eq!(replaced["metadata"]["managedFields"], custom);
    // Undecodable ones are ignored: the tracked ones stay.
    let mut garbage = created.clone();
    garbage["metadata"]["managedFields"] = json!([{"manager": "x", "operation": "Delete"}]);
    let garbage = update_ok(Some(&created), garbage, "b", None, T2);
    assert_eq!(garbage["metadata"]["managedFields"], created["metadata"]["managedFields"]);
}

#[test]
fn the_status_subresource_ignores_managed_fields_sent_by_clients() {
    let live = with_status(json!([]));
    let mut new = live.clone();
    new["metadata"]["managedFields"] = json!([]);
    let updated = update_ok(Some(&live), new, "x", Some("status"), T2);
    assert_eq!(updated["metadata"]["managedFields"], live["metadata"]["managedFields"]);
}

#[test]
fn first_apply_to_an_untracked_object_attributes_it_to_before_first_apply() {
    let mut live = config(json!({"labels": {"app": "web"}}), json!({"paused": false, "format": "helm"}));
    live["metadata"]["uid"] = json!("1234");
    let error = apply_err(&live, &config(json!({}), json!({"paused": true})), "kubectl");
    assert_eq!(
        error.to_string(),
        format!("Apply failed with 1 conflict: conflict with \"before-first-apply\" using {API}: .spec.paused")
    );
    let object = apply_ok(Some(&live), &config(json!({}), json!({"revisionHistoryLimit": 3})), "kubectl", T2);
    assert_eq!(
        fields(&object, "before-first-apply", "Update").as_deref(),
        Some(r#"{"f:metadata":{"f:labels":{".":{},"f:app":{}}},"f:spec":{".":{},"f:format":{},"f:paused":{}}}"#)
    );
    assert_eq!(object["metadata"]["uid"], "1234");
}

#[test]
fn invalid_configurations_are_refused() {
    let live = created_by_update("a");
    let mut with_managed = config(json!({}), json!({}));
    with_managed["metadata"]["managedFields"] = json!([]);
    let error = apply_err(&live, &with_managed, "m");
    assert!(matches!(&error, ApplyError::BadRequest(m) if m == "metadata.managedFields must be nil"), "{error:?}");

    let error = apply_err(&live, &config(json!({"finalizers": ["a", "a"]}), json!({})), "m");
    assert!(
        matches!(&error, ApplyError::Invalid(m) if m == ".metadata.finalizers: duplicate entries for key [=\"a\"]"),
        "{error:?}"
    );

    let error = apply_err(&live, &config(json!({}), json!({"bogus": 1})), "m");
    assert!(matches!(&error, ApplyError::Invalid(m) if m == ".spec.bogus: field not declared in schema"), "{error:?}");

    let status = with_status(json!([]));
    let error = match status_apply(&status, json!({"conditions": [{"status": "True"}]}), "m", T2) {
        Ok(o) => panic!("expected an error, got {o}"),
        Err(e) => e,
    };
    assert_eq!(
        error.to_string(),
        ".status.conditions: element 0: associative list with keys has an element that omits key field \"type\" \
         (and doesn't have default value)"
    );

    let mut other_version = config(json!({}), json!({}));
    other_version["apiVersion"] = json!("content.stowage.dev/v2");
    assert!(matches!(apply_err(&live, &other_version, "m"), ApplyError::BadRequest(_)));
    let no_name = json!({"apiVersion": API, "kind": "Bundle", "metadata": {}});
    assert!(matches!(apply_err(&live, &no_name, "m"), ApplyError::BadRequest(_)));
    assert!(matches!(
        apply(&schema(), None, &config(json!({}), json!({})), "m", false, Some("scale"), T1),
        Err(ApplyError::BadRequest(_))
    ));
}

#[test]
fn update_managers_beyond_ten_are_folded_into_ancient_changes() {
    let mut object = created_by_update("m0");
    for i in 1..12 {
        let mut new = object.clone();
        let mut labels = object["metadata"]["labels"].as_object().cloned().unwrap_or_default();
        labels.insert(format!("l{i}"), json!("x"));
        new["metadata"]["labels"] = Value::Object(labels);
        object = update_ok(Some(&object), new, &format!("m{i}"), None, &format!("2024-01-{:02}T00:00:00Z", i + 1));
    }
    let managers: Vec<String> =
        entries(&object).iter().filter_map(|e| e["manager"].as_str().map(String::from)).collect();
    assert_eq!(managers.len(), 10);
    assert_eq!(managers[0], "ancient-changes");
    assert!(!managers.contains(&"m0".to_string()) && !managers.contains(&"m2".to_string()));
    let ancient = fields(&object, "ancient-changes", "Update").unwrap_or_default();
    assert!(ancient.contains("f:paused") && ancient.contains("f:l1") && ancient.contains("f:l2"), "{ancient}");
}

#[test]
fn fields_v1_round_trips() {
    let encoded = json!({
        "f:metadata": {"f:finalizers": {".": {}, "v:\"a\"": {}}, "f:labels": {"f:app": {}}},
        "f:status": {"f:conditions": {"k:{\"type\":\"Ready\"}": {".": {}, "f:status": {}}}},
        "f:x": {"i:0": {}},
    });
    let set = match FieldSet::from_fields_v1(&encoded) {
        Ok(set) => set,
        Err(e) => panic!("{e}"),
    };
    assert_eq!(set.to_fields_v1().to_string(), encoded.to_string());
    for bad in [json!({"x:y": {}}), json!({"f:a": 1}), json!({"k:[1]": {}}), json!([]), json!({"i:-1": {}})] {
        assert!(FieldSet::from_fields_v1(&bad).is_err(), "{bad}");
    }
}

#[test]
fn manager_names_come_from_the_user_agent() {
    assert_eq!(manager_from_user_agent(Some("kubectl/v1.30.0 (linux/amd64) kubernetes/7c48c2b")), "kubectl");
    assert_eq!(manager_from_user_agent(Some("my controller\u{7}/1")), "my controller");
    assert_eq!(manager_from_user_agent(None), "");
    assert_eq!(manager_from_user_agent(Some(&"é".repeat(100))).len(), 128);
}

#[test]
fn hostile_inputs_do_not_panic() {
    let live = with_status(json!([{"type": "A"}, {"type": "A"}, {"no": "type"}]));
    let weird = [
        json!({"apiVersion": API, "kind": "Bundle", "metadata": {"name": "b", "labels": "x", "finalizers": {"a": 1}}, "spec": "s"}),
        json!({"apiVersion": API, "kind": "Bundle", "metadata": {"name": "b", "finalizers": [null, [1], {"a": 1}]}, "spec": []}),
        json!({"apiVersion": API, "kind": "Bundle", "metadata": {"name": "b", "ownerReferences": [1, null, {}]}}),
        json!({"apiVersion": API, "kind": "Bundle", "metadata": {"name": "b"}, "status": {"conditions": "x"}}),
        json!({"apiVersion": API, "kind": "Bundle", "metadata": {"name": "b"}, "status": {"conditions": [{"type": "A"}]}}),
        json!([1, 2]),
        json!(null),
    ];
    for applied in &weird {
        for subresource in [None, Some("status")] {
            let _ = apply(&schema(), Some(&live), applied, "m", true, subresource, T2);
            let _ = apply(&schema(), None, applied, "m", false, subresource, T2);
            let _ = update(&schema(), Some(&live), applied.clone(), "m", subresource, T2);
            let _ = update(&schema(), Some(applied), live.clone(), "m", subresource, T2);
        }
    }
    let mut garbage = live.clone();
    garbage["metadata"]["managedFields"] = json!([{"manager": 1, "fieldsV1": "x"}, 7]);
    let _ =
        apply(&schema(), Some(&garbage), &config(json!({}), json!({"paused": true})), "m", false, None, "not a time");
    let _ = update(&schema(), Some(&garbage), live.clone(), "m", None, T2);
}

#[test]
fn items_the_configuration_names_take_its_order_and_other_items_keep_their_place() {
    let live = with_status(json!([{"type": "A"}, {"type": "B"}, {"type": "C"}]));
    let applied = json!({"conditions": [{"type": "C"}, {"type": "X"}, {"type": "A"}]});
    let object = match apply(&schema(), Some(&live), &status_config(applied), "ctl", true, Some("status"), T2) {
        Ok(object) => object,
        Err(e) => panic!("{e}"),
    };
    let types: Vec<&str> =
        object["status"]["conditions"].as_array().into_iter().flatten().filter_map(|c| c["type"].as_str()).collect();
    assert_eq!(types, vec!["B", "C", "X", "A"]);
}

#[test]
fn preserve_unknown_fields_subtrees_are_granular_maps_with_atomic_lists() {
    let schema = (crate::strategy::bundlecontent::BUNDLE_CONTENT.schema)();
    let content = |source: Value| json!({"apiVersion": API, "kind": "BundleContent", "metadata": {"name": "c"}, "spec": {"formatDetails": source}});
    let a = match apply(&schema, None, &content(json!({"image": {"ref": "x"}, "tags": [1, 2]})), "a", false, None, T1) {
        Ok(object) => object,
        Err(e) => panic!("{e}"),
    };
    assert_eq!(
        fields(&a, "a", "Apply").as_deref(),
        Some(r#"{"f:spec":{"f:formatDetails":{"f:image":{".":{},"f:ref":{}},"f:tags":{}}}}"#)
    );
    let b = match apply(&schema, Some(&a), &content(json!({"image": {"digest": "d"}})), "b", false, None, T2) {
        Ok(object) => object,
        Err(e) => panic!("{e}"),
    };
    assert_eq!(b["spec"]["formatDetails"], json!({"image": {"ref": "x", "digest": "d"}, "tags": [1, 2]}));
    let error = match apply(&schema, Some(&b), &content(json!({"tags": [3]})), "b", false, None, T3) {
        Ok(object) => panic!("expected a conflict, got {object}"),
        Err(e) => e,
    };
    assert_eq!(conflicts(error)[0].field, ".spec.formatDetails.tags");
}

#[test]
fn entries_are_ordered_apply_first_then_by_time() {
    let object = created_by_update("zz-early");
    let mut new = object.clone();
    new["spec"]["paused"] = json!(true);
    let object = update_ok(Some(&object), new, "aa-late", None, T3);
    let object = apply_ok(Some(&object), &config(json!({"labels": {"x": "y"}}), json!({})), "mm", T2);
    let order: Vec<(Value, Value)> =
        entries(&object).iter().map(|e| (e["manager"].clone(), e["operation"].clone())).collect();
    assert_eq!(
        order,
        vec![(json!("mm"), json!("Apply")), (json!("zz-early"), json!("Update")), (json!("aa-late"), json!("Update")),]
    );
}
