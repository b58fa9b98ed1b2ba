//! A chunked upload's session as a request sees it: opened and locked for the request, pieces
//! appended, the commit (the early ingest's revision, or the spooled bytes ingested then). The
//! protocol, in the shape of the OCI distribution chunked-upload protocol, so that no single
//! request comes near the aggregator's 60 s cut (its routes: [`super::routes`]):
//!
//! - `POST …/content?uploads` starts a session (202, `{"uploadID", "offset": 0}`, `Location`);
//!   its `Content-Encoding` (gzip, zstd or none/sniffed) applies to the assembled archive.
//! - `PATCH …/content?upload=ID` with `Content-Range: bytes START-END/*` (or none: at the current
//!   offset) appends a piece; bytes before the offset (a re-sent piece) are skipped, a piece past
//!   it is 416 with the offset. Answers 202 with the new offset (`Upload-Offset`, `Range: 0-LAST`).
//! - `GET`/`HEAD …/content?upload=ID` reports the offset, to resume after a cut.
//! - `PUT …/content?upload=ID&digest=sha256:HEX` (optionally with a last piece as its body)
//!   checks the digest of all bytes and ingests them like a single PUT; returns the Bundle.
//! - `DELETE …/content?upload=ID` aborts (204).
//!
//! The bytes live in the [`UploadSessions`] (in the replicated store: etcd and the bucket, so
//! every replica serves every step); a session belongs to one Bundle (namespace, name, uid) and is
//! a 404 anywhere else.

use std::io::{self, Read};

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use tokio::sync::OwnedMutexGuard;

use super::early::Start;
use super::ingest::{commit_ingested, ingest_and_commit, UploadTarget};
use crate::apiserver::handlers::{get_object, json_response};
use crate::apiserver::status::{ApiError, ApiResult, PieceRefused};
use crate::apiserver::{AppState, API_VERSION};
use crate::storage::sessions::{Piece, SessionMeta, UploadSessions};
use crate::strategy::bundle::BUNDLE;
use crate::unpack::source::HashingReader;
use crate::unpack::tar_ingest::Encoding;

/// `?uploads` starts a session.
pub const START_PARAM: &str = "uploads";
/// `?upload=ID` names one.
pub const UPLOAD_PARAM: &str = "upload";
const OFFSET_HEADER: &str = "upload-offset";

/// `PUT bundles/NAME/content?upload=ID&digest=sha256:HEX`: the body, if any, is a last piece.
pub(super) async fn commit(
    app: &AppState,
    namespace: &str,
    name: &str,
    id: &str,
    digest: Option<&String>,
    headers: &HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let Some(digest) = digest else {
        return Err(ApiError::bad_request(
            "committing an upload needs the sha256 of all its bytes: PUT …/content?upload=ID&digest=sha256:HEX",
        ));
    };
    let expected = parse_digest(digest)?;
    let mut session = Session::open(app, namespace, name, id).await?;
    if session.meta.committed {
        // A re-sent commit (the first one's response was lost, or cut at 60 s while it ran).
        return Ok(json_response(StatusCode::OK, &session.bundle, &[]));
    }
    let piece = piece(headers, session.meta.offset)?;
    if let Err(e) = session.append(app, piece, body).await {
        return Ok(e);
    }
    session.piece_added(app, false);
    // Replicated: a commit of this session re-sent to another replica waits for that one.
    app.uploads
        .claim_commit(id, &mut session.meta)
        .await
        .map_err(|e| ApiError::io(&format!("claiming the commit of upload {id:?}"), e))?;
    if session.meta.committed {
        let bundle = get_object(app, &BUNDLE, namespace, name).await?;
        return Ok(json_response(StatusCode::OK, &bundle, &[]));
    }
    // The commit runs to its end even if the client goes away (the aggregator cuts requests at
    // 60 s): it holds the session's lock, so a re-sent commit waits for it and then answers from
    // the committed session.
    let (app, id) = (app.clone(), id.to_string());
    let work = tokio::spawn(async move {
        let target = UploadTarget::of(&session.bundle, &session.meta.namespace, &session.meta.name)?;
        let length = session.meta.offset;
        let early = app.early_ingests.take(&id, length, &expected, target.generation).await;
        let ingested_early = early.is_some();
        let committed = match early {
            Some(ingested) => commit_ingested(&app, target, ingested).await,
            None => ingest_spooled(&app, &id, &session.meta, target, expected).await,
        };
        let written = match committed {
            Ok(written) => written,
            Err(e) => {
                session.release_commit(&app).await;
                return Err(e);
            }
        };
        session.mark_committed(&app).await?;
        tracing::info!(upload = %id, bytes = length, ingested_early, "upload session committed");
        Ok::<_, ApiError>(written)
    });
    let written = work.await.map_err(ApiError::from)??;
    Ok(json_response(StatusCode::OK, &written, &[]))
}

