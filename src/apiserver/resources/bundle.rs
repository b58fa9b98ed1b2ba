//! `Bundle`: where a bundle's content comes from (user-written `spec`) and what is served now
//! (server-written `status`).

use serde_json::{json, Value};

use super::{short_digest, str_at, u64_at, Column, ResourceDef, AGE_COLUMN, NAME_COLUMN};
use crate::apiserver::meta;
use crate::apiserver::schema::{array_of, boolean, conditions, doc_string, integer, kind_root, object, string};
use crate::apiserver::status::Cause;
use crate::storage::{ObjectWrite, StorageError, Store};

pub const FORMATS: [&str; 3] = ["plain", "registry-v1", "helm"];
const SOURCE_KINDS: [&str; 4] = ["image", "git", "http", "upload"];

pub static BUNDLE: ResourceDef = ResourceDef {
    plural: "bundles",
    singular: "bundle",
    kind: "Bundle",
    list_kind: "BundleList",
    short_names: &["bdl"],
    user_writable: true,
    schema,
    validate,
    initial_status,
    columns: &[
        NAME_COLUMN,
        Column { name: "Format", kind: "string", format: "", description: "Bundle format.", priority: 0 },
        Column { name: "Phase", kind: "string", format: "", description: "Lifecycle phase.", priority: 0 },
        Column { name: "Files", kind: "integer", format: "", description: "Files in the served content.", priority: 0 },
        Column { name: "Size", kind: "string", format: "", description: "Bytes of the served content.", priority: 0 },
        Column {
            name: "Digest",
            kind: "string",
            format: "",
            description: "Digest of the served content.",
            priority: 0,
        },
        AGE_COLUMN,
        Column { name: "Content", kind: "string", format: "", description: "The BundleContent served.", priority: 1 },
        Column { name: "Sources", kind: "string", format: "", description: "Kinds of sources.", priority: 1 },
    ],
    row,
    secret_refs,
    on_delete,
};

fn schema() -> Value {
    let secret_ref = doc_string("Name of a Secret in the Bundle's namespace.");
    let source = object(
        "Where content comes from: exactly one of image, git, http, upload.",
        json!({
            "image": object("An OCI image or artifact.", json!({
                "ref": doc_string("Image reference, by tag or digest."),
                "pullSecret": secret_ref,
                "platform": doc_string("os/arch[/variant] to select from an image index."),
            })),
            "git": object("A git repository.", json!({
                "repository": doc_string("Repository URL (https)."),
                "ref": object("Exactly one of commit, tag, branch.", json!({"commit": string(), "tag": string(), "branch": string()})),
                "directory": doc_string("Subdirectory to take."),
                "authSecret": secret_ref,
            })),
            "http": object("A tar, tar.gz or tar.zst URL.", json!({
                "url": string(),
                "sha256": doc_string("Expected sha256 of the downloaded file (hex)."),
                "authSecret": secret_ref,
            })),
            "upload": object("Content arrives by PUT on the content subresource.", json!({})),
            "destination": doc_string("Path prefix under which this source's files are placed."),
        }),
    );
    let spec = object(
        "What the bundle contains.",
        json!({
            "sources": array_of(source),
            "format": {"type": "string", "enum": FORMATS, "description": "plain, registry-v1 or helm; empty to detect."},
            "paused": boolean(),
            "revisionHistoryLimit": integer(),
            "pollInterval": doc_string("How often to re-resolve floating references (e.g. 10m); empty = resolve once."),
            "allowEmpty": {"type": "boolean", "description": "Accept content that holds no files (nothing, or only \
                directories). By default such an archive or source is refused (`archive holds no files`) and the \
                Bundle keeps serving its last good content."},
        }),
    );
    let status = object(
        "What is served now.",
        json!({
            "observedGeneration": integer(),
            "phase": string(),
            "conditions": conditions(),
            "resolvedSources": array_of(json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true})),
            "contentName": string(),
            "digest": string(),
            "format": string(),
            "formatDetails": {"type": "object", "x-kubernetes-preserve-unknown-fields": true,
                "description": "Objects by kind; chart and version; package and clusterServiceVersion."},
            "files": integer(),
            "size": integer(),
        }),
    );
    kind_root("A bundle of content (operator bundle, Helm chart, manifests) and where it comes from.", spec, status)
}

fn validate(obj: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    let sources = obj.pointer("/spec/sources").and_then(Value::as_array);
    match sources {
        None => causes.push(Cause::required("spec.sources", "at least one source is required")),
        Some(list) if list.is_empty() => {
            causes.push(Cause::required("spec.sources", "at least one source is required"))
        }
        Some(list) => {
            for (i, source) in list.iter().enumerate() {
                causes.extend(validate_source(&format!("spec.sources[{i}]"), source));
            }
            let uploads = list.iter().filter(|s| s.get("upload").is_some_and(|u| !u.is_null())).count();
            if uploads > 0 && list.len() > 1 {
                causes.push(Cause::invalid(
                    "spec.sources",
                    &json!(format!("{} sources", list.len())),
                    "an upload source must be the only source",
                ));
            }
        }
    }
    if let Some(limit) = obj.pointer("/spec/revisionHistoryLimit").and_then(Value::as_i64) {
        if limit < 0 {
            causes.push(Cause::invalid(
                "spec.revisionHistoryLimit",
                &json!(limit),
                "must be greater than or equal to 0",
            ));
        }
    }
    let poll = str_at(obj, "/spec/pollInterval");
    if !poll.is_empty() && parse_duration(poll).is_none() {
        causes.push(Cause::invalid(
            "spec.pollInterval",
            &json!(poll),
            "must be a duration such as 30s, 10m or 1h30m, and at most 2562047h (about 292 years)",
        ));
    }
    causes
}

