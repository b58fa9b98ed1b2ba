//! Bundles through kube-rs, the way a Rust controller talks to stowage: a `kube::Client` built from
//! the admin kubeconfig, `Api<DynamicObject>` for `content.stowage.dev/v1alpha1` Bundles, discovery,
//! paged and selected lists, watches, merge/JSON patches, the status subresource, metadata-only
//! reads, deletes, server-side apply, and `kube::runtime` watchers feeding a reflector that must
//! converge on the server's state again after the server restarts or the watch is cut off.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{Stream, StreamExt};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams,
    WatchEvent, WatchParams,
};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::discovery::{self, verbs, Discovery, Scope};
use kube::runtime::{reflector, watcher, WatchStreamExt};
use kube::{Client, Config, ResourceExt};
use serde_json::{json, Value};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use crate::harness::*;

const GROUP: &str = "content.stowage.dev";
const VERSION: &str = "v1alpha1";
/// How long a reflector gets to catch up with the server (it may be in the watcher's backoff).
const CONVERGE: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------------------------
// Helpers

/// The Bundle resource as a controller would write it by hand.
fn bundle_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, VERSION, "Bundle"), "bundles")
}

/// A kube-rs client from the server's admin kubeconfig (client certificate, the server's CA),
/// optionally pointed at another URL (a proxy in front of the server).
async fn kube_client_at(server: &Server, url: Option<&str>) -> Client {
    let path = server.kubeconfig();
    let kubeconfig = Kubeconfig::read_from(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let mut config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap_or_else(|e| panic!("kube config from {}: {e}", path.display()));
    if let Some(url) = url {
        config.cluster_url = url.parse().unwrap_or_else(|e| panic!("cluster URL {url}: {e}"));
    }
    Client::try_from(config).unwrap_or_else(|e| panic!("kube client: {e}"))
}

async fn kube_client(server: &Server) -> Client {
    kube_client_at(server, None).await
}

fn bundles_api(client: &Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), ns, &bundle_resource())
}

/// A Bundle with one upload source and these labels.
fn new_bundle(name: &str, labels: &[(&str, &str)]) -> DynamicObject {
    let mut obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": API_VERSION,
        "kind": "Bundle",
        "metadata": {"name": name},
        "spec": {"sources": [{"upload": {}}]},
    }))
    .expect("a Bundle is a DynamicObject");
    if !labels.is_empty() {
        obj.metadata.labels = Some(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
    }
    obj
}

async fn create(api: &Api<DynamicObject>, name: &str, labels: &[(&str, &str)]) -> DynamicObject {
    api.create(&PostParams::default(), &new_bundle(name, labels))
        .await
        .unwrap_or_else(|e| panic!("create bundle {name}: {e}"))
}

fn generation(obj: &DynamicObject) -> i64 {
    obj.metadata.generation.unwrap_or_else(|| panic!("no metadata.generation: {obj:?}"))
}

/// The Bundle once the server has brought its status to its generation (it writes the status of
/// an upload Bundle after each spec change, as a controller would).
async fn settled(api: &Api<DynamicObject>, name: &str) -> DynamicObject {
    eventually_every(
        Duration::from_secs(30),
        Duration::from_millis(100),
        &format!("the status of {name} at its generation"),
        || async {
            let obj = api.get(name).await.expect("get");
            match obj.data["status"]["observedGeneration"] == json!(generation(&obj)) {
                true => Ok(obj),
                false => Err(format!("{:?}", obj.data["status"])),
            }
        },
    )
    .await
}

fn rv(obj: &DynamicObject) -> String {
    obj.resource_version().unwrap_or_else(|| panic!("no metadata.resourceVersion: {obj:?}"))
}

/// The Kubernetes error a kube call failed with (panics on success or on a transport error).
fn api_error<T: std::fmt::Debug>(result: kube::Result<T>, what: &str) -> kube::core::Status {
    match result {
        Err(kube::Error::Api(e)) => *e,
        other => panic!("{what}: expected an API error, got {other:?}"),
    }
}