/// Ingests and commits a session's spooled bytes, checking that they hash to `expected` (hex): at
/// its commit, when no early ingest ([`super::early`]) made the revision.
async fn ingest_spooled(
    app: &AppState,
    id: &str,
    meta: &SessionMeta,
    target: UploadTarget,
    expected: String,
) -> ApiResult<Value> {
    let encoding = Encoding::from_content_encoding(Some(&meta.encoding)).unwrap_or(Encoding::Identity);
    let data = app
        .uploads
        .open_data(id, meta)
        .map_err(|e| ApiError::internal(format!("opening the spool of upload {id:?}: {e}")))?;
    let length = meta.offset;
    let reader = HashingReader::new(io::BufReader::with_capacity(1 << 20, data).take(length));
    let verify = move |reader: &mut HashingReader<_>| {
        io::copy(reader, &mut io::sink())
            .map_err(|e| ApiError::internal(format!("reading the spool of the upload: {e}")))?;
        let computed = reader.hex_digest();
        if computed != expected {
            return Err(ApiError::bad_request(format!(
                "digest mismatch: the {length} bytes received hash to sha256:{computed}, not sha256:{expected}; \
                 nothing was committed and the upload session is kept"
            )));
        }
        Ok(())
    };
    ingest_and_commit(app, target, reader, encoding, verify).await
}

/// A session, locked for the request, with the Bundle it belongs to.
pub(super) struct Session {
    id: String,
    pub meta: SessionMeta,
    bundle: Value,
    /// The session's lock; `None` only while [`Session::append`]'s task holds it.
    guard: Option<OwnedMutexGuard<()>>,
}

impl Session {
    pub async fn open(app: &AppState, namespace: &str, name: &str, id: &str) -> ApiResult<Session> {
        let not_found =
            || ApiError::not_found_message(format!("upload session {id:?} not found for bundles {namespace}/{name}"));
        if !UploadSessions::valid_id(id) {
            return Err(not_found());
        }
        let guard = app.uploads.lock(id).lock_owned().await;
        let (spool, owned_id) = (app.uploads.clone(), id.to_string());
        let meta = tokio::task::spawn_blocking(move || spool.load(&owned_id))
            .await
            .map_err(ApiError::from)?
            .map_err(|e| ApiError::internal(format!("reading upload session {id:?}: {e}")))?
            .ok_or_else(not_found)?;
        if meta.namespace != namespace || meta.name != name {
            return Err(not_found());
        }
        let bundle = get_object(app, &BUNDLE, namespace, name).await?;
        if bundle.pointer("/metadata/uid").and_then(Value::as_str) != Some(meta.uid.as_str()) {
            return Err(not_found());
        }
        Ok(Session { id: id.to_string(), meta, bundle, guard: Some(guard) })
    }

    /// After a piece was appended: its bytes go to the session's early ingest, which the
    /// session's `first` piece starts ([`super::early`]).
    pub fn piece_added(&self, app: &AppState, first: bool) {
        let start = || {
            let target = UploadTarget::of(&self.bundle, &self.meta.namespace, &self.meta.name).ok()?;
            let encoding = Encoding::from_content_encoding(Some(&self.meta.encoding)).unwrap_or(Encoding::Identity);
            Some(Start { target, encoding })
        };
        app.early_ingests.piece_added(app, &self.id, self.meta.offset, first && self.meta.offset > 0, start);
    }

    /// Appends a piece; a refusal comes back as the response to send.
    pub async fn append(&mut self, app: &AppState, piece: Piece, body: Body) -> Result<(), Response> {
        let limit = app.limits.max_body_bytes;
        // On a task of its own that holds the session's lock until the piece is durable and its
        // record saved: when the request is cut, the handler is dropped but the save goes on, and
        // the next request on the session must not run beside it (two saves of one record race).
        let (uploads, id, mut meta, guard) =
            (app.uploads.clone(), self.id.clone(), self.meta.clone(), self.guard.take());
        let appended = tokio::spawn(async move {
            let result = uploads.append(&id, &mut meta, piece, body.into_data_stream(), limit).await;
            (result, meta, guard)
        })
        .await;
        let result = match appended {
            Ok((result, meta, guard)) => {
                (self.meta, self.guard) = (meta, guard);
                result
            }
            Err(e) => return Err(ApiError::from(e).into_response()),
        };
        let Err(error) = result else { return Ok(()) };
        let resume_at = error.resume_at();
        let mut response = ApiError::from(PieceRefused { session: self.id.clone(), error }).into_response();
        if let Some(offset) = resume_at {
            offset_headers(response.headers_mut(), offset);
        }
        Err(response)
    }

    async fn mark_committed(mut self, app: &AppState) -> ApiResult<()> {
        let (spool, id) = (app.uploads.clone(), self.id.clone());
        let mut meta = self.meta.clone();
        tokio::task::spawn_blocking(move || spool.mark_committed(&id, &mut meta))
            .await
            .map_err(ApiError::from)?
            .map_err(|e| ApiError::io(&format!("recording the commit of upload {:?}", self.id), e))?;
        self.meta.committed = true;
        Ok(())
    }

