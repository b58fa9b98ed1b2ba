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
    /// `registry/repo:tag`, `registry/repo@sha256:…` (or both); with `semver`, `registry/repo`
    /// alone.
    #[serde(default, rename = "ref")]
    pub reference: String,
    /// Follow the newest tag of `ref`'s repository in this version range (`>=88.4.0 <89`,
    /// `88.x`; see [`super::versions`]), re-resolved every `spec.pollInterval`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub semver: String,
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
    /// The newest tag in this version range ([`super::versions`]).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub semver: String,
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
    /// A release asset: `url` holds `{version}` and/or `{tag}`, filled from the newest release
    /// tag of a git repository in a version range.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub releases: Option<Releases>,
}

/// Where the releases of an http source's asset are listed: the tags of a git repository (as
/// GitHub, GitLab and Gitea tag their releases).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Releases {
    /// The git repository (https) whose tags are the releases.
    #[serde(default)]
    pub repository: String,
    /// The version range the release must be in ([`super::versions`]).
    #[serde(default)]
    pub semver: String,
}

/// The placeholders of a release asset's URL: the release's version (the tag without a leading
/// `v`) and the tag itself.
pub const VERSION_PLACEHOLDER: &str = "{version}";
pub const TAG_PLACEHOLDER: &str = "{tag}";

impl HttpSource {
    /// The URL of the release `tag` with version `version`.
    pub fn release_url(&self, tag: &str, version: &str) -> String {
        self.url.replace(VERSION_PLACEHOLDER, version).replace(TAG_PLACEHOLDER, tag)
    }
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
        /// With `semver`: the tag that won.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        tag: String,
    },
    #[serde(rename_all = "camelCase")]
    Git {
        repository: String,
        commit: String,
        /// With `ref.semver`: the tag that won.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        tag: String,
    },
    #[serde(rename_all = "camelCase")]
    Http {
        /// The URL fetched (a release asset's with its placeholders filled).
        url: String,
        /// With `releases`: the release tag that won.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        tag: String,
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

impl ResolvedSource {
    /// The same pin, recording that a version range chose `tag`.
    pub fn with_tag(mut self, chosen: &str) -> ResolvedSource {
        match &mut self {
            ResolvedSource::Image { tag, .. } | ResolvedSource::Git { tag, .. } | ResolvedSource::Http { tag, .. } => {
                chosen.clone_into(tag)
            }
            ResolvedSource::Upload { .. } => {}
        }
        self
    }
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
