//! The bottom of uploads, shared by a single PUT and a chunked upload's commit: an archive is
//! streamed (size-limited, optionally gzip/zstd) through the tar validator into a new revision,
//! then committed atomically with a BundleContent and the Bundle's status — or the BundleContent
//! that already holds identical content is reused.

use std::io::Read;
use std::sync::Arc;

use axum::http::{header, HeaderMap};
use serde_json::Value;

use crate::api::event::Regarding;
use crate::api::Bundle;
use crate::apiserver::status::{ApiError, ApiResult, UploadFailure};
use crate::apiserver::AppState;
use crate::storage::{PendingRevision, Store};
use crate::strategy::decode_or_default;
use crate::unpack::format::FormatReport;
use crate::unpack::revisions::{self, Expect};
use crate::unpack::sink::TreeSink;
use crate::unpack::source::Budget;
use crate::unpack::tar_ingest::{self, Encoding};
use crate::unpack::{ResolvedSource, UnpackLimits};

/// The archive's encoding, from `Content-Encoding`.
pub(super) fn encoding(headers: &HeaderMap) -> ApiResult<Encoding> {
    let value = headers.get(header::CONTENT_ENCODING).and_then(|v| v.to_str().ok());
    Encoding::from_content_encoding(value).ok_or_else(|| {
        ApiError::unsupported_media_type(format!(
            "unsupported Content-Encoding {:?}: use gzip, zstd or none",
            value.unwrap_or("")
        ))
    })
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
    let (store, events) = (app.store.clone(), app.events.clone());
    let committed = tokio::task::spawn_blocking(move || {
        revisions::commit(&store, &expect, pending, &report, &resolved, &events).map_err(ApiError::from)
    })
    .await
    .map_err(ApiError::from)
    .and_then(|committed| committed);
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
