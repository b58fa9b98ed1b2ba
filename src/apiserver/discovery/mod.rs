//! API discovery — what clients read before anything else to map `kubectl get bundles` (or `bdl`)
//! to a URL: `/api`, `/apis` (the legacy `APIGroupList`, or the aggregated
//! `apidiscovery.k8s.io/v2` `APIGroupDiscoveryList` when the client asks for it, as kubectl and the
//! kube-aggregator do), the group, the group-version `APIResourceList`, and `/version`.
//!
//! Every document is rendered once from one description of what is served ([`API_RESOURCES`], and
//! standalone the self reviews of `authentication.k8s.io/v1` and `authorization.k8s.io/v1`,
//! `review_groups.rs`) and answered from memory, with an ETag. A delegated server advertises its
//! own group only: there the kube-apiserver serves the review groups. The documents are kube's own
//! types: the legacy ones and `version.Info` (`version.rs`) from k8s-openapi, the aggregated ones
//! from kube-core (`discovery::v2`, which the kube-rs client decodes them with).

use std::sync::LazyLock;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;
use kube::core::discovery::v2;
use serde::Serialize;
use serde_json::Value;

use super::negotiation::{accepted, Caching, Document};
use super::reviews;
use super::{AppState, API_VERSION, GROUP, VERSION};

pub mod events;
mod review_groups;
mod version;

use crate::strategy::{ResourceDef, RESOURCES};
use review_groups::{review_group_discovery, review_resource_list};
pub use version::version;

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

fn group_version(group: &str, version: &str) -> meta::GroupVersionForDiscovery {
    meta::GroupVersionForDiscovery { group_version: format!("{group}/{version}"), version: version.into() }
}

/// A group with its one version.
fn api_group(group: &str, version: &str) -> meta::APIGroup {
    meta::APIGroup {
        name: group.into(),
        versions: vec![group_version(group, version)],
        preferred_version: Some(group_version(group, version)),
        server_address_by_client_cidrs: None,
    }
}

