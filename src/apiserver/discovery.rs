//! API discovery — what clients read before anything else to map `kubectl get bundles` (or `bdl`)
//! to a URL: `/api`, `/apis` (the legacy `APIGroupList`, or the aggregated
//! `apidiscovery.k8s.io/v2` `APIGroupDiscoveryList` when the client asks for it, as kubectl and the
//! kube-aggregator do), the group, the group-version `APIResourceList`, and `/version`.
//!
//! Every document is rendered once from one description of what is served ([`API_RESOURCES`]) and
//! answered from memory, with an ETag.

use std::sync::LazyLock;

use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde_json::{json, Value};

use super::handlers::json_response;
use super::negotiation::{accepted, Caching, Document};
use super::{API_VERSION, GROUP, VERSION};
use crate::api::strategy::{ResourceDef, RESOURCES};

/// A served resource as discovery describes it.
pub struct ApiResource {
    pub def: &'static ResourceDef,
    pub verbs: &'static [&'static str],
    pub subresources: Vec<ApiSubresource>,
}

pub struct ApiSubresource {
    pub name: &'static str,
    pub verbs: &'static [&'static str],
}

impl ApiResource {
    pub fn subresource(&self, name: &str) -> Option<&ApiSubresource> {
        self.subresources.iter().find(|s| s.name == name)
    }
}

/// Every resource of the group with its verbs and subresources: the single source of both
/// discovery forms and of the OpenAPI operations.
pub static API_RESOURCES: LazyLock<Vec<ApiResource>> =
    LazyLock::new(|| RESOURCES.iter().map(|def| describe(def)).collect());

/// What the resource's strategy says it serves.
fn describe(def: &'static ResourceDef) -> ApiResource {
    let subresources = def.subresources.iter().map(|s| ApiSubresource { name: s.name, verbs: s.verbs }).collect();
    ApiResource { def, verbs: def.verbs, subresources }
}

const CATEGORIES: &[&str] = &["stowage"];

/// The versions of apidiscovery.k8s.io we answer in; v2beta1 has the same shape as v2.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Aggregated {
    V2,
    V2Beta1,
}

impl Aggregated {
    fn api_version(self) -> &'static str {
        match self {
            Aggregated::V2 => "apidiscovery.k8s.io/v2",
            Aggregated::V2Beta1 => "apidiscovery.k8s.io/v2beta1",
        }
    }

    fn content_type(self) -> &'static str {
        match self {
            Aggregated::V2 => "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList",
            Aggregated::V2Beta1 => "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList",
        }
    }
}

/// Which form of `/api` and `/apis` the client prefers: the first acceptable media range wins;
/// ranges we cannot serve (protobuf, other kinds) are skipped; nothing acceptable means legacy JSON.
fn negotiate(headers: &HeaderMap) -> Option<Aggregated> {
    for range in accepted(headers) {
        let aggregated = range.param("g") == Some("apidiscovery.k8s.io")
            && range.param("as") == Some("APIGroupDiscoveryList")
            && range.accepts("application/json");
        match range.param("v") {
            Some("v2") if aggregated => return Some(Aggregated::V2),
            Some("v2beta1") if aggregated => return Some(Aggregated::V2Beta1),
            _ if !range.has_params() && range.accepts("application/json") => return None,
            _ => continue,
        }
    }
    None
}

fn gvk(kind: &str) -> Value {
    json!({"group": GROUP, "version": VERSION, "kind": kind})
}

fn group_version() -> Value {
    json!({"groupVersion": API_VERSION, "version": VERSION})
}

fn api_group() -> Value {
    json!({"kind": "APIGroup", "apiVersion": "v1", "name": GROUP, "versions": [group_version()], "preferredVersion": group_version()})
}

fn resource_list() -> Value {
    let mut list = Vec::new();
    for resource in API_RESOURCES.iter() {
        let def = resource.def;
        list.push(json!({
            "name": def.plural,
            "singularName": def.singular,
            "namespaced": true,
            "kind": def.kind,
            "verbs": resource.verbs,
            "shortNames": def.short_names,
            "categories": CATEGORIES,
        }));
        for sub in &resource.subresources {
            list.push(json!({
                "name": format!("{}/{}", def.plural, sub.name),
                "singularName": "",
                "namespaced": true,
                "kind": def.kind,
                "verbs": sub.verbs,
            }));
        }
    }
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": API_VERSION, "resources": list})
}

fn discovery_list(version: Aggregated, with_group: bool) -> Value {
    let resources: Vec<Value> = API_RESOURCES
        .iter()
        .map(|resource| {
            let def = resource.def;
            let subresources: Vec<Value> = resource
                .subresources
                .iter()
                .map(|sub| json!({"subresource": sub.name, "responseKind": gvk(def.kind), "verbs": sub.verbs}))
                .collect();
            json!({
                "resource": def.plural,
                "responseKind": gvk(def.kind),
                "scope": "Namespaced",
                "singularResource": def.singular,
                "verbs": resource.verbs,
                "shortNames": def.short_names,
                "categories": CATEGORIES,
                "subresources": subresources,
            })
        })
        .collect();
    let group = json!({
        "metadata": {"name": GROUP},
        "versions": [{"version": VERSION, "resources": resources, "freshness": "Current"}],
    });
    let items = if with_group { vec![group] } else { vec![] };
    json!({"kind": "APIGroupDiscoveryList", "apiVersion": version.api_version(), "metadata": {}, "items": items})
}

