//! The access log: one line per request (kube-apiserver's httplog, which it writes from `--v=3`),
//! on target [`TARGET`] at info, enabled by `-v 3` and above (see `serve/logging.rs`).
//!
//! Like kube's, the line is written when the request is over: when its response body has been
//! sent or dropped, so a watch or a download is logged when it ends, with its whole duration and
//! the bytes it sent. A request whose client left before any answer is logged then too, without a
//! status. Fields: `verb` (kube's, from [`RequestInfo`]), `path` (path and query), `user` (the user
//! it ran as, once authenticated), `status`, `latency_ms`, `bytes` (response body bytes sent),
//! `retry_after` (seconds, when the response carries `Retry-After`), `user_agent`, `remote`. Never
//! a header's value besides `User-Agent`, never a body: no credential can reach the line.
//!
//! Off (the default), the middleware only asks whether it is on: nothing is parsed, allocated or
//! wrapped.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use axum::body::Body;
use axum::extract::Request;
use axum::http::header;
use axum::middleware::Next;
use axum::response::Response;
use http_body_util::BodyExt as _;

use super::request_info::RequestInfo;

/// The target of access lines, which the log filter turns on and off on its own.
pub const TARGET: &str = "stowage::access";

/// Whether access lines are written; cached per call site by tracing, so cheap on every request.
pub fn enabled() -> bool {
    tracing::enabled!(target: TARGET, tracing::Level::INFO)
}

/// The client's address, which the listener records while access lines are on.
#[derive(Clone, Copy, Debug)]
pub struct RemoteAddr(pub SocketAddr);

/// Where the gate leaves the name of the user a request runs as; present only while logging.
#[derive(Clone, Default)]
struct UserSlot(Arc<OnceLock<String>>);

/// Records who `request` runs as for its access line (the first name given wins).
pub fn note_user(request: &Request, name: &str) {
    if let Some(slot) = request.extensions().get::<UserSlot>() {
        let _ = slot.0.set(name.to_owned());
    }
}

/// Middleware: the access line of every request below it.
pub async fn log_request(mut request: Request, next: Next) -> Response {
    if !enabled() {
        return next.run(request).await;
    }
    let info = RequestInfo::new(request.method(), request.uri().path(), request.uri().query());
    let user = UserSlot::default();
    request.extensions_mut().insert(user.clone());
    let mut line = Line {
        started: Instant::now(),
        verb: info.verb,
        path: request.uri().path_and_query().map_or_else(|| request.uri().path().to_string(), |p| p.to_string()),
        user,
        user_agent: request
            .headers()
            .get(header::USER_AGENT)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned()),
        remote: request.extensions().get::<RemoteAddr>().map(|r| r.0),
        status: None,
        retry_after: None,
        bytes: 0,
    };
    // Dropped here, unanswered, if the client goes away first: that logs it too.
    let response = next.run(request).await;
    line.status = Some(response.status().as_u16());
    line.retry_after =
        response.headers().get(header::RETRY_AFTER).and_then(|v| v.to_str().ok()).and_then(|v| v.trim().parse().ok());
    // The closure owns the whole line (a method call captures it, not just its `bytes` field):
    // it is written when the body is dropped.
    response.map(|body| {
        Body::new(body.map_frame(move |frame| {
            if let Some(data) = frame.data_ref() {
                line.sent(data.len());
            }
            frame
        }))
    })
}

/// One request's access line, written when it is dropped (with the response body, or unanswered).
struct Line {
    started: Instant,
    verb: String,
    path: String,
    user: UserSlot,
    user_agent: Option<String>,
    remote: Option<SocketAddr>,
    status: Option<u16>,
    retry_after: Option<u64>,
    bytes: u64,
}

impl Line {
    fn sent(&mut self, bytes: usize) {
        self.bytes = self.bytes.saturating_add(bytes as u64);
    }
}

impl Drop for Line {
    fn drop(&mut self) {
        // Milliseconds to the microsecond: a readable number rather than float noise.
        let latency_ms = self.started.elapsed().as_micros() as f64 / 1000.0;
        // kube's httplog message; fields left unknown (None) are omitted.
        tracing::info!(
            target: TARGET,
            verb = %self.verb,
            path = %self.path,
            user = self.user.0.get().map(String::as_str),
            status = self.status,
            latency_ms,
            bytes = self.status.map(|_| self.bytes),
            retry_after = self.retry_after,
            user_agent = self.user_agent.as_deref(),
            remote = self.remote.map(tracing::field::display),
            "HTTP"
        );
    }
}
