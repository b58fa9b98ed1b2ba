use std::collections::BTreeMap;

use serde_json::json;

use super::*;
use crate::api::{AvailableVersions, Condition, FormatDetails};
use crate::api::{GitRef, GitSource, HttpSource, ImageSource, Releases, ResolvedSource, Source, UploadSource};
use crate::strategy::schema_check::{declared, written};

/// A Bundle with every field set (sources of every kind, though one Bundle may have only one).
fn full_bundle() -> Bundle {
    let image = ImageSource {
        reference: "r/x:1".into(),
        semver: "1.x".into(),
        pull_secret: "s".into(),
        platform: "linux/arm64".into(),
    };
    let git = GitSource {
        repository: "https://g".into(),
        reference: GitRef { commit: "c".into(), tag: "t".into(), branch: "b".into(), semver: "1.x".into() },
        directory: "d".into(),
        auth_secret: "s".into(),
    };
    let releases = Releases { repository: "https://g".into(), semver: "1.x".into() };
    let http = HttpSource {
        url: "https://h/{version}".into(),
        sha256: "0".repeat(64),
        auth_secret: "s".into(),
        releases: Some(releases),
    };
    let source = Source {
        image: Some(image),
        git: Some(git),
        http: Some(http),
        upload: Some(UploadSource {}),
        destination: "x".into(),
    };
    let spec = BundleSpec {
        sources: vec![source],
        format: Some(crate::api::Format::Helm),
        paused: Some(false),
        revision_history_limit: Some(3),
        poll_interval: Some("1m".into()),
        allow_empty: Some(false),
        revision: Some("b-0123456789".into()),
    };
    let condition = Condition {
        type_: "Unpacked".into(),
        status: "True".into(),
        reason: "Unpacked".into(),
        message: "m".into(),
        last_transition_time: "2026-01-01T00:00:00Z".into(),
        observed_generation: Some(1),
    };
    let status = BundleStatus {
        observed_generation: Some(1),
        phase: Some("Unpacked".into()),
        conditions: vec![condition],
        resolved_sources: vec![ResolvedSource::Upload { digest: "sha256:0".into() }],
        content_name: Some("c".into()),
        latest_content_name: Some("c".into()),
        digest: Some("sha256:0".into()),
        format: Some("helm".into()),
        format_details: Some(FormatDetails { objects: BTreeMap::from([("Pod".into(), 1)]), ..Default::default() }),
        files: Some(1),
        size: Some(1),
        available_versions: vec![AvailableVersions { source: 0, versions: vec!["1.0.0".into()] }],
        next_poll_time: Some("2026-01-01T00:00:00Z".into()),
        last_handled_refresh: Some("now".into()),
    };
    Bundle { status: Some(status), ..Bundle::new("b", spec) }
}

#[test]
fn the_schema_declares_exactly_the_typed_fields() {
    let schema = schema();
    let value = serde_json::to_value(full_bundle()).unwrap();
    let of = |set: std::collections::BTreeSet<String>| -> Vec<String> {
        set.into_iter().filter(|p| p.starts_with("spec") || p.starts_with("status")).collect()
    };
    assert_eq!(of(written(&schema, &value)), of(declared(&schema)));
}

#[test]
fn defaults_are_added_and_never_rewrite_what_the_user_wrote() {
    let mut obj = json!({"spec": {"sources": [{"upload": {}, "destination": ""}]}});
    default(&mut obj);
    assert_eq!(obj["spec"]["revisionHistoryLimit"], 3);
    assert_eq!(obj["spec"]["sources"][0]["destination"], "", "the user's own field stays as written");
    let mut zero = json!({"spec": {"sources": [{"upload": {}}], "revisionHistoryLimit": 0}});
    default(&mut zero);
    assert_eq!(zero["spec"]["revisionHistoryLimit"], 0);
}

#[test]
fn validation_names_the_field() {
    let two = json!({"spec": {"sources": [{"upload": {}, "http": {"url": "https://x"}}]}});
    assert_eq!(validate(&two)[0].field, "spec.sources[0]");
    assert_eq!(validate(&json!({"spec": {}}))[0].field, "spec.sources");
    assert_eq!(validate(&json!({}))[0].field, "spec.sources");
}

#[test]
fn secret_refs_name_their_fields() {
    let obj = json!({"spec": {"sources": [{"image": {"ref": "r", "pullSecret": "pull"}}, {"git": {"repository": "r", "authSecret": "git"}}]}});
    assert_eq!(
        secret_refs(&obj),
        vec![
            ("spec.sources[0].image.pullSecret".to_string(), "pull".to_string()),
            ("spec.sources[1].git.authSecret".to_string(), "git".to_string())
        ]
    );
}

#[test]
fn rows_follow_the_columns() {
    let value = serde_json::to_value(full_bundle()).unwrap();
    let cells = row(&value);
    assert_eq!(cells.len(), BUNDLE.columns.len());
    assert_eq!(cells[0], "b");
    assert_eq!(cells[1], "helm");
    assert_eq!(cells[8], "image");
}
