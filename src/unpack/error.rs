//! Why an unpack failed, and whether trying again can help.
//!
//! Every source and sink reports an [`UnpackError`]; the reconcile loop turns it into the Bundle's
//! `Unpacked` condition (its [`UnpackError::reason`]) and decides between retrying with backoff
//! ([`UnpackError::is_transient`]) and waiting for the spec to change or the next poll.

use crate::storage::StorageError;
use crate::unpack::tar_ingest::IngestError;

#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    /// The source could not be reached or read: network, TLS, server errors, a Secret that is
    /// missing or unreadable. Retried with backoff and jitter.
    #[error("{0}")]
    Fetch(String),
    /// The source answered that what was asked for does not exist (404, a tag or ref the remote
    /// does not have). Not retried before the spec changes or the next poll.
    #[error("{0}")]
    NotFound(String),
    /// The source refused the credentials presented (401, 403). Not retried before the spec
    /// changes or the next poll: credentials are read afresh for every attempt.
    #[error("{0}")]
    Denied(String),
    /// No tag of the source's repository is in its version range; the message lists the newest
    /// versions seen. Not retried before the spec changes or the next poll.
    #[error("{0}")]
    NoMatchingVersion(String),
    /// The source is specified in a way this server will never fetch (plain http to a host not
    /// listed as insecure, an unsupported media type, no matching platform). Not retried.
    #[error("{0}")]
    Unsupported(String),
    /// Downloaded bytes do not match the digest they were asked for. Not retried.
    #[error("{what}: digest mismatch: expected {expected}, got {actual}")]
    DigestMismatch { what: String, expected: String, actual: String },
    /// An unsafe or malformed archive entry (path traversal, symlink escape, device file…).
    #[error("invalid entry {path:?}: {reason}")]
    InvalidEntry { path: String, reason: String },
    /// A truncated or corrupt archive or compression stream, or no archive at all; the message
    /// says which (`corrupt archive: …`, `truncated archive: …`, `not a tar archive …`).
    #[error("{0}")]
    CorruptArchive(String),
    /// A configured limit was exceeded (size, file count, expansion ratio, path length…).
    #[error("{0}")]
    TooLarge(String),
    /// The tree is not a valid bundle of its format; `path` names the offending file, `problem`
    /// is the whole message (`not a helm chart: no Chart.yaml …`: it names the path itself).
    #[error("{problem}")]
    InvalidFormat { path: String, problem: String },
    /// The content holds no file or symlink (nothing, or directories only) and the Bundle does
    /// not say that empty content is intended (`spec.allowEmpty`). Not retried.
    #[error("archive holds no files: set spec.allowEmpty to true if the Bundle is meant to serve empty content")]
    Empty,
    /// The store failed; retried.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The work was cancelled (spec changed, Bundle deleted, server stopping).
    #[error("cancelled")]
    Cancelled,
}

impl UnpackError {
    /// The `reason` of the Bundle's `Unpacked=False` condition.
    pub fn reason(&self) -> &'static str {
        match self {
            UnpackError::Fetch(_) => "PullFailed",
            UnpackError::NotFound(_) => "SourceNotFound",
            UnpackError::Denied(_) => "AccessDenied",
            UnpackError::NoMatchingVersion(_) => "NoMatchingVersion",
            UnpackError::Unsupported(_) => "InvalidSource",
            UnpackError::DigestMismatch { .. } => "DigestMismatch",
            UnpackError::InvalidEntry { .. } | UnpackError::CorruptArchive(_) => "InvalidContent",
            UnpackError::TooLarge(_) => "LimitExceeded",
            UnpackError::InvalidFormat { .. } => "InvalidFormat",
            UnpackError::Empty => "EmptyContent",
            UnpackError::Storage(_) => "StorageFailed",
            UnpackError::Cancelled => "Cancelled",
        }
    }

    /// Whether trying again later, with the same spec, may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(self, UnpackError::Fetch(_) | UnpackError::Storage(_))
    }

    /// Maps a tar ingestion failure of the archive `what` (e.g. a layer's digest) to an unpack error.
    /// Reader errors are kept as they are when they already are an [`UnpackError`] (a digest
    /// check or the download failing underneath the archive reader).
    pub fn from_ingest(what: &str, err: IngestError<UnpackError>) -> UnpackError {
        match err {
            IngestError::InvalidEntry { path, reason } => UnpackError::InvalidEntry { path, reason },
            IngestError::Corrupt(message) => UnpackError::CorruptArchive(format!("{what}: {message}")),
            IngestError::TooLarge { limit } => {
                UnpackError::TooLarge(format!("{what} unpacks to more than the limit of {limit}"))
            }
            IngestError::Source(e) => UnpackError::from_io(what, e),
            IngestError::Sink(e) => e,
        }
    }

    /// An I/O error from a reader stack: an [`UnpackError`] wrapped by [`UnpackError::into_io`]
    /// comes back out unchanged; anything else is a fetch failure.
    pub fn from_io(what: &str, err: std::io::Error) -> UnpackError {
        if err.get_ref().is_some_and(|inner| inner.is::<UnpackError>()) {
            if let Some(inner) = err.into_inner() {
                if let Ok(unpack) = inner.downcast::<UnpackError>() {
                    return *unpack;
                }
            }
            return UnpackError::Fetch(format!("{what}: read failed"));
        }
        UnpackError::Fetch(format!("{what}: {err}"))
    }

    /// Wraps this error so it can travel through `std::io::Read` and be recovered by
    /// [`UnpackError::from_io`].
    pub fn into_io(self) -> std::io::Error {
        std::io::Error::other(self)
    }
}

