//! Uploading an [`Archive`] as a Bundle's content in resumable pieces (the chunked-upload protocol
//! of `bundles/NAME/content`): start a session (or take up one the caller remembered, from the
//! offset the server reports), send `PATCH` pieces with `Content-Range`, re-ask the offset after a
//! failed piece and go on from there, commit with the sha256 (of packed bytes, computed as they
//! are packed; of a file taken as is, as its pieces are read).

use std::time::Duration;

use serde_json::Value;

use super::archive::RunningDigest;
use super::{Archive, ClientError, ContentClient, Transferred, API};
use stowage_api::Bundle;

/// Times a commit is re-sent after a 5xx or a cut connection (each may wait up to the
/// aggregator's 60 s for the server's running commit).
const COMMIT_TRIES: u32 = 60;

/// How a push goes.
#[derive(Clone, Debug)]
pub struct PushOptions {
    /// Bytes per piece: each must finish well within the aggregator's 60 s.
    pub piece_bytes: u64,
    /// An upload session an earlier push of the same archive started: taken up from the offset
    /// the server reports, or replaced by a new session if the server no longer knows it.
    pub resume: Option<String>,
}

impl Default for PushOptions {
    fn default() -> Self {
        PushOptions { piece_bytes: 16 << 20, resume: None }
    }
}

/// What a push reports as it goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PushEvent<'a> {
    /// The bytes go to this upload session, which already holds `offset` bytes (more than 0 only
    /// when an earlier push's session was taken up).
    Session { upload_id: &'a str, offset: u64 },
    /// After every piece.
    Sent(Transferred),
    /// Every byte is sent: the server checks the digest and unpacks.
    Committing,
}

