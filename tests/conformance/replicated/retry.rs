//! Requests that fail only because their connection died are retried, as clients behind a Service
//! do; everything else is a failure. Counts requests by kind, failures by cause, and retries.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::Duration;

use reqwest::{RequestBuilder, StatusCode};

const TIMEOUT: Duration = Duration::from_secs(60);
/// A request still failing on a dead connection after this many tries has not "succeeded on retry".
const ATTEMPTS: u32 = 40;
const BACKOFF: Duration = Duration::from_millis(250);

/// What the clients did and what went wrong.
#[derive(Default)]
pub struct Stats {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    requests: BTreeMap<&'static str, u64>,
    /// Dead-connection failures, by cause (each was retried).
    failures: BTreeMap<String, u64>,
    /// Requests that failed at least once and then succeeded.
    retried: u64,
    /// Everything that is not allowed: other errors, unexpected answers, requests never answered.
    problems: Vec<String>,
}

impl Stats {
    pub fn request(&self, kind: &'static str) {
        *self.inner.lock().unwrap().requests.entry(kind).or_default() += 1;
    }

    /// A failure on a dead connection (the request is retried, or the watch resumed).
    pub fn count_failure(&self, cause: String) {
        *self.inner.lock().unwrap().failures.entry(cause).or_default() += 1;
    }

    fn retried(&self) {
        self.inner.lock().unwrap().retried += 1;
    }

    /// Records something a user would see as a failure that a dead connection does not explain.
    pub fn problem(&self, what: String) {
        let mut inner = self.inner.lock().unwrap();
        if inner.problems.len() < 1000 {
            inner.problems.push(what);
        }
    }

    pub fn problems(&self) -> Vec<String> {
        self.inner.lock().unwrap().problems.clone()
    }

    /// `requests: upload=… list=…; dead-connection failures: cause=…; retried ok: N; problems: N`
    pub fn summary(&self) -> String {
        let inner = self.inner.lock().unwrap();
        let mut s = String::from("requests:");
        for (k, v) in &inner.requests {
            let _ = write!(s, " {k}={v}");
        }
        s.push_str("; dead-connection failures:");
        if inner.failures.is_empty() {
            s.push_str(" none");
        }
        for (k, v) in &inner.failures {
            let _ = write!(s, " {k}={v}");
        }
        let _ = write!(s, "; retried ok: {}; problems: {}", inner.retried, inner.problems.len());
        s
    }
}

/// Why a transport error happened: `Ok(cause)` when the connection died (closed, reset, refused
/// while a backend was down, an HTTP/2 GOAWAY or refused stream), `Err(text)` for anything else
/// (a timeout included: a live connection that does not answer is not a dead one).
pub fn dead_connection(error: &reqwest::Error) -> Result<&'static str, String> {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(s) = source {
        let _ = write!(text, ": {s}");
        source = s.source();
    }
    if error.is_timeout() {
        return Err(format!("timeout: {text}"));
    }
    let lower = text.to_ascii_lowercase();
    let causes: [(&str, &'static str); 14] = [
        ("connection refused", "refused"),
        ("os error 111", "refused"),
        ("connection reset", "reset"),
        ("os error 104", "reset"),
        ("broken pipe", "broken-pipe"),
        ("os error 32", "broken-pipe"),
        ("connection closed", "closed"),
        ("incomplete", "closed"),
        ("unexpected eof", "closed"),
        ("close_notify", "closed"),
        ("end of file", "closed"),
        ("refused stream", "refused-stream"),
        ("go away", "goaway"),
        ("goaway", "goaway"),
    ];
    for (needle, cause) in causes {
        if lower.contains(needle) {
            return Ok(cause);
        }
    }
    if error.is_connect() {
        return Ok("connect");
    }
    Err(text)
}

/// Sends the request `make` builds until it gets an answer (status and whole body), retrying
/// while connections die; `Err` when it never got one or failed some other way (recorded).
pub async fn send(
    stats: &Stats,
    kind: &'static str,
    what: &str,
    make: impl Fn() -> RequestBuilder,
) -> Result<(StatusCode, bytes::Bytes, u32), ()> {
    stats.request(kind);
    let mut failed = 0;
    for attempt in 1..=ATTEMPTS {
        let error = match make().timeout(TIMEOUT).send().await {
            Ok(resp) => {
                let status = resp.status();
                match resp.bytes().await {
                    Ok(body) => {
                        if failed > 0 {
                            stats.retried();
                        }
                        return Ok((status, body, failed));
                    }
                    Err(e) => e,
                }
            }
            Err(e) => e,
        };
        match dead_connection(&error) {
            Ok(cause) => {
                failed += 1;
                stats.count_failure(format!("{kind}/{cause}"));
            }
            Err(other) => {
                stats.problem(format!("{what} (attempt {attempt}): {other}"));
                return Err(());
            }
        }
        tokio::time::sleep(BACKOFF).await;
    }
    stats.problem(format!("{what}: still failing on dead connections after {ATTEMPTS} attempts"));
    Err(())
}

/// `send`, then the answer must be one of `ok` (its body), else a problem is recorded.
pub async fn expect(
    stats: &Stats,
    kind: &'static str,
    what: &str,
    ok: &[StatusCode],
    make: impl Fn() -> RequestBuilder,
) -> Option<(StatusCode, bytes::Bytes, u32)> {
    let (status, body, failed) = send(stats, kind, what, make).await.ok()?;
    if ok.contains(&status) {
        return Some((status, body, failed));
    }
    stats.problem(format!("{what}: HTTP {status}: {}", String::from_utf8_lossy(&body[..body.len().min(400)])));
    None
}