/// Every page of a list, following `continue` tokens; `between_pages` runs after the first page.
async fn list_pages(
    api: &Api<DynamicObject>,
    selector: &str,
    limit: u32,
    mut between_pages: impl FnMut() -> Option<std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>>,
) -> Vec<Vec<String>> {
    let mut pages = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let mut params = ListParams::default().labels(selector).limit(limit);
        if let Some(token) = &token {
            params = params.continue_token(token);
        }
        let list = api.list(&params).await.unwrap_or_else(|e| panic!("list {selector} limit {limit}: {e}"));
        assert!(
            list.metadata.resource_version.as_deref().is_some_and(|rv| !rv.is_empty()),
            "list without metadata.resourceVersion: {:?}",
            list.metadata
        );
        pages.push(list.items.iter().map(|o| o.name_any()).collect::<Vec<_>>());
        if pages.len() == 1 {
            if let Some(change) = between_pages() {
                change.await;
            }
        }
        match list.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(next) => token = Some(next),
            None => break,
        }
        assert!(pages.len() <= 1000, "more than 1000 pages for limit {limit}: the continue token does not advance");
    }
    pages
}

/// The next `count` non-bookmark watch events (or fewer if the stream ends / 20 s pass).
async fn next_events(
    stream: &mut (impl Stream<Item = kube::Result<WatchEvent<DynamicObject>>> + Unpin),
    count: usize,
) -> Vec<WatchEvent<DynamicObject>> {
    let mut events = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while events.len() < count {
        match tokio::time::timeout_at(deadline, stream.next()).await {
            Ok(Some(Ok(WatchEvent::Bookmark(_)))) => {}
            Ok(Some(Ok(event))) => events.push(event),
            Ok(Some(Err(e))) => panic!("watch stream error: {e}"),
            Ok(None) | Err(_) => break,
        }
    }
    events
}

fn describe(event: &WatchEvent<DynamicObject>) -> (String, String) {
    match event {
        WatchEvent::Added(o) => ("ADDED".into(), o.name_any()),
        WatchEvent::Modified(o) => ("MODIFIED".into(), o.name_any()),
        WatchEvent::Deleted(o) => ("DELETED".into(), o.name_any()),
        WatchEvent::Bookmark(b) => ("BOOKMARK".into(), b.metadata.resource_version.clone()),
        WatchEvent::Error(e) => ("ERROR".into(), format!("{} {}", e.code, e.message)),
    }
}

