//! The `content` subresource: upload (PUT on bundles) and download (GET on bundles and
//! bundlecontents) of a revision — the whole deterministic tar, one file, a subtree, or a JSON
//! listing — with ETags and byte ranges, streamed both ways.

use std::collections::HashMap;

use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::TryStreamExt;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::handlers::{get_object, json_response, resource_def};
use super::range::{self, RangeRequest};
use super::resources::bundle::BUNDLE;
use super::resources::bundlecontent::{content_name, BUNDLE_CONTENT};
use super::status::{ApiError, ApiResult, Cause};
use super::{blocking, meta, AppState, API_VERSION};
use crate::storage::{
    FileEntry, ObjectKey, ObjectWrite, Precondition, RangeSpec, RevisionId, RevisionRecord, StorageError, Store,
};
use crate::unpack::tar_ingest::{self, Encoding, IngestError, IngestLimits};
use crate::unpack::EntrySink;

/// The error the body reader returns once the configured maximum is exceeded.
#[derive(Debug, thiserror::Error)]
#[error("request body larger than the maximum of {0} bytes")]
struct BodyTooLarge(u64);

/// Output buffer size for streamed responses.
const OUT_CHUNK: usize = 256 * 1024;

// ---------------------------------------------------------------------------------------------
// Upload

/// Writes accepted archive entries into a revision, under the source's destination prefix.
struct RevisionSink<'a> {
    writer: &'a mut crate::storage::RevisionWriter,
    prefix: String,
}

impl RevisionSink<'_> {
    fn place(&self, path: &str) -> String {
        format!("{}{path}", self.prefix)
    }
}

impl EntrySink for RevisionSink<'_> {
    type Error = StorageError;
    fn file(&mut self, path: &str, executable: bool, data: &mut dyn std::io::Read) -> Result<(), StorageError> {
        let path = self.place(path);
        self.writer.add_file(&path, executable, data)
    }
    fn symlink(&mut self, path: &str, target: &str) -> Result<(), StorageError> {
        let path = self.place(path);
        self.writer.add_symlink(&path, target)
    }
    fn hardlink(&mut self, path: &str, target: &str) -> Result<(), StorageError> {
        let (path, target) = (self.place(path), self.place(target));
        self.writer.add_hardlink(&path, &target)
    }
}

fn encoding(headers: &HeaderMap) -> ApiResult<Encoding> {
    let value = headers.get(header::CONTENT_ENCODING).and_then(|v| v.to_str().ok()).unwrap_or("").trim();
    match value.to_ascii_lowercase().as_str() {
        "" | "identity" => Ok(Encoding::Identity),
        "gzip" | "x-gzip" => Ok(Encoding::Gzip),
        "zstd" => Ok(Encoding::Zstd),
        other => Err(ApiError::unsupported_media_type(format!(
            "unsupported Content-Encoding {other:?}: use gzip, zstd or none"
        ))),
    }
}

pub async fn put_bundle_content(
    State(app): State<AppState>,
    Path((namespace, resource, name)): Path<(String, String, String)>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    if resource != BUNDLE.plural {
        resource_def(&resource)?;
        return Err(ApiError::method_not_allowed(format!(
            "{resource}/content is read-only: upload to bundles/NAME/content"
        )));
    }
    let bundle = get_object(&app, &BUNDLE, &namespace, &name).await?;
    let Some(upload) = upload_source(&bundle) else {
        return Err(ApiError::bad_request(format!(
            "Bundle {name:?} has no upload source: add `{{upload: {{}}}}` to spec.sources to accept content by PUT"
        )));
    };
    let limit = app.limits.max_body_bytes;
    let declared =
        headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit) {
        return Err(ApiError::too_large(BodyTooLarge(limit).to_string()));
    }
    let encoding = encoding(&headers)?;
    let prefix = upload_prefix(&upload);

    // Count bytes as they arrive; past the limit the stream fails with BodyTooLarge.
    let mut seen = 0u64;
    let stream = body.into_data_stream().map_err(std::io::Error::other).and_then(move |chunk: Bytes| {
        seen += chunk.len() as u64;
        let result = if seen > limit { Err(std::io::Error::other(BodyTooLarge(limit))) } else { Ok(chunk) };
        std::future::ready(result)
    });
    let reader = tokio_util::io::SyncIoBridge::new(tokio_util::io::StreamReader::new(stream));
    let ingest_limits = IngestLimits { max_unpacked_bytes: app.limits.max_unpacked_bytes, ..IngestLimits::default() };
    let store = app.store.clone();
    let bundle_name = name.clone();
    let pending = tokio::task::spawn_blocking(move || {
        let mut writer = store.begin_revision().map_err(ApiError::from)?;
        let mut sink = RevisionSink { writer: &mut writer, prefix };
        tar_ingest::ingest(reader, encoding, &ingest_limits, &mut sink).map_err(|e| ingest_error(&bundle_name, e))?;
        writer.finalize().map_err(ApiError::from)
    })
    .await
    .map_err(|e| ApiError::internal(format!("upload task failed: {e}")))??;

    commit_upload(&app, &namespace, &name, pending).await
}