/// Every discovery document, rendered once.
struct Documents {
    core_legacy: Document,
    core_aggregated: [Document; 2],
    groups_legacy: Document,
    groups_aggregated: [Document; 2],
    group: Document,
    resources: Document,
}

static DOCUMENTS: LazyLock<Documents> = LazyLock::new(|| {
    let both = |with_group| {
        [
            Document::json(&discovery_list(Aggregated::V2, with_group)),
            Document::json(&discovery_list(Aggregated::V2Beta1, with_group)),
        ]
    };
    Documents {
        core_legacy: Document::json(&json!({"kind": "APIVersions", "versions": [], "serverAddressByClientCIDRs": []})),
        core_aggregated: both(false),
        groups_legacy: Document::json(&json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": [api_group()]})),
        groups_aggregated: both(true),
        group: Document::json(&api_group()),
        resources: Document::json(&resource_list()),
    }
});

fn legacy_or_aggregated(headers: &HeaderMap, legacy: &Document, aggregated: &[Document; 2]) -> Response {
    match negotiate(headers) {
        Some(version) => {
            let [v2, v2beta1] = aggregated;
            let document = if version == Aggregated::V2 { v2 } else { v2beta1 };
            document.respond(headers, version.content_type(), Caching::Revalidate)
        }
        None => legacy.respond(headers, "application/json", Caching::Revalidate),
    }
}

/// `/api`: this server serves no core (legacy) group.
pub async fn core_versions(headers: HeaderMap) -> Response {
    legacy_or_aggregated(&headers, &DOCUMENTS.core_legacy, &DOCUMENTS.core_aggregated)
}

pub async fn groups(headers: HeaderMap) -> Response {
    legacy_or_aggregated(&headers, &DOCUMENTS.groups_legacy, &DOCUMENTS.groups_aggregated)
}

pub async fn group(headers: HeaderMap) -> Response {
    DOCUMENTS.group.respond(&headers, "application/json", Caching::Revalidate)
}

pub async fn resources(headers: HeaderMap) -> Response {
    DOCUMENTS.resources.respond(&headers, "application/json", Caching::Revalidate)
}

/// `/version`: kube's `version.Info`. The commit and build date come from `STOWAGE_GIT_COMMIT` and
/// `STOWAGE_BUILD_DATE` at compile time when a release build sets them (empty / the epoch
/// otherwise, as kube reports unstamped builds).
pub async fn version() -> Response {
    let go_arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    let info = json!({
        "major": env!("CARGO_PKG_VERSION_MAJOR"),
        "minor": env!("CARGO_PKG_VERSION_MINOR"),
        "gitVersion": concat!("v", env!("CARGO_PKG_VERSION")),
        "gitCommit": option_env!("STOWAGE_GIT_COMMIT").unwrap_or(""),
        "gitTreeState": "",
        "buildDate": option_env!("STOWAGE_BUILD_DATE").unwrap_or("1970-01-01T00:00:00Z"),
        "goVersion": "n/a",
        "compiler": "rustc",
        "platform": format!("{}/{go_arch}", std::env::consts::OS),
    });
    json_response(StatusCode::OK, &info, &[])
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::{header, HeaderValue};

    fn accept(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::ACCEPT, HeaderValue::from_str(value).unwrap());
        h
    }

    #[test]
    fn negotiates_like_kubectl_and_the_aggregator() {
        let kubectl = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json";
        assert_eq!(negotiate(&accept(kubectl)), Some(Aggregated::V2));
        let beta_first =
            "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList;q=0.9,application/json;q=0.8";
        assert_eq!(negotiate(&accept(beta_first)), Some(Aggregated::V2Beta1));
        let protobuf_first =
            "application/vnd.kubernetes.protobuf;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json";
        assert_eq!(negotiate(&accept(protobuf_first)), None);
        assert_eq!(
            negotiate(&accept(
                "application/json;q=0.9,application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
            )),
            Some(Aggregated::V2)
        );
        assert_eq!(negotiate(&HeaderMap::new()), None);
    }

    #[test]
    fn both_forms_advertise_the_same_verbs() {
        let legacy = resource_list();
        let aggregated = discovery_list(Aggregated::V2, true);
        let resources = &aggregated["items"][0]["versions"][0]["resources"];
        for entry in legacy["resources"].as_array().unwrap() {
            let name = entry["name"].as_str().unwrap();
            let verbs = match name.split_once('/') {
                None => resources.as_array().unwrap().iter().find(|r| r["resource"] == name).unwrap()["verbs"].clone(),
                Some((plural, sub)) => {
                    let parent = resources.as_array().unwrap().iter().find(|r| r["resource"] == plural).unwrap();
                    let found = parent["subresources"].as_array().unwrap().iter().find(|s| s["subresource"] == sub);
                    found.unwrap()["verbs"].clone()
                }
            };
            assert_eq!(entry["verbs"], verbs, "{name}");
        }
    }
}
