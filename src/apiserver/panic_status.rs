//! The net under every handler: a panic while a request is handled becomes a 500 `Status`
//! (`InternalError`, a fixed plain message) and one log line naming the request, instead of a
//! reset stream the client cannot explain. The panic's own text goes to the log only: it may
//! name library internals or echo input.
//!
//! This is the last line of defence, not error handling: request input must never reach a panic
//! (clippy denies `unwrap`, `expect`, `panic!` and unchecked indexing; release builds check
//! arithmetic overflow, so an overflow is a caught panic rather than a wrong number).

use std::any::Any;
use std::panic::AssertUnwindSafe;

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures_util::FutureExt;

use super::status::ApiError;

/// What the client is told (kube-apiserver says as little).
const MESSAGE: &str = "this request caused the server to fail unexpectedly; the server log has the details";
/// The longest piece of a panic's message that is logged.
const LOGGED_CHARS: usize = 300;

/// Middleware: runs the rest of the stack, turning a panic into a 500 `Status`.
pub(crate) async fn catch(request: Request, next: Next) -> Response {
    let (method, path) = (request.method().clone(), request.uri().path().to_owned());
    match AssertUnwindSafe(next.run(request)).catch_unwind().await {
        Ok(response) => response,
        Err(payload) => {
            tracing::error!(%method, %path, panic = %panic_text(payload.as_ref()), "a request handler panicked");
            ApiError::internal(MESSAGE).into_response()
        }
    }
}

/// A blocking task that did not finish: its panic is logged, the client gets the plain message.
pub(crate) fn task_failed(error: tokio::task::JoinError) -> ApiError {
    match error.try_into_panic() {
        Ok(payload) => {
            tracing::error!(panic = %panic_text(payload.as_ref()), "a blocking task of a request panicked");
            ApiError::internal(MESSAGE)
        }
        Err(error) => ApiError::internal(format!("a blocking task of the request failed: {error}")),
    }
}

/// The message a panic carries (`panic!` gives a `&str` or a `String`), shortened for the log.
fn panic_text(payload: &(dyn Any + Send)) -> String {
    let text = payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)");
    text.chars().take(LOGGED_CHARS).collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]

    use axum::body::Body;
    use axum::http::StatusCode;
    use axum::routing::get;
    use axum::Router;
    use tower::ServiceExt;

    use super::*;

    async fn explode() -> &'static str {
        panic!("secret internals 0xdeadbeef");
    }

    async fn fine() -> &'static str {
        "ok"
    }

    fn app() -> Router {
        Router::new().route("/boom", get(explode)).route("/fine", get(fine)).layer(axum::middleware::from_fn(catch))
    }

    async fn call(path: &str) -> (StatusCode, Vec<u8>) {
        let response = app().oneshot(Request::get(path).body(Body::empty()).unwrap()).await.unwrap();
        let code = response.status();
        (code, axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap().to_vec())
    }

    #[tokio::test]
    async fn a_panicking_handler_is_a_500_status_without_the_panic_text() {
        let (code, body) = call("/boom").await;
        assert_eq!(code, StatusCode::INTERNAL_SERVER_ERROR);
        let status: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(status["kind"], "Status");
        assert_eq!(status["reason"], "InternalError");
        assert_eq!(status["code"], 500);
        assert_eq!(status["message"], MESSAGE);
        assert!(!String::from_utf8_lossy(&body).contains("deadbeef"), "panic text leaked");
        // The server goes on serving.
        assert_eq!(call("/fine").await, (StatusCode::OK, b"ok".to_vec()));
    }

    #[tokio::test]
    async fn a_panicking_blocking_task_is_a_plain_500() {
        let joined = tokio::task::spawn_blocking(|| panic!("index out of bounds: secret")).await;
        let Err(joined) = joined else { panic!("the task panicked") };
        let error = task_failed(joined);
        assert_eq!(error.code, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(error.message, MESSAGE);
    }

    #[test]
    fn panic_text_is_short() {
        let long = "x".repeat(10_000);
        assert_eq!(panic_text(&long).len(), LOGGED_CHARS);
        assert_eq!(panic_text(&"static"), "static");
        assert_eq!(panic_text(&42u8), "(no message)");
    }
}