fn upload_source(bundle: &Value) -> Option<Value> {
    bundle
        .pointer("/spec/sources")
        .and_then(Value::as_array)?
        .iter()
        .find(|s| s.get("upload").is_some_and(|u| !u.is_null()))
        .cloned()
}

fn upload_prefix(source: &Value) -> String {
    let destination = source.get("destination").and_then(Value::as_str).unwrap_or("").trim_matches('/');
    if destination.is_empty() {
        String::new()
    } else {
        format!("{destination}/")
    }
}

fn ingest_error(bundle: &str, err: IngestError<StorageError>) -> ApiError {
    match err {
        IngestError::InvalidEntry { path, reason } => invalid_entry(bundle, path, reason),
        IngestError::Sink(StorageError::InvalidEntry { path, reason }) => invalid_entry(bundle, path, reason),
        IngestError::Corrupt(message) => ApiError::bad_request(format!("invalid archive: {message}")),
        IngestError::TooLarge { limit } => {
            ApiError::too_large(format!("archive expands past the maximum of {limit} bytes (--max-unpacked-bytes)"))
        }
        IngestError::Source(e) => match e.get_ref().and_then(|inner| inner.downcast_ref::<BodyTooLarge>()) {
            Some(too_large) => ApiError::too_large(format!("{too_large} (--max-body-bytes)")),
            None => ApiError::bad_request(format!("reading the request body: {e}")),
        },
        IngestError::Sink(other) => other.into(),
    }
}

fn invalid_entry(bundle: &str, path: String, reason: String) -> ApiError {
    let cause = Cause { reason: "FieldValueInvalid".into(), message: format!("{path}: {reason}"), field: path };
    ApiError::invalid(BUNDLE.kind, bundle, vec![cause])
}

/// Attaches the new revision to a BundleContent and points the Bundle at it, atomically. Identical
/// content already stored for this Bundle is reused (the new copy is released).
async fn commit_upload(
    app: &AppState,
    namespace: &str,
    name: &str,
    pending: crate::storage::PendingRevision,
) -> ApiResult<Response> {
    let record = pending.record().clone();
    let content = content_name(name, &record.digest);
    let (namespace, name) = (namespace.to_string(), name.to_string());
    let outcome = blocking(app, move |store| {
        let mut pending = pending;
        // Retry on conflict: the Bundle may be updated while a long upload runs.
        for _ in 0..5 {
            let Some(bundle) = store.get_object(&ObjectKey::new("bundles", &namespace, &name))? else {
                return Err(StorageError::NotFound(format!("bundles {name:?}")));
            };
            let existing = store.get_object(&ObjectKey::new("bundlecontents", &namespace, &content))?;
            let mut updated = bundle.value.clone();
            updated["status"] = uploaded_status(&bundle.value, &content, &record);
            let bundle_write = ObjectWrite::Put {
                key: ObjectKey::new("bundles", &namespace, &name),
                object: updated,
                precondition: Precondition::ResourceVersion(bundle.resource_version),
                revision: None,
            };
            let already_stored =
                existing.as_ref().and_then(|e| e.value.pointer("/spec/digest").and_then(Value::as_str))
                    == Some(record.digest.as_str());
            let result = if already_stored {
                // Identical content is already stored: the new copy is released when `pending` drops.
                store.write_objects(vec![bundle_write])
            } else {
                let content_write = ObjectWrite::Put {
                    key: ObjectKey::new("bundlecontents", &namespace, &content),
                    object: bundle_content_object(&bundle.value, &content, &record),
                    precondition: Precondition::MustNotExist,
                    revision: Some(record.id),
                };
                pending.commit(vec![content_write, bundle_write])
            };
            match result {
                Err(StorageError::Conflict(_)) => continue,
                other => return other,
            }
        }
        Err(StorageError::Conflict(format!("bundles {name:?}")))
    })
    .await?;
    let bundle = outcome.objects.into_iter().last().unwrap_or(Value::Null);
    Ok(json_response(StatusCode::OK, &bundle, &[]))
}

