//! Source: a tar, tar.gz or tar.zst at an http(s) URL.
//!
//! * [`resolve`] is free for a URL pinned by `sha256`; otherwise it sends a conditional `HEAD`
//!   (the previous `ETag`/`Last-Modified`) and reports "unchanged" (a value equal to `previous`)
//!   on 304 or identical validators. Without validators every re-resolve reads as a change: the
//!   caller fetches and compares content digests.
//! * [`fetch`] streams one `GET` through the download counter and a sha256 hasher into
//!   [`tar_ingest::ingest`] (compression sniffed from magic bytes), then checks the digest.
//!   With a download spool ([`SourceContext::downloads`]) and a known version of the file (its
//!   sha256, a strong `ETag` or a `Last-Modified` date), the bytes are also kept on disk as they
//!   stream; a later attempt reads them from disk and asks only for the rest (`Range` with
//!   `If-Range`). A server that answers with the whole file instead has the bytes on disk skipped
//!   when it is the same version, and the download starts over when the file changed; the sha256
//!   is always of the whole file.
//!
//! Credentials (the `authSecret`, else the `--source-credentials` entry for the host): `Basic` →
//! HTTP basic auth, `Bearer` → `Authorization: Bearer`. Redirects are
//! followed (at most 10) only to URLs the network policy allows; reqwest drops the
//! `Authorization` header when a redirect leaves the host.

use std::cell::RefCell;
use std::io::Read;
use std::time::Duration;

use futures_util::TryStreamExt;
use reqwest::header::{HeaderMap, ETAG, IF_MODIFIED_SINCE, IF_NONE_MATCH, IF_RANGE, LAST_MODIFIED, RANGE};
use reqwest::StatusCode;
use sha2::{Digest, Sha256};

use super::download_spool::{content_range_start, Rest};
use super::error::UnpackError;
use super::git::{check_scheme, redact};
use super::source::{Credentials, HashingReader, HttpSource, NetworkPolicy, ResolvedSource, Sink, SourceContext};
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
        return Ok(ResolvedSource::http(&spec.url, sha256, String::new(), String::new()));
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
        return Ok(ResolvedSource::http(&spec.url, String::new(), String::new(), String::new()));
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
    Ok(ResolvedSource::http(&spec.url, String::new(), etag, last_modified))
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
    let version = Version::of(pinned, expected.first());
    let download = match (&ctx.downloads, version.key(&spec.url)) {
        (Some(spool), Some(key)) => Some(spool.open(&key, None, &ctx.scratch)?),
        _ => None,
    };
    // The validators of the response the bytes came from; the pinned ones when all were on disk.
    let seen = RefCell::new(None);
    let open = |offset: u64| -> Result<Rest<'_>, UnpackError> {
        let mut request = authorize(client.get(url.clone()), ctx.credentials.as_ref());
        if offset > 0 {
            request = request.header(RANGE, format!("bytes={offset}-"));
            if let Some(if_range) = version.if_range() {
                request = request.header(IF_RANGE, if_range);
            }
        }
        let response = ctx.runtime.block_on(async {
            tokio::select! {
                r = request.send() => r.map_err(|e| request_failed(&url, e)),
                _ = ctx.cancel.cancelled() => Err(UnpackError::Cancelled),
            }
        })?;
        let status = response.status();
        if offset > 0 && status == StatusCode::RANGE_NOT_SATISFIABLE {
            // Everything was on disk already (cut off before it was marked complete).
            return Ok(Rest::From(Box::new(std::io::empty())));
        }
        check_status(&url, status)?;
        let got = validators(response.headers());
        let partial = status == StatusCode::PARTIAL_CONTENT;
        if partial && content_range_start(response.headers()) != Some(offset) {
            return Err(UnpackError::Fetch(format!(
                "{shown}: the server sent another part of the file than asked for"
            )));
        }
        if offset > 0 && !partial && !version.same(&got) {
            if let Some(download) = &download {
                download.discard();
            }
            return Err(UnpackError::Fetch(format!(
                "{shown}: the file changed on the server since an earlier attempt began downloading it; \
                 the next attempt downloads it again"
            )));
        }
        seen.replace(Some(got));
        let stream = response.bytes_stream().map_err(|e| std::io::Error::other(e.without_url()));
        let body = Box::new(ctx.read_ahead(stream));
        Ok(if partial { Rest::From(body) } else { Rest::Whole(body) })
    };
    let result = match &download {
        Some(download) => download.reader(Box::new(open)).and_then(|raw| ingest(raw, ctx, &shown, &expected, sink)),
        None => open(0).and_then(|rest| match rest {
            Rest::From(raw) | Rest::Whole(raw) => ingest(raw, ctx, &shown, &expected, sink),
        }),
    };
    let sha256 = match &download {
        Some(download) => download.settle(result)?,
        None => result?,
    };
    let (etag, last_modified) = seen.take().unwrap_or((version.etag, version.last_modified));
    Ok(ResolvedSource::http(&spec.url, sha256, etag, last_modified))
}