fn validate_source(path: &str, source: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    let present: Vec<&str> =
        SOURCE_KINDS.iter().copied().filter(|k| source.get(*k).is_some_and(|v| !v.is_null())).collect();
    if present.len() != 1 {
        causes.push(Cause::invalid(path, &json!(present), "must specify exactly one of image, git, http, upload"));
    }
    let required = |field: &str, pointer: &str, causes: &mut Vec<Cause>| {
        if str_at(source, pointer).is_empty() {
            causes.push(Cause::required(format!("{path}.{field}"), "must be set"));
        }
    };
    if source.get("image").is_some_and(Value::is_object) {
        required("image.ref", "/image/ref", &mut causes);
    }
    if let Some(git) = source.get("git").filter(|g| g.is_object()) {
        required("git.repository", "/git/repository", &mut causes);
        let refs = ["commit", "tag", "branch"].iter().filter(|k| !str_at(git, &format!("/ref/{k}")).is_empty()).count();
        if refs > 1 {
            causes.push(Cause::invalid(
                format!("{path}.git.ref"),
                git.get("ref").unwrap_or(&Value::Null),
                "at most one of commit, tag, branch",
            ));
        }
    }
    if source.get("http").is_some_and(Value::is_object) {
        let url = str_at(source, "/http/url");
        if !(url.starts_with("https://") || url.starts_with("http://")) {
            causes.push(Cause::invalid(format!("{path}.http.url"), &json!(url), "must be an http or https URL"));
        }
        let sha = str_at(source, "/http/sha256");
        let valid_sha = sha.len() == 64 && sha.bytes().all(|b| b.is_ascii_hexdigit());
        if !sha.is_empty() && !valid_sha {
            causes.push(Cause::invalid(format!("{path}.http.sha256"), &json!(sha), "must be 64 hexadecimal digits"));
        }
    }
    for (kind, field) in [("image", "pullSecret"), ("git", "authSecret"), ("http", "authSecret")] {
        let secret = str_at(source, &format!("/{kind}/{field}"));
        for error in meta::dns1123_subdomain_errors(secret).into_iter().take(1).filter(|_| !secret.is_empty()) {
            // Secrets are read from the Bundle's own namespace only: a name, never `ns/name`.
            causes.push(Cause::invalid(format!("{path}.{kind}.{field}"), &json!(secret), error));
        }
    }
    let destination = str_at(source, "/destination");
    if !destination.is_empty()
        && (destination.starts_with('/') || destination.split('/').any(|c| c == ".." || c == "."))
    {
        causes.push(Cause::invalid(
            format!("{path}.destination"),
            &json!(destination),
            "must be a relative path without '.' or '..' components",
        ));
    }
    causes
}

/// `spec.allowEmpty`: whether content without files is intended (absent = false).
pub fn allows_empty(bundle: &Value) -> bool {
    bundle.pointer("/spec/allowEmpty").and_then(Value::as_bool).unwrap_or(false)
}

/// The longest duration [`parse_duration`] accepts: Go's `time.Duration` range (2^63-1 ns, about
/// 292 years), so the server takes exactly the durations a Go client (kubectl, `metav1.Duration`)
/// can write, and everything it takes fits a timer and an `Instant`.
pub const MAX_DURATION: std::time::Duration = std::time::Duration::new(9_223_372_036, 854_775_807);

/// Go-style durations: `1h30m`, `10m`, `45s`, `500ms`; `None` for anything else, also for one
/// beyond [`MAX_DURATION`] (Go's `time.ParseDuration` refuses those too).
pub fn parse_duration(text: &str) -> Option<std::time::Duration> {
    let mut total = 0f64;
    let mut number = String::new();
    let mut chars = text.chars().peekable();
    let mut any = false;
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() || c == '.' {
            number.push(c);
            continue;
        }
        let value: f64 = number.parse().ok()?;
        number.clear();
        let unit = match c {
            'h' => 3600.0,
            's' => 1.0,
            'm' if chars.peek() == Some(&'s') => {
                chars.next();
                0.001
            }
            'm' => 60.0,
            _ => return None,
        };
        total += value * unit;
        any = true;
    }
    if !number.is_empty() || !any {
        return None;
    }
    // Not finite or out of range: refused, never a panic (`Duration::from_secs_f64` would).
    std::time::Duration::try_from_secs_f64(total).ok().filter(|d| *d <= MAX_DURATION)
}

