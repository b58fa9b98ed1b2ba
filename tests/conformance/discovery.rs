//! What clients read before anything else, and what operators scrape: aggregated and legacy
//! discovery, the OpenAPI v2 and v3 documents, `/version`, and the request metrics — checked over
//! HTTP and through kubectl.

use std::collections::HashMap;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};
use sha2::{Digest, Sha512};

use crate::harness::*;
use crate::kubectl::Kubectl;

const AGGREGATED_V2: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";
/// What kubectl 1.32 sends for `/api` and `/apis`.
const KUBECTL_DISCOVERY_ACCEPT: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json";
const BUNDLE_VERBS: [&str; 8] = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"];
const BUNDLECONTENT_VERBS: [&str; 7] = ["delete", "deletecollection", "get", "list", "patch", "update", "watch"];

async fn get_with(server: &Server, path: &str, headers: &[(&str, &str)]) -> reqwest::Response {
    let mut request = server.client().get(server.url(path));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request.send().await.unwrap_or_else(|e| panic!("GET {path}: {e}"))
}

/// Asserts 200 and returns the Content-Type and the JSON body.
async fn json_with(server: &Server, path: &str, headers: &[(&str, &str)]) -> (String, Value) {
    let resp = get_with(server, path, headers).await;
    assert_eq!(resp.status(), StatusCode::OK, "GET {path} {headers:?}");
    let content_type = header(resp.headers(), "content-type").unwrap_or("").to_owned();
    let body = resp.bytes().await.expect("read body");
    (content_type, parse_json(&body, path))
}

fn find<'a>(list: &'a Value, field: &str, value: &str) -> &'a Value {
    let items = list.as_array().unwrap_or_else(|| panic!("not a list: {list:#}"));
    items.iter().find(|i| i[field] == value).unwrap_or_else(|| panic!("no {field}={value} in {list:#}"))
}

fn gvk(kind: &str) -> Value {
    json!({"group": "content.stowage.dev", "version": "v1alpha1", "kind": kind})
}

