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

mod pieces;
mod push;

use std::path::{Path, PathBuf};

use kube::api::ListParams;
use kube::Api;
use serde_json::Value;

use crate::api::{Bundle, BundleContent, BUNDLE_LABEL, UNPACKED};

pub use pieces::FetchOptions;
pub use push::Progress;

const API: &str = "/apis/content.stowage.dev/v1alpha1";

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("request failed: {0}")]
    Request(#[from] kube::Error),
    #[error("{what}: HTTP {status}: {body}")]
    Status { what: String, status: u16, body: String },
    #[error("content of {0} changed while it was being fetched; fetch again")]
    Changed(String),
    #[error("content of {bundle}: sha256 {actual} does not match the digest {expected}")]
    DigestMismatch { bundle: String, expected: String, actual: String },
    #[error("{0}")]
    Protocol(String),
    #[error("writing {}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
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
    /// content is verified), unless its digest is still `current`.
    pub async fn fetch_into(
        &self,
        namespace: &str,
        name: &str,
        dir: &Path,
        current: Option<&str>,
    ) -> Result<Fetched, ClientError> {
        let path = format!("{API}/namespaces/{namespace}/bundles/{name}/content");
        pieces::fetch(&self.client, &self.options, &format!("{namespace}/{name}"), &path, dir, current).await
    }
}

/// One entry of a content listing.
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize)]
pub struct FileInfo {
    pub path: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub mode: u32,
    pub size: u64,
    pub sha256: String,
    #[serde(default)]
    pub target: Option<String>,
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
        let path = match revision {
            None => format!("{API}/namespaces/{namespace}/bundles/{name}/content"),
            Some(rev) => format!("{API}/namespaces/{namespace}/bundlecontents/{rev}/content"),
        };
        let request = http::Request::get(&path)
            .header("Accept", "application/json")
            .body(Vec::new())
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        let listing: Value = self.client.request(request).await?;
        let files = listing.get("files").cloned().unwrap_or(Value::Array(Vec::new()));
        serde_json::from_value(files).map_err(|e| ClientError::Protocol(format!("listing of {path}: {e}")))
    }

    /// The stored revisions of Bundle `name`, oldest first.
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
