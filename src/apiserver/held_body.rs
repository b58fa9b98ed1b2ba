//! HTTP/2 early answers that clients can read: an unread request body is kept until the response
//! has been sent.
//!
//! Why: a request refused before its body is read (404 missing Bundle, 400, 401, 403, 413, 507…)
//! drops the body in the handler, before the response is written, and h2 resets the stream with
//! `CANCEL` ahead of the answer. Even a reset after the answer (`NO_ERROR`, RFC 9113 §8.1: "stop
//! sending, the answer is complete") is lost on curl 7.88, which fails with `(92) Stream error in
//! the HTTP/2 framing layer` while it is still sending and never reads the Status. So once the
//! response is sent, what the client still sends is read and discarded, within the bounds of
//! HTTP/1's lingering close ([`super::listener::lingering`]); then the stream is reset.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::Version;
use axum::middleware::Next;
use axum::response::Response;
use hyper::body::{Frame, SizeHint};

use super::listener::lingering::{LINGER_IDLE, LINGER_MAX_BYTES, LINGER_TIME};

/// The request body, shared by the handler's view of it and the response that outlives it.
type Slot = Arc<Mutex<Option<Body>>>;

/// Middleware: on HTTP/2, the handler reads the body through a [`SlotBody`]; the body itself is
/// dropped only with the response body.
pub async fn hold_until_answered(request: Request, next: Next) -> Response {
    if request.version() != Version::HTTP_2 {
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    let slot: Slot = Arc::new(Mutex::new(Some(body)));
    let response = next.run(Request::from_parts(parts, Body::new(SlotBody(slot.clone())))).await;
    let (parts, body) = response.into_parts();
    Response::from_parts(parts, Body::new(Holding { body, slot }))
}

/// The request body as the handler sees it.
struct SlotBody(Slot);

impl hyper::body::Body for SlotBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        // Only this body polls the slot; the lock is never contended.
        let mut slot = self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        match slot.as_mut() {
            Some(body) => Pin::new(body).poll_frame(cx),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        let slot = self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        slot.as_ref().is_none_or(hyper::body::Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        let slot = self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        slot.as_ref().map(hyper::body::Body::size_hint).unwrap_or_default()
    }
}

/// The response body, holding the request body until it is dropped itself (sent or cut).
struct Holding {
    body: Body,
    slot: Slot,
}

impl Drop for Holding {
    fn drop(&mut self) {
        let unread = self.slot.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take();
        let Some(unread) = unread.filter(|body| !hyper::body::Body::is_end_stream(body)) else { return };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(drain(unread));
        }
    }
}

/// Reads and discards `body` until it ends or a lingering bound is reached.
async fn drain(body: Body) {
    use futures_util::StreamExt;
    let deadline = tokio::time::Instant::now() + LINGER_TIME;
    let mut frames = body.into_data_stream();
    let mut read = 0u64;
    while read < LINGER_MAX_BYTES {
        let next = tokio::time::timeout(LINGER_IDLE, frames.next());
        match tokio::time::timeout_at(deadline, next).await {
            Ok(Ok(Some(Ok(data)))) => read += data.len() as u64,
            _ => return,
        }
    }
}

impl hyper::body::Body for Holding {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
