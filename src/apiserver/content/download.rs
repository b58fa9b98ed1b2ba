//! Downloads: the revision an object serves, as the whole tar (with ETag, If-None-Match, Range and
//! If-Range), one file, a subtree tar, or a streamed JSON listing. Bodies are fed by a blocking
//! producer through a small bounded channel, so memory does not grow with content size.

use std::collections::HashMap;

use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::apiserver::handlers::{get_object, resource_def};
use crate::apiserver::range::{self, RangeRequest};
use crate::apiserver::resources::bundle::BUNDLE;
use crate::apiserver::resources::bundlecontent::BUNDLE_CONTENT;
use crate::apiserver::status::{ApiError, ApiResult};
use crate::apiserver::{blocking, AppState, ChannelStream, API_VERSION};
use crate::storage::{FileEntry, ObjectKey, RangeSpec, RevisionId, RevisionRecord, Sink, StorageError, Store};

/// Output buffer size for streamed responses.
const OUT_CHUNK: usize = 256 * 1024;

pub async fn get_content(
    State(app): State<AppState>,
    Path((namespace, resource, name)): Path<(String, String, String)>,
    Query(params): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    if let Some(id) = params.get(super::upload_session::UPLOAD_PARAM) {
        return super::upload_session::status(&app, &namespace, &resource, &name, id).await;
    }
    let def = resource_def(&resource)?;
    let (revision, record) = resolve_revision(&app, def.plural, &namespace, &name).await?;
    let wants_listing = wants_listing(&headers);
    let path = params.get("path").map(|p| p.trim_start_matches('/').to_string()).unwrap_or_default();
    if wants_listing {
        return listing(&app, revision, record, path).await;
    }
    let incompressible = record.compresses_poorly();
    let mut response = if path.is_empty() {
        let tar_size = record.tar_size;
        serve_ranged(&app, &headers, &record.digest, tar_size, "application/x-tar", move |store, range, out| {
            store.read_tar(revision, tar_size, range, out)
        })?
    } else {
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
                })?
            }
            None => subtree(&app, revision, &path).await?,
        }
    };
    if incompressible {
        response.extensions_mut().insert(crate::apiserver::Incompressible);
    }
    Ok(response)
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
        out(&head.as_bytes()[..head.len() - 1])?;
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
    F: FnOnce(&Store, RangeSpec, &mut Sink<'_>) -> Result<(), StorageError> + Send + 'static,
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
    F: FnOnce(&Store, &mut Sink<'_>) -> Result<(), StorageError> + Send + 'static,
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
