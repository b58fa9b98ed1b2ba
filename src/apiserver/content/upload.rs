//! Uploads: `PUT bundles/NAME/content` streams the body (size-limited, optionally gzip/zstd)
//! through the tar validator into a new revision, then commits it atomically with a BundleContent
//! and the Bundle's status — or reuses the BundleContent that already holds identical content.

use crate::api::event::Regarding;
use axum::body::{Body, Bytes};
use std::collections::HashMap;
use std::io::Read;
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::Response;
use futures_util::TryStreamExt;
use serde_json::Value;

use crate::api::Bundle;
use crate::strategy::decode_or_default;

use super::upload_session;
use crate::apiserver::handlers::{get_object, json_response, resource_def};
use crate::apiserver::status::{ApiError, ApiResult, BodyTooLarge, UploadFailure};
use crate::apiserver::{blocking, AppState};
use crate::storage::{PendingRevision, StorageError, Store};
use crate::strategy::bundle::BUNDLE;
use crate::unpack::format::FormatReport;
use crate::unpack::read_ahead::ReadAhead;
use crate::unpack::revisions::{self, CommitError, Expect};
use crate::unpack::sink::TreeSink;
use crate::unpack::source::Budget;
use crate::unpack::tar_ingest::{self, Encoding};
use crate::unpack::{ResolvedSource, UnpackLimits};

pub(super) fn encoding(headers: &HeaderMap) -> ApiResult<Encoding> {
    let value = headers.get(header::CONTENT_ENCODING).and_then(|v| v.to_str().ok());
    Encoding::from_content_encoding(value).ok_or_else(|| {
        ApiError::unsupported_media_type(format!(
            "unsupported Content-Encoding {:?}: use gzip, zstd or none",
            value.unwrap_or("")
        ))
    })
}