fn event_object(event: &WatchEvent<DynamicObject>) -> &DynamicObject {
    match event {
        WatchEvent::Added(o) | WatchEvent::Modified(o) | WatchEvent::Deleted(o) => o,
        other => panic!("not an object event: {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Discovery, lists, watches

#[tokio::test(flavor = "multi_thread")]
async fn discovery_finds_bundles_as_the_hand_written_resource() {
    let server = Server::start_temp(&[]);
    let client = kube_client(&server).await;

    let discovery = Discovery::new(client.clone()).filter(&[GROUP]).run().await.expect("discovery of the group");
    let group = discovery.get(GROUP).unwrap_or_else(|| panic!("discovery has no group {GROUP}"));
    assert_eq!(group.preferred_version_or_latest(), VERSION);
    let (ar, caps) = group.recommended_kind("Bundle").expect("discovery finds kind Bundle");
    assert_eq!(ar, bundle_resource(), "discovered Bundle resource");
    assert_eq!(caps.scope, Scope::Namespaced);
    for verb in [verbs::GET, verbs::LIST, verbs::WATCH, verbs::CREATE, verbs::UPDATE, verbs::PATCH, verbs::DELETE] {
        assert!(caps.supports_operation(verb), "Bundle verbs lack {verb}: {:?}", caps.operations);
    }
    let subresources: BTreeSet<&str> = caps.subresources.iter().map(|(r, _)| r.plural.as_str()).collect();
    assert!(subresources.contains("status") && subresources.contains("content"), "subresources: {subresources:?}");
    let (content, _) = group.recommended_kind("BundleContent").expect("discovery finds kind BundleContent");
    assert_eq!(content.plural, "bundlecontents");

    let gvk = GroupVersionKind::gvk(GROUP, VERSION, "Bundle");
    assert_eq!(discovery.resolve_gvk(&gvk).map(|(ar, _)| ar), Some(bundle_resource()));

    // The aggregated documents (`/apis` and `/api` as apidiscovery.k8s.io/v2, the latter without
    // groups) say the same.
    let aggregated = Discovery::new(client.clone()).run_aggregated().await.expect("aggregated discovery");
    // A standalone server also serves the self reviews (`kubectl auth whoami`, `can-i`) and its
    // Events (core `v1` and `events.k8s.io`).
    assert_eq!(
        aggregated.groups().map(|g| g.name()).collect::<BTreeSet<_>>(),
        BTreeSet::from(["", "authentication.k8s.io", "authorization.k8s.io", "events.k8s.io", GROUP]),
        "aggregated groups"
    );
    let group = aggregated.get(GROUP).unwrap_or_else(|| panic!("aggregated discovery has no group {GROUP}"));
    assert_eq!(group.preferred_version_or_latest(), VERSION);
    let (aggregated_ar, aggregated_caps) = group.recommended_kind("Bundle").expect("aggregated discovery finds Bundle");
    assert_eq!(aggregated_ar, bundle_resource());
    assert_eq!(aggregated_caps.scope, Scope::Namespaced);
    assert_eq!(aggregated_caps.operations, caps.operations, "verbs differ between the two discovery forms");
    let aggregated_subresources: BTreeSet<&str> =
        aggregated_caps.subresources.iter().map(|(r, _)| r.plural.as_str()).collect();
    assert_eq!(aggregated_subresources, subresources);
    let (content, _) = group.recommended_kind("BundleContent").expect("aggregated discovery finds BundleContent");
    assert_eq!(content.plural, "bundlecontents");
    let (pinned, _) = discovery::pinned_kind(&client, &gvk).await.expect("pinned_kind Bundle");
    assert_eq!(pinned, bundle_resource());

    // The discovered resource works.
    let api: Api<DynamicObject> = Api::namespaced_with(client, "disc", &ar);
    create(&api, "found", &[]).await;
    assert_eq!(api.get("found").await.expect("get via discovered resource").name_any(), "found");
}

#[tokio::test(flavor = "multi_thread")]
async fn list_with_selector_and_limit_pages_to_full_duplicate_free_results() {
    let server = Server::start_temp(&[]);
    let client = kube_client(&server).await;
    let api = bundles_api(&client, "paging");
    let mut tier_a = BTreeSet::new();
    for i in 0..23 {
        let (name, tier) = (format!("b{i:02}"), if i % 3 == 2 { "b" } else { "a" });
        create(&api, &name, &[("tier", tier)]).await;
        if tier == "a" {
            tier_a.insert(name);
        }
    }
    create(&bundles_api(&client, "elsewhere"), "other-ns", &[("tier", "a")]).await;
    assert_eq!(tier_a.len(), 16);

    let mut paged = false;
    for limit in [1u32, 4, 7, 16, 500] {
        let pages = list_pages(&api, "tier=a", limit, || None).await;
        let names: Vec<&String> = pages.iter().flatten().collect();
        let unique: BTreeSet<String> = names.iter().map(|n| n.to_string()).collect();
        assert_eq!(names.len(), unique.len(), "limit {limit}: duplicates across pages {pages:?}");
        assert_eq!(unique, tier_a, "limit {limit}: pages {pages:?}");
        if pages.len() > 1 {
            paged = true;
            for page in &pages {
                assert!(page.len() <= limit as usize, "limit {limit}: a page of {}: {pages:?}", page.len());
            }
        }
    }
    report(&format!("kube_client: list limit/continue: server {}", if paged { "pages" } else { "does not page" }));

    // Objects created and deleted while a client pages: every object that existed throughout is
    // returned exactly once.
    let pages = list_pages(&api, "tier=a", 4, || {
        let api = api.clone();
        Some(Box::pin(async move {
            create(&api, "a-late", &[("tier", "a")]).await;
            create(&api, "00-early", &[("tier", "a")]).await;
        }))
    })
    .await;
    let names: Vec<&String> = pages.iter().flatten().collect();
    let unique: BTreeSet<String> = names.iter().map(|n| n.to_string()).collect();
    assert_eq!(names.len(), unique.len(), "duplicates across pages with concurrent creates: {pages:?}");
    assert!(unique.is_superset(&tier_a), "objects missing when paging with concurrent creates: {pages:?}");

    // All namespaces, selected.
    let all: Api<DynamicObject> = Api::all_with(client, &bundle_resource());
    let list = all.list(&ListParams::default().labels("tier=a")).await.expect("list all namespaces");
    let got: BTreeSet<String> =
        list.items.iter().map(|o| format!("{}/{}", o.namespace().unwrap_or_default(), o.name_any())).collect();
    assert!(got.contains("elsewhere/other-ns") && got.contains("paging/b00") && !got.contains("paging/b02"), "{got:?}");
    assert_eq!(got.len(), tier_a.len() + 3, "{got:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn watch_from_a_list_resource_version_sees_changes_in_order() {
    let server = Server::start_temp(&[]);
    let client = kube_client(&server).await;
    let api = bundles_api(&client, "watch");
    create(&api, "before", &[("app", "web")]).await;
    let list = api.list(&ListParams::default()).await.expect("list");
    let list_rv = list.metadata.resource_version.expect("list resourceVersion");

    let params = WatchParams::default().labels("app=web").timeout(60);
    let mut stream = api.watch(&params, &list_rv).await.expect("start watch").boxed();

    let created = create(&api, "web", &[("app", "web")]).await;
    create(&api, "unselected", &[("app", "db")]).await;
    let patched = api
        .patch("web", &PatchParams::default(), &Patch::Merge(json!({"spec": {"revisionHistoryLimit": 4}})))
        .await
        .expect("merge patch");
    let deleted = api.delete("web", &DeleteParams::default()).await.expect("delete");
    assert!(deleted.is_left(), "delete returned a Status, not the object: {deleted:?}");

    // The server's own status write after the spec change (observedGeneration follows every spec
    // change) may land before the delete: one more MODIFIED, with the patched spec.
    let mut events = next_events(&mut stream, 3).await;
    if events.get(2).is_some_and(|e| matches!(e, WatchEvent::Modified(_))) {
        let status_write = events.remove(2);
        assert_eq!(event_object(&status_write).data["spec"]["revisionHistoryLimit"], 4);
        events.extend(next_events(&mut stream, 1).await);
    }
    let seen: Vec<(String, String)> = events.iter().map(describe).collect();
    assert_eq!(
        seen,
        vec![("ADDED".into(), "web".into()), ("MODIFIED".into(), "web".into()), ("DELETED".into(), "web".into())],
        "events after list resourceVersion {list_rv}"
    );
    assert_eq!(event_object(&events[0]).uid(), created.uid());
    assert_eq!(event_object(&events[1]).data["spec"]["revisionHistoryLimit"], 4);
    assert_eq!(rv(event_object(&events[1])), rv(&patched));
    let rvs: Vec<u64> = events.iter().map(|e| rv(event_object(e)).parse().expect("numeric resourceVersion")).collect();
    assert!(rvs.windows(2).all(|w| w[0] < w[1]), "resourceVersions not increasing: {rvs:?}");
    assert!(rvs[0] > list_rv.parse::<u64>().expect("numeric list resourceVersion"), "{rvs:?} vs list {list_rv}");
}

// ---------------------------------------------------------------------------------------------
// Writes

#[tokio::test(flavor = "multi_thread")]
async fn merge_and_json_patches_and_the_status_subresource() {
    let server = Server::start_temp(&[]);
    let client = kube_client(&server).await;
    let api = bundles_api(&client, "patch");
    let created = create(&api, "p", &[]).await;
    assert_eq!(generation(&created), 1);

    // Merge: spec bumps generation, labels do not; sources are kept.
    let merged = api
        .patch("p", &PatchParams::default(), &Patch::Merge(json!({"spec": {"revisionHistoryLimit": 5}})))
        .await
        .expect("merge patch spec");
    assert_eq!(generation(&merged), 2);
    assert_eq!(merged.data["spec"]["revisionHistoryLimit"], 5);
    assert_eq!(merged.data["spec"]["sources"], json!([{"upload": {}}]));
    let merged = settled(&api, "p").await;
    let labelled = api
        .patch("p", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"tier": "gold"}}})))
        .await
        .expect("merge patch labels");
    assert_eq!(generation(&labelled), 2, "labels are not spec");
    assert_eq!(labelled.labels().get("tier").map(String::as_str), Some("gold"));
    assert_ne!(rv(&labelled), rv(&merged));

    // JSON patch, including a test operation.
    let ops = json!([
        {"op": "test", "path": "/spec/revisionHistoryLimit", "value": 5},
        {"op": "replace", "path": "/spec/revisionHistoryLimit", "value": 7},
        {"op": "add", "path": "/metadata/annotations", "value": {"note": "json-patched"}},
    ]);
    let json_patched = api
        .patch("p", &PatchParams::default(), &Patch::Json::<()>(serde_json::from_value(ops).expect("JSON patch")))
        .await
        .expect("JSON patch");
    assert_eq!(generation(&json_patched), 3);
    assert_eq!(json_patched.data["spec"]["revisionHistoryLimit"], 7);
    assert_eq!(json_patched.annotations().get("note").map(String::as_str), Some("json-patched"));
    let json_patched = settled(&api, "p").await;
    let failing = json!([
        {"op": "test", "path": "/spec/revisionHistoryLimit", "value": 3},
        {"op": "replace", "path": "/spec/revisionHistoryLimit", "value": 9},
    ]);
    let err = api_error(
        api.patch("p", &PatchParams::default(), &Patch::Json::<()>(serde_json::from_value(failing).expect("patch")))
            .await,
        "JSON patch with a failing test",
    );
    assert!((400..500).contains(&err.code), "failing test op: {err:?}");
    assert_eq!(rv(&api.get("p").await.expect("get")), rv(&json_patched), "a failed patch changed the object");

    // replace_status: status changes, spec in the same body is ignored, generation stays.
    let mut body = json_patched.clone();
    body.data["status"]["phase"] = json!("Failed");
    body.data["status"]["conditions"] = json!([{
        "type": "Unpacked", "status": "False", "reason": "SourceUnavailable",
        "message": "set by a test", "lastTransitionTime": "2026-01-01T00:00:00Z",
    }]);
    body.data["spec"]["paused"] = json!(true);
    let replaced = api.replace_status("p", &PostParams::default(), &body).await.expect("replace_status");
    assert_eq!(replaced.data["status"]["phase"], "Failed");
    assert_eq!(replaced.data["status"]["conditions"][0]["reason"], "SourceUnavailable");
    assert_eq!(replaced.data["spec"], json_patched.data["spec"], "replace_status changed spec");
    assert_eq!(generation(&replaced), 3, "a status write bumped generation");
    assert_ne!(rv(&replaced), rv(&json_patched));

    // patch_status (merge): same rules.
    let status_patched = api
        .patch_status(
            "p",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Patched"}, "spec": {"paused": true}})),
        )
        .await
        .expect("patch_status");
    assert_eq!(status_patched.data["status"]["phase"], "Patched");
    assert_eq!(status_patched.data["status"]["conditions"][0]["reason"], "SourceUnavailable", "merge kept the rest");
    assert_eq!(status_patched.data["spec"], json_patched.data["spec"], "patch_status changed spec");
    assert_eq!(generation(&status_patched), 3);
    assert_eq!(api.get_status("p").await.expect("get_status").data["status"]["phase"], "Patched");

    // And the other way round: the main resource does not write status.
    let mut main = api.get("p").await.expect("get");
    main.data["status"]["phase"] = json!("Hijacked");
    main.metadata.labels.get_or_insert_with(BTreeMap::new).insert("tier".into(), "silver".into());
    let written = api.replace("p", &PostParams::default(), &main).await.expect("replace");
    assert_eq!(written.data["status"]["phase"], "Patched", "the main resource wrote status");
    assert_eq!(written.labels().get("tier").map(String::as_str), Some("silver"));
    assert_eq!(generation(&written), 3);

    // A stale resourceVersion is a conflict.
    let err = api_error(api.replace("p", &PostParams::default(), &main).await, "replace with a stale resourceVersion");
    assert_eq!((err.code, err.reason.as_str()), (409, "Conflict"), "{err:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn delete_returns_the_object_and_metadata_reads_work() {
    let server = Server::start_temp(&[]);
    let client = kube_client(&server).await;
    let api = bundles_api(&client, "meta");
    let m1 = create(&api, "m1", &[("x", "1")]).await;
    create(&api, "m2", &[("x", "2")]).await;

    let meta = api.get_metadata("m1").await.expect("get_metadata");
    assert_eq!(meta.metadata.name.as_deref(), Some("m1"));
    assert_eq!(meta.metadata.uid, m1.metadata.uid);
    assert_eq!(meta.metadata.resource_version, m1.metadata.resource_version);
    assert_eq!(meta.metadata.labels, m1.metadata.labels);
    let types = meta.types.as_ref().expect("PartialObjectMetadata has apiVersion and kind");
    assert_eq!((types.api_version.as_str(), types.kind.as_str()), ("meta.k8s.io/v1", "PartialObjectMetadata"));

    let list = api.list_metadata(&ListParams::default().labels("x=1")).await.expect("list_metadata");
    let names: Vec<String> = list.items.iter().map(|m| m.metadata.name.clone().unwrap_or_default()).collect();
    assert_eq!(names, vec!["m1"]);
    assert_eq!(list.types.kind, "PartialObjectMetadataList");
    assert!(list.metadata.resource_version.is_some(), "{:?}", list.metadata);
    let all = api.list_metadata(&ListParams::default()).await.expect("list_metadata, no selector");
    assert_eq!(all.items.len(), 2);

    // A uid precondition that does not match is a conflict; nothing is deleted.
    let err = api_error(
        api.delete("m1", &DeleteParams { preconditions: Some(wrong_uid()), ..DeleteParams::default() }).await,
        "delete with a wrong uid precondition",
    );
    assert_eq!(err.code, 409, "{err:?}");

    let deleted = api.delete("m1", &DeleteParams::default()).await.expect("delete");
    let obj = deleted.left().expect("delete returns the deleted object, not a Status");
    assert_eq!(obj.name_any(), "m1");
    assert_eq!(obj.uid(), m1.uid());
    assert!(api.get_opt("m1").await.expect("get_opt").is_none(), "m1 still there");
    assert!(api.get_metadata_opt("m1").await.expect("get_metadata_opt").is_none());
    let err = api_error(api.delete("m1", &DeleteParams::default()).await, "second delete");
    assert_eq!((err.code, err.reason.as_str()), (404, "NotFound"), "{err:?}");
    let err = api_error(api.get("m1").await, "get after delete");
    assert_eq!(err.code, 404);
}

