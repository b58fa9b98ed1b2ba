//! The labels a request is counted under, derived from method and path as kube-apiserver derives
//! them: verb (`GET`, `LIST`, `WATCH`, `POST`, `PUT`, `PATCH`, `APPLY`, `DELETE`,
//! `DELETECOLLECTION`), resource, subresource and scope. Every label value is one of a fixed set of
//! static strings, so cardinality stays bounded whatever clients send: unknown resources and paths
//! collapse to empty labels.

use axum::extract::Request;
use axum::http::{header, Method};
use prometheus_client::encoding::{EncodeLabelSet, LabelSetEncoder};

use crate::apiserver::discovery::API_RESOURCES;
use crate::apiserver::{GROUP, VERSION};

/// Non-resource paths counted by name (as the `subresource` label, like kube counts `/healthz`).
const KNOWN_PATHS: &[&str] = &[
    "/api",
    "/apis",
    "/apis/content.stowage.dev",
    "/apis/content.stowage.dev/v1alpha1",
    "/openapi/v2",
    "/openapi/v3",
    "/openapi/v3/apis/content.stowage.dev/v1alpha1",
    "/version",
    "/metrics",
    "/healthz",
    "/livez",
    "/readyz",
];

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestLabels {
    pub verb: &'static str,
    /// Whether this is a request for one of our resources (group and version labels set).
    pub in_group: bool,
    pub resource: &'static str,
    pub subresource: &'static str,
    /// `resource` (one named object, or a create), `namespace`, `cluster`, or empty.
    pub scope: &'static str,
}

impl RequestLabels {
    pub fn group(&self) -> &'static str {
        if self.in_group {
            GROUP
        } else {
            ""
        }
    }

    pub fn version(&self) -> &'static str {
        if self.in_group {
            VERSION
        } else {
            ""
        }
    }

    /// Watches and content downloads: they last as long as the client reads, so they are left out
    /// of the latency histogram and counted in the long-running gauge while open.
    pub fn is_long_running(&self) -> bool {
        self.verb == "WATCH" || (self.verb == "GET" && self.subresource == "content")
    }

    pub fn of(request: &Request) -> RequestLabels {
        let path = request.uri().path();
        if let Some(labels) = group_version_rest(path).and_then(|rest| resource_request(rest, request)) {
            return labels;
        }
        let subresource = KNOWN_PATHS.iter().copied().find(|known| *known == path).unwrap_or("");
        RequestLabels { verb: plain_verb(request.method()), in_group: false, resource: "", subresource, scope: "" }
    }
}

/// kube-apiserver's labels, in its order: component, group, resource, scope, subresource, verb,
/// version.
impl EncodeLabelSet for RequestLabels {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> std::fmt::Result {
        [
            ("component", "apiserver"),
            ("group", self.group()),
            ("resource", self.resource),
            ("scope", self.scope),
            ("subresource", self.subresource),
            ("verb", self.verb),
            ("version", self.version()),
        ]
        .encode(encoder)
    }
}

/// The path after `/apis/GROUP/VERSION/`.
fn group_version_rest(path: &str) -> Option<&str> {
    path.strip_prefix("/apis/")?.strip_prefix(GROUP)?.strip_prefix('/')?.strip_prefix(VERSION)?.strip_prefix('/')
}

fn plain_verb(method: &Method) -> &'static str {
    match *method {
        Method::GET | Method::HEAD => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        _ => "other",
    }
}

