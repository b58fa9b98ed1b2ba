//! API discovery — what clients read before anything else to map `kubectl get bundles` (or `bdl`)
//! to a URL: `/api`, `/apis` (the legacy `APIGroupList`, or the aggregated
//! `apidiscovery.k8s.io/v2` `APIGroupDiscoveryList` when the client asks for it, as kubectl and the
//! kube-aggregator do), the group, the group-version `APIResourceList`, and `/version`.
//!
//! Every document is rendered once from one description of what is served ([`API_RESOURCES`]) and
//! answered from memory, with an ETag. The documents are kube's own types: the legacy ones and
//! `version.Info` from k8s-openapi, the aggregated ones from kube-core (`discovery::v2`, which the
//! kube-rs client decodes them with).

use std::sync::LazyLock;

use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;
use k8s_openapi::apimachinery::pkg::version::Info;
use kube::core::discovery::v2;
use serde::Serialize;
use serde_json::Value;

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

fn gvk(kind: &str) -> v2::GroupVersionKind {
    v2::GroupVersionKind { group: Some(GROUP.into()), version: Some(VERSION.into()), kind: Some(kind.into()) }
}

fn strings(values: &[&str]) -> Vec<String> {
    values.iter().map(|v| v.to_string()).collect()
}

fn group_version() -> meta::GroupVersionForDiscovery {
    meta::GroupVersionForDiscovery { group_version: API_VERSION.into(), version: VERSION.into() }
}

fn api_group() -> meta::APIGroup {
    meta::APIGroup {
        name: GROUP.into(),
        versions: vec![group_version()],
        preferred_version: Some(group_version()),
        server_address_by_client_cidrs: None,
    }
}

fn resource_list() -> meta::APIResourceList {
    let mut resources = Vec::new();
    for resource in API_RESOURCES.iter() {
        let def = resource.def;
        resources.push(meta::APIResource {
            name: def.plural.into(),
            singular_name: def.singular.into(),
            namespaced: true,
            kind: def.kind.into(),
            verbs: strings(resource.verbs),
            short_names: Some(strings(def.short_names)),
            categories: Some(strings(CATEGORIES)),
            ..meta::APIResource::default()
        });
        for sub in &resource.subresources {
            resources.push(meta::APIResource {
                name: format!("{}/{}", def.plural, sub.name),
                singular_name: String::new(),
                namespaced: true,
                kind: def.kind.into(),
                verbs: strings(sub.verbs),
                ..meta::APIResource::default()
            });
        }
    }
    meta::APIResourceList { group_version: API_VERSION.into(), resources }
}

/// kube-core's `APIGroupDiscoveryList` leaves `kind` and `apiVersion` to the caller (v2 and v2beta1
/// share the shape); clients check them.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct AggregatedDocument {
    kind: &'static str,
    api_version: &'static str,
    #[serde(flatten)]
    list: v2::APIGroupDiscoveryList,
}

fn discovery_list(version: Aggregated, with_group: bool) -> AggregatedDocument {
    let resources = API_RESOURCES
        .iter()
        .map(|resource| {
            let def = resource.def;
            let subresources = resource
                .subresources
                .iter()
                .map(|sub| v2::APISubresourceDiscovery {
                    subresource: Some(sub.name.into()),
                    response_kind: Some(gvk(def.kind)),
                    verbs: strings(sub.verbs),
                    accepted_types: Vec::new(),
                })
                .collect();
            v2::APIResourceDiscovery {
                resource: Some(def.plural.into()),
                response_kind: Some(gvk(def.kind)),
                scope: Some("Namespaced".into()),
                singular_resource: Some(def.singular.into()),
                verbs: strings(resource.verbs),
                short_names: strings(def.short_names),
                categories: strings(CATEGORIES),
                subresources,
            }
        })
        .collect();
    let group = v2::APIGroupDiscovery {
        metadata: Some(meta::ObjectMeta { name: Some(GROUP.into()), ..meta::ObjectMeta::default() }),
        versions: vec![v2::APIVersionDiscovery {
            version: Some(VERSION.into()),
            resources,
            freshness: Some("Current".into()),
        }],
    };
    let items = if with_group { vec![group] } else { vec![] };
    AggregatedDocument {
        kind: "APIGroupDiscoveryList",
        api_version: version.api_version(),
        list: v2::APIGroupDiscoveryList { metadata: Some(meta::ListMeta::default()), items },
    }
}

/// A document as JSON. These types have string keys and no floats, so this cannot fail; were it
/// to, the document would be `null` (a client error naming it), not a panic.
fn to_json(document: &impl Serialize) -> Value {
    serde_json::to_value(document).unwrap_or(Value::Null)
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
            Document::json(&to_json(&discovery_list(Aggregated::V2, with_group))),
            Document::json(&to_json(&discovery_list(Aggregated::V2Beta1, with_group))),
        ]
    };
    Documents {
        core_legacy: Document::json(&to_json(&meta::APIVersions::default())),
        core_aggregated: both(false),
        groups_legacy: Document::json(&to_json(&meta::APIGroupList { groups: vec![api_group()] })),
        groups_aggregated: both(true),
        group: Document::json(&to_json(&api_group())),
        resources: Document::json(&to_json(&resource_list())),
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
    let info = Info {
        major: env!("CARGO_PKG_VERSION_MAJOR").into(),
        minor: env!("CARGO_PKG_VERSION_MINOR").into(),
        git_version: concat!("v", env!("CARGO_PKG_VERSION")).into(),
        git_commit: option_env!("STOWAGE_GIT_COMMIT").unwrap_or("").into(),
        git_tree_state: String::new(),
        build_date: option_env!("STOWAGE_BUILD_DATE").unwrap_or("1970-01-01T00:00:00Z").into(),
        go_version: "n/a".into(),
        compiler: "rustc".into(),
        platform: format!("{}/{go_arch}", std::env::consts::OS),
        ..Info::default()
    };
    json_response(StatusCode::OK, &to_json(&info), &[])
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
        let resources = &aggregated.list.items[0].versions[0].resources;
        let resource = |plural: &str| resources.iter().find(|r| r.resource.as_deref() == Some(plural)).unwrap();
        for entry in &legacy.resources {
            let verbs = match entry.name.split_once('/') {
                None => &resource(&entry.name).verbs,
                Some((plural, sub)) => {
                    let subresources = &resource(plural).subresources;
                    &subresources.iter().find(|s| s.subresource.as_deref() == Some(sub)).unwrap().verbs
                }
            };
            assert_eq!(&entry.verbs, verbs, "{}", entry.name);
        }
    }
}
