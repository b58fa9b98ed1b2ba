//! One file of a Bundle's content (`?path=FILE`), streamed to a writer and verified against the
//! sha256 the listing gives for it: nothing is held in memory but a buffer, and a file that does
//! not match is an error once its bytes are written (the caller decides what to do with them).

use futures_util::StreamExt;
use http_body_util::BodyExt;
use sha2::{Digest, Sha256};

use super::{content_path, ClientError, ContentClient};

/// What a `?path=` value may hold as it is.
const QUERY: &percent_encoding::AsciiSet =
    &percent_encoding::NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'.').remove(b'~').remove(b'/');

/// The `content` subresource's URL for `?path=PATH` (a file, or a directory's subtree or listing).
pub(super) fn path_url(namespace: &str, name: &str, revision: Option<&str>, path: &str) -> String {
    let base = content_path(namespace, name, revision);
    format!("{base}?path={}", percent_encoding::utf8_percent_encode(path, QUERY))
}

impl ContentClient {
    /// A GET whose body is read as it streams (`accept`: the media type asked for, if any); any
    /// answer but 200 is the server's refusal.
    pub(super) async fn get_streamed(
        &self,
        url: &str,
        accept: Option<&str>,
    ) -> Result<http::Response<kube::client::Body>, ClientError> {
        let mut builder = http::Request::get(url);
        if let Some(accept) = accept {
            builder = builder.header("Accept", accept);
        }
        let request = builder.body(kube::client::Body::empty()).map_err(|e| ClientError::Protocol(e.to_string()))?;
        let response = self.client.send(request).await?;
        let status = response.status().as_u16();
        if status != 200 {
            let body = response.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
            return Err(ClientError::from_response(status, &body));
        }
        Ok(response)
    }

    /// Writes file `path` of Bundle `name`'s served content (or of BundleContent `revision`) to
    /// `out`, then checks it against the listing's sha256. Returns the bytes written.
    pub async fn read_file(
        &self,
        namespace: &str,
        name: &str,
        revision: Option<&str>,
        path: &str,
        out: &mut (dyn std::io::Write + Send),
    ) -> Result<u64, ClientError> {
        let listing = self.file_list(namespace, name, revision).await?;
        let wanted = path.trim_start_matches("./");
        let Some(entry) = listing.files.iter().find(|f| f.path == wanted) else {
            let under = format!("{}/", wanted.trim_end_matches('/'));
            if listing.files.iter().any(|f| f.path.starts_with(&under)) {
                return Err(ClientError::Protocol(format!("{wanted:?} is a directory, not a file")));
            }
            return Err(ClientError::Protocol(format!("{namespace}/{name} has no file {wanted:?}")));
        };
        if entry.kind != "file" {
            return Err(ClientError::Protocol(format!("{wanted:?} is a {}, not a file", entry.kind)));
        }
        let response = self.get_streamed(&path_url(namespace, name, revision, wanted), None).await?;
        let mut data = response.into_body().into_data_stream();
        let (mut sha, mut written) = (Sha256::new(), 0u64);
        while let Some(chunk) = data.next().await {
            let bytes = chunk.map_err(|e| ClientError::Protocol(format!("reading {wanted}: {e}")))?;
            sha.update(&bytes);
            written += bytes.len() as u64;
            out.write_all(&bytes).map_err(|source| ClientError::Io { path: "stdout".into(), source })?;
        }
        let actual = hex::encode(sha.finalize());
        if actual != entry.sha256.trim_start_matches("sha256:") {
            return Err(ClientError::DigestMismatch {
                bundle: format!("{namespace}/{name}: {wanted}"),
                expected: entry.sha256.clone(),
                actual: format!("sha256:{actual}"),
            });
        }
        Ok(written)
    }
}
