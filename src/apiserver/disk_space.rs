//! Refuses requests that would write new content or objects while the data directory is below
//! its free-space reserve (`--min-free-bytes`), with a 507 `InsufficientStorage` Status, before
//! any byte of the body is read. Reads and deletes pass: a full disk keeps serving, and deleting is
//! how space comes back. The store checks again as it writes (an upload crossing the reserve
//! stops there); this gate only answers early and uniformly.

use axum::extract::{Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::status::ApiError;
use super::AppState;
use crate::storage::WriteKind;

pub async fn refuse_writes_when_full(State(app): State<AppState>, request: Request, next: Next) -> Response {
    let writes = matches!(*request.method(), Method::POST | Method::PUT | Method::PATCH);
    if writes {
        // One statvfs call: cheap enough to make on the async thread.
        if let Err(e) = app.store.ensure_space(WriteKind::Content) {
            return ApiError::from(e).into_response();
        }
    }
    next.run(request).await
}
