//! Source: a tar, tar.gz or tar.zst at an http(s) URL.
//!
//! * [`resolve`] is free for a URL pinned by `sha256`; otherwise it sends a conditional `HEAD`
//!   (the previous `ETag`/`Last-Modified`) and reports "unchanged" (a value equal to `previous`)
//!   on 304 or identical validators. Without validators every re-resolve reads as a change: the
//!   caller fetches and compares content digests.
//! * [`fetch`] streams one `GET` through the download counter and a sha256 hasher into
//!   [`tar_ingest::ingest`] (compression sniffed from magic bytes), then checks the digest.
//!
//! Credentials (the `authSecret`, else the `--source-credentials` entry for the host): `Basic` →
//! HTTP basic auth, `Bearer` → `Authorization: Bearer`. Redirects are
//! followed (at most 10) only to URLs the network policy allows; reqwest drops the
//! `Authorization` header when a redirect leaves the host.

use std::io::Read;
use std::time::Duration;

use futures_util::TryStreamExt;
use reqwest::header::{HeaderMap, ETAG, IF_MODIFIED_SINCE, IF_NONE_MATCH, LAST_MODIFIED};
use reqwest::StatusCode;
use sha2::{Digest, Sha256};
use tokio_util::io::{StreamReader, SyncIoBridge};

use super::error::UnpackError;
use super::git::{check_scheme, redact};
use super::source::{Credentials, HttpSource, NetworkPolicy, ResolvedSource, Sink, SourceContext};
use super::tar_ingest::{self, Encoding};

/// What `spec` points at now, fetching metadata only. Returns a value equal to `previous` when
/// nothing changed; performs no network I/O for a source pinned by digest/commit/sha256.
pub async fn resolve(
    spec: &HttpSource,
    ctx: &SourceContext,
    previous: Option<&ResolvedSource>,
) -> Result<ResolvedSource, UnpackError> {
    let url = check_url(&spec.url, &ctx.network)?;
    let previous = previous.filter(|p| matches!(p, ResolvedSource::Http { url, .. } if *url == spec.url));
    if !spec.sha256.is_empty() {
        let sha256 = parse_sha256(&spec.sha256)?;
        if let Some(p @ ResolvedSource::Http { sha256: known, .. }) = previous {
            if *known == sha256 {
                return Ok(p.clone());
            }
        }
        return Ok(ResolvedSource::Http {
            url: spec.url.clone(),
            tag: String::new(),
            sha256,
            etag: String::new(),
            last_modified: String::new(),
        });
    }
    ctx.check_cancelled()?;
    let client = client(&ctx.network)?;
    let mut request = authorize(client.head(url.clone()), ctx.credentials.as_ref());
    if let Some(ResolvedSource::Http { etag, last_modified, .. }) = previous {
        if !etag.is_empty() {
            request = request.header(IF_NONE_MATCH, etag.as_str());
        }
        if !last_modified.is_empty() {
            request = request.header(IF_MODIFIED_SINCE, last_modified.as_str());
        }
    }
    let response = tokio::select! {
        r = request.send() => r.map_err(|e| request_failed(&url, e))?,
        _ = ctx.cancel.cancelled() => return Err(UnpackError::Cancelled),
    };
    let status = response.status();
    if status == StatusCode::NOT_MODIFIED {
        if let Some(p) = previous {
            return Ok(p.clone());
        }
    }
    if status == StatusCode::METHOD_NOT_ALLOWED || status == StatusCode::NOT_IMPLEMENTED {
        // No HEAD support: nothing to compare, so report a change and let the content decide.
        return Ok(ResolvedSource::Http {
            url: spec.url.clone(),
            tag: String::new(),
            sha256: String::new(),
            etag: String::new(),
            last_modified: String::new(),
        });
    }
    check_status(&url, status)?;
    let (etag, last_modified) = validators(response.headers());
    if let Some(p @ ResolvedSource::Http { etag: old_etag, last_modified: old_lm, .. }) = previous {
        // A strong-enough sign of "same file": the same ETag, or (no ETags at all) the same date.
        let same = if !etag.is_empty() || !old_etag.is_empty() {
            etag == *old_etag
        } else {
            !last_modified.is_empty() && last_modified == *old_lm
        };
        if same {
            return Ok(p.clone());
        }
    }
    Ok(ResolvedSource::Http { url: spec.url.clone(), tag: String::new(), sha256: String::new(), etag, last_modified })
}

