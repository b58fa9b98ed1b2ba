//! The discovery documents of the Events a standalone server serves (`apiserver::events`): the
//! core group's `v1` (Events only) and `events.k8s.io/v1`, both namespaced `events` with get, list
//! and watch.

use axum::http::HeaderMap;
use axum::response::Response;
use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;
use kube::core::discovery::v2;

use super::{api_group, strings, to_json};
use crate::api::event::EVENTS_GROUP;
use crate::apiserver::negotiation::{Caching, Document};
use crate::strategy::event::EVENT;

const VERSION: &str = "v1";

/// The legacy resource list of `group_version` (`v1` or `events.k8s.io/v1`).
fn resource_list(group_version: &str) -> meta::APIResourceList {
    let resource = meta::APIResource {
        name: EVENT.plural.into(),
        singular_name: EVENT.singular.into(),
        namespaced: true,
        kind: EVENT.kind.into(),
        verbs: strings(EVENT.verbs),
        short_names: Some(strings(EVENT.short_names)),
        ..meta::APIResource::default()
    };
    meta::APIResourceList { group_version: group_version.into(), resources: vec![resource] }
}

/// The aggregated form of `group` (`""`: the core group).
pub(super) fn group_discovery(group: &str) -> v2::APIGroupDiscovery {
    let resource = v2::APIResourceDiscovery {
        resource: Some(EVENT.plural.into()),
        response_kind: Some(v2::GroupVersionKind {
            group: Some(group.into()),
            version: Some(VERSION.into()),
            kind: Some(EVENT.kind.into()),
        }),
        scope: Some("Namespaced".into()),
        singular_resource: Some(EVENT.singular.into()),
        verbs: strings(EVENT.verbs),
        short_names: strings(EVENT.short_names),
        categories: Vec::new(),
        subresources: Vec::new(),
    };
    let name = Some(group.to_owned()).filter(|g| !g.is_empty());
    v2::APIGroupDiscovery {
        metadata: Some(meta::ObjectMeta { name, ..meta::ObjectMeta::default() }),
        versions: vec![v2::APIVersionDiscovery {
            version: Some(VERSION.into()),
            resources: vec![resource],
            freshness: Some("Current".into()),
        }],
    }
}

/// The events group in `/apis`.
pub(super) fn api_group_entry() -> meta::APIGroup {
    api_group(EVENTS_GROUP, VERSION)
}

/// `/api`'s legacy versions, standalone.
pub(super) fn core_versions() -> meta::APIVersions {
    meta::APIVersions { versions: vec![VERSION.into()], ..meta::APIVersions::default() }
}

fn respond(headers: &HeaderMap, document: &'static std::sync::LazyLock<Document>) -> Response {
    document.respond(headers, "application/json", Caching::Revalidate)
}

static CORE: std::sync::LazyLock<Document> =
    std::sync::LazyLock::new(|| Document::json(&to_json(&resource_list(VERSION))));
static GROUP: std::sync::LazyLock<Document> =
    std::sync::LazyLock::new(|| Document::json(&to_json(&api_group(EVENTS_GROUP, VERSION))));
static RESOURCES: std::sync::LazyLock<Document> =
    std::sync::LazyLock::new(|| Document::json(&to_json(&resource_list(&format!("{EVENTS_GROUP}/{VERSION}")))));

/// `/api/v1` (routed only when standalone).
pub async fn core_resources(headers: HeaderMap) -> Response {
    respond(&headers, &CORE)
}

/// `/apis/events.k8s.io` (routed only when standalone).
pub async fn group(headers: HeaderMap) -> Response {
    respond(&headers, &GROUP)
}

/// `/apis/events.k8s.io/v1` (routed only when standalone).
pub async fn resources(headers: HeaderMap) -> Response {
    respond(&headers, &RESOURCES)
}