    /// After a failed commit: another replica may try it (replicated store); best effort, since
    /// a claim of a replica that is gone lapses anyway.
    async fn release_commit(&mut self, app: &AppState) {
        let (spool, id, mut meta) = (app.uploads.clone(), self.id.clone(), self.meta.clone());
        let released = tokio::task::spawn_blocking(move || spool.release_commit(&id, &mut meta).map(|()| meta)).await;
        match released {
            Ok(Ok(meta)) => self.meta = meta,
            Ok(Err(e)) => tracing::warn!(upload = %self.id, error = %e, "releasing the commit claim"),
            Err(e) => tracing::warn!(upload = %self.id, error = %e, "releasing the commit claim"),
        }
    }

    pub async fn remove(self, app: &AppState) -> ApiResult<()> {
        let (spool, id) = (app.uploads.clone(), self.id.clone());
        tokio::task::spawn_blocking(move || spool.remove(&id))
            .await
            .map_err(ApiError::from)?
            .map_err(|e| ApiError::internal(format!("removing upload session {:?}: {e}", self.id)))
    }
}

/// The piece a request carries: `Content-Range: bytes START-END/TOTAL` (`bytes ` and `/TOTAL`
/// optional, `END` may be `*`); without one, the bytes go at the current offset.
pub(crate) fn piece(headers: &HeaderMap, offset: u64) -> ApiResult<Piece> {
    let Some(value) = headers.get(header::CONTENT_RANGE) else { return Ok(Piece { start: offset, end: None }) };
    let invalid = || {
        ApiError::bad_request(format!(
            "invalid Content-Range {:?}: expected `bytes START-END/*` (END inclusive)",
            String::from_utf8_lossy(value.as_bytes())
        ))
    };
    let text = value.to_str().map_err(|_| invalid())?.trim();
    let text = text.strip_prefix("bytes").map(|t| t.trim_start_matches([' ', '='])).unwrap_or(text);
    let range = text.split('/').next().unwrap_or("");
    let (start, end) = range.split_once('-').ok_or_else(invalid)?;
    let start: u64 = start.trim().parse().map_err(|_| invalid())?;
    let end = match end.trim() {
        "" | "*" => None,
        end => Some(end.parse::<u64>().map_err(|_| invalid())?),
    };
    if end.is_some_and(|end| end < start) {
        return Err(invalid());
    }
    Ok(Piece { start, end })
}

fn parse_digest(digest: &str) -> ApiResult<String> {
    let hex = digest.strip_prefix("sha256:").unwrap_or("");
    if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(ApiError::bad_request(format!("invalid digest {digest:?}: expected sha256: and 64 hex digits")));
    }
    Ok(hex.to_ascii_lowercase())
}

pub(super) fn location(namespace: &str, name: &str, id: &str) -> String {
    format!("/apis/{API_VERSION}/namespaces/{namespace}/bundles/{name}/content?{UPLOAD_PARAM}={id}")
}

fn offset_headers(headers: &mut HeaderMap, offset: u64) {
    headers.insert(OFFSET_HEADER, HeaderValue::from(offset));
    if let Some(last) = offset.checked_sub(1) {
        if let Ok(range) = HeaderValue::from_str(&format!("0-{last}")) {
            headers.insert(header::RANGE, range);
        }
    }
}

pub(super) fn session_response(code: StatusCode, namespace: &str, name: &str, id: &str, offset: u64) -> Response {
    let body = json!({"uploadID": id, "offset": offset, "location": location(namespace, name, id)});
    let mut response = json_response(code, &body, &[]);
    offset_headers(response.headers_mut(), offset);
    if let Ok(location) = HeaderValue::from_str(&location(namespace, name, id)) {
        response.headers_mut().insert(header::LOCATION, location);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_range(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_RANGE, HeaderValue::from_str(value).unwrap());
        headers
    }

    #[test]
    fn content_ranges() {
        let p = piece(&with_range("bytes 10-19/*"), 0).unwrap();
        assert_eq!((p.start, p.end), (10, Some(19)));
        let p = piece(&with_range("5-9"), 0).unwrap();
        assert_eq!((p.start, p.end), (5, Some(9)));
        let p = piece(&with_range("bytes=7-*/100"), 0).unwrap();
        assert_eq!((p.start, p.end), (7, None));
        let p = piece(&HeaderMap::new(), 42).unwrap();
        assert_eq!((p.start, p.end), (42, None));
        for bad in ["bytes 9-3/*", "bytes x-3", "12", "bytes -3"] {
            assert!(piece(&with_range(bad), 0).is_err(), "{bad}");
        }
    }

    #[test]
    fn digests() {
        let hex = "ab".repeat(32);
        assert_eq!(parse_digest(&format!("sha256:{}", hex.to_uppercase())).unwrap(), hex);
        assert!(parse_digest(&hex).is_err());
        assert!(parse_digest("sha256:abc").is_err());
    }
}
