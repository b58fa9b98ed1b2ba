//! The resumable, verified download behind [`super::ContentClient::fetch_into`].

use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use http_body_util::BodyExt;
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

use super::{target, ClientError, Fetched, Transferred};

/// How content is fetched.
#[derive(Clone, Copy, Debug)]
pub struct FetchOptions {
    /// Bytes per `Range` request: each must finish well within the aggregator's 60 s.
    pub piece_bytes: u64,
    /// Consecutive failed tries before giving up (a cut piece resumes where it stopped; a try
    /// that made progress resets the count).
    pub attempts: u32,
    /// Replace the target directory whatever it holds. Without it a fetch writes only into a
    /// missing or empty directory, or one an earlier fetch of the same Bundle wrote and nobody
    /// changed since; anything else is refused with [`ClientError::TargetInUse`].
    pub replace: bool,
}

impl Default for FetchOptions {
    fn default() -> Self {
        FetchOptions { piece_bytes: 64 << 20, attempts: 5, replace: false }
    }
}

/// One response, as far as the download cares.
enum Reply {
    NotModified,
    /// 200: the whole content.
    Whole {
        etag: String,
        body: kube::client::Body,
    },
    /// 206: bytes `start..` of `total`.
    Part {
        etag: String,
        start: u64,
        total: u64,
        body: kube::client::Body,
    },
}

pub(super) async fn fetch(
    client: &kube::Client,
    options: &FetchOptions,
    what: &str,
    path: &str,
    dir: &Path,
    current: Option<&str>,
    progress: &mut (dyn FnMut(Transferred) + Send),
) -> Result<Fetched, ClientError> {
    let piece = options.piece_bytes.max(1);
    let first = request(client, what, path, 0, piece, current.map(|d| ("If-None-Match", quote(d)))).await?;
    let (etag, total, body) = match first {
        Reply::NotModified => return Ok(Fetched::Unchanged),
        Reply::Whole { etag, body } => (etag, None, body),
        Reply::Part { etag, total, body, .. } => (etag, Some(total), body),
    };
    // Before anything is downloaded: a directory holding what no fetch of this Bundle wrote stays.
    target::check(dir, what, options.replace)?;
    let staging = sibling(dir, "incoming");
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::create_dir_all(&staging).map_err(|source| ClientError::Io { path: staging.clone(), source })?;
    // The extractor reads what the pieces deliver, on a blocking thread; 8 buffers in flight.
    let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(8);
    let target = staging.clone();
    let extractor = tokio::task::spawn_blocking(move || {
        let stream = tokio_stream_from(rx);
        let reader = tokio_util::io::SyncIoBridge::new(tokio_util::io::StreamReader::new(stream));
        tar::Archive::new(reader).unpack(&target)
    });
    let mut sha = Sha256::new();
    let mut offset = 0u64;
    let mut next_body = Some(body);
    let mut failures = 0u32;
    let result = loop {
        let body = match next_body.take() {
            Some(body) => body,
            None => {
                if total.is_none_or(|t| offset >= t) {
                    break Ok(());
                }
                match request(client, what, path, offset, piece, Some(("If-Range", quote(&etag)))).await {
                    Ok(Reply::Part { start, body, .. }) if start == offset => body,
                    Ok(Reply::Part { start, .. }) => {
                        break Err(ClientError::Protocol(format!("{what}: asked for byte {offset}, got {start}")))
                    }
                    // A stale If-Range yields the whole (new) representation.
                    Ok(_) => break Err(ClientError::Changed(what.to_string())),
                    Err(e) if retry(&mut failures, options).await => {
                        tracing::debug!(error = %e, "piece request failed; retrying");
                        continue;
                    }
                    Err(e) => break Err(e),
                }
            }
        };
        let mut data = body.into_data_stream();
        let mut cut = false;
        let before = offset;
        while let Some(chunk) = data.next().await {
            match chunk {
                Ok(bytes) => {
                    sha.update(&bytes);
                    offset += bytes.len() as u64;
                    progress(Transferred { done: offset, total });
                    if tx.send(Ok(bytes)).await.is_err() {
                        break; // the extractor failed: its error is reported below
                    }
                }
                Err(_) => {
                    cut = true;
                    break;
                }
            }
        }
        if offset > before {
            failures = 0; // progress: only consecutive failures count
        }
        if cut && !retry(&mut failures, options).await {
            break Err(ClientError::Protocol(format!("{what}: the download was cut {} times", options.attempts)));
        }
        if total.is_none() && !cut {
            break Ok(());
        }
    };
    drop(tx);
    let extracted = extractor.await;
    let finish = || -> Result<Fetched, ClientError> {
        result?;
        match extracted {
            Ok(Ok(())) => {}
            Ok(Err(source)) => return Err(ClientError::Io { path: staging.clone(), source }),
            Err(e) => return Err(ClientError::Protocol(format!("extracting {what}: {e}"))),
        }
        let actual = format!("sha256:{}", hex::encode(sha.finalize()));
        if actual != etag {
            return Err(ClientError::DigestMismatch { bundle: what.to_string(), expected: etag.clone(), actual });
        }
        // Again: the user may have written into the directory while the download ran.
        target::check(dir, what, options.replace)?;
        replace(dir, &staging)?;
        target::record(dir, what, &etag)?;
        Ok(Fetched::Updated { digest: etag.clone() })
    };
    let outcome = finish();
    if outcome.is_err() {
        let _ = std::fs::remove_dir_all(&staging);
    }
    outcome
}