/// The groups `/apis` lists: ours, and standalone the review groups.
fn api_groups(standalone: bool) -> Vec<meta::APIGroup> {
    let mut groups = vec![api_group(GROUP, VERSION)];
    if standalone {
        groups.extend([reviews::AUTHENTICATION, reviews::AUTHORIZATION].map(|g| api_group(g, reviews::VERSION)));
        groups.push(events::api_group_entry());
    }
    groups
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

/// `/apis` (`with_groups`) or `/api` (no groups) in aggregated form; standalone with the review groups.
fn discovery_list(version: Aggregated, with_groups: bool, standalone: bool) -> AggregatedDocument {
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
    let mut items = vec![group];
    if standalone {
        items.extend([reviews::AUTHENTICATION, reviews::AUTHORIZATION].map(review_group_discovery));
        items.push(events::group_discovery(crate::api::event::EVENTS_GROUP));
    }
    if !with_groups {
        // `/api`: the core group, which standalone serves Events in.
        items.clear();
        if standalone {
            items.push(events::group_discovery(""));
        }
    }
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

/// Every discovery document of one mode, rendered once.
struct Documents {
    core_legacy: Document,
    core_aggregated: [Document; 2],
    groups_legacy: Document,
    groups_aggregated: [Document; 2],
    group: Document,
    resources: Document,
    /// Standalone only: each review group's APIGroup and APIResourceList.
    review_groups: Vec<(&'static str, Document, Document)>,
}

impl Documents {
    fn render(standalone: bool) -> Documents {
        let both = |with_groups| {
            [
                Document::json(&to_json(&discovery_list(Aggregated::V2, with_groups, standalone))),
                Document::json(&to_json(&discovery_list(Aggregated::V2Beta1, with_groups, standalone))),
            ]
        };
        let review_groups = match standalone {
            true => [reviews::AUTHENTICATION, reviews::AUTHORIZATION]
                .map(|g| {
                    let group = Document::json(&to_json(&api_group(g, reviews::VERSION)));
                    (g, group, Document::json(&to_json(&review_resource_list(g))))
                })
                .into(),
            false => Vec::new(),
        };
        Documents {
            core_legacy: match standalone {
                true => Document::json(&to_json(&events::core_versions())),
                false => Document::json(&to_json(&meta::APIVersions::default())),
            },
            core_aggregated: both(false),
            groups_legacy: Document::json(&to_json(&meta::APIGroupList { groups: api_groups(standalone) })),
            groups_aggregated: both(true),
            group: Document::json(&to_json(&api_group(GROUP, VERSION))),
            resources: Document::json(&to_json(&resource_list())),
            review_groups,
        }
    }
}

/// The documents of a delegated server, and of a standalone one.
static DOCUMENTS: LazyLock<[Documents; 2]> = LazyLock::new(|| [Documents::render(false), Documents::render(true)]);

/// The documents of the server's mode.
fn documents(app: &AppState) -> &'static Documents {
    let [delegated, standalone] = &*DOCUMENTS;
    if app.access.authorizer.is_standalone() {
        standalone
    } else {
        delegated
    }
}

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

/// `/api`: the core group, standalone for its Events only; none delegated.
pub async fn core_versions(State(app): State<AppState>, headers: HeaderMap) -> Response {
    let documents = documents(&app);
    legacy_or_aggregated(&headers, &documents.core_legacy, &documents.core_aggregated)
}

pub async fn groups(State(app): State<AppState>, headers: HeaderMap) -> Response {
    let documents = documents(&app);
    legacy_or_aggregated(&headers, &documents.groups_legacy, &documents.groups_aggregated)
}

pub async fn group(State(app): State<AppState>, headers: HeaderMap) -> Response {
    documents(&app).group.respond(&headers, "application/json", Caching::Revalidate)
}

pub async fn resources(State(app): State<AppState>, headers: HeaderMap) -> Response {
    documents(&app).resources.respond(&headers, "application/json", Caching::Revalidate)
}

/// `/apis/GROUP` of a review group (routed only when standalone).
pub async fn review_group(headers: HeaderMap, group: &'static str) -> Response {
    review_document(&headers, group, false)
}

/// `/apis/GROUP/v1` of a review group (routed only when standalone).
pub async fn review_resources(headers: HeaderMap, group: &'static str) -> Response {
    review_document(&headers, group, true)
}

fn review_document(headers: &HeaderMap, group: &str, resources: bool) -> Response {
    let [_, standalone] = &*DOCUMENTS;
    match standalone.review_groups.iter().find(|(g, _, _)| *g == group) {
        Some((_, document, _)) if !resources => document.respond(headers, "application/json", Caching::Revalidate),
        Some((_, _, document)) => document.respond(headers, "application/json", Caching::Revalidate),
        None => super::status::ApiError::not_found_message(format!("no group {group:?}")).into_response(),
    }
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
        let aggregated = discovery_list(Aggregated::V2, true, false);
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

    #[test]
    fn standalone_discovery_adds_the_review_groups_and_events_only() {
        let names = |standalone| {
            discovery_list(Aggregated::V2, true, standalone)
                .list
                .items
                .iter()
                .map(|g| g.metadata.as_ref().and_then(|m| m.name.clone()).unwrap_or_default())
                .collect::<Vec<_>>()
        };
        assert_eq!(names(false), [GROUP]);
        assert_eq!(names(true), [GROUP, "authentication.k8s.io", "authorization.k8s.io", "events.k8s.io"]);
        assert!(discovery_list(Aggregated::V2, false, false).list.items.is_empty(), "/api has no groups");
        let core = discovery_list(Aggregated::V2, false, true).list.items;
        assert_eq!(core.len(), 1, "/api standalone: the core group, for Events");
        let legacy: Vec<String> = api_groups(true).into_iter().map(|g| g.name).collect();
        assert_eq!(legacy, names(true));
        let authz = review_resource_list("authorization.k8s.io");
        let listed: Vec<(&str, &[String])> = authz.resources.iter().map(|r| (r.name.as_str(), &r.verbs[..])).collect();
        assert_eq!(
            listed,
            [
                ("selfsubjectaccessreviews", &["create".to_owned()][..]),
                ("selfsubjectrulesreviews", &["create".to_owned()][..])
            ]
        );
    }
}
