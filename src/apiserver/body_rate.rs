//! A minimum rate for request bodies: a client must deliver at least [`MIN_BYTES_PER_WINDOW`]
//! within every `--request-body-timeout` spent waiting for it, or the request ends with
//! 408 `Timeout`. This bounds a stalled upload and one that trickles a few bytes per second
//! (slowloris on the body) without cutting a long upload that keeps making progress.
//!
//! Only time spent waiting on the client counts: while a handler is not reading (the store is
//! syncing a block, say) the clock stands still, so the server's own pace never times a client out.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hyper::body::{Frame, SizeHint};
use tokio::time::{Instant, Sleep};

use super::status::ApiError;

/// Bytes a body must deliver per window; ~550 B/s at the default 30 s window.
pub const MIN_BYTES_PER_WINDOW: u64 = 16 << 10;

#[derive(Debug, thiserror::Error)]
#[error("the request body arrived slower than {MIN_BYTES_PER_WINDOW} bytes per {0:?}")]
pub struct BodyTooSlow(Duration);

/// Middleware: wraps every request body; a request whose body stalled answers 408, whatever the
/// handler made of the failed read.
pub async fn enforce(State(window): State<Duration>, request: Request, next: Next) -> Response {
    let stalled = Arc::new(AtomicBool::new(false));
    let request = request.map(|body| Body::new(MinRateBody::new(body, window, stalled.clone())));
    let response = next.run(request).await;
    if stalled.load(Ordering::Acquire) {
        return ApiError::from_code(StatusCode::REQUEST_TIMEOUT, BodyTooSlow(window).to_string()).into_response();
    }
    response
}

/// A body that fails with [`BodyTooSlow`] once it has spent `window` waiting for the client
/// without receiving [`MIN_BYTES_PER_WINDOW`].
struct MinRateBody {
    inner: Body,
    window: Duration,
    /// Waiting time left in the current window.
    left: Duration,
    received_in_window: u64,
    /// Set while waiting: when the wait began and when the window runs out.
    waiting: Option<(Instant, Pin<Box<Sleep>>)>,
    stalled: Arc<AtomicBool>,
}

impl MinRateBody {
    fn new(inner: Body, window: Duration, stalled: Arc<AtomicBool>) -> MinRateBody {
        MinRateBody { inner, window, left: window, received_in_window: 0, waiting: None, stalled }
    }

    fn stop_waiting(&mut self) {
        if let Some((since, _)) = self.waiting.take() {
            self.left = self.left.saturating_sub(since.elapsed());
        }
    }
}

impl hyper::body::Body for MinRateBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                this.stop_waiting();
                if let Some(Ok(data)) = &frame {
                    this.received_in_window += data.data_ref().map_or(0, |d| d.len() as u64);
                }
                if this.received_in_window >= MIN_BYTES_PER_WINDOW {
                    this.received_in_window = 0;
                    this.left = this.window;
                }
                Poll::Ready(frame)
            }
            Poll::Pending => {
                let left = this.left;
                let (_, deadline) =
                    this.waiting.get_or_insert_with(|| (Instant::now(), Box::pin(tokio::time::sleep(left))));
                if deadline.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                this.stalled.store(true, Ordering::Release);
                Poll::Ready(Some(Err(axum::Error::new(BodyTooSlow(this.window)))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::StreamExt;
    use http_body_util::BodyExt;

    const WINDOW: Duration = Duration::from_millis(300);

    fn trickle(pieces: usize, every: Duration, size: usize) -> Body {
        let stream = futures_util::stream::iter(0..pieces).then(move |_| async move {
            tokio::time::sleep(every).await;
            Ok::<_, std::io::Error>(Bytes::from(vec![b'x'; size]))
        });
        Body::from_stream(stream)
    }

    #[tokio::test]
    async fn a_trickling_body_fails_after_one_window() {
        let stalled = Arc::new(AtomicBool::new(false));
        let body = MinRateBody::new(trickle(1000, Duration::from_millis(20), 1), WINDOW, stalled.clone());
        let started = std::time::Instant::now();
        let err = body.collect().await.expect_err("a trickle must fail");
        assert!(err.to_string().contains("slower than"), "{err}");
        assert!(stalled.load(Ordering::Acquire));
        assert!(started.elapsed() < WINDOW * 3, "failed after {:?}", started.elapsed());
    }

    #[tokio::test]
    async fn a_slow_body_that_keeps_making_progress_is_not_cut() {
        let stalled = Arc::new(AtomicBool::new(false));
        // 16 KiB every 100 ms for well over a window.
        let body = trickle(8, Duration::from_millis(100), MIN_BYTES_PER_WINDOW as usize);
        let body = MinRateBody::new(body, WINDOW, stalled.clone());
        let bytes = body.collect().await.expect("progressing body").to_bytes();
        assert_eq!(bytes.len() as u64, 8 * MIN_BYTES_PER_WINDOW);
        assert!(!stalled.load(Ordering::Acquire));
    }

    #[tokio::test]
    async fn time_the_reader_spends_elsewhere_does_not_count() {
        let stalled = Arc::new(AtomicBool::new(false));
        let mut body = MinRateBody::new(trickle(3, Duration::ZERO, 10), WINDOW, stalled);
        while let Some(frame) = body.frame().await {
            frame.expect("the client was never waited for");
            tokio::time::sleep(WINDOW * 2).await;
        }
    }
}
