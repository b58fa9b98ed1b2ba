//! What a request asks for, in Kubernetes terms (kube-apiserver's `RequestInfo`): a resource request
//! (verb, group, version, namespace, resource, subresource, name) or a non-resource one (path and
//! the lower-cased method). Authorization and metrics both read it; it is derived once per request.

use axum::http::Method;

/// The Kubernetes view of one request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestInfo {
    pub is_resource_request: bool,
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, `deletecollection`; for
    /// non-resource requests the lower-cased HTTP method.
    pub verb: String,
    pub path: String,
    pub api_group: String,
    pub api_version: String,
    pub namespace: String,
    pub resource: String,
    pub subresource: String,
    pub name: String,
}

impl RequestInfo {
    /// Parses a request's method, path and query string as kube-apiserver's RequestInfoFactory.
    pub fn new(method: &Method, path: &str, query: Option<&str>) -> RequestInfo {
        let mut info = RequestInfo {
            verb: method.as_str().to_ascii_lowercase(),
            path: path.to_string(),
            ..RequestInfo::default()
        };
        let parts: Vec<&str> = path.trim_matches('/').split('/').filter(|p| !p.is_empty()).collect();
        // /apis/GROUP/VERSION/... or /api/VERSION/...; shorter paths (discovery) are non-resource.
        let rest = match parts.as_slice() {
            ["apis", group, version, rest @ ..] if !rest.is_empty() => {
                info.api_group = group.to_string();
                info.api_version = version.to_string();
                rest
            }
            ["api", version, rest @ ..] if !rest.is_empty() => {
                info.api_version = version.to_string();
                rest
            }
            _ => return info,
        };
        info.is_resource_request = true;
        let rest = match rest {
            // `namespaces/NS/RESOURCE...`; `namespaces/NS` alone is the namespace object itself.
            ["namespaces", namespace, tail @ ..] if !tail.is_empty() => {
                info.namespace = namespace.to_string();
                tail
            }
            ["namespaces", namespace] => {
                info.resource = "namespaces".into();
                info.name = namespace.to_string();
                &[][..]
            }
            other => other,
        };
        if let [resource, tail @ ..] = rest {
            info.resource = resource.to_string();
            if let [name, tail @ ..] = tail {
                info.name = name.to_string();
                if let [subresource, ..] = tail {
                    info.subresource = subresource.to_string();
                }
            }
        }
        let watch = query_param(query, "watch").is_some_and(|w| w == "true" || w == "1");
        info.verb = match *method {
            Method::GET | Method::HEAD if watch => "watch",
            Method::GET | Method::HEAD if info.name.is_empty() => "list",
            Method::GET | Method::HEAD => "get",
            Method::POST => "create",
            Method::PUT => "update",
            Method::PATCH => "patch",
            Method::DELETE if info.name.is_empty() => "deletecollection",
            Method::DELETE => "delete",
            _ => info.verb.as_str(),
        }
        .to_string();
        // Every request of a chunked upload (`?uploads` starts one, `?upload=ID` continues,
        // inspects, commits or aborts it) is a write of the content, authorized as the single
        // `PUT bundles/NAME/content` is: `update` on `bundles/content`.
        let chunked = query_param(query, "uploads").is_some() || query_param(query, "upload").is_some();
        if info.subresource == "content" && chunked {
            info.verb = "update".to_string();
        }
        // A list or watch narrowed to one name by `fieldSelector=metadata.name=X` is about X.
        if (info.verb == "list" || info.verb == "watch") && info.name.is_empty() {
            if let Some(selector) = query_param(query, "fieldSelector") {
                if let Some(name) = selector.strip_prefix("metadata.name=").filter(|n| !n.contains(',')) {
                    info.name = name.to_string();
                }
            }
        }
        info
    }
}

/// A query parameter's decoded value.
fn query_param(query: Option<&str>, name: &str) -> Option<String> {
    form_urlencoded::parse(query?.as_bytes()).find(|(k, _)| k == name).map(|(_, v)| v.into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(method: Method, path: &str, query: Option<&str>) -> RequestInfo {
        RequestInfo::new(&method, path, query)
    }

    #[test]
    fn resource_requests() {
        let base = "/apis/content.stowage.dev/v1alpha1";
        let get = info(Method::GET, &format!("{base}/namespaces/team-a/bundles/web/content"), None);
        assert!(get.is_resource_request);
        assert_eq!(
            (get.verb.as_str(), get.api_group.as_str(), get.namespace.as_str(), get.resource.as_str()),
            ("get", "content.stowage.dev", "team-a", "bundles")
        );
        assert_eq!((get.name.as_str(), get.subresource.as_str()), ("web", "content"));
        assert_eq!(info(Method::GET, &format!("{base}/bundles"), None).verb, "list");
        let watch = info(Method::GET, &format!("{base}/namespaces/a/bundles"), Some("watch=true&labelSelector=x"));
        assert_eq!(watch.verb, "watch");
        let one = info(Method::GET, &format!("{base}/namespaces/a/bundles"), Some("fieldSelector=metadata.name%3Dweb"));
        assert_eq!((one.verb.as_str(), one.name.as_str()), ("list", "web"));
        assert_eq!(info(Method::DELETE, &format!("{base}/namespaces/a/bundles"), None).verb, "deletecollection");
        assert_eq!(info(Method::DELETE, &format!("{base}/namespaces/a/bundles/x"), None).verb, "delete");
        assert_eq!(info(Method::POST, &format!("{base}/namespaces/a/bundles"), None).verb, "create");
        assert_eq!(info(Method::PATCH, &format!("{base}/namespaces/a/bundles/x/status"), None).subresource, "status");
        let content = format!("{base}/namespaces/a/bundles/x/content");
        for (method, query) in [
            (Method::POST, "uploads"),
            (Method::PATCH, "upload=u"),
            (Method::GET, "upload=u"),
            (Method::HEAD, "upload=u"),
            (Method::PUT, "upload=u&digest=sha256:00"),
            (Method::DELETE, "upload=u"),
        ] {
            assert_eq!(info(method.clone(), &content, Some(query)).verb, "update", "{method} ?{query}");
        }
        assert_eq!(info(Method::GET, &content, Some("path=a")).verb, "get");
        let ns = info(Method::GET, "/api/v1/namespaces/kube-system", None);
        assert_eq!((ns.resource.as_str(), ns.name.as_str(), ns.verb.as_str()), ("namespaces", "kube-system", "get"));
    }

    #[test]
    fn non_resource_requests() {
        for path in
            ["/healthz", "/apis", "/apis/content.stowage.dev", "/apis/content.stowage.dev/v1alpha1", "/openapi/v2", "/"]
        {
            let i = info(Method::GET, path, None);
            assert!(!i.is_resource_request, "{path}");
            assert_eq!(i.verb, "get");
            assert_eq!(i.path, path);
        }
        assert_eq!(info(Method::POST, "/metrics", None).verb, "post");
    }
}