/// Streams exactly the content `pinned` names into `sink`, verifying every digest; returns the
/// final pinned identity (e.g. with the downloaded sha256 filled in). Blocking: run on a blocking
/// thread.
pub fn fetch(
    spec: &HttpSource,
    ctx: &SourceContext,
    pinned: &ResolvedSource,
    sink: &mut Sink<'_>,
) -> Result<ResolvedSource, UnpackError> {
    let url = check_url(&spec.url, &ctx.network)?;
    let shown = format!("http source {}", redact(&url));
    // Both the spec's digest and one recorded in the pinned identity must hold.
    let mut expected = Vec::new();
    if !spec.sha256.is_empty() {
        expected.push(parse_sha256(&spec.sha256)?);
    }
    if let ResolvedSource::Http { sha256, .. } = pinned {
        if !sha256.is_empty() {
            expected.push(parse_sha256(sha256)?);
        }
    }
    ctx.check_cancelled()?;
    let client = client(&ctx.network)?;
    let request = authorize(client.get(url.clone()), ctx.credentials.as_ref());
    let response = ctx.runtime.block_on(async {
        tokio::select! {
            r = request.send() => r.map_err(|e| request_failed(&url, e)),
            _ = ctx.cancel.cancelled() => Err(UnpackError::Cancelled),
        }
    })?;
    check_status(&url, response.status())?;
    let (etag, last_modified) = validators(response.headers());

    let stream = response.bytes_stream().map_err(|e| std::io::Error::other(e.without_url()));
    let body = SyncIoBridge::new_with_handle(StreamReader::new(stream), ctx.runtime.clone());
    let mut hashing = HashingReader { inner: ctx.download_reader(body), hasher: Sha256::new() };
    tar_ingest::ingest(&mut hashing, Encoding::Identity, &ctx.limits.ingest(), sink)
        .map_err(|e| UnpackError::from_ingest(&shown, e))?;
    // The digest covers the whole file: read whatever follows the archive (bounded, as a body
    // that never ends must not keep us here).
    let allowance = ctx.limits.max_total_bytes.max(1 << 20);
    let rest = std::io::copy(&mut (&mut hashing).take(allowance), &mut std::io::sink())
        .map_err(|e| UnpackError::from_io(&shown, e))?;
    if rest == allowance {
        return Err(UnpackError::TooLarge(format!("{shown}: too much data after the end of the archive")));
    }
    let actual = hex::encode(hashing.hasher.finalize());
    if let Some(want) = expected.into_iter().find(|want| *want != actual) {
        return Err(UnpackError::DigestMismatch { what: shown, expected: want, actual });
    }
    Ok(ResolvedSource::Http { url: spec.url.clone(), tag: String::new(), sha256: actual, etag, last_modified })
}

fn check_url(raw: &str, network: &NetworkPolicy) -> Result<reqwest::Url, UnpackError> {
    let url = reqwest::Url::parse(raw)
        .map_err(|e| UnpackError::Unsupported(format!("http source {raw:?}: not a URL ({e})")))?;
    check_scheme(&url, network, "http")?;
    Ok(url)
}

/// Lower-case hex sha256 (an optional `sha256:` prefix is accepted).
fn parse_sha256(value: &str) -> Result<String, UnpackError> {
    let hex = value.strip_prefix("sha256:").unwrap_or(value);
    if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(UnpackError::Unsupported(format!("http source sha256 {value:?}: expected 64 hex digits")));
    }
    Ok(hex.to_ascii_lowercase())
}

/// A client that verifies TLS (rustls, the process's crypto provider; the system's roots and
/// `--source-ca-file`), never downgrades to plain http on redirect unless the policy allows that
/// host, and gives up on stalled servers.
fn client(network: &NetworkPolicy) -> Result<reqwest::Client, UnpackError> {
    let roots = super::trust::extra_roots(network)?;
    let policy = network.clone();
    let redirects = reqwest::redirect::Policy::custom(move |attempt| {
        if attempt.previous().len() >= 10 {
            attempt.error("too many redirects")
        } else if check_scheme(attempt.url(), &policy, "http").is_err() {
            attempt.error("redirect to a URL that is not allowed (plain http or another scheme)")
        } else {
            attempt.follow()
        }
    });
    reqwest::Client::builder()
        .redirect(redirects)
        .connect_timeout(Duration::from_secs(30))
        .read_timeout(Duration::from_secs(120))
        .user_agent(concat!("stowage/", env!("CARGO_PKG_VERSION")))
        .tls_certs_merge(roots)
        .build()
        .map_err(|e| UnpackError::Fetch(format!("building the http client: {e}")))
}

fn authorize(request: reqwest::RequestBuilder, credentials: Option<&Credentials>) -> reqwest::RequestBuilder {
    match credentials {
        Some(Credentials::Basic { username, password }) => request.basic_auth(username, Some(password)),
        Some(Credentials::Bearer(token)) => request.bearer_auth(token),
        Some(Credentials::DockerConfig(_)) | None => request,
    }
}

/// Network failures name the URL (without user information) but never the credentials.
fn request_failed(url: &reqwest::Url, err: reqwest::Error) -> UnpackError {
    let err = err.without_url();
    UnpackError::Fetch(format!("http source {}: {}", redact(url), super::error::describe(&err)))
}

/// A 404 or a refused credential waits for a spec change or the next poll; other failures are
/// retried ([`crate::unpack::error::for_status`]).
fn check_status(url: &reqwest::Url, status: StatusCode) -> Result<(), UnpackError> {
    if status.is_success() {
        Ok(())
    } else {
        Err(crate::unpack::error::for_status(status, format!("http source {}: server answered {status}", redact(url))))
    }
}

fn validators(headers: &HeaderMap) -> (String, String) {
    let get =
        |name| headers.get(name).and_then(|v: &reqwest::header::HeaderValue| v.to_str().ok()).unwrap_or("").to_owned();
    (get(ETAG), get(LAST_MODIFIED))
}

/// Hashes every byte read through it.
struct HashingReader<R> {
    inner: R,
    hasher: Sha256,
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(buf.get(..n).unwrap_or_default());
        Ok(n)
    }
}