impl ContentClient {
    /// Uploads `archive` as the content of Bundle `namespace/name` (which must take uploads) and
    /// returns the Bundle as the server wrote it after the commit.
    pub async fn push(
        &self,
        namespace: &str,
        name: &str,
        archive: &Archive,
        options: &PushOptions,
        events: &mut (dyn FnMut(PushEvent<'_>) + Send),
    ) -> Result<Bundle, ClientError> {
        let content = format!("{API}/namespaces/{namespace}/bundles/{name}/content");
        let (id, mut offset) = match self.resumable(&content, options.resume.as_deref(), archive.known_len()).await? {
            Some(found) => found,
            None => (self.start(&content, archive).await?, 0),
        };
        let session = format!("{content}?upload={id}");
        events(PushEvent::Session { upload_id: &id, offset });
        let mut failures = 0u32;
        let piece_bytes = options.piece_bytes.max(1);
        let mut running = archive.needs_running_digest().then(RunningDigest::new);
        loop {
            let read = async {
                let piece = archive.piece(offset, piece_bytes).await?;
                if let Some(running) = &mut running {
                    running.piece(archive, offset, &piece)?;
                }
                Ok::<_, ClientError>(piece)
            };
            let piece = match read.await {
                Ok(piece) => piece,
                Err(e) => {
                    // The bytes could not be read or packed (a file unreadable, the disk full):
                    // nothing to resume.
                    let _ = self.send_json::<Value>("DELETE", &session, &[], Vec::new()).await;
                    return Err(e);
                }
            };
            if piece.is_empty() {
                break;
            }
            let len = piece.len() as u64;
            let range = format!("bytes {offset}-{}/*", offset + len - 1);
            match self.send_json::<Value>("PATCH", &session, &[("Content-Range", &range)], piece).await {
                Ok(_) => {
                    offset += len;
                    failures = 0;
                    events(PushEvent::Sent(Transferred { done: offset, total: archive.known_len() }));
                }
                Err(e) => {
                    failures += 1;
                    if failures >= self.options.attempts {
                        return Err(e);
                    }
                    tokio::time::sleep(Duration::from_millis(200 << failures.min(6))).await;
                    // Part of the piece may have landed: continue from the server's offset.
                    if let Ok(state) = self.send_json::<Value>("GET", &session, &[], Vec::new()).await {
                        offset = state.get("offset").and_then(Value::as_u64).unwrap_or(offset);
                    }
                }
            }
        }
        let digest = match running {
            Some(running) => running.finish(archive)?,
            None => archive.digest().ok_or_else(|| ClientError::Protocol("the archive has no digest".into()))?,
        };
        events(PushEvent::Committing);
        // The commit unpacks everything: behind the aggregator a large one is cut at 60 s (504)
        // while the server carries on. Re-sending it waits for that work and gets the Bundle.
        let commit = format!("{session}&digest={digest}");
        let mut tries = 0;
        loop {
            match self.send_json("PUT", &commit, &[], Vec::new()).await {
                Err(ClientError::Server(s)) if s.code >= 500 && tries < COMMIT_TRIES => tries += 1,
                Err(ClientError::Request(_)) if tries < COMMIT_TRIES => tries += 1,
                Err(refused @ ClientError::Server(_)) => {
                    // The content was refused: the spooled bytes would only wait for the timeout.
                    let _ = self.send_json::<Value>("DELETE", &session, &[], Vec::new()).await;
                    return Err(refused);
                }
                other => return other,
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    /// The remembered session and its offset, if the server still has it for this Bundle (and
    /// holds no more than `total` bytes, when that is known).
    async fn resumable(
        &self,
        content: &str,
        id: Option<&str>,
        total: Option<u64>,
    ) -> Result<Option<(String, u64)>, ClientError> {
        let Some(id) = id else { return Ok(None) };
        let session = format!("{content}?upload={}", percent_encoding::utf8_percent_encode(id, QUERY));
        match self.send_json::<Value>("GET", &session, &[], Vec::new()).await {
            Ok(state) => match state.get("offset").and_then(Value::as_u64) {
                Some(offset) if total.is_none_or(|total| offset <= total) => Ok(Some((id.to_string(), offset))),
                _ => {
                    let _ = self.send_json::<Value>("DELETE", &session, &[], Vec::new()).await;
                    Ok(None)
                }
            },
            Err(ClientError::Server(s)) if s.code == 404 => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// A new upload session for `archive`'s compression.
    async fn start(&self, content: &str, archive: &Archive) -> Result<String, ClientError> {
        let encoding: Vec<(&str, &str)> =
            archive.compression().content_encoding().map(|e| ("Content-Encoding", e)).into_iter().collect();
        let started: Value = self.send_json("POST", &format!("{content}?uploads"), &encoding, Vec::new()).await?;
        started
            .get("uploadID")
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or_else(|| ClientError::Protocol(format!("the server did not start an upload session: {started}")))
    }

    async fn send_json<T: serde::de::DeserializeOwned>(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Vec<u8>,
    ) -> Result<T, ClientError> {
        let mut builder = http::Request::builder().method(method).uri(path).header("Accept", "application/json");
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        let request = builder.body(kube::client::Body::from(body)).map_err(|e| ClientError::Protocol(e.to_string()))?;
        let response = self.client.send(request).await?;
        let status = response.status().as_u16();
        let bytes = http_body_util::BodyExt::collect(response.into_body())
            .await
            .map(|b| b.to_bytes())
            .map_err(|e| ClientError::Protocol(format!("{method} {path}: {}", super::chain(&e))))?;
        if !(200..300).contains(&status) {
            return Err(ClientError::from_response(status, &bytes));
        }
        let bytes = if bytes.is_empty() { &b"null"[..] } else { &bytes[..] };
        serde_json::from_slice(bytes).map_err(|e| ClientError::Protocol(format!("{method} {path}: {e}")))
    }
}

/// What a query value may not hold unescaped.
const QUERY: &percent_encoding::AsciiSet =
    &percent_encoding::NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'.').remove(b'~');
