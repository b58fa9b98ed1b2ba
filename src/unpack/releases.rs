//! Sources that follow releases: a source with a version range (`image.semver`,
//! `git.ref.semver`, `http.releases`) made concrete before it is resolved like any other.
//!
//! [`pick`] lists the tags (the image's repository, or the git repository), lets the range
//! choose ([`crate::api::versions`]) and returns the source as if the user had written the
//! winning tag: `repo:TAG`, `ref.commit` of the tag (the listing already peeled it, so resolving
//! needs no second round trip), or the asset URL with `{version}`/`{tag}` filled.
//! The winner is recorded in `status.resolvedSources[].tag`, the newest matches in
//! `status.availableVersions`.

use crate::api::versions::{no_match, shown, VersionRange};
use crate::api::Source;

use super::error::UnpackError;
use super::source::SourceContext;
use super::{git, oci};

/// A source with a version range, made concrete.
#[derive(Clone, Debug)]
pub struct Picked {
    /// The source with the winning tag written in.
    pub source: Source,
    /// The tag that won.
    pub tag: String,
    /// The newest matching tags, newest first.
    pub available: Vec<String>,
}

/// The version range a source follows, if any.
pub fn range_of(source: &Source) -> Option<&str> {
    let text = if let Some(image) = &source.image {
        &image.semver
    } else if let Some(repo) = &source.git {
        &repo.reference.semver
    } else {
        &source.http.as_ref()?.releases.as_ref()?.semver
    };
    (!text.is_empty()).then_some(text.as_str())
}

/// `None` for a source without a version range; else the source pinned to its newest matching
/// tag, or [`UnpackError::NoMatchingVersion`] naming the versions the range missed.
pub async fn pick(source: &Source, ctx: &SourceContext) -> Result<Option<Picked>, UnpackError> {
    let Some(text) = range_of(source) else { return Ok(None) };
    // Git listings carry each tag's commit, so a git source is pinned by the listing itself.
    let (what, tags, commits) = if let Some(image) = &source.image {
        (format!("image {}", image.reference), oci::tags(image, ctx).await?, Vec::new())
    } else {
        let (what, repository) = match (&source.git, source.http.as_ref().and_then(|h| h.releases.as_ref())) {
            (Some(repo), _) => (format!("git source {}", repo.repository), repo.repository.as_str()),
            (None, releases) => {
                let repository = releases.map_or("", |r| r.repository.as_str());
                (format!("releases of {repository}"), repository)
            }
        };
        let listed = git::tags(repository, ctx).await?;
        (what, listed.iter().map(|(tag, _)| tag.clone()).collect(), listed)
    };
    let range = VersionRange::parse(text)
        .map_err(|problem| UnpackError::Unsupported(format!("{what}: the version range {text:?} {problem}")))?;
    let candidates = range.select(tags.iter().map(String::as_str));
    let Some(winner) = candidates.first() else {
        return Err(UnpackError::NoMatchingVersion(no_match(&what, &range, &tags)));
    };
    let tag = winner.tag.clone();
    let mut concrete = source.clone();
    if let Some(image) = &mut concrete.image {
        image.reference = format!("{}:{tag}", image.reference);
        image.semver.clear();
    } else if let Some(repo) = &mut concrete.git {
        repo.reference.semver.clear();
        let commit = commits.iter().find(|(listed, _)| *listed == tag).map(|(_, commit)| commit.clone());
        match commit {
            Some(commit) => repo.reference.commit = commit,
            None => repo.reference.tag.clone_from(&tag),
        }
    } else if let Some(http) = &mut concrete.http {
        http.url = http.release_url(&tag);
        http.releases = None;
    }
    Ok(Some(Picked { source: concrete, tag, available: shown(&candidates) }))
}
