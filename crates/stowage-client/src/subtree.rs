//! One directory of a Bundle's content (`?path=DIR`, which the server sends as a tar of the
//! entries under it), fetched into a directory of its own. A subtree has no digest of its own, so
//! every entry is checked against the listing instead: each file's sha256, each link's target, and
//! no entry missing or added. The target rules are those of a whole fetch (`target.rs`), and the
//! directory is replaced only once everything matched.

use std::path::Path;

use futures_util::StreamExt;
use http_body_util::BodyExt;
use sha2::{Digest, Sha256};

use super::file::path_url;
use super::{pieces, target, ClientError, ContentClient, Fetched, FileInfo};

impl ContentClient {
    /// Fetches the entries under `subtree` of Bundle `name`'s served content (or of BundleContent
    /// `revision`) into `dir`, the subtree's own path left out (`dir/x` for `SUBTREE/x`), once
    /// each is verified against the listing; `dir` must be missing, empty or an earlier fetch of
    /// this Bundle left unchanged, as for [`fetch_into`](Self::fetch_into).
    pub async fn fetch_subtree_into(
        &self,
        namespace: &str,
        name: &str,
        revision: Option<&str>,
        subtree: &str,
        dir: &Path,
    ) -> Result<Fetched, ClientError> {
        let what = format!("{namespace}/{name}");
        let subtree = subtree.trim_start_matches("./").trim_matches('/');
        let prefix = format!("{subtree}/");
        let listing = self.listing(namespace, name, revision, Some(&prefix)).await?;
        let expected: Vec<&FileInfo> = listing.files.iter().filter(|f| f.path.starts_with(&prefix)).collect();
        if expected.is_empty() {
            let whole = self.listing(namespace, name, revision, Some(subtree)).await?;
            if whole.files.iter().any(|f| f.path == subtree) {
                let hint =
                    format!("{subtree:?} is a file, not a directory: kubectl stowage cat {name} {subtree} > FILE");
                return Err(ClientError::Protocol(hint));
            }
            return Err(ClientError::Protocol(format!("{what} has no directory {subtree:?}")));
        }
        target::check(dir, &what, self.options.replace)?;
        let staging = pieces::sibling(dir, "incoming");
        let _ = std::fs::remove_dir_all(&staging);
        std::fs::create_dir_all(&staging).map_err(|source| ClientError::Io { path: staging.clone(), source })?;
        let fetched = self.download_subtree(namespace, name, revision, subtree, &staging).await.and_then(|()| {
            verify(&staging, subtree, &expected, &what)?;
            // Again: the user may have written into the directory while the download ran.
            target::check(dir, &what, self.options.replace)?;
            pieces::replace(dir, &staging.join(subtree))?;
            target::record(dir, &what, &format!("{}:{subtree}", listing.digest))?;
            Ok(Fetched::Updated { digest: listing.digest.clone() })
        });
        let _ = std::fs::remove_dir_all(&staging);
        fetched
    }

    /// The subtree's tar, extracted into `staging` (paths kept whole) as it streams in.
    async fn download_subtree(
        &self,
        namespace: &str,
        name: &str,
        revision: Option<&str>,
        subtree: &str,
        staging: &Path,
    ) -> Result<(), ClientError> {
        let url = path_url(namespace, name, revision, subtree);
        let response = self.get_streamed(&url, Some("application/x-tar")).await?;
        let stream = response.into_body().into_data_stream().map(|chunk| chunk.map_err(std::io::Error::other));
        let reader = tokio_util::io::SyncIoBridge::new(tokio_util::io::StreamReader::new(stream));
        let target = staging.to_owned();
        match tokio::task::spawn_blocking(move || tar::Archive::new(reader).unpack(&target)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(source)) => Err(ClientError::Io { path: staging.to_owned(), source }),
            Err(e) => Err(ClientError::Protocol(format!("extracting {namespace}/{name}: {e}"))),
        }
    }
}

/// Every entry under `staging/subtree` is one the listing names, with the sha256 (files) or
/// target (links) it gives, and none is missing.
fn verify(staging: &Path, subtree: &str, expected: &[&FileInfo], what: &str) -> Result<(), ClientError> {
    let root = staging.join(subtree);
    // Path → whether it is a directory (tar makes the parents of what it extracts).
    let mut found = std::collections::BTreeMap::new();
    for item in walkdir::WalkDir::new(&root).min_depth(1) {
        let item = item.map_err(|e| ClientError::Io { path: root.clone(), source: e.into() })?;
        let relative = item.path().strip_prefix(staging).unwrap_or(item.path()).to_string_lossy().into_owned();
        found.insert(relative, item.file_type().is_dir());
    }
    for entry in expected {
        // Directories are listed with a trailing `/`, the subtree's own among them.
        let relative = entry.path.trim_end_matches('/');
        if relative == subtree {
            continue;
        }
        let path = staging.join(relative);
        let io = |source| ClientError::Io { path: path.clone(), source };
        if found.remove(relative).is_none() {
            return Err(ClientError::Protocol(format!("{what}: {} is missing from the download", entry.path)));
        }
        match entry.kind.as_str() {
            "file" => {
                let mut file = std::fs::File::open(&path).map_err(io)?;
                let mut sha = Sha256::new();
                let mut buf = vec![0u8; 64 << 10];
                loop {
                    let n = std::io::Read::read(&mut file, &mut buf).map_err(io)?;
                    let Some(read) = buf.get(..n).filter(|r| !r.is_empty()) else { break };
                    sha.update(read);
                }
                let actual = format!("sha256:{}", hex::encode(sha.finalize()));
                if actual.trim_start_matches("sha256:") != entry.sha256.trim_start_matches("sha256:") {
                    return Err(ClientError::DigestMismatch {
                        bundle: format!("{what}: {}", entry.path),
                        expected: entry.sha256.clone(),
                        actual,
                    });
                }
            }
            "symlink" => {
                let link = std::fs::read_link(&path).map_err(io)?;
                let wanted = entry.target.as_deref().unwrap_or("");
                if link.to_string_lossy() != wanted {
                    let message = format!("{what}: {} is not the link to {wanted:?} the listing names", entry.path);
                    return Err(ClientError::Protocol(message));
                }
            }
            _ => {}
        }
    }
    match found.into_iter().find(|(_, is_dir)| !is_dir) {
        Some((extra, _)) => {
            Err(ClientError::Protocol(format!("{what}: the download holds {extra}, which the listing does not")))
        }
        None => Ok(()),
    }
}
