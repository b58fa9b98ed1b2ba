//! The Bundle strategy: its schema, defaults, validation, initial status, table and the Secrets
//! it names. The fields themselves are [`crate::api::bundle`].

use serde_json::{json, Value};

use super::{
    add_defaulted, decode, decode_or_default, name_and_age, short_digest, Column, ResourceDef, Subresource, AGE_COLUMN,
    NAME_COLUMN,
};
use crate::api::meta;
use crate::api::schema::{array_of, boolean, conditions, doc_string, integer, kind_root, object, string};
use crate::api::BundleStatus;
use crate::api::Cause;
use crate::api::{Bundle, BundleSpec, FORMATS};

pub static BUNDLE: ResourceDef = ResourceDef {
    api_version: crate::api::API_VERSION,
    plural: Bundle::PLURAL,
    singular: "bundle",
    kind: Bundle::KIND,
    list_kind: "BundleList",
    short_names: &["bdl"],
    user_writable: true,
    verbs: &["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"],
    subresources: &[
        Subresource { name: "content", verbs: &["get", "update"] },
        Subresource { name: "status", verbs: &["get", "patch", "update"] },
    ],
    takes_uploads: true,
    schema,
    default,
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
        Column {
            name: "Revision",
            kind: "string",
            format: "",
            description: "The BundleContent spec.revision chooses to serve instead of the newest (a rollback).",
            priority: 1,
        },
    ],
    row,
    selectable_fields: &[("status.phase", "/status/phase")],
    secret_refs,
    // A Bundle's BundleContents name it as their owner: the garbage collector deletes or orphans
    // them per the delete's propagation policy, nothing changes in the same write.
    on_delete: None,
    view: None,
};

fn schema() -> Value {
    let secret_ref = doc_string("Name of a Secret in the Bundle's namespace.");
    let source = object(
        "Where content comes from: exactly one of image, git, http, upload.",
        json!({
            "image": object("An OCI image or artifact.", json!({
                "ref": doc_string("Image reference, by tag or digest; with semver, the repository alone."),
                "semver": doc_string("Follow the newest tag in this version range (e.g. \">=1.2 <2\", \"88.x\"); \
                    pre-releases count only when the range names one (\">=1.0.0-0\")."),
                "pullSecret": secret_ref,
                "platform": doc_string("os/arch[/variant] to select from an image index."),
            })),
            "git": object("A git repository.", json!({
                "repository": doc_string("Repository URL (https)."),
                "ref": object("At most one of commit, tag, branch, semver (none: the default branch).", json!({
                    "commit": string(), "tag": string(), "branch": string(),
                    "semver": doc_string("The newest tag in this version range."),
                })),
                "directory": doc_string("Subdirectory to take."),
                "authSecret": secret_ref,
            })),
            "http": object("A tar, tar.gz or tar.zst URL.", json!({
                "url": doc_string("The file's URL; with releases, holding {version} and/or {tag}."),
                "sha256": doc_string("Expected sha256 of the downloaded file (hex)."),
                "authSecret": secret_ref,
                "releases": object("A release asset: the release is the newest tag of a git repository in a range.", json!({
                    "repository": doc_string("The git repository (https) whose tags are the releases."),
                    "semver": doc_string("The version range the release must be in."),
                })),
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
            "revision": doc_string("A BundleContent of this Bundle to serve instead of the newest (a rollback, as \
                `kubectl stowage rollback` sets it). While it is set, the sources are still resolved and new content \
                is stored and recorded in status.latestContentName, but not served; the history limit never prunes \
                it. Clear it to serve the newest content again."),
        }),
    );
    let status = object(
        "What is served now.",
        json!({
            "observedGeneration": integer(),
            "phase": string(),
            "conditions": conditions(),
            "resolvedSources": array_of(json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true})),
            "availableVersions": array_of(object("The newest tags a source's version range matches.", json!({
                "source": integer(),
                "versions": array_of(string()),
            }))),
            "nextPollTime": doc_string("When the sources are resolved next (the next poll, or the retry after a failure)."),
            "lastHandledRefresh": doc_string("The last value of the content.stowage.dev/refresh annotation acted on."),
            "contentName": doc_string("The BundleContent served."),
            "latestContentName": doc_string("The newest BundleContent unpacked or uploaded: the one served unless \
                spec.revision chooses another."),
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

fn default(obj: &mut Value) {
    let Some(spec) = obj.get("spec") else { return };
    let mut typed: BundleSpec = decode_or_default(spec);
    typed.apply_defaults();
    add_defaulted(obj, serde_json::to_value(typed).unwrap_or_default());
}

fn validate(obj: &Value) -> Vec<Cause> {
    match obj.get("spec").map(decode::<BundleSpec>) {
        None => BundleSpec::default().validate(),
        Some(Ok(spec)) => spec.validate(),
        Some(Err(cause)) => vec![Cause { field: "spec".into(), ..cause }],
    }
}

fn initial_status(obj: &Value) -> Option<Value> {
    let bundle: Bundle = decode_or_default(obj);
    serde_json::to_value(BundleStatus::initial(bundle.generation(), bundle.takes_uploads(), bundle.spec.is_paused()))
        .ok()
}

/// `spec.sources[i].image.pullSecret`, `.git.authSecret`, `.http.authSecret`.
fn secret_refs(obj: &Value) -> Vec<(String, String)> {
    let spec: BundleSpec = obj.get("spec").map(decode_or_default).unwrap_or_default();
    let mut refs = Vec::new();
    for (i, source) in spec.sources.iter().enumerate() {
        for (field, name) in source.secret_refs() {
            refs.push((format!("spec.sources[{i}].{field}"), name.to_string()));
        }
    }
    refs
}

fn row(obj: &Value) -> Vec<Value> {
    let bundle: Bundle = decode_or_default(obj);
    let (name, age) = name_and_age(obj);
    let status = bundle.status.unwrap_or_default();
    let sources: Vec<&str> = bundle.spec.sources.iter().filter_map(|s| s.kinds().first().copied()).collect();
    vec![
        name,
        json!(status.format.unwrap_or_default()),
        json!(status.phase.unwrap_or_default()),
        status.files.map_or(Value::Null, |n| json!(n)),
        json!(status.size.map(meta::human_bytes).unwrap_or_default()),
        json!(short_digest(status.digest.as_deref().unwrap_or(""))),
        age,
        json!(status.content_name.unwrap_or_default()),
        json!(sources.join(",")),
        json!(bundle.spec.revision.unwrap_or_default()),
    ]
}

#[cfg(test)]
#[path = "bundle_tests.rs"]
mod tests;
