//! Uploading a directory as a Bundle's content in resumable pieces (the chunked-upload protocol of
//! `bundles/NAME/content`): tar + zstd into a temporary file (hashed as written), start a
//! session, send `PATCH` pieces with `Content-Range`, re-ask the offset after a failed piece and go
//! on from there, commit with the sha256.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::time::Duration;

use kube::api::PostParams;
use kube::Api;
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::{ClientError, ContentClient, API};
use crate::api::{Bundle, BundleSpec, Source, UploadSource};

/// Times a commit is re-sent after a 5xx or a cut connection (each may wait up to the
/// aggregator's 60 s for the server's running commit).
const COMMIT_TRIES: u32 = 60;

/// Called after every piece with (bytes sent, total bytes).
pub type Progress<'a> = &'a mut dyn FnMut(u64, u64);

impl ContentClient {
    /// Creates Bundle `name` with an upload source if it does not exist, uploads `dir` in pieces of
    /// `piece_bytes`, and returns the Bundle as the server wrote it after the commit.
    pub async fn push(
        &self,
        namespace: &str,
        name: &str,
        dir: &Path,
        piece_bytes: u64,
        progress: Progress<'_>,
    ) -> Result<Bundle, ClientError> {
        self.ensure_upload_bundle(namespace, name).await?;
        let dir = dir.to_owned();
        let (mut archive, digest, total) = tokio::task::spawn_blocking(move || pack(&dir))
            .await
            .map_err(|e| ClientError::Protocol(e.to_string()))??;
        let content = format!("{API}/namespaces/{namespace}/bundles/{name}/content");
        let started: Value =
            self.send_json("POST", &format!("{content}?uploads"), &[("Content-Encoding", "zstd")], Vec::new()).await?;
        let id = started
            .get("uploadID")
            .and_then(Value::as_str)
            .ok_or_else(|| ClientError::Protocol(format!("the server did not start an upload session: {started}")))?;
        let session = format!("{content}?upload={id}");
        let mut offset = 0u64;
        let mut failures = 0u32;
        let piece_bytes = piece_bytes.max(1);
        while offset < total {
            let len = piece_bytes.min(total - offset);
            let mut piece = vec![0u8; len as usize];
            archive.seek(SeekFrom::Start(offset)).and_then(|_| archive.read_exact(&mut piece)).map_err(io)?;
            let range = format!("bytes {offset}-{}/*", offset + len - 1);
            match self.send_json::<Value>("PATCH", &session, &[("Content-Range", &range)], piece).await {
                Ok(_) => {
                    offset += len;
                    failures = 0;
                    progress(offset, total);
                }
                Err(e) => {
                    failures += 1;
                    if failures >= self.options.attempts {
                        return Err(e);
                    }
                    tokio::time::sleep(Duration::from_millis(200 << failures.min(6))).await;
                    // Part of the piece may have landed: continue from the server's offset.
                    let state: Value = self.send_json("GET", &session, &[], Vec::new()).await?;
                    offset = state.get("offset").and_then(Value::as_u64).unwrap_or(offset);
                }
            }
        }
        // The commit unpacks everything: behind the aggregator a large one is cut at 60 s (504)
        // while the server carries on. Re-sending it waits for that work and gets the Bundle.
        let commit = format!("{session}&digest={digest}");
        let mut tries = 0;
        loop {
            match self.send_json("PUT", &commit, &[], Vec::new()).await {
                Err(ClientError::Status { status, .. }) if status >= 500 && tries < COMMIT_TRIES => tries += 1,
                Err(ClientError::Request(_)) if tries < COMMIT_TRIES => tries += 1,
                other => return other,
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    async fn ensure_upload_bundle(&self, namespace: &str, name: &str) -> Result<(), ClientError> {
        let api: Api<Bundle> = Api::namespaced(self.client.clone(), namespace);
        match api.get_opt(name).await? {
            Some(bundle) if bundle.takes_uploads() => Ok(()),
            Some(_) => Err(ClientError::Protocol(format!(
                "Bundle {namespace}/{name} has no upload source: it takes its content from elsewhere"
            ))),
            None => {
                let upload = Source { upload: Some(UploadSource {}), ..Default::default() };
                let bundle = Bundle::new(name, BundleSpec { sources: vec![upload], ..Default::default() });
                api.create(&PostParams::default(), &bundle).await.map(|_| ()).map_err(ClientError::from)
            }
        }
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
            .map_err(|e| ClientError::Protocol(format!("{method} {path}: {e}")))?;
        if !(200..300).contains(&status) {
            let body = String::from_utf8_lossy(bytes.get(..2000).unwrap_or(bytes.as_ref())).into_owned();
            return Err(ClientError::Status { what: format!("{method} {path}"), status, body });
        }
        let bytes = if bytes.is_empty() { &b"null"[..] } else { &bytes[..] };
        serde_json::from_slice(bytes).map_err(|e| ClientError::Protocol(format!("{method} {path}: {e}")))
    }
}

/// `dir` as a zstd-compressed tar in an anonymous temporary file: (file, `sha256:<hex>`, size).
fn pack(dir: &Path) -> Result<(std::fs::File, String, u64), ClientError> {
    struct Hashing<W> {
        inner: W,
        sha: Sha256,
        len: u64,
    }
    impl<W: Write> Write for Hashing<W> {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            let n = self.inner.write(buf)?;
            // `write` never reports more than it was given.
            self.sha.update(buf.get(..n).unwrap_or(buf));
            self.len += n as u64;
            Ok(n)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            self.inner.flush()
        }
    }
    let file = tempfile_in_tmp()?;
    let hashing = Hashing { inner: std::io::BufWriter::new(file), sha: Sha256::new(), len: 0 };
    let encoder = zstd::Encoder::new(hashing, 3).map_err(io)?;
    let mut builder = tar::Builder::new(encoder);
    builder.follow_symlinks(false);
    builder.append_dir_all(".", dir).map_err(|source| ClientError::Io { path: dir.to_owned(), source })?;
    let encoder = builder.into_inner().map_err(io)?;
    let mut hashing = encoder.finish().map_err(io)?;
    hashing.flush().map_err(io)?;
    let digest = format!("sha256:{}", hex::encode(hashing.sha.finalize()));
    let file = hashing.inner.into_inner().map_err(|e| io(e.into_error()))?;
    Ok((file, digest, hashing.len))
}

fn tempfile_in_tmp() -> Result<std::fs::File, ClientError> {
    let path = std::env::temp_dir().join(format!("stowage-push-{}", uuid::Uuid::new_v4()));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .map_err(|source| ClientError::Io { path: path.clone(), source })?;
    // Unlinked at once: the open handle keeps it until the push ends, whatever happens.
    let _ = std::fs::remove_file(&path);
    Ok(file)
}

fn io(source: std::io::Error) -> ClientError {
    ClientError::Io { path: std::env::temp_dir(), source }
}