/// `rest` is the path after `/apis/GROUP/VERSION/`; `None` when it names no resource of ours.
fn resource_request(rest: &str, request: &Request) -> Option<RequestLabels> {
    let mut parts = [""; 5];
    let mut count = 0;
    for part in rest.split('/') {
        *parts.get_mut(count)? = part;
        count += 1;
    }
    let (plural, named, subresource, namespaced) = match *parts.get(..count)? {
        [plural] => (plural, false, None, false),
        ["namespaces", _, plural] => (plural, false, None, true),
        ["namespaces", _, plural, _] => (plural, true, None, true),
        ["namespaces", _, plural, _, sub] => (plural, true, Some(sub), true),
        _ => return None,
    };
    let resource = API_RESOURCES.iter().find(|r| r.def.plural == plural)?;
    let subresource = match subresource {
        None => "",
        Some(name) => resource.subresource(name)?.name,
    };
    let method = request.method();
    let scope = if named || *method == Method::POST {
        "resource"
    } else if namespaced {
        "namespace"
    } else {
        "cluster"
    };
    let verb = match *method {
        Method::GET | Method::HEAD if named => "GET",
        Method::GET | Method::HEAD if is_watch(request.uri().query()) => "WATCH",
        Method::GET | Method::HEAD => "LIST",
        Method::PATCH if is_apply(request) => "APPLY",
        Method::DELETE if !named => "DELETECOLLECTION",
        ref other => plain_verb(other),
    };
    Some(RequestLabels { verb, in_group: true, resource: resource.def.plural, subresource, scope })
}

/// `watch=true` or `watch=1`, as the list handler reads it.
fn is_watch(query: Option<&str>) -> bool {
    query.unwrap_or("").split('&').any(|pair| matches!(pair, "watch=true" | "watch=1"))
}

fn is_apply(request: &Request) -> bool {
    let content_type = request.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    content_type.starts_with("application/apply-patch")
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;

    fn labels(method: Method, uri: &str) -> RequestLabels {
        RequestLabels::of(&Request::builder().method(method).uri(uri).body(Body::empty()).unwrap())
    }

    #[test]
    fn derives_verb_and_scope_like_kube() {
        let ns = "/apis/content.stowage.dev/v1alpha1/namespaces/a/bundles";
        let cases = [
            (Method::GET, ns.to_string(), "LIST", "namespace", ""),
            (Method::GET, format!("{ns}?watch=true&resourceVersion=1"), "WATCH", "namespace", ""),
            (Method::POST, ns.to_string(), "POST", "resource", ""),
            (Method::DELETE, ns.to_string(), "DELETECOLLECTION", "namespace", ""),
            (Method::GET, format!("{ns}/b"), "GET", "resource", ""),
            (Method::PUT, format!("{ns}/b"), "PUT", "resource", ""),
            (Method::PATCH, format!("{ns}/b/status"), "PATCH", "resource", "status"),
            (Method::DELETE, format!("{ns}/b"), "DELETE", "resource", ""),
            (Method::GET, format!("{ns}/b/content?path=x"), "GET", "resource", "content"),
            (Method::GET, "/apis/content.stowage.dev/v1alpha1/bundlecontents".to_string(), "LIST", "cluster", ""),
        ];
        for (method, uri, verb, scope, subresource) in cases {
            let got = labels(method, &uri);
            assert_eq!((got.verb, got.scope, got.subresource, got.in_group), (verb, scope, subresource, true), "{uri}");
        }
        assert!(labels(Method::GET, &format!("{ns}?watch=1")).is_long_running());
        assert!(labels(Method::GET, &format!("{ns}/b/content")).is_long_running());
        assert!(!labels(Method::PUT, &format!("{ns}/b/content")).is_long_running());
    }

    #[test]
    fn unknown_paths_collapse() {
        for uri in [
            "/apis/content.stowage.dev/v1alpha1/namespaces/a/widgets",
            "/apis/content.stowage.dev/v1alpha1/namespaces/a/bundles/b/logs",
            "/apis/content.stowage.dev/v1alpha1/namespaces/a/bundles/b/content/extra",
            "/random/abc123",
        ] {
            let got = labels(Method::GET, uri);
            assert_eq!((got.resource, got.subresource, got.scope, got.in_group), ("", "", "", false), "{uri}");
        }
        assert_eq!(labels(Method::GET, "/openapi/v2").subresource, "/openapi/v2");
    }
}