fn wrong_uid() -> kube::api::Preconditions {
    kube::api::Preconditions { uid: Some("00000000-0000-0000-0000-000000000000".into()), resource_version: None }
}

#[tokio::test(flavor = "multi_thread")]
async fn server_side_apply_creates_updates_conflicts_and_forces() {
    let server = Server::start_temp(&[]);
    let client = kube_client(&server).await;
    let api = bundles_api(&client, "ssa");
    let config = |limit: u32, labels: Value| {
        json!({
            "apiVersion": API_VERSION,
            "kind": "Bundle",
            "metadata": {"name": "ssa", "labels": labels},
            "spec": {"sources": [{"upload": {}}], "revisionHistoryLimit": limit},
        })
    };
    let owner = |obj: &DynamicObject, manager: &str| -> Value {
        obj.metadata
            .managed_fields
            .iter()
            .flatten()
            .find(|f| f.manager.as_deref() == Some(manager))
            .and_then(|f| f.fields_v1.as_ref())
            .map(|f| f.0.clone())
            .unwrap_or(Value::Null)
    };
    let a = PatchParams::apply("manager-a");

    // Apply creates.
    let created = api.patch("ssa", &a, &Patch::Apply(config(2, json!({"owner": "a"})))).await.expect("apply creates");
    assert_eq!(generation(&created), 1);
    assert_eq!(created.data["spec"]["revisionHistoryLimit"], 2);
    assert!(owner(&created, "manager-a").pointer("/f:spec/f:revisionHistoryLimit").is_some(), "{created:?}");

    // Re-applying the same configuration changes nothing (no new resourceVersion).
    let again = api.patch("ssa", &a, &Patch::Apply(config(2, json!({"owner": "a"})))).await.expect("re-apply");
    assert_eq!(rv(&again), rv(&created), "a no-op apply wrote a new resourceVersion");

    // A changed field.
    let changed = api.patch("ssa", &a, &Patch::Apply(config(4, json!({"owner": "a"})))).await.expect("apply change");
    assert_eq!(changed.data["spec"]["revisionHistoryLimit"], 4);
    assert_eq!(generation(&changed), 2);

    // Another manager setting the same field conflicts...
    let b = PatchParams::apply("manager-b");
    let err = api_error(
        api.patch("ssa", &b, &Patch::Apply(config(7, json!({})))).await,
        "apply by another manager of a field manager-a owns",
    );
    assert_eq!((err.code, err.reason.as_str()), (409, "Conflict"), "{err:?}");
    assert!(err.message.contains("manager-a"), "the conflict names the owner: {err:?}");
    assert_eq!(api.get("ssa").await.expect("get").data["spec"]["revisionHistoryLimit"], 4);

    // ...unless it forces, which takes the field over.
    let forced = api.patch("ssa", &b.clone().force(), &Patch::Apply(config(7, json!({})))).await.expect("force");
    assert_eq!(forced.data["spec"]["revisionHistoryLimit"], 7);
    assert!(owner(&forced, "manager-b").pointer("/f:spec/f:revisionHistoryLimit").is_some(), "{forced:?}");
    assert!(owner(&forced, "manager-a").pointer("/f:spec/f:revisionHistoryLimit").is_none(), "{forced:?}");

    // A manager that stops applying a field it alone owns removes it.
    let dropped = api
        .patch(
            "ssa",
            &a,
            &Patch::Apply(json!({"apiVersion": API_VERSION, "kind": "Bundle", "metadata": {"name": "ssa"}})),
        )
        .await
        .expect("apply without the label");
    assert!(!dropped.labels().contains_key("owner"), "label manager-a no longer applies stayed: {dropped:?}");
    assert_eq!(dropped.data["spec"]["revisionHistoryLimit"], 7, "manager-b's field went with manager-a's apply");
}