#[tokio::test(flavor = "multi_thread")]
async fn aggregated_discovery_when_asked_legacy_otherwise() {
    let server = Server::start_temp(&[]);
    let resp = get_with(&server, "/apis", &[("accept", KUBECTL_DISCOVERY_ACCEPT)]).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(header(resp.headers(), "content-type"), Some(AGGREGATED_V2));
    let etag = header(resp.headers(), "etag").expect("aggregated discovery has an ETag").to_owned();
    let list = parse_json(&resp.bytes().await.unwrap(), "/apis aggregated");
    assert_eq!(list["kind"], "APIGroupDiscoveryList");
    assert_eq!(list["apiVersion"], "apidiscovery.k8s.io/v2");
    let items = list["items"].as_array().expect("items");
    let names: Vec<&str> = items.iter().map(|i| i["metadata"]["name"].as_str().unwrap_or("")).collect();
    // Standalone, the self reviews kubectl's `auth whoami` and `auth can-i` use are served too,
    // and the Events the server writes about its objects.
    assert_eq!(
        names,
        ["content.stowage.dev", "authentication.k8s.io", "authorization.k8s.io", "events.k8s.io"],
        "{list:#}"
    );
    for (group, resources) in [
        ("authentication.k8s.io", vec!["selfsubjectreviews"]),
        ("authorization.k8s.io", vec!["selfsubjectaccessreviews", "selfsubjectrulesreviews"]),
    ] {
        let item = items.iter().find(|i| i["metadata"]["name"] == group).unwrap();
        let served = item["versions"][0]["resources"].as_array().unwrap();
        let plural: Vec<&str> = served.iter().map(|r| r["resource"].as_str().unwrap_or("")).collect();
        assert_eq!(plural, resources, "{item:#}");
        assert!(served.iter().all(|r| r["verbs"] == json!(["create"]) && r["scope"] == "Cluster"), "{item:#}");
    }
    let version = &items[0]["versions"][0];
    assert_eq!((&version["version"], &version["freshness"]), (&json!("v1alpha1"), &json!("Current")));

    let bundles = find(&version["resources"], "resource", "bundles");
    assert_eq!(bundles["responseKind"], gvk("Bundle"));
    assert_eq!(bundles["scope"], "Namespaced");
    assert_eq!(bundles["singularResource"], "bundle");
    assert_eq!(bundles["verbs"], json!(BUNDLE_VERBS));
    assert_eq!(bundles["shortNames"], json!(["bdl"]));
    assert_eq!(bundles["categories"], json!(["stowage"]));
    let content = find(&bundles["subresources"], "subresource", "content");
    assert_eq!((&content["responseKind"], &content["verbs"]), (&gvk("Bundle"), &json!(["get", "update"])));
    let status = find(&bundles["subresources"], "subresource", "status");
    assert_eq!((&status["responseKind"], &status["verbs"]), (&gvk("Bundle"), &json!(["get", "patch", "update"])));

    let contents = find(&version["resources"], "resource", "bundlecontents");
    assert_eq!(contents["responseKind"], gvk("BundleContent"));
    assert_eq!(contents["verbs"], json!(BUNDLECONTENT_VERBS));
    assert_eq!(contents["shortNames"], json!(["bc"]));
    assert_eq!(find(&contents["subresources"], "subresource", "content")["verbs"], json!(["get"]));

    // The kube-aggregator revalidates with the ETag.
    let again = get_with(&server, "/apis", &[("accept", AGGREGATED_V2), ("if-none-match", &etag)]).await;
    assert_eq!(again.status(), StatusCode::NOT_MODIFIED);

    // v2beta1 for clients that only know it; /api has the core group, with Events only.
    let beta = "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList";
    let (content_type, list) = json_with(&server, "/apis", &[("accept", beta)]).await;
    assert_eq!((content_type.as_str(), &list["apiVersion"]), (beta, &json!("apidiscovery.k8s.io/v2beta1")));
    let (content_type, core) = json_with(&server, "/api", &[("accept", KUBECTL_DISCOVERY_ACCEPT)]).await;
    assert_eq!(content_type, AGGREGATED_V2);
    assert_eq!(core["kind"], "APIGroupDiscoveryList");
    let core_resources = &core["items"][0]["versions"][0]["resources"];
    assert_eq!(core["items"].as_array().map(Vec::len), Some(1), "{core:#}");
    assert_eq!(
        (&core_resources[0]["resource"], &core_resources[0]["verbs"]),
        (&json!("events"), &json!(["get", "list", "watch"]))
    );

    // Legacy documents otherwise, advertising the same verbs.
    for accept in [None, Some("application/json"), Some("application/vnd.kubernetes.protobuf,application/json")] {
        let headers: Vec<(&str, &str)> = accept.iter().map(|a| ("accept", *a)).collect();
        let (content_type, groups) = json_with(&server, "/apis", &headers).await;
        assert_eq!(
            (content_type.as_str(), &groups["kind"]),
            ("application/json", &json!("APIGroupList")),
            "{accept:?}"
        );
        assert_eq!(groups["groups"][0]["preferredVersion"]["groupVersion"], API_VERSION);
        let (_, core) = json_with(&server, "/api", &headers).await;
        assert_eq!(core["kind"], "APIVersions");
    }
    let legacy = server.get_json(API).await;
    assert_eq!(legacy["kind"], "APIResourceList");
    assert_eq!(find(&legacy["resources"], "name", "bundles")["verbs"], json!(BUNDLE_VERBS));
    assert_eq!(find(&legacy["resources"], "name", "bundlecontents")["verbs"], json!(BUNDLECONTENT_VERBS));
    assert_eq!(find(&legacy["resources"], "name", "bundles/status")["verbs"], status["verbs"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_api_resources_reads_aggregated_discovery() {
    let server = Server::start_temp(&[]);
    let kubectl = Kubectl::new(&server);
    let out = kubectl.ok(&["api-resources", "--api-group=content.stowage.dev", "-o", "wide"]);
    for (name, short, kind, verbs) in [
        ("bundles", "bdl", "Bundle", BUNDLE_VERBS.join(",")),
        ("bundlecontents", "bc", "BundleContent", BUNDLECONTENT_VERBS.join(",")),
    ] {
        let line =
            out.lines().find(|l| l.starts_with(&format!("{name} "))).unwrap_or_else(|| panic!("no {name}:\n{out}"));
        let columns: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(columns, [name, short, API_VERSION, "true", kind, verbs.as_str(), "stowage"], "{out}");
    }
    // kubectl took everything from the aggregated document: it never asked for the legacy
    // group-version resource list.
    let metrics = server.metrics().await;
    let aggregated = sample(&metrics, "apiserver_request_total", &[("subresource", "/apis"), ("code", "200")]);
    assert!(aggregated.is_some_and(|n| n >= 1.0), "no /apis request counted: {metrics:?}");
    let legacy = sample(&metrics, "apiserver_request_total", &[("subresource", "/apis/content.stowage.dev/v1alpha1")]);
    assert_eq!(legacy, None, "kubectl fell back to legacy discovery");
}

/// Every `$ref` in `doc` resolves inside it.
fn assert_refs_resolve(doc: &Value, node: &Value) {
    match node {
        Value::Object(map) => {
            if let Some(target) = map.get("$ref").and_then(Value::as_str) {
                assert!(doc.pointer(target.trim_start_matches('#')).is_some(), "dangling $ref {target}");
            }
            map.values().for_each(|v| assert_refs_resolve(doc, v));
        }
        Value::Array(items) => items.iter().for_each(|v| assert_refs_resolve(doc, v)),
        _ => {}
    }
}

/// Every operation of every path names the kind it acts on; returns how many there are.
fn assert_operations_carry_gvk(doc: &Value) -> usize {
    let mut operations = 0;
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for (method, op) in item.as_object().expect("path item").iter().filter(|(m, _)| *m != "parameters") {
            let gvk = &op["x-kubernetes-group-version-kind"];
            assert_eq!(gvk["group"], "content.stowage.dev", "{method} {path}: {op:#}");
            assert!(["Bundle", "BundleContent"].contains(&gvk["kind"].as_str().unwrap_or("")), "{method} {path}");
            assert!(op["x-kubernetes-action"].is_string(), "{method} {path}");
            operations += 1;
        }
    }
    operations
}

#[tokio::test(flavor = "multi_thread")]
async fn openapi_v2_and_v3_documents() {
    let server = Server::start_temp(&[]);
    let resp = get_with(&server, "/openapi/v2", &[("accept", "application/json")]).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let etag = header(resp.headers(), "etag").expect("ETag on /openapi/v2").to_owned();
    let v2 = parse_json(&resp.bytes().await.unwrap(), "/openapi/v2");
    assert_eq!(v2["swagger"], "2.0");
    for kind in ["Bundle", "BundleList", "BundleContent", "BundleContentList"] {
        let definition = &v2["definitions"][format!("dev.stowage.content.v1alpha1.{kind}")];
        assert_eq!(definition["x-kubernetes-group-version-kind"], json!([gvk(kind)]), "{kind}");
    }
    assert!(v2["definitions"]["io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"]["properties"]["labels"].is_object());
    assert_refs_resolve(&v2, &v2);
    assert!(assert_operations_carry_gvk(&v2) >= 15);
    let patch = &v2["paths"]["/apis/content.stowage.dev/v1alpha1/namespaces/{namespace}/bundles/{name}"]["patch"];
    assert!(patch["parameters"].as_array().unwrap().iter().any(|p| p["name"] == "fieldValidation"), "{patch:#}");
    let again = get_with(&server, "/openapi/v2", &[("if-none-match", &etag)]).await;
    assert_eq!(again.status(), StatusCode::NOT_MODIFIED);
    let protobuf = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf";
    expect_status(get_with(&server, "/openapi/v2", &[("accept", protobuf)]).await, 406, "NotAcceptable").await;

    // v3: the index names the document by its hash; that URL is immutable, a stale one redirects.
    let index = server.get_json("/openapi/v3").await;
    let url = str_at(&index, "/paths/apis~1content.stowage.dev~1v1alpha1/serverRelativeURL").to_owned();
    let (path, hash) = url.split_once("?hash=").unwrap_or_else(|| panic!("no ?hash= in {url}"));
    let resp = get_with(&server, &url, &[("accept", "application/json")]).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(header(resp.headers(), "cache-control"), Some("public, immutable"));
    assert_eq!(header(resp.headers(), "etag"), Some(format!("\"{hash}\"").as_str()));
    let body = resp.bytes().await.unwrap();
    assert_eq!(hex::encode_upper(Sha512::digest(&body)), hash, "the hash names the document's bytes");
    let v3 = parse_json(&body, &url);
    assert_refs_resolve(&v3, &v3);
    assert_eq!(
        assert_operations_carry_gvk(&v3),
        assert_operations_carry_gvk(&v2),
        "v2 and v3 describe the same operations"
    );
    let unhashed = get_with(&server, path, &[]).await;
    assert_eq!(header(unhashed.headers(), "cache-control"), Some("public"));
    let stale = get_with(&server, &format!("{path}?hash=0000"), &[]).await;
    assert_eq!(stale.status(), StatusCode::OK, "a stale hash redirects to the current document");
    assert_eq!(stale.url().query(), Some(format!("hash={hash}").as_str()));
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_explain_reads_the_openapi_documents() {
    let server = Server::start_temp(&[]);
    let kubectl = Kubectl::new(&server);
    let sources = kubectl.ok(&["explain", "bundle.spec.sources"]);
    for want in
        ["KIND:       Bundle", "VERSION:    v1alpha1", "exactly one of image, git, http, upload", "upload", "git"]
    {
        assert!(sources.contains(want), "explain bundle.spec.sources lacks {want:?}:\n{sources}");
    }
    let labels = kubectl.ok(&["explain", "bundle.metadata.labels"]);
    assert!(labels.contains("map[string]string"), "metadata resolves to ObjectMeta:\n{labels}");
    let content = kubectl.ok(&["explain", "bundlecontents"]);
    assert!(content.contains("KIND:       BundleContent"), "{content}");
}

#[tokio::test(flavor = "multi_thread")]
async fn version_over_http_and_kubectl() {
    let server = Server::start_temp(&[]);
    let info = server.get_json("/version").await;
    // A Kubernetes release kubectl does not warn about, stowage's own version as build metadata.
    let expected = format!("v1.33.0+stowage.{}", env!("CARGO_PKG_VERSION"));
    assert_eq!(str_at(&info, "/gitVersion"), expected);
    assert_eq!(str_at(&info, "/major"), "1");
    assert_eq!(str_at(&info, "/minor"), "33");
    assert_eq!(str_at(&info, "/compiler"), "rustc");
    assert!(str_at(&info, "/platform").contains('/'), "{info:#}");
    for field in ["gitCommit", "buildDate", "goVersion"] {
        assert!(info[field].is_string(), "{field} in {info:#}");
    }
    // Public, as kube's system:public-info-viewer makes it.
    let anonymous = server.anonymous_client().get(server.url("/version")).send().await.unwrap();
    assert_eq!(anonymous.status(), StatusCode::OK);

    let kubectl = Kubectl::new(&server);
    let out: Value = serde_json::from_str(&kubectl.ok(&["version", "-o", "json"])).expect("kubectl version -o json");
    assert_eq!(str_at(&out, "/serverVersion/gitVersion"), expected, "{out:#}");
    assert_eq!(str_at(&out, "/serverVersion/platform"), str_at(&info, "/platform"));
}

/// The value of the series `name` whose labels include `labels`, if exactly one matches.
fn sample(metrics: &HashMap<String, f64>, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let wanted: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
    let matching: Vec<f64> = metrics
        .iter()
        .filter(|(key, _)| key.strip_prefix(name).is_some_and(|rest| rest.starts_with('{')))
        .filter(|(key, _)| {
            let inner = key[name.len() + 1..key.len() - 1].to_owned();
            let present: Vec<&str> = inner.split(',').collect();
            wanted.iter().all(|w| present.contains(&w.as_str()))
        })
        .map(|(_, value)| *value)
        .collect();
    assert!(matching.len() <= 1, "{name} {labels:?} matches several series: {metrics:?}");
    matching.first().copied()
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_count_requests_and_open_watches() {
    let server = Server::start_temp(&[]);
    let resource = [
        ("group", "content.stowage.dev"),
        ("version", "v1alpha1"),
        ("resource", "bundles"),
        ("component", "apiserver"),
    ];
    let series = |verb: &'static str, scope: &'static str, code: &'static str| {
        let mut labels = resource.to_vec();
        labels.extend([("verb", verb), ("scope", scope), ("subresource", ""), ("code", code)]);
        labels
    };
    server.create_bundle("m", "one").await;
    server.get_json(&bundle("m", "one")).await;
    server.get_json(&bundles("m")).await;
    server.get_json(&bundles("m")).await;
    expect_status(server.get(&bundle("m", "missing")).await, 404, "NotFound").await;
    let m = server.metrics().await;
    assert_eq!(sample(&m, "apiserver_request_total", &series("POST", "resource", "201")), Some(1.0), "{m:?}");
    assert_eq!(sample(&m, "apiserver_request_total", &series("GET", "resource", "200")), Some(1.0));
    assert_eq!(sample(&m, "apiserver_request_total", &series("GET", "resource", "404")), Some(1.0));
    assert_eq!(sample(&m, "apiserver_request_total", &series("LIST", "namespace", "200")), Some(2.0));
    let mut list_histogram = resource.to_vec();
    list_histogram.extend([("verb", "LIST"), ("scope", "namespace"), ("subresource", "")]);
    assert_eq!(sample(&m, "apiserver_request_duration_seconds_count", &list_histogram), Some(2.0));
    list_histogram.push(("le", "+Inf"));
    assert_eq!(sample(&m, "apiserver_request_duration_seconds_bucket", &list_histogram), Some(2.0));

    // A watch is long-running: in the gauge while open, never in the latency histogram.
    let mut watch_labels = resource.to_vec();
    watch_labels.extend([("verb", "WATCH"), ("scope", "namespace"), ("subresource", "")]);
    let watch = server.client().get(server.url(&format!("{}?watch=true", bundles("m")))).send().await.expect("watch");
    assert_eq!(watch.status(), StatusCode::OK);
    let open = |expected: f64| {
        let (server, labels) = (&server, &watch_labels);
        async move {
            let m = server.metrics().await;
            match sample(&m, "apiserver_longrunning_requests", labels) {
                Some(n) if n == expected => Ok(m),
                other => Err(format!("{other:?}")),
            }
        }
    };
    let m = eventually(Duration::from_secs(10), "the open watch in the gauge", || open(1.0)).await;
    assert_eq!(sample(&m, "apiserver_request_total", &[&watch_labels[..], &[("code", "200")]].concat()), Some(1.0));
    assert_eq!(sample(&m, "apiserver_request_duration_seconds_count", &watch_labels), None);
    drop(watch);
    eventually(Duration::from_secs(30), "the closed watch out of the gauge", || open(0.0)).await;
}
