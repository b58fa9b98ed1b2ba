//! The operations of the group, independent of the OpenAPI version: one per verb that discovery
//! ([`API_RESOURCES`]) advertises, with path, parameters, body and response. Both `/openapi/v2`
//! and `/openapi/v3` render this list, so neither can drift from discovery or from the other.

use crate::apiserver::discovery::{ApiResource, API_RESOURCES};
use crate::apiserver::{GROUP, VERSION};

use super::{definition_name, DELETE_OPTIONS, PATCH, STATUS};

/// What a request or response carries.
pub enum Payload {
    /// A JSON object described by this definition.
    Definition(String),
    /// Raw bytes (tar streams, files).
    Binary,
}

/// A query parameter: name, OpenAPI type, description.
pub type QueryParam = (&'static str, &'static str, &'static str);

const LIST_PARAMS: &[QueryParam] = &[
    ("allowWatchBookmarks", "boolean", "Ask for BOOKMARK events on watches."),
    ("continue", "string", "Continue a chunked list (every list is currently answered whole)."),
    ("fieldSelector", "string", "Select objects by fields (metadata.name, metadata.namespace, …)."),
    ("labelSelector", "string", "Select objects by labels."),
    ("limit", "integer", "Largest number of items wanted (every list is currently answered whole)."),
    ("resourceVersion", "string", "Which resourceVersion the list or watch starts from."),
    ("resourceVersionMatch", "string", "How resourceVersion applies: Exact or NotOlderThan."),
    ("sendInitialEvents", "boolean", "Start a watch with the current state (WatchList)."),
    ("timeoutSeconds", "integer", "How long a watch may last."),
    ("watch", "boolean", "Watch for changes instead of listing."),
];
const WRITE_PARAMS: &[QueryParam] = &[
    ("dryRun", "string", "When present (\"All\"), the request is checked but not persisted."),
    ("fieldManager", "string", "Name of the actor making the change."),
    ("fieldValidation", "string", "How unknown fields are handled: Ignore, Warn (default) or Strict."),
];
const PATCH_PARAMS: &[QueryParam] = &[
    ("dryRun", "string", "When present (\"All\"), the request is checked but not persisted."),
    ("fieldManager", "string", "Name of the actor making the change."),
    ("fieldValidation", "string", "How unknown fields are handled: Ignore, Warn (default) or Strict."),
    ("force", "boolean", "Force apply requests (server-side apply only)."),
];
const DELETE_PARAMS: &[QueryParam] = &[
    ("dryRun", "string", "When present (\"All\"), the request is checked but not persisted."),
    ("gracePeriodSeconds", "integer", "Seconds before the object is deleted."),
    ("propagationPolicy", "string", "Whether and how dependents are deleted: Orphan, Background or Foreground."),
];
const CONTENT_PARAMS: &[QueryParam] =
    &[("path", "string", "One file (FILE) or subtree (DIR/) instead of the whole tar.")];

const JSON: &[&str] = &["application/json", "application/yaml"];
const PATCHES: &[&str] = &["application/json-patch+json", "application/merge-patch+json"];
const TAR_OUT: &[&str] = &["application/x-tar", "application/octet-stream", "application/json"];
const TAR_IN: &[&str] = &["application/x-tar", "application/gzip", "application/zstd"];

pub struct Operation {
    pub path: String,
    /// Lowercase HTTP method, as OpenAPI keys operations.
    pub method: &'static str,
    pub id: String,
    /// `x-kubernetes-action`.
    pub action: &'static str,
    /// The kind of `x-kubernetes-group-version-kind`: the resource's kind, even for lists.
    pub kind: &'static str,
    pub description: String,
    pub query: Vec<QueryParam>,
    pub request: Option<(&'static [&'static str], Payload)>,
    pub response: (&'static [&'static str], Payload),
    /// Success codes.
    pub codes: &'static [&'static str],
}

/// `ContentStowageDevV1alpha1`, as kube spells a group-version inside operation ids.
fn id_infix() -> String {
    let pascal = |s: &str| {
        let mut chars = s.chars();
        chars.next().map(|c| c.to_ascii_uppercase().to_string() + chars.as_str()).unwrap_or_default()
    };
    GROUP.split('.').map(pascal).collect::<String>() + &pascal(VERSION)
}

/// Every operation of every resource, in a stable order.
pub fn operations() -> Vec<Operation> {
    API_RESOURCES.iter().flat_map(resource_operations).collect()
}