fn uploaded_status(bundle: &Value, content: &str, record: &RevisionRecord) -> Value {
    let generation = bundle.pointer("/metadata/generation").and_then(Value::as_u64).unwrap_or(1);
    let mut status = bundle.get("status").cloned().filter(Value::is_object).unwrap_or_else(|| json!({}));
    let previous = status.pointer("/conditions/0").cloned();
    let transition = match previous {
        Some(c) if c.get("status") == Some(&json!("True")) => c.get("lastTransitionTime").cloned(),
        _ => None,
    }
    .unwrap_or_else(|| json!(meta::now_timestamp()));
    let format = bundle.pointer("/spec/format").and_then(Value::as_str).unwrap_or("");
    status["observedGeneration"] = json!(generation);
    status["phase"] = json!("Unpacked");
    status["conditions"] = json!([{
        "type": "Unpacked",
        "status": "True",
        "reason": "Unpacked",
        "message": format!("serving {} ({} files, {} bytes)", record.digest, record.files, record.size),
        "lastTransitionTime": transition,
        "observedGeneration": generation,
    }]);
    status["resolvedSources"] = json!([{"upload": {"digest": record.digest}}]);
    status["contentName"] = json!(content);
    status["digest"] = json!(record.digest);
    status["format"] = json!(format);
    status["files"] = json!(record.files);
    status["size"] = json!(record.size);
    status
}

fn bundle_content_object(bundle: &Value, content: &str, record: &RevisionRecord) -> Value {
    let name = bundle.pointer("/metadata/name").cloned().unwrap_or(Value::Null);
    let namespace = bundle.pointer("/metadata/namespace").cloned().unwrap_or(Value::Null);
    json!({
        "apiVersion": API_VERSION,
        "kind": BUNDLE_CONTENT.kind,
        "metadata": {
            "name": content,
            "namespace": namespace,
            "uid": uuid::Uuid::new_v4().to_string(),
            "creationTimestamp": meta::now_timestamp(),
            "generation": 1,
            "labels": {"content.stowage.dev/bundle": name},
            "ownerReferences": [{
                "apiVersion": API_VERSION,
                "kind": BUNDLE.kind,
                "name": name,
                "uid": bundle.pointer("/metadata/uid").cloned().unwrap_or(Value::Null),
                "controller": true,
                "blockOwnerDeletion": true,
            }],
        },
        "spec": {
            "bundle": name,
            "digest": record.digest,
            "format": bundle.pointer("/spec/format").and_then(Value::as_str).unwrap_or(""),
            "files": record.files,
            "size": record.size,
            "storedSize": record.stored_size,
            "source": {"upload": {}},
        },
    })
}

// ---------------------------------------------------------------------------------------------
// Download

pub async fn get_content(
    State(app): State<AppState>,
    Path((namespace, resource, name)): Path<(String, String, String)>,
    Query(params): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let def = resource_def(&resource)?;
    let (revision, record) = resolve_revision(&app, def.plural, &namespace, &name).await?;
    let wants_listing = wants_listing(&headers);
    let path = params.get("path").map(|p| p.trim_start_matches('/').to_string()).unwrap_or_default();
    if wants_listing {
        return listing(&app, revision, record, path).await;
    }
    if path.is_empty() {
        return serve_ranged(
            &app,
            &headers,
            &record.digest,
            record.tar_size,
            "application/x-tar",
            move |store, range, out| store.read_tar(revision, record.tar_size, range, out),
        );
    }
    let entry = {
        let path = path.clone();
        blocking(&app, move |store| resolve_file(store, revision, &path)).await?
    };
    match entry {
        Some(entry) => {
            let etag = format!("sha256:{}", entry.sha256);
            let size = entry.size;
            serve_ranged(&app, &headers, &etag, size, "application/octet-stream", move |store, range, out| {
                store.read_file(revision, &entry, range, out)
            })
        }
        None => subtree(&app, revision, &path).await,
    }
}

