//! The conversions of lower layers' errors into a Kubernetes `Status`, in one place: the store's,
//! server-side apply's, an upload's (archive and format problems name the Bundle; a refused piece
//! of a chunked upload names its session; a commit that lost its Bundle is a conflict), a list's
//! (an expired continue token carries a fresh one), and a blocking task that did not finish.
//! (Authentication and authorization failures are converted by the access gate.)

use axum::http::StatusCode;
use serde_json::json;

use super::{ApiError, Cause, Reason};
use crate::api::Bundle;
use crate::apiserver::fieldmanager::ApplyError;
use crate::apiserver::handlers::{continue_token, ListOptions};
use crate::apiserver::panic_status;
use crate::apiserver::GROUP;
use crate::storage::sessions::AppendError;
use crate::storage::{StorageError, DUPLICATE_PATH};
use crate::unpack::revisions::CommitError;
use crate::unpack::tar_ingest::IngestError;
use crate::unpack::UnpackError;

impl ApiError {
    /// An I/O failure outside the store (the upload spool): 507 on a full disk, else 500.
    pub fn io(context: &str, err: std::io::Error) -> ApiError {
        match StorageError::from(err) {
            StorageError::InsufficientStorage(message) => {
                ApiError::insufficient_storage(format!("{context}: {message}"))
            }
            other => ApiError::internal(format!("{context}: {other}")),
        }
    }
}

impl From<StorageError> for ApiError {
    fn from(err: StorageError) -> ApiError {
        match err {
            StorageError::NotFound(what) => ApiError::not_found_message(format!("{what} not found")),
            StorageError::AlreadyExists(what) => {
                ApiError::new(StatusCode::CONFLICT, Reason::AlreadyExists, format!("{what} already exists"))
            }
            StorageError::Conflict(what) => modified(&what),
            StorageError::InvalidEntry { path, reason } => invalid_archive_entry(path, reason),
            StorageError::DuplicatePath { path } => invalid_archive_entry(path, DUPLICATE_PATH.into()),
            StorageError::InsufficientStorage(message) => {
                tracing::warn!(%message, "write refused: out of space");
                ApiError::insufficient_storage(message)
            }
            // Not retried by waiting: the store refuses writes until a restart (logged once, when
            // it was poisoned); the message says so.
            poisoned @ StorageError::Poisoned(_) => ApiError::unavailable(poisoned.to_string()),
            // etcd or object storage: a retry may reach them (or a replica that can).
            remote @ StorageError::Remote(_) => {
                tracing::warn!(error = %remote, "shared store unavailable");
                ApiError::unavailable(remote.to_string())
            }
            // Only a request already dropped gets this: nobody reads the answer.
            StorageError::Cancelled => ApiError::unavailable("the request was abandoned before it was applied"),
            other => {
                tracing::error!(error = %other, "storage failure");
                ApiError::internal(other.to_string())
            }
        }
    }
}

/// `Operation cannot be fulfilled on WHAT: the object has been modified; …` (409 Conflict).
fn modified(what: &str) -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        Reason::Conflict,
        format!("Operation cannot be fulfilled on {what}: the object has been modified; please apply your changes to the latest version and try again"),
    )
}

/// An upload's commit: the store's failure as the store's; a Bundle that went away or whose spec
/// changed meanwhile is a conflict, said as one.
impl From<CommitError> for ApiError {
    fn from(err: CommitError) -> ApiError {
        match err {
            CommitError::Storage(e) => e.into(),
            other @ (CommitError::Gone | CommitError::Superseded) => modified(&other.to_string()),
        }
    }
}

/// A request body that cannot be read as the kind it was sent as (not JSON, YAML or protobuf, or
/// not that kind), and what was wrong in plain words.
pub struct UndecodableBody<'a> {
    pub kind: &'a str,
    /// The version the body was read as, `v1alpha1` or `v1`.
    pub version: &'a str,
    pub problem: &'a dyn std::fmt::Display,
}

/// Worded as kube-apiserver words a body it cannot decode.
impl From<UndecodableBody<'_>> for ApiError {
    fn from(UndecodableBody { kind, version, problem }: UndecodableBody<'_>) -> ApiError {
        ApiError::bad_request(format!("{kind} in version \"{version}\" cannot be handled as a {kind}: {problem}"))
    }
}

/// A piece of a chunked upload that was not appended, and the session it was for.
pub struct PieceRefused {
    pub session: String,
    pub error: AppendError,
}

impl From<PieceRefused> for ApiError {
    fn from(PieceRefused { session, error }: PieceRefused) -> ApiError {
        match error {
            AppendError::Gap { start, offset } => ApiError::range_not_satisfiable(format!(
                "the piece starts at byte {start} but upload {session:?} has {offset} bytes: send from byte {offset}"
            )),
            e @ AppendError::TooLarge { .. } => ApiError::too_large(format!("{e} (--max-body-bytes)")),
            e @ (AppendError::Short { .. } | AppendError::Body(_)) => ApiError::bad_request(e.to_string()),
            e @ AppendError::Raced => ApiError::conflict_message(e.to_string()),
            AppendError::Io(e) => ApiError::io("writing the piece to the upload spool", e),
        }
    }
}

/// `invalid archive entry PATH: REASON`, the path as the cause's field.
fn invalid_archive_entry(path: String, reason: String) -> ApiError {
    ApiError::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        Reason::Invalid,
        format!("invalid archive entry {path:?}: {reason}"),
    )
    .with_details(json!({"causes": [Cause { reason: "FieldValueInvalid".into(), message: reason, field: path }]}))
}

