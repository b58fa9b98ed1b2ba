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
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
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
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
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
    /// The URL of the release `tag` (its version is the tag without a leading `v`).
    pub fn release_url(&self, tag: &str) -> String {
        let version = tag.strip_prefix(['v', 'V']).unwrap_or(tag);
        self.url.replace(VERSION_PLACEHOLDER, version).replace(TAG_PLACEHOLDER, tag)
    }
}

/// What a source was pinned to: recorded in `status.resolvedSources[i]` and compared on re-resolve.
/// Equal values mean "nothing changed, do not fetch". Besides the pin itself (digest, commit,
/// sha256), each records what the source asked for — ref, range, directory, platform,
/// destination ([`ResolvedSource::recording`]) — so `kubectl get -o yaml` tells what a pin was
/// resolved from, and a spec change that leaves a source's own fields alone keeps it pinned
/// ([`ResolvedSource::resolved_from`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ResolvedSource {
    #[serde(rename_all = "camelCase")]
    Image {
        /// The reference resolved (with `semver`: the repository with the winning tag).
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
        /// `spec.sources[i].image.semver` as resolved.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        semver: String,
        /// `spec.sources[i].image.platform` as resolved.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        platform: String,
        /// `spec.sources[i].destination`.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        destination: String,
    },
    #[serde(rename_all = "camelCase")]
    Git {
        repository: String,
        /// The ref asked for (`spec.sources[i].git.ref`; none: the remote's `HEAD`).
        #[serde(default, rename = "ref", skip_serializing_if = "GitRef::is_head")]
        reference: GitRef,
        /// `spec.sources[i].git.directory`.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        directory: String,
        commit: String,
        /// With `ref.semver`: the tag that won.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        tag: String,
        /// `spec.sources[i].destination`.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        destination: String,
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
        /// `spec.sources[i].http.releases` as resolved.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        releases: Option<Releases>,
        /// `spec.sources[i].destination`.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        destination: String,
    },
    #[serde(rename_all = "camelCase")]
    Upload { digest: String },
}

impl GitRef {
    /// No ref: the remote's default branch.
    pub fn is_head(&self) -> bool {
        *self == GitRef::default()
    }
}

impl ResolvedSource {
    /// The pin of an image `reference` at `digest` (nothing else recorded yet).
    pub fn image(reference: &str, digest: String, manifest: String) -> ResolvedSource {
        ResolvedSource::Image {
            reference: reference.into(),
            digest,
            manifest,
            tag: String::new(),
            semver: String::new(),
            platform: String::new(),
            destination: String::new(),
        }
    }

    /// The pin of a git `repository` at `commit`.
    pub fn git(repository: &str, commit: String) -> ResolvedSource {
        ResolvedSource::Git {
            repository: repository.into(),
            reference: GitRef::default(),
            directory: String::new(),
            commit,
            tag: String::new(),
            destination: String::new(),
        }
    }

    /// The pin of an http `url` (`sha256` empty until fetched; validators for re-checks).
    pub fn http(url: &str, sha256: String, etag: String, last_modified: String) -> ResolvedSource {
        ResolvedSource::Http {
            url: url.into(),
            tag: String::new(),
            sha256,
            etag,
            last_modified,
            releases: None,
            destination: String::new(),
        }
    }

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

    /// The same pin, recording what `spec` (the source as written, before a version range made it
    /// concrete) asked for: what [`ResolvedSource::resolved_from`] compares.
    pub fn recording(mut self, spec: &Source) -> ResolvedSource {
        match (&mut self, spec) {
            (ResolvedSource::Image { semver, platform, destination, .. }, Source { image: Some(image), .. }) => {
                image.semver.clone_into(semver);
                image.platform.clone_into(platform);
                spec.destination.clone_into(destination);
            }
            (ResolvedSource::Git { reference, directory, destination, .. }, Source { git: Some(repo), .. }) => {
                reference.clone_from(&repo.reference);
                repo.directory.clone_into(directory);
                spec.destination.clone_into(destination);
            }
            (ResolvedSource::Http { releases, destination, .. }, Source { http: Some(http), .. }) => {
                releases.clone_from(&http.releases);
                spec.destination.clone_into(destination);
            }
            _ => {}
        }
        self
    }