/// The JSON listing is served only to clients that ask for JSON and nothing else: kubectl and
/// client-go send `application/json, */*` by default, and `kubectl get --raw …/content > x.tar`
/// must get the tar.
fn wants_listing(headers: &HeaderMap) -> bool {
    let accept = headers.get_all(header::ACCEPT).iter().filter_map(|v| v.to_str().ok()).collect::<Vec<_>>().join(",");
    let types: Vec<&str> = accept.split(',').map(|m| m.split(';').next().unwrap_or("").trim()).collect();
    types.contains(&"application/json")
        && !types
            .iter()
            .any(|t| matches!(*t, "*/*" | "application/*" | "application/x-tar" | "application/octet-stream"))
}

/// The revision an object serves: a BundleContent's own, or a Bundle's active one.
async fn resolve_revision(
    app: &AppState,
    plural: &str,
    namespace: &str,
    name: &str,
) -> ApiResult<(RevisionId, RevisionRecord)> {
    let content = if plural == BUNDLE.plural {
        let bundle = get_object(app, &BUNDLE, namespace, name).await?;
        let content = bundle.pointer("/status/contentName").and_then(Value::as_str).unwrap_or("").to_string();
        if content.is_empty() {
            return Err(ApiError::not_found_message(format!("Bundle {name:?} has no content yet")));
        }
        content
    } else {
        name.to_string()
    };
    let key = ObjectKey::new(BUNDLE_CONTENT.plural, namespace, &content);
    let stored = blocking(app, move |store| store.get_object(&key)).await?;
    let Some(revision) = stored.and_then(|s| s.revision) else {
        return Err(ApiError::not_found(BUNDLE_CONTENT.plural, &content));
    };
    let record = blocking(app, move |store| store.revision(revision)).await?;
    Ok((revision, record))
}

/// Follows symlinks inside the revision (a few hops) to a regular file.
fn resolve_file(store: &Store, revision: RevisionId, path: &str) -> Result<Option<FileEntry>, StorageError> {
    let mut path = path.to_string();
    for _ in 0..8 {
        let Some(entry) = store.file(revision, &path)? else {
            return Ok(None);
        };
        let Some(target) = entry.target.as_deref() else {
            return Ok(Some(entry));
        };
        let base = path.rsplit_once('/').map(|(dir, _)| dir).unwrap_or("");
        let mut parts: Vec<&str> = base.split('/').filter(|p| !p.is_empty()).collect();
        for part in target.split('/') {
            match part {
                "" | "." => {}
                ".." => {
                    parts.pop();
                }
                p => parts.push(p),
            }
        }
        path = parts.join("/");
    }
    Ok(None)
}

async fn subtree(app: &AppState, revision: RevisionId, path: &str) -> ApiResult<Response> {
    let prefix = format!("{}/", path.trim_end_matches('/'));
    let exists = {
        let prefix = prefix.clone();
        blocking(app, move |store| store.files(revision, &prefix).next().transpose()).await?.is_some()
    };
    if !exists {
        return Err(ApiError::not_found_message(format!("path {path:?} not found in the content")));
    }
    let body = stream_body(app.store.clone(), move |store, out| store.write_subtree_tar(revision, &prefix, out));
    Ok(([(header::CONTENT_TYPE, "application/x-tar")], body).into_response())
}

async fn listing(app: &AppState, revision: RevisionId, record: RevisionRecord, path: String) -> ApiResult<Response> {
    let body = stream_body(app.store.clone(), move |store, out| {
        let head = json!({"kind": "BundleContentFileList", "apiVersion": API_VERSION, "digest": record.digest});
        let head = head.to_string();
        // Stream `{"kind":…,"digest":…,"files":[…]}` without holding the list.
        out(head[..head.len() - 1].as_bytes())?;
        out(b",\"files\":[")?;
        let mut first = true;
        for entry in store.files(revision, &path) {
            let entry = entry?;
            let mut item = json!({
                "path": entry.path,
                "type": if entry.is_symlink() { "symlink" } else { "file" },
                "mode": entry.mode(),
                "size": entry.size,
                "sha256": entry.sha256,
            });
            if let Some(target) = &entry.target {
                item["target"] = json!(target);
            }
            if !first {
                out(b",")?;
            }
            first = false;
            out(item.to_string().as_bytes())?;
        }
        out(b"]}")
    });
    Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
}

