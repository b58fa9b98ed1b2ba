//! Entry points for the fuzz targets (`fuzz/`) and their regression test
//! (`tests/fuzz_regressions.rs`). Not an API: hidden from the docs and free to change.
//!
//! Each function takes the raw fuzzer input, drives one untrusted-input path of the server
//! through the same functions the request and unpack paths call, and asserts the properties that
//! must hold whatever the input (a panic here is a finding). It returns the user-visible error,
//! if any, so regression tests can pin the message of a fixed bug. The first input byte usually
//! picks a variant (encoding, patch type, resource, ...), the rest is the payload.

// Fuzz harness, not a request path: a panic here is how a fuzz target reports a finding.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

mod sinks;

use std::collections::HashMap;
use std::sync::OnceLock;

use axum::body::Bytes;
use axum::http::{header, HeaderMap, HeaderValue};
use serde_json::{json, Value};

use self::sinks::{with_revision, CheckedSink};
use crate::apiserver::fuzz_access::{
    check_object, decode_body, list_options, new_object, parse_patch, patched_object, piece, range, replacement,
    FieldSelector, LabelSelector, ResourceDef, UpdateScope, WriteRequest, RESOURCES,
};
use crate::apiserver::status::ApiError;
use crate::auth::UserInfo;
use crate::unpack::oci::{docker_config, layers::LayerSink};
use crate::unpack::source::{Sink, UnpackLimits};
use crate::unpack::tar_ingest::{self, Encoding};
use crate::unpack::UnpackError;

/// What a fuzzed call answered: `Err` holds the message a user would see.
pub type Outcome = Result<(), String>;

/// Small limits, so limit paths are reachable with small inputs.
const LIMITS: UnpackLimits = UnpackLimits {
    max_total_bytes: 1 << 20,
    max_files: 64,
    max_file_bytes: 256 << 10,
    max_path_bytes: 200,
    max_expansion_ratio: 250,
    max_git_fetch_bytes: 1 << 20,
    max_git_file_bytes: 256 << 10,
};

/// Separates the layers of an `oci_layers` input (bottom layer first, as in a manifest).
pub const LAYER_SEPARATOR: &[u8] = b"\n--stowage-layer--\n";

fn split_mode(data: &[u8]) -> (u8, &[u8]) {
    match data.split_first() {
        Some((mode, rest)) => (*mode, rest),
        None => (0, &[]),
    }
}

/// The content upload: `tar_ingest::ingest` into a `TreeSink` over a real revision, then the
/// format check and `finalize`, as `PUT …/content` does. Mode bits 0-1: 0 sniffed identity, 1/2
/// the payload gzip/zstd-compressed here (so the fuzzer reaches the tar layer), 3 the raw payload
/// declared gzip or zstd (bit 7); bits 2-3 the declared format; bit 4 a destination.
pub fn tar_ingest(data: &[u8]) -> Outcome {
    let (mode, payload) = split_mode(data);
    let (body, encoding) = match mode & 3 {
        0 => (payload.to_vec(), Encoding::Identity),
        1 => (sinks::gzip(payload), Encoding::Gzip),
        2 => (sinks::zstd(payload), Encoding::Zstd),
        _ if mode & 0x80 != 0 => (payload.to_vec(), Encoding::Zstd),
        _ => (payload.to_vec(), Encoding::Gzip),
    };
    let format = ["", "plain", "registry-v1", "helm"][usize::from((mode >> 2) & 3)];
    let destination = if mode & 0x10 != 0 { "sub/dir" } else { "" };
    with_revision(
        LIMITS,
        |sink| {
            sink.set_destination(destination);
            let mut checked = CheckedSink::new(sink, false);
            let ingested = tar_ingest::ingest(body.as_slice(), encoding, &LIMITS.ingest(), &mut checked);
            ingested.map_err(|e| UnpackError::from_ingest("upload", e))?;
            Ok(())
        },
        format,
    )
}