    /// Whether this pin was resolved from `spec` as it is now: every field of the source but its
    /// credentials is what the pin recorded. A Bundle whose spec changed elsewhere (history
    /// limit, format, another source) keeps such a source on its pin; a branch, tag, range or URL
    /// is resolved again only when its source changes, on a poll or when asked to.
    pub fn resolved_from(&self, spec: &Source) -> bool {
        match (self, spec) {
            (
                ResolvedSource::Image { reference, tag, semver, platform, destination, .. },
                Source { image: Some(image), .. },
            ) => {
                let asked = match image.semver.is_empty() {
                    true => tag.is_empty() && *reference == image.reference,
                    false => *reference == format!("{}:{tag}", image.reference),
                };
                asked && *semver == image.semver && *platform == image.platform && *destination == spec.destination
            }
            (
                ResolvedSource::Git { repository, reference, directory, destination, .. },
                Source { git: Some(repo), .. },
            ) => {
                *repository == repo.repository
                    && *reference == repo.reference
                    && *directory == repo.directory
                    && *destination == spec.destination
            }
            (ResolvedSource::Http { url, tag, sha256, releases, destination, .. }, Source { http: Some(http), .. }) => {
                let asked = match &http.releases {
                    None => *url == http.url && tag.is_empty(),
                    Some(_) => *url == http.release_url(tag),
                };
                let digest = http.sha256.is_empty() || http.sha256.eq_ignore_ascii_case(sha256);
                asked && digest && *releases == http.releases && *destination == spec.destination
            }
            _ => false,
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn git(reference: GitRef, directory: &str, destination: &str) -> Source {
        let git = GitSource {
            repository: "https://h/r".into(),
            reference,
            directory: directory.into(),
            ..Default::default()
        };
        Source { git: Some(git), destination: destination.into(), ..Default::default() }
    }

    #[test]
    fn a_pin_holds_while_its_source_is_unchanged_but_for_credentials() {
        let main = GitRef { branch: "main".into(), ..Default::default() };
        let spec = git(main.clone(), "deploy", "from-git");
        let pin = ResolvedSource::git("https://h/r", "c1".into()).recording(&spec);
        assert!(pin.resolved_from(&spec));
        let mut secret = spec.clone();
        secret.git.as_mut().unwrap().auth_secret = "creds".into();
        assert!(pin.resolved_from(&secret), "credentials are not what was asked for");
        let tag = GitRef { tag: "v1".into(), ..Default::default() };
        for changed in
            [git(tag, "deploy", "from-git"), git(main.clone(), "other", "from-git"), git(main, "deploy", "x")]
        {
            assert!(!pin.resolved_from(&changed), "{changed:?}");
        }
        let old = ResolvedSource::git("https://h/r", "c1".into());
        assert!(!old.resolved_from(&spec), "a pin that recorded nothing is resolved again");

        let image = |reference: &str, semver: &str, platform: &str| Source {
            image: Some(ImageSource {
                reference: reference.into(),
                semver: semver.into(),
                platform: platform.into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let ranged = image("r/x", ">=1 <2", "");
        let pin =
            ResolvedSource::image("r/x:1.4.0", "sha256:1".into(), String::new()).with_tag("1.4.0").recording(&ranged);
        assert!(pin.resolved_from(&ranged));
        assert!(!pin.resolved_from(&image("r/x", ">=2", "")), "another range");
        assert!(!pin.resolved_from(&image("r/x", ">=1 <2", "linux/arm64")), "another platform");
        let tagged = image("r/x:1", "", "");
        let pin = ResolvedSource::image("r/x:1", "sha256:1".into(), String::new()).recording(&tagged);
        assert!(pin.resolved_from(&tagged) && !pin.resolved_from(&image("r/x:2", "", "")));

        let releases = Releases { repository: "https://h/r".into(), semver: "^1".into() };
        let http = |url: &str, sha256: &str| Source {
            http: Some(HttpSource {
                url: url.into(),
                sha256: sha256.into(),
                releases: url.contains('{').then(|| releases.clone()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let asset = http("https://h/d/{tag}/a-{version}.tgz", "");
        let pin = ResolvedSource::http("https://h/d/v1.2.0/a-1.2.0.tgz", "ab".into(), String::new(), String::new())
            .with_tag("v1.2.0")
            .recording(&asset);
        assert!(pin.resolved_from(&asset));
        assert!(!pin.resolved_from(&http("https://h/d/{tag}/b-{version}.tgz", "")));
        let plain = http("https://h/a.tgz", "");
        let pin = ResolvedSource::http("https://h/a.tgz", "ab".into(), String::new(), String::new()).recording(&plain);
        assert!(pin.resolved_from(&plain) && pin.resolved_from(&http("https://h/a.tgz", "AB")));
        assert!(!pin.resolved_from(&http("https://h/a.tgz", "cd")), "another pinned digest");
    }
}
