//! `Bundle.spec.sources[]`: where content comes from (exactly one of image, git, http, upload,
//! plus where its files go), and `status.resolvedSources[]`: what each source was pinned to.

use serde::{Deserialize, Serialize};

/// `spec.sources[i]`: exactly one of the kinds, plus where its files go.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Source {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<ImageSource>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub git: Option<GitSource>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<HttpSource>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upload: Option<UploadSource>,
    /// Path prefix (relative, validated) under which this source's files are placed.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub destination: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageSource {
    /// `registry/repo:tag`, `registry/repo@sha256:…` (or both).
    #[serde(default, rename = "ref")]
    pub reference: String,
    /// A `kubernetes.io/dockerconfigjson` Secret in the Bundle's namespace.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pull_secret: String,
    /// `os/arch[/variant]` to pick from an image index. Empty: `linux/amd64` when the index has it,
    /// else its only image — a rule rather than a default value, so it is not written into the spec.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub platform: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GitSource {
    #[serde(default)]
    pub repository: String,
    #[serde(default, rename = "ref")]
    pub reference: GitRef,
    /// Only this subdirectory of the repository (its contents become the source's root).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub directory: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub auth_secret: String,
}

/// At most one is set; none = the remote's default branch (`HEAD`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GitRef {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub commit: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub tag: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub branch: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpSource {
    #[serde(default)]
    pub url: String,
    /// Expected hex sha256 of the downloaded file; a mismatch fails the fetch.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub sha256: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub auth_secret: String,
}

/// What a source was pinned to: recorded in `status.resolvedSources[i]` and compared on re-resolve.
/// Equal values mean "nothing changed, do not fetch".
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ResolvedSource {
    #[serde(rename_all = "camelCase")]
    Image {
        /// The reference as written in the spec.
        #[serde(rename = "ref")]
        reference: String,
        /// Digest of what the reference points at (an index or a manifest).
        digest: String,
        /// The platform manifest picked from an index (empty for a single manifest).
        #[serde(default, skip_serializing_if = "String::is_empty")]
        manifest: String,
    },
    #[serde(rename_all = "camelCase")]
    Git { repository: String, commit: String },
    #[serde(rename_all = "camelCase")]
    Http {
        url: String,
        /// Hex sha256 of the downloaded file; empty until fetched.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        sha256: String,
        #[serde(default, skip_serializing_if = "String::is_empty")]
        etag: String,
        #[serde(default, skip_serializing_if = "String::is_empty")]
        last_modified: String,
    },
    #[serde(rename_all = "camelCase")]
    Upload { digest: String },
}

/// `upload: {}`: content arrives by PUT on the content subresource. No fields (yet).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UploadSource {}

/// The kinds a source may be, in the order the schema and messages list them.
pub const SOURCE_KINDS: [&str; 4] = ["image", "git", "http", "upload"];

impl Source {
    /// Which kinds are set (valid sources have exactly one).
    pub fn kinds(&self) -> Vec<&'static str> {
        let set = [self.image.is_some(), self.git.is_some(), self.http.is_some(), self.upload.is_some()];
        SOURCE_KINDS.iter().zip(set).filter(|(_, on)| *on).map(|(k, _)| *k).collect()
    }

    /// The Secrets this source names, each with the field naming it (relative to the source).
    pub fn secret_refs(&self) -> Vec<(&'static str, &str)> {
        let refs = [
            ("image.pullSecret", self.image.as_ref().map(|i| i.pull_secret.as_str())),
            ("git.authSecret", self.git.as_ref().map(|g| g.auth_secret.as_str())),
            ("http.authSecret", self.http.as_ref().map(|h| h.auth_secret.as_str())),
        ];
        refs.into_iter().filter_map(|(field, name)| name.filter(|n| !n.is_empty()).map(|n| (field, n))).collect()
    }
}