// ---------------------------------------------------------------------------------------------
// kube::runtime: watcher + reflector across a restart and a cut-off

/// A TCP proxy in front of the server: gives the reflector's client one stable address across
/// server restarts (which pick a new port) and lets a test cut every connection.
struct Proxy {
    addr: SocketAddr,
    backend: Arc<Mutex<String>>,
    up: Arc<AtomicBool>,
    connections: Arc<Mutex<CancellationToken>>,
    accept: tokio::task::JoinHandle<()>,
}

impl Proxy {
    async fn start(server_url: &str) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("proxy address");
        let backend = Arc::new(Mutex::new(Self::host_port(server_url)));
        let up = Arc::new(AtomicBool::new(true));
        let connections = Arc::new(Mutex::new(CancellationToken::new()));
        let (b, u, c) = (backend.clone(), up.clone(), connections.clone());
        let accept = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                if !u.load(Ordering::SeqCst) {
                    continue; // dropped: the client sees the connection close
                }
                let target = b.lock().expect("proxy backend").clone();
                let cancel = c.lock().expect("proxy connections").child_token();
                tokio::spawn(async move {
                    let Ok(mut upstream) = TcpStream::connect(&target).await else { return };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut upstream) => {}
                        _ = cancel.cancelled() => {}
                    }
                });
            }
        });
        Proxy { addr, backend, up, connections, accept }
    }

    fn host_port(url: &str) -> String {
        url.strip_prefix("https://").unwrap_or(url).trim_end_matches('/').to_owned()
    }

    fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    fn set_backend(&self, server_url: &str) {
        *self.backend.lock().expect("proxy backend") = Self::host_port(server_url);
    }

    /// Closes every open connection and refuses new ones until [`Proxy::resume`].
    fn cut(&self) {
        self.up.store(false, Ordering::SeqCst);
        let mut token = self.connections.lock().expect("proxy connections");
        token.cancel();
        *token = CancellationToken::new();
    }

    fn resume(&self) {
        self.up.store(true, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.connections.lock().map(|t| t.cancel()).unwrap_or(());
    }
}

