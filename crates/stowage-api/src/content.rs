//! `BundleContent`: one immutable, unpacked revision of a Bundle's content, written only by the
//! server and owned by its Bundle. Its `content` subresource serves exactly that revision.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use serde::{Deserialize, Serialize};

use super::bundle::Bundle;
use super::source::ResolvedSource;
use super::status::{FormatDetails, Served};
use super::API_VERSION;

/// Labels a BundleContent with its Bundle's name (`-l content.stowage.dev/bundle=NAME`).
pub const BUNDLE_LABEL: &str = "content.stowage.dev/bundle";

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct BundleContent {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: BundleContentSpec,
}

impl Serialize for BundleContent {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        #[serde(rename_all = "camelCase")]
        struct Wire<'a> {
            api_version: &'static str,
            kind: &'static str,
            metadata: &'a ObjectMeta,
            spec: &'a BundleContentSpec,
        }
        Wire { api_version: API_VERSION, kind: BundleContent::KIND, metadata: &self.metadata, spec: &self.spec }
            .serialize(serializer)
    }
}

/// The revision: immutable, written by the server.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BundleContentSpec {
    /// The owning Bundle's name.
    #[serde(default)]
    pub bundle: String,
    /// sha256 of the deterministic tar the content subresource serves.
    #[serde(default)]
    pub digest: String,
    #[serde(default)]
    pub format: String,
    #[serde(default)]
    pub files: u64,
    #[serde(default)]
    pub size: u64,
    /// Compressed bytes of its chunks when it was written.
    #[serde(default)]
    pub stored_size: u64,
    #[serde(default)]
    pub format_details: FormatDetails,
    /// Each source pinned: image digest, git commit, http sha256, upload digest.
    #[serde(default)]
    pub sources: Vec<ResolvedSource>,
}

impl BundleContent {
    pub const KIND: &'static str = "BundleContent";
    pub const PLURAL: &'static str = "bundlecontents";

    /// The BundleContent `bundle` serves for `served` (named by [`content_name`], labelled with and
    /// owned by its Bundle), before the server stamps it (`strategy::prepare_create`).
    pub fn for_bundle(bundle: &Bundle, served: &Served, stored_size: u64) -> BundleContent {
        let owner = OwnerReference {
            api_version: API_VERSION.into(),
            kind: Bundle::KIND.into(),
            name: bundle.name().into(),
            uid: bundle.uid().into(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        };
        let metadata = ObjectMeta {
            name: Some(served.content.clone()),
            namespace: Some(bundle.namespace().into()),
            labels: Some(BTreeMap::from([(BUNDLE_LABEL.to_string(), bundle.name().to_string())])),
            owner_references: Some(vec![owner]),
            ..Default::default()
        };
        let spec = BundleContentSpec {
            bundle: bundle.name().into(),
            digest: served.digest.clone(),
            format: served.format.clone(),
            files: served.files,
            size: served.size,
            stored_size,
            format_details: served.format_details.clone(),
            sources: served.resolved.clone(),
        };
        BundleContent { metadata, spec }
    }

    pub fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or("")
    }

    /// Whether the Bundle with `uid` owns it.
    pub fn owned_by(&self, uid: &str) -> bool {
        self.metadata.owner_references.iter().flatten().any(|r| r.uid == uid)
    }
}

super::namespaced_resource!(BundleContent);

/// `NAME-<first 10 hex digits of the digest>`, shortened so it stays a valid object name.
pub fn content_name(bundle: &str, digest: &str) -> String {
    let hex = digest.trim_start_matches("sha256:");
    let short: String = hex.chars().take(10).collect();
    let mut base: String = bundle.chars().take(253 - 11).collect();
    while base.ends_with(['-', '.']) {
        base.pop();
    }
    format!("{base}-{short}")
}
