//! The routes of uploads on `bundles/NAME/content`: a single `PUT` of the archive, and the
//! requests of a chunked upload (`POST ?uploads`, `PATCH`, `GET`/`HEAD`, `PUT` and `DELETE` with
//! `?upload=ID`; see [`super::session`]).

use std::collections::HashMap;

use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::TryStreamExt;

use super::ingest::{encoding, ingest_and_commit, UploadTarget};
use super::session::{self, piece, session_response, Session, START_PARAM, UPLOAD_PARAM};
use crate::apiserver::handlers::{get_object, json_response, resource_def};
use crate::apiserver::status::{ApiError, ApiResult, BodyTooLarge};
use crate::apiserver::AppState;
use crate::storage::sessions::SessionMeta;
use crate::strategy::bundle::BUNDLE;
use crate::unpack::read_ahead::ReadAhead;

/// `PUT bundles/NAME/content`: the body is the archive; with `?upload=ID`, a chunked upload's commit.
pub async fn put_bundle_content(
    State(app): State<AppState>,
    Path((namespace, resource, name)): Path<(String, String, String)>,
    Query(params): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    writable(&resource)?;
    if let Some(id) = params.get(UPLOAD_PARAM) {
        return session::commit(&app, &namespace, &name, id, params.get("digest"), &headers, body).await;
    }
    let bundle = get_object(&app, &BUNDLE, &namespace, &name).await?;
    let target = UploadTarget::of(&bundle, &namespace, &name)?;
    let limit = app.limits.max_body_bytes;
    let declared =
        headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit) {
        return Err(ApiError::too_large(format!("{} (--max-body-bytes)", BodyTooLarge(limit))));
    }
    let encoding = encoding(&headers)?;

    // Count bytes as they arrive; past the limit the stream fails with BodyTooLarge.
    let mut seen = 0u64;
    let stream = body.into_data_stream().map_err(std::io::Error::other).and_then(move |chunk: Bytes| {
        seen += chunk.len() as u64;
        let result = if seen > limit { Err(std::io::Error::other(BodyTooLarge(limit))) } else { Ok(chunk) };
        std::future::ready(result)
    });
    let reader = ReadAhead::spawn(&tokio::runtime::Handle::current(), stream);
    let written = ingest_and_commit(&app, target, reader, encoding, |_| Ok(())).await?;
    Ok(json_response(StatusCode::OK, &written, &[]))
}

/// Only resources whose strategy takes uploads (Bundles) do; other resources' content is read-only.
fn writable(resource: &str) -> ApiResult<()> {
    if !resource_def(resource)?.takes_uploads {
        return Err(ApiError::method_not_allowed(format!(
            "{resource}/content is read-only: upload to bundles/NAME/content"
        )));
    }
    Ok(())
}

/// `POST bundles/NAME/content?uploads`.
pub async fn post_bundle_content(
    State(app): State<AppState>,
    Path((namespace, resource, name)): Path<(String, String, String)>,
    Query(params): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    writable(&resource)?;
    if !params.contains_key(START_PARAM) {
        return Err(ApiError::method_not_allowed(
            "POST on content starts a chunked upload: POST bundles/NAME/content?uploads",
        ));
    }
    let declared =
        headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > 0) {
        return Err(ApiError::bad_request(
            "start a chunked upload with an empty POST, then send the bytes with PATCH ?upload=ID",
        ));
    }
    encoding(&headers)?;
    let content_encoding = headers
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim().to_ascii_lowercase())
        .unwrap_or_default();
    let bundle = get_object(&app, &BUNDLE, &namespace, &name).await?;
    let target = UploadTarget::of(&bundle, &namespace, &name)?;
    let meta = SessionMeta::new(&namespace, &name, &target.uid, &content_encoding);
    let sessions = app.uploads.clone();
    let id = tokio::task::spawn_blocking(move || sessions.create(&meta))
        .await
        .map_err(ApiError::from)?
        .map_err(|e| ApiError::io("starting an upload session", e))?;
    tracing::info!(upload = %id, bundle = %format!("{namespace}/{name}"), "upload session started");
    Ok(session_response(StatusCode::ACCEPTED, &namespace, &name, &id, 0))
}

/// `PATCH bundles/NAME/content?upload=ID`: one piece.
pub async fn patch_bundle_content(
    State(app): State<AppState>,
    Path((namespace, resource, name)): Path<(String, String, String)>,
    Query(params): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    writable(&resource)?;
    let id = upload_id(&params, "PATCH")?;
    let mut session = Session::open(&app, &namespace, &name, id).await?;
    if session.meta.committed {
        return Err(ApiError::conflict_message(format!("upload session {id:?} was already committed")));
    }
    let piece = piece(&headers, session.meta.offset)?;
    let first = session.meta.offset == 0;
    if let Err(e) = session.append(&app, piece, body).await {
        return Ok(e);
    }
    session.piece_added(&app, first);
    Ok(session_response(StatusCode::ACCEPTED, &namespace, &name, id, session.meta.offset))
}

/// `GET`/`HEAD bundles/NAME/content?upload=ID`: where the upload stands.
pub async fn session_status(
    app: &AppState,
    namespace: &str,
    resource: &str,
    name: &str,
    id: &str,
) -> ApiResult<Response> {
    writable(resource)?;
    let session = Session::open(app, namespace, name, id).await?;
    Ok(session_response(StatusCode::OK, namespace, name, id, session.meta.offset))
}

/// `DELETE bundles/NAME/content?upload=ID`.
pub async fn delete_bundle_content(
    State(app): State<AppState>,
    Path((namespace, resource, name)): Path<(String, String, String)>,
    Query(params): Query<HashMap<String, String>>,
) -> ApiResult<Response> {
    writable(&resource)?;
    let id = upload_id(&params, "DELETE")?;
    let session = Session::open(&app, &namespace, &name, id).await?;
    session.remove(&app).await?;
    app.early_ingests.cancel(id);
    tracing::info!(upload = %id, "upload session aborted");
    Ok(StatusCode::NO_CONTENT.into_response())
}

fn upload_id<'p>(params: &'p HashMap<String, String>, method: &str) -> ApiResult<&'p str> {
    params.get(UPLOAD_PARAM).map(String::as_str).ok_or_else(|| {
        ApiError::method_not_allowed(format!(
            "{method} on content is part of a chunked upload: {method} bundles/NAME/content?upload=ID"
        ))
    })
}