/// name → (resourceVersion, labels) of the Bundles in a namespace, from the server.
async fn server_state(
    api: &Api<DynamicObject>,
) -> Result<BTreeMap<String, (String, BTreeMap<String, String>)>, String> {
    let list = api.list(&ListParams::default()).await.map_err(|e| format!("list: {e}"))?;
    Ok(list.items.iter().map(|o| (o.name_any(), (rv(o), o.labels().clone()))).collect())
}

fn store_state(store: &reflector::Store<DynamicObject>) -> BTreeMap<String, (String, BTreeMap<String, String>)> {
    store.state().iter().map(|o| (o.name_any(), (rv(o), o.labels().clone()))).collect()
}

/// Waits until the reflector's store holds exactly the server's objects at their resourceVersions.
async fn converge(
    store: &reflector::Store<DynamicObject>,
    api: &Api<DynamicObject>,
    errors: &Mutex<Vec<String>>,
    what: &str,
) {
    eventually(CONVERGE, &format!("reflector converges {what}"), || async {
        let server = server_state(api).await?;
        let local = store_state(store);
        if server == local {
            Ok(())
        } else {
            let errors = errors.lock().expect("errors").iter().rev().take(5).cloned().collect::<Vec<_>>();
            Err(format!("server {server:?}\nreflector {local:?}\nlast watcher errors {errors:?}"))
        }
    })
    .await
}