fn resource_operations(resource: &ApiResource) -> Vec<Operation> {
    let def = resource.def;
    let (kind, plural, gv) = (def.kind, def.plural, id_infix());
    let collection = format!("/apis/{GROUP}/{VERSION}/namespaces/{{namespace}}/{plural}");
    let item = format!("{collection}/{{name}}");
    let object = || Payload::Definition(definition_name(kind));
    let list = || Payload::Definition(definition_name(def.list_kind));
    let status = || Payload::Definition(STATUS.to_string());
    let op = |path: &str, method, action, id: String, description: String| Operation {
        path: path.to_string(),
        method,
        id,
        action,
        kind,
        description,
        query: Vec::new(),
        request: None,
        response: (JSON, object()),
        codes: &["200"],
    };
    let mut ops = Vec::new();
    for verb in resource.verbs {
        match *verb {
            "list" => {
                let mut namespaced = op(
                    &collection,
                    "get",
                    "list",
                    format!("list{gv}Namespaced{kind}"),
                    format!("list or watch objects of kind {kind}"),
                );
                namespaced.query = LIST_PARAMS.to_vec();
                namespaced.response = (JSON, list());
                let all_path = format!("/apis/{GROUP}/{VERSION}/{plural}");
                let mut all = op(
                    &all_path,
                    "get",
                    "list",
                    format!("list{gv}{kind}ForAllNamespaces"),
                    format!("list or watch objects of kind {kind} in all namespaces"),
                );
                all.query = LIST_PARAMS.to_vec();
                all.response = (JSON, list());
                ops.extend([namespaced, all]);
            }
            "create" => {
                let mut create =
                    op(&collection, "post", "post", format!("create{gv}Namespaced{kind}"), format!("create a {kind}"));
                create.query = WRITE_PARAMS.to_vec();
                create.request = Some((JSON, object()));
                create.codes = &["200", "201", "202"];
                ops.push(create);
            }
            "deletecollection" => {
                let mut delete = op(
                    &collection,
                    "delete",
                    "deletecollection",
                    format!("delete{gv}CollectionNamespaced{kind}"),
                    format!("delete a collection of {kind}"),
                );
                delete.query = [LIST_PARAMS, DELETE_PARAMS].concat();
                delete.request = Some((JSON, Payload::Definition(DELETE_OPTIONS.into())));
                delete.response = (JSON, status());
                ops.push(delete);
            }
            "get" => ops.push(op(
                &item,
                "get",
                "get",
                format!("read{gv}Namespaced{kind}"),
                format!("read the specified {kind}"),
            )),
            "update" => ops.push(replace(
                op(
                    &item,
                    "put",
                    "put",
                    format!("replace{gv}Namespaced{kind}"),
                    format!("replace the specified {kind}"),
                ),
                object(),
            )),
            "patch" => ops.push(patch(op(
                &item,
                "patch",
                "patch",
                format!("patch{gv}Namespaced{kind}"),
                format!("partially update the specified {kind}"),
            ))),
            "delete" => {
                let mut delete =
                    op(&item, "delete", "delete", format!("delete{gv}Namespaced{kind}"), format!("delete a {kind}"));
                delete.query = DELETE_PARAMS.to_vec();
                delete.request = Some((JSON, Payload::Definition(DELETE_OPTIONS.into())));
                delete.response = (JSON, status());
                delete.codes = &["200", "202"];
                ops.push(delete);
            }
            _ => {} // watch: the `watch` parameter of the list operations
        }
    }
    for sub in &resource.subresources {
        let path = format!("{item}/{}", sub.name);
        for verb in sub.verbs {
            match (sub.name, *verb) {
                ("status", "get") => ops.push(op(
                    &path,
                    "get",
                    "get",
                    format!("read{gv}Namespaced{kind}Status"),
                    format!("read status of the specified {kind}"),
                )),
                ("status", "update") => ops.push(replace(
                    op(
                        &path,
                        "put",
                        "put",
                        format!("replace{gv}Namespaced{kind}Status"),
                        format!("replace status of the specified {kind}"),
                    ),
                    object(),
                )),
                ("status", "patch") => ops.push(patch(op(
                    &path,
                    "patch",
                    "patch",
                    format!("patch{gv}Namespaced{kind}Status"),
                    format!("partially update status of the specified {kind}"),
                ))),
                ("content", "get") => {
                    let description = format!("download the content of the specified {kind}: a deterministic tar, one file, a subtree, or a JSON listing");
                    let mut download =
                        op(&path, "get", "get", format!("download{gv}Namespaced{kind}Content"), description);
                    download.query = CONTENT_PARAMS.to_vec();
                    download.response = (TAR_OUT, Payload::Binary);
                    ops.push(download);
                }
                ("content", "update") => {
                    let description = format!("upload the content of the specified {kind}: a tar, plain, gzip or zstd");
                    let mut upload = op(&path, "put", "put", format!("upload{gv}Namespaced{kind}Content"), description);
                    upload.request = Some((TAR_IN, Payload::Binary));
                    ops.push(upload);
                }
                _ => {}
            }
        }
    }
    ops
}

fn replace(mut op: Operation, body: Payload) -> Operation {
    op.query = WRITE_PARAMS.to_vec();
    op.request = Some((JSON, body));
    op.codes = &["200", "201"];
    op
}

/// Every PATCH carries `fieldValidation`: kubectl checks one PATCH operation of the kind (any one)
/// for it to decide whether the server validates fields.
fn patch(mut op: Operation) -> Operation {
    op.query = PATCH_PARAMS.to_vec();
    op.request = Some((PATCHES, Payload::Definition(PATCH.into())));
    op.codes = &["200", "201"];
    op
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operation_ids_are_unique_and_patches_validate_fields() {
        let ops = operations();
        let mut ids: Vec<&str> = ops.iter().map(|o| o.id.as_str()).collect();
        ids.sort();
        let before = ids.len();
        ids.dedup();
        assert_eq!(before, ids.len(), "duplicate operation ids");
        assert!(ids.contains(&"listContentStowageDevV1alpha1NamespacedBundle"));
        for op in ops.iter().filter(|o| o.method == "patch") {
            assert!(op.query.iter().any(|(name, _, _)| *name == "fieldValidation"), "{}", op.id);
        }
    }
}