/// OCI layer application: each layer (split on [`LAYER_SEPARATOR`], bottom first) ingested
/// topmost first through [`LayerSink`], as an image pull does.
pub fn oci_layers(data: &[u8]) -> Outcome {
    let layers: Vec<&[u8]> = split_layers(data);
    with_revision(
        LIMITS,
        |sink| {
            let mut checked = CheckedSink::new(sink, true);
            {
                let inner: &mut Sink<'_> = &mut checked;
                let mut layer_sink = LayerSink::new(inner);
                for (i, layer) in layers.iter().enumerate().rev() {
                    let what = format!("layer {i}");
                    tar_ingest::ingest(*layer, Encoding::Identity, &LIMITS.ingest(), &mut layer_sink)
                        .map_err(|e| UnpackError::from_ingest(&what, e))?;
                    layer_sink.finish_layer();
                }
            }
            Ok(())
        },
        "",
    )
}

fn split_layers(data: &[u8]) -> Vec<&[u8]> {
    let mut layers = Vec::new();
    let mut rest = data;
    while let Some(at) = rest.windows(LAYER_SEPARATOR.len()).position(|w| w == LAYER_SEPARATOR) {
        layers.push(&rest[..at]);
        rest = &rest[at + LAYER_SEPARATOR.len()..];
    }
    layers.push(rest);
    layers
}

/// A Bundle as stored: what patches and updates apply to.
fn stored_bundle() -> Value {
    json!({
        "apiVersion": "content.stowage.dev/v1alpha1",
        "kind": "Bundle",
        "metadata": {
            "name": "web", "namespace": "team-a", "uid": "6f1c1a4e-0000-4000-8000-000000000001",
            "resourceVersion": "7", "generation": 2, "creationTimestamp": "2026-01-01T00:00:00Z",
            "labels": {"app": "web", "tier": "frontend"}, "finalizers": ["example.com/keep"],
            "managedFields": [{
                "manager": "kubectl", "operation": "Apply", "apiVersion": "content.stowage.dev/v1alpha1",
                "time": "2026-01-01T00:00:00Z", "fieldsType": "FieldsV1",
                "fieldsV1": {"f:metadata": {"f:labels": {"f:app": {}}}, "f:spec": {"f:format": {}, "f:sources": {}}}
            }]
        },
        "spec": {"format": "helm", "sources": [{"http": {"url": "https://charts.example.com/web-1.0.0.tgz"}}]},
        "status": {"phase": "Unpacked", "observedGeneration": 2}
    })
}

/// A BundleContent as stored (written by the server; users may change its metadata).
fn stored_bundle_content() -> Value {
    json!({
        "apiVersion": "content.stowage.dev/v1alpha1",
        "kind": "BundleContent",
        "metadata": {
            "name": "web-1a2b3c4d5e6f", "namespace": "team-a", "uid": "6f1c1a4e-0000-4000-8000-000000000002",
            "resourceVersion": "8", "generation": 1, "creationTimestamp": "2026-01-01T00:00:00Z",
            "ownerReferences": [{"apiVersion": "content.stowage.dev/v1alpha1", "kind": "Bundle", "name": "web",
                "uid": "6f1c1a4e-0000-4000-8000-000000000001", "controller": true}]
        },
        "spec": {"bundle": "web", "digest": "sha256:1a2b3c4d5e6f1a2b3c4d5e6f1a2b3c4d5e6f1a2b3c4d5e6f1a2b3c4d5e6f1a2b",
                 "format": "helm"}
    })
}

fn stored_object(def: &ResourceDef) -> Value {
    if def.plural == "bundles" {
        stored_bundle()
    } else {
        stored_bundle_content()
    }
}

/// Request parameters from mode bits 2-3 (`fieldValidation`) and 6 (`dryRun`).
fn params(mode: u8) -> HashMap<String, String> {
    let mut params = HashMap::new();
    if let Some(v) = [None, Some("Strict"), Some("Ignore"), Some("Warn")][usize::from((mode >> 2) & 3)] {
        params.insert("fieldValidation".to_owned(), v.to_owned());
    }
    if mode & 0x40 != 0 {
        params.insert("dryRun".to_owned(), "All".to_owned());
    }
    params
}

fn write_request<'a>(
    def: &'static ResourceDef,
    params: &'a HashMap<String, String>,
    scope: UpdateScope,
    user: &'a UserInfo,
    manager: Option<&'a str>,
) -> WriteRequest<'a> {
    WriteRequest { def, namespace: "team-a", params, scope, user, manager }
}

/// An error a request body may cause: a client error, never a 5xx.
fn client_error(err: ApiError) -> String {
    assert!(err.code.is_client_error(), "bad input answered {} {}: {}", err.code, err.reason, err.message);
    err.message
}