fn tokio_stream_from(
    mut rx: mpsc::Receiver<Result<Bytes, std::io::Error>>,
) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// Backs off before another try; false once the tries are used up.
async fn retry(failures: &mut u32, options: &FetchOptions) -> bool {
    *failures += 1;
    if *failures >= options.attempts {
        return false;
    }
    tokio::time::sleep(Duration::from_millis(200 << (*failures).min(6))).await;
    true
}

fn quote(digest: &str) -> String {
    format!("\"{digest}\"")
}

async fn request(
    client: &kube::Client,
    what: &str,
    path: &str,
    start: u64,
    piece: u64,
    condition: Option<(&str, String)>,
) -> Result<Reply, ClientError> {
    let mut builder = http::Request::get(path).header("Range", format!("bytes={start}-{}", start + piece - 1));
    if let Some((name, value)) = condition {
        builder = builder.header(name, value);
    }
    let request = builder.body(kube::client::Body::empty()).map_err(|e| ClientError::Protocol(e.to_string()))?;
    let response = client.send(request).await?;
    let status = response.status().as_u16();
    let header = |name: &str| response.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    let etag = header("etag").trim_matches('"').to_string();
    let content_range = header("content-range");
    match status {
        304 => Ok(Reply::NotModified),
        200 => Ok(Reply::Whole { etag, body: response.into_body() }),
        206 => {
            let (start, total) = parse_content_range(&content_range)
                .ok_or_else(|| ClientError::Protocol(format!("{what}: bad Content-Range {content_range:?}")))?;
            Ok(Reply::Part { etag, start, total, body: response.into_body() })
        }
        // Past the end (empty content asked from 0): nothing to fetch beyond what we have.
        _ => {
            let body = response.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
            Err(ClientError::from_response(status, &body))
        }
    }
}

/// `bytes START-END/TOTAL` → (START, TOTAL).
fn parse_content_range(value: &str) -> Option<(u64, u64)> {
    let rest = value.strip_prefix("bytes ")?;
    let (range, total) = rest.split_once('/')?;
    let (start, _) = range.split_once('-')?;
    Some((start.trim().parse().ok()?, total.trim().parse().ok()?))
}

/// `dir`'s sibling `.NAME.stowage-WHAT`.
pub(super) fn sibling(dir: &Path, what: &str) -> PathBuf {
    let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "content".into());
    dir.with_file_name(format!(".{name}.stowage-{what}"))
}

/// Puts `staging` in place of `dir` (the old tree is removed afterwards).
pub(super) fn replace(dir: &Path, staging: &Path) -> Result<(), ClientError> {
    let old = sibling(dir, "old");
    let _ = std::fs::remove_dir_all(&old);
    if dir.exists() {
        std::fs::rename(dir, &old).map_err(|source| ClientError::Io { path: dir.to_owned(), source })?;
    }
    std::fs::rename(staging, dir).map_err(|source| ClientError::Io { path: dir.to_owned(), source })?;
    let _ = std::fs::remove_dir_all(&old);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_ranges() {
        assert_eq!(parse_content_range("bytes 0-99/1000"), Some((0, 1000)));
        assert_eq!(parse_content_range("bytes 100-199/200"), Some((100, 200)));
        assert_eq!(parse_content_range("bytes */200"), None);
    }

    #[test]
    fn siblings_stay_in_the_same_directory() {
        assert_eq!(sibling(Path::new("/a/b"), "old"), PathBuf::from("/a/.b.stowage-old"));
    }
}
