//! For provisioners: find the Bundles that are unpacked and fetch their content into a directory,
//! through the Kubernetes API (any kube-rs `Client`: in-cluster, kubeconfig, through the
//! aggregator).
//!
//! A fetch is resumable and verified: content is requested in `Range` pieces (the kube-apiserver's
//! proxy cuts ordinary requests after 60 s), a cut piece is re-requested from where it stopped,
//! every piece after the first carries `If-Range` with the digest so a revision change midway is
//! noticed, and the bytes are hashed as they stream into the tar extractor — the directory is
//! replaced only when the sha256 equals `status.digest`. With the digest already held,
//! `If-None-Match` makes an unchanged Bundle cost one small response.

mod archive;
mod file;
mod packer;
mod pieces;
mod push;
mod subtree;
mod target;

use std::path::{Path, PathBuf};

use kube::api::ListParams;
use kube::Api;

use stowage_api::{Bundle, BundleContent, BUNDLE_LABEL, UNPACKED};

/// The typed model (crate `stowage-api`), so a provisioner needs this one dependency.
pub use stowage_api as api;

pub use archive::{Archive, Compression};
pub use kube::core::Status;
pub use pieces::FetchOptions;
pub use push::{PushEvent, PushOptions};

const API: &str = "/apis/content.stowage.dev/v1alpha1";

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The server refused the request: its `Status`, printed as kubectl prints one.
    #[error("{}", server_message(.0))]
    Server(Box<Status>),
    /// No answer from the server (connection, TLS, a response that is not HTTP).
    #[error("{}", request_message(.0))]
    Request(kube::Error),
    #[error("content of {0} changed while it was being fetched; fetch again")]
    Changed(String),
    #[error("content of {bundle}: sha256 {actual} does not match the digest {expected}")]
    DigestMismatch { bundle: String, expected: String, actual: String },
    #[error("{}: not a tar archive (expected tar, tar.gz or tar.zst)", .0.display())]
    NotAnArchive(PathBuf),
    #[error("{0}")]
    Protocol(String),
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    /// The target directory holds what no earlier fetch of this Bundle wrote: it is left alone.
    #[error("{} {reason}: not replaced", path.display())]
    TargetInUse { path: PathBuf, reason: String },
}

/// A refusal is the server's `Status`; anything else is a request that got no answer.
impl From<kube::Error> for ClientError {
    fn from(error: kube::Error) -> Self {
        match error {
            kube::Error::Api(status) => ClientError::Server(status),
            other => ClientError::Request(other),
        }
    }
}

impl ClientError {
    /// The server's `Status` when the server refused the request.
    pub fn status(&self) -> Option<&Status> {
        match self {
            ClientError::Server(status) => Some(status),
            _ => None,
        }
    }

    /// A refusal with a non-2xx response whose body may be a `Status` (kube-apiserver's shape) or
    /// anything else (a proxy's page: its first line only, never binary).
    fn from_response(code: u16, body: &[u8]) -> ClientError {
        let status = serde_json::from_slice::<Status>(body).ok().filter(|s| !s.message.is_empty());
        ClientError::Server(Box::new(status.unwrap_or_else(|| {
            let text = String::from_utf8_lossy(body.get(..200).unwrap_or(body));
            let first = text.lines().next().unwrap_or("").trim();
            let message = match first.chars().all(|c| !c.is_control()) && !first.is_empty() {
                true => format!("HTTP {code}: {first}"),
                false => format!("HTTP {code}"),
            };
            Status::failure(&message, "").with_code(code)
        })))
    }
}

/// kubectl's `Error from server (Reason): message`.
fn server_message(status: &Status) -> String {
    match status.reason.as_str() {
        "" => format!("Error from server: {}", status.message),
        reason => format!("Error from server ({reason}): {}", status.message),
    }
}