/// Decoding a create/update body (JSON; YAML as an apply body is) into an object, then what a
/// create and an update make of it. Mode bit 0: resource; bit 1: YAML; bits 2-3
/// `fieldValidation`; bit 4: the update scope is `status`.
pub fn object_decode(data: &[u8]) -> Outcome {
    let (mode, body) = split_mode(data);
    let def = RESOURCES[usize::from(mode & 1)];
    let params = params(mode);
    let body = Bytes::copy_from_slice(body);
    let decoded = if mode & 2 != 0 {
        yaml_body(&body).and_then(|v| check_object(def, v, &params))
    } else {
        decode_body(def, &body, &params)
    };
    let (obj, _warnings) = decoded.map_err(client_error)?;
    let user = UserInfo::default();
    let create = write_request(def, &params, UpdateScope::Main, &user, Some("fuzz"));
    let created = new_object(&create, obj.clone()).map_err(client_error);
    let scope = if mode & 0x10 != 0 { UpdateScope::Status } else { UpdateScope::Main };
    let update = write_request(def, &params, scope, &user, Some("fuzz"));
    let updated = replacement(&update, obj, &stored_object(def)).map_err(client_error);
    if let Ok((name, obj)) = &created {
        assert_eq!(obj.pointer("/metadata/name").and_then(Value::as_str), Some(name.as_str()));
    }
    created.and(updated).map(drop)
}

fn yaml_body(body: &Bytes) -> Result<Value, ApiError> {
    let mut headers = HeaderMap::new();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/apply-patch+yaml"));
    match parse_patch(&headers, body)? {
        crate::apiserver::fuzz_access::PatchKind::Apply(value) => Ok(value),
        _ => unreachable!("an apply-patch+yaml body is an apply patch"),
    }
}

/// PATCH: merge, strategic merge, JSON patch or server-side apply (mode bits 0-1) on a stored
/// Bundle or BundleContent (bit 2), of the object or its status (bit 3), forced (bit 4), or an
/// apply that creates (bit 5); then the update that would write the result.
pub fn patch(data: &[u8]) -> Outcome {
    let (mode, body) = split_mode(data);
    let media = [
        "application/merge-patch+json",
        "application/strategic-merge-patch+json",
        "application/json-patch+json",
        "application/apply-patch+yaml",
    ][usize::from(mode & 3)];
    let def = RESOURCES[usize::from((mode >> 2) & 1)];
    let scope = if mode & 8 != 0 { UpdateScope::Status } else { UpdateScope::Main };
    let force = mode & 0x10 != 0;
    let live = (mode & 0x20 == 0).then(|| stored_object(def));
    let mut headers = HeaderMap::new();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(media));
    let params = HashMap::new();
    let name = live.as_ref().and_then(|l| l.pointer("/metadata/name")).and_then(Value::as_str).unwrap_or("web");
    let patch = parse_patch(&headers, &Bytes::copy_from_slice(body)).map_err(client_error)?;
    let (patched, _warnings) =
        patched_object(def, &patch, live.as_ref(), &params, "fuzz", force, scope, name).map_err(client_error)?;
    let user = UserInfo::default();
    let manager = (mode & 3 != 3).then_some("fuzz");
    let request = write_request(def, &params, scope, &user, manager);
    let written = match &live {
        Some(live) => replacement(&request, patched, live),
        None => new_object(&request, patched).map(|(_, obj)| obj),
    };
    let answer_bytes = match &written {
        Ok(obj) => obj.to_string().len(),
        Err(err) => err.message.len(),
    };
    assert!(answer_bytes <= MAX_PATCH_ANSWER_BYTES, "a {}-byte patch made a {answer_bytes}-byte answer", body.len());
    written.map(drop).map_err(client_error)
}

/// What a patch of a small object may grow to: the JSON patch copy limit plus room for the
/// object and error messages around it (a patch body itself is small here).
const MAX_PATCH_ANSWER_BYTES: usize = 8 << 20;

