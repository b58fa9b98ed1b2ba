//! Uploads: `PUT bundles/NAME/content` streams the body (size-limited, optionally gzip/zstd)
//! through the tar validator into a new revision, then commits it atomically with a BundleContent
//! and the Bundle's status — or reuses the BundleContent that already holds identical content.

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::Response;
use futures_util::TryStreamExt;
use serde_json::{json, Value};

use crate::apiserver::handlers::{get_object, json_response, resource_def};
use crate::apiserver::resources::bundle::BUNDLE;
use crate::apiserver::resources::bundlecontent::{content_name, BUNDLE_CONTENT};
use crate::apiserver::status::{ApiError, ApiResult, Cause};
use crate::apiserver::{blocking, meta, AppState, API_VERSION};
use crate::storage::{
    ObjectKey, ObjectWrite, PendingRevision, Precondition, RevisionRecord, RevisionWriter, StorageError,
};
use crate::unpack::tar_ingest::{self, Encoding, IngestError, IngestLimits};
use crate::unpack::EntrySink;

/// The error the body reader returns once the configured maximum is exceeded.
#[derive(Debug, thiserror::Error)]
#[error("request body larger than the maximum of {0} bytes")]
struct BodyTooLarge(u64);

/// Writes accepted archive entries into a revision, under the source's destination prefix.
struct RevisionSink<'a> {
    writer: &'a mut RevisionWriter,
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
async fn commit_upload(app: &AppState, namespace: &str, name: &str, pending: PendingRevision) -> ApiResult<Response> {
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