/// What went wrong on the way, without kube-rs's variant names or repeated causes.
fn request_message(error: &kube::Error) -> String {
    let (what, source): (&str, Option<&(dyn std::error::Error + 'static)>) = match error {
        kube::Error::Service(e) => ("cannot reach the server", Some(e.as_ref())),
        kube::Error::HyperError(e) => ("cannot reach the server", Some(e)),
        other => return chain(other),
    };
    match source {
        Some(source) => format!("{what}: {}", chain(source)),
        None => what.to_string(),
    }
}

/// An error and its causes, `a: b: c`, leaving out a cause its parent already says.
pub fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut next = error.source();
    while let Some(cause) = next {
        let said = cause.to_string();
        if !text.contains(&said) {
            text = format!("{text}: {said}");
        }
        next = cause.source();
    }
    text
}

/// Bytes moved so far, of `total` when it is known.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transferred {
    pub done: u64,
    pub total: Option<u64>,
}

/// A Bundle whose content is served.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnpackedBundle {
    pub namespace: String,
    pub name: String,
    /// `sha256:<hex>` of the served tar.
    pub digest: String,
    pub format: String,
}

/// What a fetch did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fetched {
    /// The content still has the digest the caller holds: nothing was transferred.
    Unchanged,
    /// The directory now holds the content with this digest.
    Updated { digest: String },
}

/// Reads Bundles and their content with a kube-rs client.
#[derive(Clone)]
pub struct ContentClient {
    client: kube::Client,
    options: FetchOptions,
}

impl ContentClient {
    pub fn new(client: kube::Client) -> Self {
        ContentClient { client, options: FetchOptions::default() }
    }

    pub fn with_options(client: kube::Client, options: FetchOptions) -> Self {
        ContentClient { client, options }
    }

    /// Bundles (in `namespace`, or all) whose `Unpacked` condition is `True`.
    pub async fn unpacked(&self, namespace: Option<&str>) -> Result<Vec<UnpackedBundle>, ClientError> {
        let api: Api<Bundle> = match namespace {
            Some(ns) => Api::namespaced(self.client.clone(), ns),
            None => Api::all(self.client.clone()),
        };
        let list = api.list(&ListParams::default()).await?;
        Ok(list.items.into_iter().filter_map(summary).collect())
    }

    /// Fetches the content of Bundle `namespace/name` into `dir` (replaced as a whole once the
    /// content is verified), unless its digest is still `current`. `dir` must be missing, empty,
    /// or what an earlier fetch of this Bundle wrote there, unchanged (else
    /// [`ClientError::TargetInUse`], and nothing is touched; see [`FetchOptions::replace`]).
    pub async fn fetch_into(
        &self,
        namespace: &str,
        name: &str,
        dir: &Path,
        current: Option<&str>,
    ) -> Result<Fetched, ClientError> {
        self.fetch_into_with_progress(namespace, name, dir, current, &mut |_| {}).await
    }

    /// [`fetch_into`](Self::fetch_into), calling `progress` as the bytes arrive.
    pub async fn fetch_into_with_progress(
        &self,
        namespace: &str,
        name: &str,
        dir: &Path,
        current: Option<&str>,
        progress: &mut (dyn FnMut(Transferred) + Send),
    ) -> Result<Fetched, ClientError> {
        self.fetch_revision_into(namespace, name, None, dir, current, progress).await
    }

    /// [`fetch_into_with_progress`](Self::fetch_into_with_progress) of Bundle `name`'s stored
    /// BundleContent `revision` (`None`: the content it serves).
    pub async fn fetch_revision_into(
        &self,
        namespace: &str,
        name: &str,
        revision: Option<&str>,
        dir: &Path,
        current: Option<&str>,
        progress: &mut (dyn FnMut(Transferred) + Send),
    ) -> Result<Fetched, ClientError> {
        let path = content_path(namespace, name, revision);
        let what = format!("{namespace}/{name}");
        pieces::fetch(&self.client, &self.options, &what, &path, dir, current, progress).await
    }
}

/// A content listing (`BundleContentFileList`), as the server sends it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FileList {
    pub kind: String,
    pub api_version: String,
    /// `sha256:<hex>` of the content listed.
    pub digest: String,
    pub files: Vec<FileInfo>,
}