/// An unpack's blocking task that ended without an answer: cancelled (the server is stopping), or
/// it panicked — a bug, logged with its message and retried as a failure of this server, never
/// reported as damaged content or a corrupt store.
impl From<tokio::task::JoinError> for UnpackError {
    fn from(error: tokio::task::JoinError) -> UnpackError {
        if error.is_cancelled() {
            return UnpackError::Cancelled;
        }
        tracing::error!(%error, "an unpack task panicked");
        UnpackError::Storage(StorageError::Io(std::io::Error::other(
            "the unpack stopped unexpectedly (the server log says why)",
        )))
    }
}

/// The error for a source that answered HTTP `status` to what `what` names: 404 and 410 say the
/// thing does not exist, 401 and 403 that the credentials were refused; anything else may pass.
pub(crate) fn for_status(status: reqwest::StatusCode, message: String) -> UnpackError {
    match status.as_u16() {
        404 | 410 => UnpackError::NotFound(message),
        401 | 403 => UnpackError::Denied(message),
        _ => UnpackError::Fetch(message),
    }
}

/// Why a JSON document did not parse, with where: serde's own wording can quote the document
/// (`invalid type: string "…"`), so only its kind and position are kept.
pub(crate) fn json_problem(e: &serde_json::Error) -> String {
    let at = format!("line {}, column {}", e.line(), e.column());
    match e.classify() {
        serde_json::error::Category::Data => format!("does not have the expected fields ({at})"),
        serde_json::error::Category::Eof => format!("ends early ({at})"),
        serde_json::error::Category::Syntax | serde_json::error::Category::Io => format!("is not valid JSON ({at})"),
    }
}

/// An error and its causes on one line, each cause once: the top-level messages of gix and
/// reqwest alone ("Transport handshake failed", "error sending request") do not say what went wrong.
/// A rejected server certificate is told in plain words alone ([`super::trust`]).
pub(crate) fn describe(err: &(dyn std::error::Error + 'static)) -> String {
    if let Some(plain) = super::trust::certificate_problem(err) {
        return plain;
    }
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let more = cause.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A panicking unpack task is retried as a failure of this server, and its message keeps the
    /// panic's text (a library's internals) to the log; a cancelled one is a cancellation.
    #[tokio::test]
    async fn a_failed_unpack_task_is_neither_corrupt_content_nor_a_corrupt_store() {
        let panicked = tokio::task::spawn_blocking(|| -> Result<(), UnpackError> { panic!("index out of bounds") })
            .await
            .unwrap_err();
        let error = UnpackError::from(panicked);
        assert_eq!(error.reason(), "StorageFailed");
        assert!(error.is_transient(), "retried");
        let message = error.to_string();
        assert!(!message.contains("index out of bounds") && !message.contains("corrupt"), "{message}");

        let waiting = tokio::spawn(std::future::pending::<()>());
        waiting.abort();
        let cancelled = UnpackError::from(waiting.await.unwrap_err());
        assert!(matches!(cancelled, UnpackError::Cancelled), "{cancelled:?}");
    }
}