/// Serves a representation of `size` bytes identified by `etag`, honouring `If-None-Match`,
/// `Range` and `If-Range`; `read` streams the chosen byte range.
fn serve_ranged<F>(
    app: &AppState,
    headers: &HeaderMap,
    etag: &str,
    size: u64,
    content_type: &'static str,
    read: F,
) -> ApiResult<Response>
where
    F: FnOnce(&Store, RangeSpec, &mut crate::storage::Sink<'_>) -> Result<(), StorageError> + Send + 'static,
{
    let quoted = format!("\"{etag}\"");
    let etag_value = HeaderValue::from_str(&quoted).map_err(|e| ApiError::internal(e.to_string()))?;
    if range::if_none_match(headers, &quoted) {
        return Ok((StatusCode::NOT_MODIFIED, [(header::ETAG, etag_value)]).into_response());
    }
    let (code, spec) = match range::parse(headers, &quoted, size) {
        RangeRequest::Full => (StatusCode::OK, RangeSpec { start: 0, end: size }),
        RangeRequest::Partial(spec) => (StatusCode::PARTIAL_CONTENT, spec),
        RangeRequest::Unsatisfiable => {
            let mut response =
                ApiError::range_not_satisfiable(format!("range not satisfiable: the content has {size} bytes"))
                    .into_response();
            if let Ok(v) = HeaderValue::from_str(&format!("bytes */{size}")) {
                response.headers_mut().insert(header::CONTENT_RANGE, v);
            }
            return Ok(response);
        }
    };
    let body = stream_body(app.store.clone(), move |store, out| read(store, spec, out));
    let mut response = Response::new(body);
    *response.status_mut() = code;
    let h = response.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::ETAG, etag_value);
    h.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(spec.end - spec.start));
    if code == StatusCode::PARTIAL_CONTENT {
        if let Ok(v) = HeaderValue::from_str(&format!("bytes {}-{}/{size}", spec.start, spec.end - 1)) {
            h.insert(header::CONTENT_RANGE, v);
        }
    }
    Ok(response)
}

/// A response body fed by a blocking producer through a small bounded channel: memory stays
/// constant whatever the size, and a client that goes away stops the producer.
fn stream_body<F>(store: Store, produce: F) -> Body
where
    F: FnOnce(&Store, &mut crate::storage::Sink<'_>) -> Result<(), StorageError> + Send + 'static,
{
    let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(4);
    tokio::task::spawn_blocking(move || {
        let mut buffer = Vec::with_capacity(OUT_CHUNK);
        let mut out = |bytes: &[u8]| -> Result<(), StorageError> {
            buffer.extend_from_slice(bytes);
            if buffer.len() >= OUT_CHUNK {
                let full = std::mem::replace(&mut buffer, Vec::with_capacity(OUT_CHUNK));
                tx.blocking_send(Ok(Bytes::from(full))).map_err(|_| StorageError::Cancelled)?;
            }
            Ok(())
        };
        let result = produce(&store, &mut out);
        match result {
            Ok(()) => {
                if !buffer.is_empty() {
                    let _ = tx.blocking_send(Ok(Bytes::from(buffer)));
                }
            }
            Err(StorageError::Cancelled) => {}
            Err(e) => {
                // Headers are gone already: abort the body so the client sees a truncated transfer
                // (and a digest mismatch), never wrong bytes.
                tracing::error!(error = %e, "content read failed mid-stream");
                let _ = tx.blocking_send(Err(std::io::Error::other(e.to_string())));
            }
        }
    });
    Body::from_stream(ChannelStream(rx))
}

/// A receiver as a stream that may be polled again after it ended (compression layers do).
struct ChannelStream(mpsc::Receiver<Result<Bytes, std::io::Error>>);

impl futures_util::Stream for ChannelStream {
    type Item = Result<Bytes, std::io::Error>;
    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        self.0.poll_recv(cx)
    }
}
