//! Source: OCI images and artifacts (Helm charts) from a registry. (To be implemented.)

use super::error::UnpackError;
use super::source::{ImageSpec, Resolved, Sink, SourceContext};

/// What `spec` points at now, fetching metadata only. Returns a value equal to `previous` when
/// nothing changed; performs no network I/O for a source pinned by digest/commit/sha256.
pub async fn resolve(
    spec: &ImageSpec,
    ctx: &SourceContext,
    previous: Option<&Resolved>,
) -> Result<Resolved, UnpackError> {
    let _ = (spec, ctx, previous);
    Err(UnpackError::Unsupported("not implemented yet".into()))
}

/// Streams exactly the content `pinned` names into `sink`, verifying every digest; returns the
/// final pinned identity (e.g. with the downloaded sha256 filled in). Blocking: run on a blocking
/// thread.
pub fn fetch(
    spec: &ImageSpec,
    ctx: &SourceContext,
    pinned: &Resolved,
    sink: &mut Sink<'_>,
) -> Result<Resolved, UnpackError> {
    let _ = (spec, ctx, pinned, sink);
    Err(UnpackError::Unsupported("not implemented yet".into()))
}