fn initial_status(obj: &Value) -> Option<Value> {
    let generation = u64_at(obj, "/metadata/generation").unwrap_or(1);
    let uploads = obj
        .pointer("/spec/sources")
        .and_then(Value::as_array)
        .is_some_and(|s| s.iter().any(|src| src.get("upload").is_some()));
    let (reason, message) = if uploads {
        ("AwaitingUpload", "waiting for content to be uploaded to the content subresource")
    } else {
        ("Pending", "waiting to be unpacked")
    };
    Some(json!({
        "observedGeneration": generation,
        "phase": "Pending",
        "conditions": [{
            "type": "Unpacked",
            "status": "False",
            "reason": reason,
            "message": message,
            "lastTransitionTime": meta::now_timestamp(),
            "observedGeneration": generation,
        }],
    }))
}

/// `spec.sources[i].image.pullSecret`, `.git.authSecret`, `.http.authSecret`.
fn secret_refs(obj: &Value) -> Vec<(String, String)> {
    let sources = obj.pointer("/spec/sources").and_then(Value::as_array).cloned().unwrap_or_default();
    let mut refs = Vec::new();
    for (i, source) in sources.iter().enumerate() {
        for (kind, field) in [("image", "pullSecret"), ("git", "authSecret"), ("http", "authSecret")] {
            let name = str_at(source, &format!("/{kind}/{field}"));
            if !name.is_empty() {
                refs.push((format!("spec.sources[{i}].{kind}.{field}"), name.to_string()));
            }
        }
    }
    refs
}

/// Nothing to do in the same write: a Bundle's BundleContents name it as their owner, and the
/// garbage collector deletes or orphans them per the delete's propagation policy.
fn on_delete(_store: &Store, _bundle: &Value) -> Result<Vec<ObjectWrite>, StorageError> {
    Ok(Vec::new())
}

fn row(obj: &Value) -> Vec<Value> {
    let sources: Vec<&str> = obj
        .pointer("/spec/sources")
        .and_then(Value::as_array)
        .map(|list| list.iter().filter_map(|s| SOURCE_KINDS.iter().copied().find(|k| s.get(*k).is_some())).collect())
        .unwrap_or_default();
    let size = u64_at(obj, "/status/size");
    vec![
        json!(str_at(obj, "/metadata/name")),
        json!(str_at(obj, "/status/format")),
        json!(str_at(obj, "/status/phase")),
        u64_at(obj, "/status/files").map_or(Value::Null, |n| json!(n)),
        json!(size.map(meta::human_bytes).unwrap_or_default()),
        json!(short_digest(str_at(obj, "/status/digest"))),
        json!(meta::human_age(obj.pointer("/metadata/creationTimestamp").and_then(Value::as_str))),
        json!(str_at(obj, "/status/contentName")),
        json!(sources.join(",")),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_must_name_exactly_one_kind() {
        let ok = json!({"spec": {"sources": [{"upload": {}}]}});
        assert!(validate(&ok).is_empty());
        let two = json!({"spec": {"sources": [{"upload": {}, "http": {"url": "https://x"}}]}});
        assert_eq!(validate(&two)[0].field, "spec.sources[0]");
        let none = json!({"spec": {}});
        assert_eq!(validate(&none)[0].field, "spec.sources");
        let escape = json!({"spec": {"sources": [{"upload": {}, "destination": "../x"}]}});
        assert_eq!(validate(&escape)[0].field, "spec.sources[0].destination");
    }

    #[test]
    fn empty_content_is_intended_only_when_the_spec_says_so() {
        assert!(allows_empty(&json!({"spec": {"sources": [{"upload": {}}], "allowEmpty": true}})));
        assert!(!allows_empty(&json!({"spec": {"sources": [{"upload": {}}], "allowEmpty": false}})));
        assert!(!allows_empty(&json!({"spec": {"sources": [{"upload": {}}]}})));
        assert_eq!(schema().pointer("/properties/spec/properties/allowEmpty/type"), Some(&json!("boolean")));
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("1h30m").map(|d| d.as_secs()), Some(5400));
        assert_eq!(parse_duration("10m").map(|d| d.as_secs()), Some(600));
        assert!(parse_duration("10").is_none());
        assert!(parse_duration("x").is_none());
        assert_eq!(parse_duration("1.5s"), Some(std::time::Duration::from_millis(1500)));
        assert_eq!(parse_duration("2562047h"), Some(std::time::Duration::from_secs(2_562_047 * 3600)));
    }

    #[test]
    fn durations_beyond_go_range_are_refused_not_a_panic() {
        // Each of these panicked in `Duration::from_secs_f64` before.
        for text in ["100000000000000000000h", "2562048h", "9223372037s", &format!("{}h", "9".repeat(400))] {
            assert_eq!(parse_duration(text), None, "{text}");
        }
        let huge = json!({"spec": {"sources": [{"upload": {}}], "pollInterval": "100000000000000000000h"}});
        let causes = validate(&huge);
        assert_eq!(causes.len(), 1, "{causes:?}");
        assert_eq!(causes[0].field, "spec.pollInterval");
    }
}