/// One entry of a content listing.
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
pub struct FileInfo {
    pub path: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub mode: u32,
    pub size: u64,
    pub sha256: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
}

/// The `content` subresource of Bundle `name` (its served content) or of BundleContent `revision`.
fn content_path(namespace: &str, name: &str, revision: Option<&str>) -> String {
    match revision {
        None => format!("{API}/namespaces/{namespace}/bundles/{name}/content"),
        Some(rev) => format!("{API}/namespaces/{namespace}/bundlecontents/{rev}/content"),
    }
}

/// One stored revision (BundleContent) of a Bundle.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Revision {
    pub name: String,
    pub digest: String,
    pub created: String,
}

impl ContentClient {
    /// The files of Bundle `name`'s served content (`revision: None`) or of BundleContent
    /// `revision`.
    pub async fn files(
        &self,
        namespace: &str,
        name: &str,
        revision: Option<&str>,
    ) -> Result<Vec<FileInfo>, ClientError> {
        Ok(self.file_list(namespace, name, revision).await?.files)
    }

    /// The whole listing [`files`](Self::files) is taken from.
    pub async fn file_list(
        &self,
        namespace: &str,
        name: &str,
        revision: Option<&str>,
    ) -> Result<FileList, ClientError> {
        self.listing(namespace, name, revision, None).await
    }

    /// The listing, of the entries whose path starts with `prefix` if one is given.
    async fn listing(
        &self,
        namespace: &str,
        name: &str,
        revision: Option<&str>,
        prefix: Option<&str>,
    ) -> Result<FileList, ClientError> {
        let url = match prefix {
            Some(prefix) => file::path_url(namespace, name, revision, prefix),
            None => content_path(namespace, name, revision),
        };
        let request = http::Request::get(url)
            .header("Accept", "application/json")
            .body(Vec::new())
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        Ok(self.client.request(request).await?)
    }

    /// The stored revisions of Bundle `name`, oldest first (NotFound if there is no such Bundle).
    pub async fn revisions(&self, namespace: &str, name: &str) -> Result<Vec<Revision>, ClientError> {
        let api: Api<BundleContent> = Api::namespaced(self.client.clone(), namespace);
        let list = api.list(&ListParams::default().labels(&format!("{BUNDLE_LABEL}={name}"))).await?;
        let mut revisions: Vec<(u64, Revision)> = list
            .items
            .into_iter()
            .map(|item| {
                let rv = item.metadata.resource_version.as_deref().and_then(|v| v.parse().ok()).unwrap_or(0);
                let created = item.metadata.creation_timestamp.as_ref().map(|t| t.0.to_string()).unwrap_or_default();
                let revision = Revision { name: item.name().to_string(), digest: item.spec.digest, created };
                (rv, revision)
            })
            .collect();
        if revisions.is_empty() {
            // None stored, or no such Bundle: the latter is the server's NotFound.
            Api::<Bundle>::namespaced(self.client.clone(), namespace).get(name).await?;
        }
        revisions.sort_by_key(|(rv, _)| *rv);
        Ok(revisions.into_iter().map(|(_, r)| r).collect())
    }
}

/// The Bundle as an [`UnpackedBundle`] if its `Unpacked` condition is `True` (for any generation:
/// what it serves is what a provisioner reads).
fn summary(bundle: Bundle) -> Option<UnpackedBundle> {
    let status = bundle.status.as_ref()?;
    status.condition(UNPACKED).filter(|c| c.is_true())?;
    Some(UnpackedBundle {
        namespace: bundle.namespace().to_string(),
        name: bundle.name().to_string(),
        digest: status.digest.clone().unwrap_or_default(),
        format: status.format.clone().unwrap_or_default(),
    })
}

#[cfg(test)]
pub(crate) mod tests {
    /// Incompressible bytes, the same for a seed (xorshift), for archives and packs of a known size.
    pub(crate) fn noise(seed: u64, len: usize) -> Vec<u8> {
        let mut x = seed.wrapping_mul(0x9E3779B97F4A7C15) | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }
}