/// A refused apply: conflicts are 409 with one `FieldManagerConflict` cause each.
impl From<ApplyError> for ApiError {
    fn from(err: ApplyError) -> ApiError {
        match err {
            ApplyError::Conflicts(conflicts) => {
                let message = ApplyError::Conflicts(conflicts.clone()).to_string();
                let causes = conflicts
                    .into_iter()
                    .map(|c| Cause { reason: "FieldManagerConflict".into(), message: c.message, field: c.field })
                    .collect();
                ApiError::apply_conflict(message, causes)
            }
            ApplyError::BadRequest(message) => ApiError::bad_request(message),
            ApplyError::Invalid(message) => ApiError::new_unprocessable(message),
        }
    }
}

/// A blocking task that did not finish: its panic is logged, the client gets a plain message.
impl From<tokio::task::JoinError> for ApiError {
    fn from(error: tokio::task::JoinError) -> ApiError {
        panic_status::task_failed(error)
    }
}

/// A list the store could not serve at the requested resourceVersion, with the options it was
/// asked with (a continued list that expired gets a token to go on inconsistently).
pub(crate) struct ListFailure<'a> {
    pub error: StorageError,
    pub options: &'a ListOptions,
}

impl From<ListFailure<'_>> for ApiError {
    fn from(ListFailure { error, options }: ListFailure<'_>) -> ApiError {
        match error {
            StorageError::Expired(rv) if options.continued => ApiError::gone(
                "The provided continue parameter is too old to display a consistent list result. You can start a \
                 new list without the continue parameter, or use the continue token in this response to retrieve \
                 the remainder of the results. Continuing with the provided token results in an inconsistent \
                 list - objects that were created, modified, or deleted between the time the first chunk was \
                 returned and now may show up in the list.",
            )
            .with_list_meta(json!({
                "resourceVersion": rv.to_string(),
                "continue": continue_token(0, options.after.as_deref().unwrap_or("")),
            })),
            StorageError::Expired(rv) => ApiError::gone(format!("too old resource version: {rv}")),
            StorageError::TooNew { requested, current } => ApiError::too_large_resource_version(requested, current),
            other => other.into(),
        }
    }
}

/// An upload that failed, and the Bundle it was for.
pub struct UploadFailure {
    bundle: String,
    error: IngestError<UnpackError>,
}

impl UploadFailure {
    /// Reading or checking the archive failed.
    pub fn ingest(bundle: &str, error: IngestError<UnpackError>) -> UploadFailure {
        UploadFailure { bundle: bundle.into(), error }
    }

    /// The tree was read but refused (format, emptiness, limits).
    pub fn unpack(bundle: &str, error: UnpackError) -> UploadFailure {
        UploadFailure { bundle: bundle.into(), error: IngestError::Sink(error) }
    }
}

/// The error an upload's body reader returns once `--max-body-bytes` is exceeded.
#[derive(Debug, thiserror::Error)]
#[error("request body larger than the maximum of {0} bytes")]
pub struct BodyTooLarge(pub u64);

impl From<UploadFailure> for ApiError {
    fn from(UploadFailure { bundle, error }: UploadFailure) -> ApiError {
        ingest_error(&bundle, error)
    }
}

fn ingest_error(bundle: &str, err: IngestError<UnpackError>) -> ApiError {
    match err {
        IngestError::InvalidEntry { path, reason } => invalid_entry(bundle, path, reason),
        // The archive reader's messages are whole and plain (no library text, no body bytes).
        IngestError::Corrupt(message) => ApiError::bad_request(message),
        IngestError::TooLarge { limit } => {
            ApiError::too_large(format!("archive expands past the maximum of {limit} bytes (--max-unpacked-bytes)"))
        }
        IngestError::Source(e) => match e.get_ref().and_then(|inner| inner.downcast_ref::<BodyTooLarge>()) {
            Some(too_large) => ApiError::too_large(format!("{too_large} (--max-body-bytes)")),
            None => ApiError::bad_request(format!("reading the request body: {e}")),
        },
        IngestError::Sink(e) => unpack_error(bundle, e),
    }
}

fn unpack_error(bundle: &str, err: UnpackError) -> ApiError {
    match err {
        UnpackError::InvalidEntry { path, reason } => invalid_entry(bundle, path, reason),
        UnpackError::InvalidFormat { path, problem } => invalid_format(bundle, path, problem),
        UnpackError::TooLarge(message) => ApiError::too_large(message),
        UnpackError::CorruptArchive(message) => ApiError::bad_request(message),
        UnpackError::Empty => ApiError::new_unprocessable(UnpackError::Empty.to_string()),
        UnpackError::Storage(e) => e.into(),
        other => ApiError::internal(other.to_string()),
    }
}

/// `Bundle "b" is invalid: PATH: REASON`: the entry's path is the cause's field, said once.
fn invalid_entry(bundle: &str, path: String, reason: String) -> ApiError {
    let cause = Cause { reason: "FieldValueInvalid".into(), message: reason, field: path };
    ApiError::invalid(Bundle::KIND, bundle, vec![cause])
}

/// `Bundle "b" is invalid: not a helm chart: …`: the problem names the format and the file
/// (the cause's field), so it is not prefixed with the file again.
fn invalid_format(bundle: &str, path: String, problem: String) -> ApiError {
    let kind = Bundle::KIND;
    let message = format!("{kind}.{GROUP} {bundle:?} is invalid: {problem}");
    let cause = Cause { reason: "FieldValueInvalid".into(), message: problem, field: path };
    ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, Reason::Invalid, message)
        .with_details(json!({"name": bundle, "group": GROUP, "kind": kind, "causes": [cause]}))
}
