//! API discovery: `/api`, `/apis`, the group and the group-version resource list — what kubectl
//! reads to map `kubectl get bundles` (or `bdl`) to a URL.

use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{json, Value};

use super::handlers::json_response;
use super::resources::RESOURCES;
use super::{API_VERSION, GROUP, VERSION};

fn group_json() -> Value {
    let version = json!({"groupVersion": API_VERSION, "version": VERSION});
    json!({
        "name": GROUP,
        "versions": [version.clone()],
        "preferredVersion": version,
    })
}

/// `/api`: this server serves no core (legacy) group.
pub async fn core_versions() -> Response {
    json_response(
        StatusCode::OK,
        &json!({"kind": "APIVersions", "versions": [], "serverAddressByClientCIDRs": []}),
        &[],
    )
}

pub async fn groups() -> Response {
    let mut group = group_json();
    group["kind"] = json!("APIGroup");
    group["apiVersion"] = json!("v1");
    json_response(StatusCode::OK, &json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": [group_json()]}), &[])
}

pub async fn group() -> Response {
    let mut group = group_json();
    group["kind"] = json!("APIGroup");
    group["apiVersion"] = json!("v1");
    json_response(StatusCode::OK, &group, &[])
}

pub async fn resources() -> Response {
    let mut list = Vec::new();
    for def in RESOURCES {
        let verbs: &[&str] = if def.user_writable {
            &["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
        } else {
            &["delete", "deletecollection", "get", "list", "watch"]
        };
        list.push(json!({
            "name": def.plural,
            "singularName": def.singular,
            "namespaced": true,
            "kind": def.kind,
            "verbs": verbs,
            "shortNames": def.short_names,
            "categories": ["stowage"],
        }));
        let content_verbs: &[&str] = if def.user_writable { &["get", "update"] } else { &["get"] };
        list.push(json!({
            "name": format!("{}/content", def.plural),
            "singularName": "",
            "namespaced": true,
            "kind": def.kind,
            "verbs": content_verbs,
        }));
        if def.user_writable {
            list.push(json!({
                "name": format!("{}/status", def.plural),
                "singularName": "",
                "namespaced": true,
                "kind": def.kind,
                "verbs": ["get", "patch", "update"],
            }));
        }
    }
    json_response(
        StatusCode::OK,
        &json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": API_VERSION, "resources": list}),
        &[],
    )
}
