//! The discovery documents of the review groups a standalone server serves
//! (`authentication.k8s.io/v1`, `authorization.k8s.io/v1`: cluster-scoped, `create` only), from
//! the one list of reviews in `apiserver::reviews`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;
use kube::core::discovery::v2;

use super::strings;
use crate::apiserver::reviews::{self, REVIEWS};

/// The legacy resource list of a review group.
pub(super) fn review_resource_list(group: &str) -> meta::APIResourceList {
    let resources = REVIEWS
        .iter()
        .filter(|r| r.group == group)
        .map(|r| meta::APIResource {
            name: r.plural.into(),
            singular_name: r.singular.into(),
            namespaced: false,
            kind: r.kind.into(),
            verbs: strings(&["create"]),
            ..meta::APIResource::default()
        })
        .collect();
    meta::APIResourceList { group_version: format!("{group}/{}", reviews::VERSION), resources }
}

/// The aggregated form of a review group.
pub(super) fn review_group_discovery(group: &str) -> v2::APIGroupDiscovery {
    let resources = REVIEWS
        .iter()
        .filter(|r| r.group == group)
        .map(|r| v2::APIResourceDiscovery {
            resource: Some(r.plural.into()),
            response_kind: Some(v2::GroupVersionKind {
                group: Some(group.into()),
                version: Some(reviews::VERSION.into()),
                kind: Some(r.kind.into()),
            }),
            scope: Some("Cluster".into()),
            singular_resource: Some(r.singular.into()),
            verbs: strings(&["create"]),
            short_names: Vec::new(),
            categories: Vec::new(),
            subresources: Vec::new(),
        })
        .collect();
    v2::APIGroupDiscovery {
        metadata: Some(meta::ObjectMeta { name: Some(group.into()), ..meta::ObjectMeta::default() }),
        versions: vec![v2::APIVersionDiscovery {
            version: Some(reviews::VERSION.into()),
            resources,
            freshness: Some("Current".into()),
        }],
    }
}
