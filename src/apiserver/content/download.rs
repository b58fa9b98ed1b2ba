//! Downloads: the revision an object serves, as the whole tar (with ETag, If-None-Match, Range and
//! If-Range), one file, a subtree tar, or a streamed JSON listing. Bodies are produced in short
//! steps ([`super::stream`]), so memory does not grow with content size and a slow client holds no
//! thread.

use std::collections::HashMap;

use axum::extract::{Extension, Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use crate::api::Bundle;
use crate::apiserver::handlers::resource_def;
use crate::apiserver::range::{self, RangeRequest};
use crate::apiserver::status::{ApiError, ApiResult};
use crate::apiserver::{blocking, AppState, API_VERSION};
use crate::storage::{
    tarfmt, EntryKind, FileEntry, ObjectKey, RangeSpec, RevisionId, RevisionRecord, StorageError, Store, TarCursor,
    ZstdDownload,
};
use crate::strategy::bundle::BUNDLE;
use crate::strategy::bundlecontent::BUNDLE_CONTENT;
use crate::strategy::decode_or_default;

use super::stream::{self, Producer};
use crate::apiserver::stall::ConnectionCut;

/// How a download body is streamed: the store, when to cut a stalled client, and how.
#[derive(Clone)]
pub(crate) struct Streaming {
    store: Store,
    stall: std::time::Duration,
    cut: Option<ConnectionCut>,
}

impl Streaming {
    pub(crate) fn new(app: &AppState, cut: Option<ConnectionCut>) -> Streaming {
        Streaming { store: app.store.clone(), stall: app.limits.stream_stall_timeout, cut }
    }

    pub(crate) fn body(&self, producer: impl Producer) -> axum::body::Body {
        stream::body(self.store.clone(), producer, self.stall, self.cut.clone())
    }
}

pub async fn get_content(
    State(app): State<AppState>,
    Path((namespace, resource, name)): Path<(String, String, String)>,
    Query(params): Query<HashMap<String, String>>,
    cut: Option<Extension<ConnectionCut>>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let streaming = Streaming::new(&app, cut.map(|Extension(c)| c));
    if let Some(id) = params.get(super::upload::UPLOAD_PARAM) {
        return super::upload::session_status(&app, &namespace, &resource, &name, id).await;
    }
    let def = resource_def(&resource)?;
    let (revision, record) = resolve_revision(&app, def.plural, &namespace, &name).await?;
    let wants_listing = wants_listing(&headers);
    let path = params.get("path").map(|p| p.trim_start_matches('/').to_string()).unwrap_or_default();
    if wants_listing {
        return Ok(listing(&streaming, revision, record, path));
    }
    let incompressible = record.compresses_poorly();
    let zstd = !incompressible && accepts_zstd(&headers);
    let mut response = if path.is_empty() {
        let tar_size = record.tar_size;
        if zstd && whole_requested(&headers, &record.digest, tar_size) {
            return serve_zstd(&streaming, &headers, &record.digest, "application/x-tar", ZstdDownload::tar(&record));
        }
        let mut cursor = TarCursor::new(revision, tar_size);
        serve_ranged(&streaming, &headers, &record.digest, tar_size, "application/x-tar", move |store, range, out| {
            store.read_tar_at(&mut cursor, range, &mut |bytes| {
                out.extend_from_slice(bytes);
                Ok(())
            })
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
                if zstd && whole_requested(&headers, &etag, size) {
                    let download = ZstdDownload::file(&record, entry);
                    return serve_zstd(&streaming, &headers, &etag, "application/octet-stream", download);
                }
                serve_ranged(
                    &streaming,
                    &headers,
                    &etag,
                    size,
                    "application/octet-stream",
                    move |store, range, out| {
                        store.read_file(revision, &entry, range, &mut |bytes| {
                            out.extend_from_slice(bytes);
                            Ok(())
                        })
                    },
                )?
            }
            None => subtree(&app, &streaming, revision, &path).await?,
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
    /// What the one trip to the blocking pool found (every download pays for the trip).
    enum Found {
        Revision(RevisionId, RevisionRecord),
        NoBundle,
        NoContentYet,
        NoContent(String),
    }
    let of_bundle = plural == BUNDLE.plural;
    let (namespace, name) = (namespace.to_string(), name.to_string());
    let found = {
        let name = name.clone();
        blocking(app, move |store| {
            // Both objects at least as new as the request: one consistency check for the two.
            let read = store.consistent_read()?;
            let content = if of_bundle {
                let Some(bundle) = read.get_object(&ObjectKey::new(BUNDLE.plural, &namespace, &name))? else {
                    return Ok(Found::NoBundle);
                };
                let typed: Bundle = decode_or_default(&bundle.value);
                match typed.status.and_then(|s| s.content_name).filter(|c| !c.is_empty()) {
                    Some(content) => content,
                    None => return Ok(Found::NoContentYet),
                }
            } else {
                name
            };
            let key = ObjectKey::new(BUNDLE_CONTENT.plural, &namespace, &content);
            Ok(match read.get_object(&key)?.and_then(|s| s.revision) {
                Some(revision) => Found::Revision(revision, store.revision(revision)?),
                None => Found::NoContent(content),
            })
        })
        .await?
    };
    match found {
        Found::Revision(revision, record) => Ok((revision, record)),
        Found::NoBundle => Err(ApiError::not_found(BUNDLE.plural, &name)),
        Found::NoContentYet => Err(ApiError::not_found_message(format!("Bundle {name:?} has no content yet"))),
        Found::NoContent(content) => Err(ApiError::not_found(BUNDLE_CONTENT.plural, &content)),
    }
}

/// Follows symlinks inside the revision (a few hops) to a regular file; `None` for anything else
/// (a directory, named with or without its trailing `/`, is served as a subtree).
pub(crate) fn resolve_file(store: &Store, revision: RevisionId, path: &str) -> Result<Option<FileEntry>, StorageError> {
    let mut path = path.to_string();
    for _ in 0..8 {
        let Some(entry) = store.file(revision, &path)? else {
            return Ok(None);
        };
        let target = match entry.kind {
            EntryKind::File => return Ok(Some(entry)),
            EntryKind::Directory => return Ok(None),
            EntryKind::Symlink => entry.target.as_deref().unwrap_or_default(),
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

async fn subtree(app: &AppState, streaming: &Streaming, revision: RevisionId, path: &str) -> ApiResult<Response> {
    let prefix = format!("{}/", path.trim_end_matches('/'));
    let exists = {
        let prefix = prefix.clone();
        blocking(app, move |store| store.files(revision, &prefix).next().transpose()).await?.is_some()
    };
    if !exists {
        return Err(ApiError::not_found_message(format!("path {path:?} not found in the content")));
    }
    Ok(([(header::CONTENT_TYPE, "application/x-tar")], streaming.body(subtree_tar(revision, prefix))).into_response())
}

/// The tar of the entries under `prefix` (paths kept whole), a step at a time: whole small entries,
/// a big one in pieces, then the trailer.
fn subtree_tar(revision: RevisionId, prefix: String) -> impl Producer {
    // The last entry finished, and how far into the current one the previous step got.
    let mut after: Option<String> = None;
    let mut current: Option<(FileEntry, u64)> = None;
    move |store: &Store, out: &mut Vec<u8>| {
        // A step appends to what earlier steps of the batch left in `out`: count its own bytes.
        let start = out.len();
        while out.len() - start < stream::STEP {
            let (entry, from) = match current.take() {
                Some(partial) => partial,
                None => match store.files_after(revision, &prefix, after.as_deref()).next().transpose()? {
                    Some(entry) => (entry, 0),
                    None => {
                        out.resize(out.len() + tarfmt::TRAILER_LEN as usize, 0);
                        return Ok(false);
                    }
                },
            };
            let len = Store::entry_tar_len(&entry);
            let to = len.min(from.saturating_add((stream::STEP - (out.len() - start)) as u64));
            store.read_entry_tar(revision, &entry, from, to, &mut |bytes| {
                out.extend_from_slice(bytes);
                Ok(())
            })?;
            if to < len {
                current = Some((entry, to));
            } else {
                after = Some(entry.path);
            }
        }
        Ok(true)
    }
}

/// `{"kind":…,"digest":…,"files":[…]}`, a step's worth of entries at a time.
fn listing(streaming: &Streaming, revision: RevisionId, record: RevisionRecord, path: String) -> Response {
    let mut after: Option<String> = None;
    let mut started = false;
    let producer = move |store: &Store, out: &mut Vec<u8>| -> Result<bool, StorageError> {
        let start = out.len();
        if !started {
            let head = json!({"kind": "BundleContentFileList", "apiVersion": API_VERSION, "digest": record.digest});
            let head = head.to_string();
            out.extend_from_slice(head.strip_suffix('}').unwrap_or(&head).as_bytes());
            out.extend_from_slice(b",\"files\":[");
        }
        for entry in store.files_after(revision, &path, after.as_deref()) {
            let entry = entry?;
            let mut item = serde_json::Map::new();
            item.insert("path".into(), json!(entry.path));
            let kind = match entry.kind {
                EntryKind::File => "file",
                EntryKind::Symlink => "symlink",
                EntryKind::Directory => "directory",
            };
            item.insert("type".into(), json!(kind));
            item.insert("mode".into(), json!(entry.mode()));
            item.insert("size".into(), json!(entry.size));
            item.insert("sha256".into(), json!(entry.sha256));
            if let Some(target) = &entry.target {
                item.insert("target".into(), json!(target));
            }
            let item = Value::Object(item);
            if started {
                out.push(b',');
            }
            started = true;
            out.extend_from_slice(item.to_string().as_bytes());
            after = Some(entry.path);
            if out.len() - start >= stream::STEP {
                return Ok(true);
            }
        }
        started = true;
        out.extend_from_slice(b"]}");
        Ok(false)
    };
    ([(header::CONTENT_TYPE, "application/json")], streaming.body(producer)).into_response()
}

/// Whether `Accept-Encoding` takes zstd (with a non-zero weight, or through `*`).
fn accepts_zstd(headers: &HeaderMap) -> bool {
    let mut star = false;
    for item in
        headers.get_all(header::ACCEPT_ENCODING).iter().filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(','))
    {
        let mut parts = item.split(';');
        let coding = parts.next().unwrap_or("").trim().to_ascii_lowercase();
        let weight = parts
            .filter_map(|p| p.trim().strip_prefix("q=").or_else(|| p.trim().strip_prefix("Q=")))
            .find_map(|q| q.trim().parse::<f32>().ok())
            .unwrap_or(1.0);
        match coding.as_str() {
            "zstd" => return weight > 0.0,
            "*" => star = weight > 0.0,
            _ => {}
        }
    }
    star
}

/// Whether the request asks for the whole representation (no `Range`, or one that does not apply):
/// ranges are served on the identity bytes only.
fn whole_requested(headers: &HeaderMap, etag: &str, size: u64) -> bool {
    headers.get(header::RANGE).is_none() || range::parse(headers, &format!("\"{etag}\""), size) == RangeRequest::Full
}

/// The ETag of the zstd-encoded representation of what `etag` names: a different one, as HTTP
/// wants for a different content coding. Weak, since its bytes depend on how the store laid the
/// content out (compaction may change them) while what they decode to never changes.
fn zstd_etag(etag: &str) -> String {
    format!("W/\"{etag}-zstd\"")
}

/// Serves `download` as `Content-Encoding: zstd`, made of stored frames where the store has them
/// ([`crate::storage::ZstdDownload`]), honouring `If-None-Match` against its own ETag.
fn serve_zstd(
    streaming: &Streaming,
    headers: &HeaderMap,
    etag: &str,
    content_type: &'static str,
    download: ZstdDownload,
) -> ApiResult<Response> {
    let weak = zstd_etag(etag);
    let etag_value = HeaderValue::from_str(&weak).map_err(|e| ApiError::internal(e.to_string()))?;
    let vary = (header::VARY, HeaderValue::from_static("accept-encoding"));
    if range::if_none_match(headers, weak.trim_start_matches("W/")) {
        return Ok((StatusCode::NOT_MODIFIED, [(header::ETAG, etag_value), vary]).into_response());
    }
    let mut download = download;
    // Frames are small (a stored block is about a tenth of its MiB): several go in one step.
    let body = streaming.body(move |store: &Store, out: &mut Vec<u8>| {
        let start = out.len();
        loop {
            let more = store.zstd_step(&mut download, out)?;
            if !more || out.len() - start >= stream::STEP {
                return Ok(more);
            }
        }
    });
    let mut response = Response::new(body);
    let h = response.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CONTENT_ENCODING, HeaderValue::from_static("zstd"));
    h.insert(header::ETAG, etag_value);
    h.insert(vary.0, vary.1);
    Ok(response)
}

/// Serves a representation of `size` bytes identified by `etag`, honouring `If-None-Match`,
/// `Range` and `If-Range`; `read` streams the chosen byte range.
pub(crate) fn serve_ranged<F>(
    streaming: &Streaming,
    headers: &HeaderMap,
    etag: &str,
    size: u64,
    content_type: &'static str,
    read: F,
) -> ApiResult<Response>
where
    F: FnMut(&Store, RangeSpec, &mut Vec<u8>) -> Result<(), StorageError> + Send + 'static,
{
    let mut read = read;
    serve_range_of(streaming, headers, etag, size, content_type, move |spec| {
        stream::ranged(spec.start, spec.end, move |store, start, end, out| read(store, RangeSpec { start, end }, out))
    })
}

/// [`serve_ranged`] for bytes made by a producer of the chosen range (a blob built as it is
/// sent), rather than read at any offset.
pub(crate) fn serve_range_of<P: Producer>(
    streaming: &Streaming,
    headers: &HeaderMap,
    etag: &str,
    size: u64,
    content_type: &'static str,
    produce: impl FnOnce(RangeSpec) -> P,
) -> ApiResult<Response> {
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
    let mut response = Response::new(streaming.body(produce(spec)));
    *response.status_mut() = code;
    let h = response.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::ETAG, etag_value);
    h.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    h.insert(header::VARY, HeaderValue::from_static("accept-encoding"));
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(spec.end - spec.start));
    if code == StatusCode::PARTIAL_CONTENT {
        if let Ok(v) = HeaderValue::from_str(&format!("bytes {}-{}/{size}", spec.start, spec.end - 1)) {
            h.insert(header::CONTENT_RANGE, v);
        }
    }
    Ok(response)
}