/// Label and field selectors: the first line is a label selector, the second a field selector
/// (for either resource, mode bit 0); both are matched against the stored objects.
pub fn selectors(data: &[u8]) -> Outcome {
    let (mode, text) = split_mode(data);
    let text = String::from_utf8_lossy(text);
    let (labels, fields) = text.split_once('\n').unwrap_or((&text, ""));
    let def = RESOURCES[usize::from(mode & 1)];
    let objects = [stored_bundle(), stored_bundle_content(), json!({}), json!({"metadata": {"labels": []}})];
    let label_selector = LabelSelector::parse(labels).map_err(client_error)?;
    let field_selector = FieldSelector::parse(fields, &def.all_selectable_fields()).map_err(client_error)?;
    for obj in &objects {
        let _ = label_selector.matches(obj) && field_selector.matches(obj);
    }
    Ok(())
}

/// Registry credentials from a docker config file: the first line names the registry, the rest
/// is the file.
pub fn docker_config(data: &[u8]) -> Outcome {
    let split = data.iter().position(|b| *b == b'\n').unwrap_or(data.len());
    let registry = String::from_utf8_lossy(&data[..split]);
    let config = data.get(split + 1..).unwrap_or_default();
    match docker_config::credentials_for(config, &registry)? {
        Some(credentials) => {
            let shown = format!("{credentials:?}");
            assert!(shown.contains("<redacted>"), "credentials printed without redaction: {shown}");
            Ok(())
        }
        None => Ok(()),
    }
}

/// A kubeconfig as `--kubeconfig` reads it (the plugin and the delegated client): parsed,
/// turned into a client configuration for each context, then a client. File, command and
/// auth-provider references are dropped first: a fuzzer must not run commands or read files.
pub fn kubeconfig(data: &[u8]) -> Outcome {
    let text = std::str::from_utf8(data).map_err(|e| e.to_string())?;
    let mut config = kube::config::Kubeconfig::from_yaml(text).map_err(|e| e.to_string())?;
    for cluster in config.clusters.iter_mut().filter_map(|c| c.cluster.as_mut()) {
        cluster.certificate_authority = None;
        cluster.proxy_url = None;
    }
    for user in config.auth_infos.iter_mut().filter_map(|a| a.auth_info.as_mut()) {
        user.token_file = None;
        user.client_certificate = None;
        user.client_key = None;
        user.auth_provider = None;
        user.exec = None;
    }
    let contexts: Vec<Option<String>> =
        std::iter::once(None).chain(config.contexts.iter().map(|c| Some(c.name.clone())).take(4)).collect();
    let runtime = runtime();
    let mut last = Ok(());
    for context in contexts {
        let options = kube::config::KubeConfigOptions { context, ..Default::default() };
        let kubeconfig = config.clone();
        last = runtime.block_on(async move {
            let config = kube::Config::from_custom_kubeconfig(kubeconfig, &options).await.map_err(|e| e.to_string())?;
            kube::Client::try_from(config).map(drop).map_err(|e| e.to_string())
        });
    }
    last
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a current-thread runtime")
    })
}

/// `Range`/`If-Range` of a download (first line: Range, second: If-Range, third: the size; an
/// empty line is no header) and `Content-Range` of a chunked upload piece (fourth line).
pub fn range_headers(data: &[u8]) -> Outcome {
    let text = String::from_utf8_lossy(data);
    let mut lines = text.split('\n');
    let mut headers = HeaderMap::new();
    for name in [header::RANGE, header::IF_RANGE] {
        if let Some(value) = lines.next().filter(|l| !l.is_empty()).and_then(|l| HeaderValue::from_str(l).ok()) {
            headers.insert(name, value);
        }
    }
    let size = lines.next().and_then(|l| l.trim().parse::<u64>().ok()).unwrap_or(1000);
    if let range::RangeRequest::Partial(spec) = range::parse(&headers, "\"etag\"", size) {
        assert!(spec.start < spec.end && spec.end <= size, "range {spec:?} outside 0..{size}");
    }
    let mut upload = HeaderMap::new();
    if let Some(value) = lines.next().and_then(|l| HeaderValue::from_str(l).ok()) {
        upload.insert(header::CONTENT_RANGE, value);
    }
    let piece = piece(&upload, 0).map_err(client_error)?;
    assert!(piece.end.is_none_or(|end| end >= piece.start), "piece {piece:?} ends before it starts");
    Ok(())
}

/// List options (`limit`, `continue`, `resourceVersion`, `resourceVersionMatch`) from a query
/// string.
pub fn list_query(data: &[u8]) -> Outcome {
    let params: HashMap<String, String> = form_urlencoded::parse(data).into_owned().collect();
    list_options(&params).map(drop).map_err(client_error)
}