/// Waits until the watcher has failed (one more error than the `seen` before `what`).
async fn watcher_failed_since(errors: &Mutex<Vec<String>>, seen: usize, what: &str) {
    eventually_every(CONVERGE, Duration::from_millis(20), &format!("the watcher failed after {what}"), || async {
        let errors = errors.lock().expect("errors");
        match errors.len() > seen {
            true => Ok(()),
            false => Err(format!("{} error(s): {:?}", errors.len(), errors.last())),
        }
    })
    .await;
}

/// A reflector through a proxy follows creates, updates and deletes made while it is connected, while
/// the server is down and restarts, and while it is cut off.
async fn reflector_converges_across_restart_and_cut(config: watcher::Config, ns: &str) {
    let mut server = Server::start_temp(&[]);
    let proxy = Proxy::start(&server.url).await;
    let mut direct = bundles_api(&kube_client(&server).await, ns);
    for i in 0..5 {
        create(&direct, &format!("r{i}"), &[("gen", "0")]).await;
    }

    let reflected = bundles_api(&kube_client_at(&server, Some(&proxy.url())).await, ns);
    let writer = reflector::store::Writer::<DynamicObject>::new(bundle_resource());
    let store = writer.as_reader();
    let errors = Arc::new(Mutex::new(Vec::<String>::new()));
    let stream = reflector(writer, watcher(reflected, config)).default_backoff();
    let task = {
        let errors = errors.clone();
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(event) = stream.next().await {
                if let Err(e) = event {
                    errors.lock().expect("errors").push(e.to_string());
                }
            }
        })
    };
    tokio::time::timeout(CONVERGE, store.wait_until_ready())
        .await
        .expect("reflector ready within 30 s")
        .expect("reflector writer alive");
    converge(&store, &direct, &errors, "after the initial list").await;

    // Changes while connected.
    create(&direct, "live", &[]).await;
    direct
        .patch("r0", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"gen": "1"}}})))
        .await
        .expect("label");
    converge(&store, &direct, &errors, "after live changes").await;

    // The server dies and comes back on another port; changes land before the watcher is back.
    let seen = errors.lock().expect("errors").len();
    server.kill9();
    watcher_failed_since(&errors, seen, "the server was killed").await;
    server.restart();
    proxy.set_backend(&server.url);
    direct = bundles_api(&kube_client(&server).await, ns);
    create(&direct, "after-restart", &[]).await;
    direct.delete("r1", &DeleteParams::default()).await.expect("delete r1");
    direct
        .patch("r2", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"gen": "2"}}})))
        .await
        .expect("label r2");
    converge(&store, &direct, &errors, "after a server restart").await;

    // Cut off from the server (connections closed, new ones refused) while objects change.
    let seen = errors.lock().expect("errors").len();
    proxy.cut();
    watcher_failed_since(&errors, seen, "the cut").await;
    create(&direct, "while-cut", &[]).await;
    direct.delete("r3", &DeleteParams::default()).await.expect("delete r3");
    direct
        .patch("r4", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"gen": "3"}}})))
        .await
        .expect("label r4");
    // It tried again after those changes, and was refused: it missed them while cut off.
    let seen = errors.lock().expect("errors").len();
    watcher_failed_since(&errors, seen, "the changes made while cut off").await;
    proxy.resume();
    converge(&store, &direct, &errors, "after the watch was cut off").await;

    // And it keeps following.
    direct.delete("live", &DeleteParams::default()).await.expect("delete live");
    create(&direct, "final", &[("gen", "4")]).await;
    converge(&store, &direct, &errors, "after it is back").await;
    task.abort();
}

#[tokio::test(flavor = "multi_thread")]
async fn reflector_with_list_watch_converges_across_restart() {
    reflector_converges_across_restart_and_cut(watcher::Config::default(), "reflect-lw").await;
}

/// Streaming lists (WatchList: `sendInitialEvents=true`, ended by the `k8s.io/initial-events-end`
/// bookmark). A resumed watcher asks from its last resourceVersion without initial events, so it
/// sees the deletes made while it was away as DELETED events (kube-runtime before 3 asked for the
/// initial events again and never pruned the objects deleted meanwhile: kube-rs/kube#1844).
#[tokio::test(flavor = "multi_thread")]
async fn reflector_with_streaming_list_sees_deletes_made_while_away() {
    let config = watcher::Config::default().streaming_lists();
    reflector_converges_across_restart_and_cut(config, "reflect-sl").await;
}