/// Streams the file's bytes into `sink` and returns their sha256, checked against `expected`.
fn ingest(
    raw: impl Read,
    ctx: &SourceContext,
    shown: &str,
    expected: &[String],
    sink: &mut Sink<'_>,
) -> Result<String, UnpackError> {
    let mut hashing = HashingReader::new(ctx.download_reader(raw));
    tar_ingest::ingest(&mut hashing, Encoding::Identity, &ctx.limits.ingest(), sink)
        .map_err(|e| UnpackError::from_ingest(shown, e))?;
    // The digest covers the whole file: read whatever follows the archive (bounded, as a body
    // that never ends must not keep us here).
    let allowance = ctx.limits.max_total_bytes.max(1 << 20);
    let rest = std::io::copy(&mut (&mut hashing).take(allowance), &mut std::io::sink())
        .map_err(|e| UnpackError::from_io(shown, e))?;
    if rest == allowance {
        return Err(UnpackError::TooLarge(format!("{shown}: too much data after the end of the archive")));
    }
    let actual = hashing.hex_digest();
    if let Some(want) = expected.iter().find(|want| **want != actual) {
        return Err(UnpackError::DigestMismatch { what: shown.to_owned(), expected: want.clone(), actual });
    }
    Ok(actual)
}

/// Which version of the file a download is of, as far as it can be told before fetching it: its
/// sha256 when known, else a strong `ETag` or a `Last-Modified` date (from the pinned identity).
/// A download is spooled (and resumed) only when one of them is known.
struct Version {
    sha256: Option<String>,
    etag: String,
    last_modified: String,
}

impl Version {
    fn of(pinned: &ResolvedSource, sha256: Option<&String>) -> Version {
        let (etag, last_modified) = match pinned {
            ResolvedSource::Http { etag, last_modified, .. } => (etag.clone(), last_modified.clone()),
            _ => Default::default(),
        };
        Version { sha256: sha256.cloned(), etag, last_modified }
    }

    /// A strong `ETag`, else the date: what `If-Range` may carry (a weak `ETag` may not).
    fn if_range(&self) -> Option<&str> {
        if !self.etag.is_empty() && !self.etag.starts_with("W/") {
            Some(&self.etag)
        } else {
            Some(self.last_modified.as_str()).filter(|d| !d.is_empty())
        }
    }

    /// The spool key of the download of `url` at this version, if it can be resumed.
    fn key(&self, url: &str) -> Option<String> {
        let version = self.sha256.as_deref().or(self.if_range())?;
        Some(format!("http-{}", hex::encode(Sha256::digest(format!("{url}\n{version}")))))
    }

    /// Whether a whole answer (`200`) to a resumed request is of the same version, so that the
    /// bytes on disk are its beginning: its validator is the one `If-Range` carried, or (no
    /// validator) the sha256 checked at the end covers the whole.
    fn same(&self, (etag, last_modified): &(String, String)) -> bool {
        match self.if_range() {
            Some(v) if v == self.etag => *etag == self.etag,
            Some(v) => *last_modified == v,
            None => true,
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn pinned(etag: &str, last_modified: &str) -> ResolvedSource {
        ResolvedSource::http("https://x/f.tar", String::new(), etag.to_owned(), last_modified.to_owned())
    }

    #[test]
    fn only_a_known_version_is_resumed_and_a_whole_answer_must_be_that_version() {
        let date = "Wed, 21 Oct 2026 07:28:00 GMT";
        let strong = Version::of(&pinned("\"abc\"", date), None);
        assert_eq!(strong.if_range(), Some("\"abc\""));
        assert!(strong.same(&("\"abc\"".into(), String::new())));
        assert!(!strong.same(&("\"def\"".into(), date.into())), "another ETag is another file");

        let weak = Version::of(&pinned("W/\"abc\"", date), None);
        assert_eq!(weak.if_range(), Some(date), "a weak ETag may not be used with If-Range");
        assert!(weak.same(&(String::new(), date.into())) && !weak.same(&(String::new(), "later".into())));

        let unknown = Version::of(&pinned("W/\"abc\"", ""), None);
        assert_eq!((unknown.if_range(), unknown.key("https://x/f.tar")), (None, None), "nothing to resume against");
        let sha = "ab".repeat(32);
        let pinned_sha = Version::of(&pinned("", ""), Some(&sha));
        assert!(pinned_sha.key("https://x/f.tar").is_some() && pinned_sha.same(&Default::default()));

        let key = |v: &Version, url: &str| v.key(url).unwrap();
        assert_ne!(key(&strong, "https://x/f.tar"), key(&strong, "https://x/g.tar"));
        assert_ne!(
            key(&strong, "https://x/f.tar"),
            key(&Version::of(&pinned("\"new\"", date), None), "https://x/f.tar")
        );
        assert!(key(&strong, "https://x/f.tar").starts_with("http-"));
    }
}