pub async fn put_bundle_content(
    State(app): State<AppState>,
    Path((namespace, resource, name)): Path<(String, String, String)>,
    Query(params): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    writable(&resource)?;
    if let Some(id) = params.get(upload_session::UPLOAD_PARAM) {
        return upload_session::commit(&app, &namespace, &name, id, params.get("digest"), &headers, body).await;
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
pub(super) fn writable(resource: &str) -> ApiResult<()> {
    if !resource_def(resource)?.takes_uploads {
        return Err(ApiError::method_not_allowed(format!(
            "{resource}/content is read-only: upload to bundles/NAME/content"
        )));
    }
    Ok(())
}

/// The Bundle an upload goes to, and what of its spec the upload needs.
#[derive(Clone)]
pub(super) struct UploadTarget {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// The generation whose spec (format, allowEmpty, destination) the upload is checked against.
    pub generation: i64,
    destination: String,
    declared_format: String,
    /// `spec.allowEmpty`: an archive without files is content, not a mistake.
    allow_empty: bool,
}

impl UploadTarget {
    /// The Bundle, as its Events name it.
    fn regarding(&self) -> Regarding {
        Regarding::bundle(&self.namespace, &self.name, &self.uid)
    }

    /// The Bundle as an upload target: it must have an `upload` source.
    pub fn of(bundle: &Value, namespace: &str, name: &str) -> ApiResult<UploadTarget> {
        let bundle: Bundle = decode_or_default(bundle);
        let Some(upload) = bundle.spec.sources.iter().find(|s| s.upload.is_some()) else {
            return Err(ApiError::bad_request(format!(
                "Bundle {name:?} has no upload source: add `{{upload: {{}}}}` to spec.sources to accept content by PUT"
            )));
        };
        Ok(UploadTarget {
            namespace: namespace.to_string(),
            name: name.to_string(),
            uid: bundle.uid().to_string(),
            generation: bundle.generation(),
            destination: upload.destination.clone(),
            declared_format: bundle.spec.format_name().to_string(),
            allow_empty: bundle.spec.allows_empty(),
        })
    }
}

/// Streams an archive from `reader` (on the blocking pool) through the tar validator into a new
/// revision and commits it with a BundleContent and the Bundle's status; returns the Bundle.
///
/// `verify` sees the reader after the archive was read (whether or not ingest succeeded) and may
/// refuse the upload (a digest check); its error wins over the ingest error, and nothing is
/// committed unless it passes.
pub(super) async fn ingest_and_commit<R, V>(
    app: &AppState,
    target: UploadTarget,
    reader: R,
    encoding: Encoding,
    verify: V,
) -> ApiResult<Value>
where
    R: Read + Send + 'static,
    V: FnOnce(&mut R) -> ApiResult<()> + Send + 'static,
{
    let (store, limits, checked) = (app.store.clone(), app.limits.unpack, target.clone());
    let ingested = tokio::task::spawn_blocking(move || ingest(&store, limits, &checked, reader, encoding, verify))
        .await
        .map_err(ApiError::from)?;
    match ingested {
        Ok(ingested) => commit_ingested(app, target, ingested).await,
        Err(refused) => {
            app.events.warning(&target.regarding(), "UploadRefused", "Upload", &refused.message);
            Err(refused)
        }
    }
}

/// A finalized revision of an upload and what its content was found to be, not yet committed.
pub(super) struct Ingested {
    pending: PendingRevision,
    report: FormatReport,
}

/// The blocking half of [`ingest_and_commit`]: the archive from `reader` into a finalized revision.
pub(super) fn ingest<R, V>(
    store: &Store,
    limits: UnpackLimits,
    target: &UploadTarget,
    reader: R,
    encoding: Encoding,
    verify: V,
) -> ApiResult<Ingested>
where
    R: Read,
    V: FnOnce(&mut R) -> ApiResult<()>,
{
    // The body's bytes count as downloaded ones: an upload obeys the same expansion-ratio limit
    // (--max-expansion-ratio) as an image layer or an http source.
    let budget = Arc::new(Budget::default());
    let mut reader = Received { inner: reader, budget: budget.clone() };
    let mut writer = store.begin_revision().map_err(ApiError::from)?;
    let mut sink = TreeSink::new(&mut writer, limits, budget);
    sink.set_destination(&target.destination);
    let ingested = tar_ingest::ingest(&mut reader, encoding, &limits.ingest(), &mut sink);
    verify(&mut reader.inner)?;
    ingested.map_err(|e| UploadFailure::ingest(&target.name, e))?;
    // Uploads bring their own tree: an undetected format is accepted, a declared one checked.
    let report = sink
        .finish(&target.declared_format, false, target.allow_empty)
        .map_err(|e| UploadFailure::unpack(&target.name, e))?;
    Ok(Ingested { pending: writer.finalize().map_err(ApiError::from)?, report })
}

/// The async half of [`ingest_and_commit`]: commits an ingested revision to `target`.
pub(super) async fn commit_ingested(app: &AppState, target: UploadTarget, ingested: Ingested) -> ApiResult<Value> {
    let Ingested { pending, report } = ingested;
    // Any generation: a spec changed meanwhile gets the content checked again (the status says
    // which generation this check was for).
    let expect = Expect {
        namespace: target.namespace,
        name: target.name,
        uid: target.uid,
        generation: None,
        checked_generation: target.generation,
    };
    let record = pending.record().clone();
    let resolved = [ResolvedSource::Upload { digest: record.digest.clone() }];
    let regarding = Regarding::bundle(&expect.namespace, &expect.name, &expect.uid);
    let events = app.events.clone();
    let committed =
        blocking(app, move |store| match revisions::commit(store, &expect, pending, &report, &resolved, &events) {
            Ok(bundle) => Ok(bundle),
            Err(CommitError::Storage(e)) => Err(e),
            Err(other) => Err(StorageError::Conflict(other.to_string())),
        })
        .await;
    match &committed {
        Ok(_) => {
            let note = format!("uploaded {} ({} files, {} bytes)", record.digest, record.files, record.size);
            app.events.normal(&regarding, "Uploaded", "Upload", &note);
        }
        Err(refused) => app.events.warning(&regarding, "UploadRefused", "Upload", &refused.message),
    }
    committed
}

/// The upload's (still compressed) bytes on their way to the archive reader, counted.
struct Received<R> {
    inner: R,
    budget: Arc<Budget>,
}

impl<R: Read> Read for Received<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.budget.add_downloaded(n as u64);
        Ok(n)
    }
}
