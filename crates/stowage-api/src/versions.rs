//! Version ranges of sources that follow releases (`image.semver`, `git.ref.semver`,
//! `http.releases.semver`): which tags are versions, which of them a range admits, and which wins.
//!
//! The syntax is the one Flux, Helm and kapp-controller users write (Masterminds semver, a
//! superset of npm's): `>=1.2 <2`, `>=1.2, <2`, `88.x`, `~1.2`, `^1.2`, `1.2 - 1.4`, `1.x || 2.x`.
//! Matching is done by `node-semver`; two rules are Masterminds' rather than npm's:
//!
//! - a pre-release (`1.3.0-rc.1`) is a candidate only when the range itself names one
//!   (`>=1.3.0-0`), and then anywhere in the range, not only at the named version — what Flux
//!   documents for "include pre-releases";
//! - a tag is a version when it is `X.Y.Z[-PRE][+BUILD]`, optionally with a leading `v`; Helm's
//!   OCI tags spell `+` as `_` (`+` is not allowed in a tag), so `_` reads as `+`.

use node_semver::{Range, Version};

/// How many of the newest matching versions `status.availableVersions` shows.
pub const SHOWN: usize = 5;
/// Tags looked at, at most, per resolve: a repository with more is refused rather than read
/// without bound.
pub const MAX_TAGS: usize = 100_000;

/// A parsed `semver` field.
#[derive(Clone, Debug)]
pub struct VersionRange {
    text: String,
    range: Range,
    /// The range names a pre-release: pre-releases inside its bounds are candidates.
    prereleases: bool,
}

/// A tag that is a version the range admits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub tag: String,
    pub version: Version,
}

impl VersionRange {
    /// `Err` with a plain-words reason when `text` is not a range.
    pub fn parse(text: &str) -> Result<VersionRange, String> {
        let trimmed = text.trim();
        if trimmed.is_empty() {
            return Err("is empty".into());
        }
        // Masterminds separates the comparators of one alternative by commas or spaces; npm
        // only by spaces.
        let spaced = trimmed.replace(',', " ");
        let range = Range::parse(&spaced).map_err(|_| {
            "is not a version range (examples: \">=1.2.0 <2.0.0\", \"88.x\", \"~1.2\", \"^1.2\", \"1.x || 2.x\")"
                .to_string()
        })?;
        Ok(VersionRange { text: trimmed.to_owned(), range, prereleases: names_prerelease(&spaced) })
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }

    pub fn matches(&self, version: &Version) -> bool {
        if !version.is_prerelease() {
            return self.range.satisfies(version);
        }
        if !self.prereleases {
            return false;
        }
        // `allows_any` compares bounds only (npm's `includePrerelease`): the pre-release counts
        // anywhere inside the range.
        Range::parse(format!("={version}")).is_ok_and(|exact| self.range.allows_any(&exact))
    }

    /// The tags that are versions in range, newest first (equal versions: by tag, for a stable
    /// answer).
    pub fn select<'a>(&self, tags: impl IntoIterator<Item = &'a str>) -> Vec<Candidate> {
        let mut found: Vec<Candidate> = tags
            .into_iter()
            .filter_map(|tag| {
                let version = tag_version(tag)?;
                self.matches(&version).then(|| Candidate { tag: tag.to_owned(), version })
            })
            .collect();
        found.sort_by(|a, b| b.version.cmp(&a.version).then_with(|| a.tag.cmp(&b.tag)));
        found
    }
}

/// The version a tag names, if it names one.
pub fn tag_version(tag: &str) -> Option<Version> {
    let bare = tag.strip_prefix(['v', 'V']).unwrap_or(tag);
    if !bare.starts_with(|c: char| c.is_ascii_digit()) || bare.matches('.').count() < 2 {
        return None;
    }
    Version::parse(bare.replace('_', "+")).ok()
}

/// Whether a comparator of the range carries a pre-release (`1.3.0-rc.1`, `>=1.3.0-0`); the
/// ` - ` of a hyphen range is a separator, not a pre-release.
fn names_prerelease(range: &str) -> bool {
    range.split(|c: char| c.is_whitespace() || c == '|').any(|token| {
        let version = token.trim_start_matches(['<', '>', '=', '~', '^', 'v', 'V']);
        version.starts_with(|c: char| c.is_ascii_digit()) && version.split('+').next().unwrap_or("").contains('-')
    })
}

/// The newest versions of `candidates` as `status.availableVersions` shows them (their tags).
pub fn shown(candidates: &[Candidate]) -> Vec<String> {
    candidates.iter().take(SHOWN).map(|c| c.tag.clone()).collect()
}

/// The message of a range that matched nothing: what was asked, how many tags were seen, and the
/// newest version tags, so the user sees what the range missed.
pub fn no_match(what: &str, range: &VersionRange, tags: &[String]) -> String {
    let mut versions: Vec<(Version, &str)> = tags.iter().filter_map(|t| Some((tag_version(t)?, t.as_str()))).collect();
    versions.sort_by(|a, b| b.0.cmp(&a.0));
    let newest: Vec<&str> = versions.iter().take(SHOWN).map(|(_, t)| *t).collect();
    let seen = match (tags.len(), newest.is_empty()) {
        (0, _) => "it has no tags".to_string(),
        (n, true) => format!("none of its {n} tags is a version (X.Y.Z)"),
        (n, false) => format!("{n} tags seen; the newest versions are {}", newest.join(", ")),
    };
    let hint = if versions.iter().any(|(v, _)| v.is_prerelease()) && !range.prereleases {
        "; pre-releases count only when the range names one, e.g. \">=1.0.0-0\""
    } else {
        ""
    };
    format!("{what}: no tag matches the version range {:?}: {seen}{hint}", range.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pick(range: &str, tags: &[&str]) -> Vec<String> {
        VersionRange::parse(range).unwrap().select(tags.iter().copied()).into_iter().map(|c| c.tag).collect()
    }

    #[test]
    fn the_newest_version_in_range_wins() {
        let tags = ["88.4.0", "88.5.0", "88.5.3", "88.5.10-rc.1", "89.0.0", "latest", "sha-abc", "88.5"];
        assert_eq!(pick("88.x", &tags).first().map(String::as_str), Some("88.5.3"));
        assert_eq!(pick(">=88.4.0 <89", &tags), ["88.5.3", "88.5.0", "88.4.0"]);
        assert_eq!(pick(">=88.4.0, <89", &tags), ["88.5.3", "88.5.0", "88.4.0"], "Masterminds' commas");
        assert_eq!(pick("~88.4", &tags), ["88.4.0"]);
        assert_eq!(pick("^88.4", &tags), ["88.5.3", "88.5.0", "88.4.0"]);
        assert_eq!(pick("88.4.0", &tags), ["88.4.0"], "a bare version is exact, as in Helm and Flux");
        assert_eq!(pick("88.4.0 - 88.5.0", &tags), ["88.5.0", "88.4.0"]);
        assert_eq!(pick("<88.5 || >=89", &tags), ["89.0.0", "88.4.0"]);
        assert!(pick(">=100", &tags).is_empty());
    }

    #[test]
    fn prereleases_count_only_when_the_range_names_one() {
        let tags = ["1.2.0", "1.3.0-rc.1", "1.3.0-rc.2", "1.4.0-beta.1"];
        assert_eq!(pick(">=1.0", &tags), ["1.2.0"]);
        assert_eq!(pick(">=1.0.0-0", &tags), ["1.4.0-beta.1", "1.3.0-rc.2", "1.3.0-rc.1", "1.2.0"]);
        assert_eq!(pick(">=1.0.0-0 <1.4.0-0", &tags), ["1.3.0-rc.2", "1.3.0-rc.1", "1.2.0"]);
        assert_eq!(pick(">=1.0.0-0 <1.4.0", &tags)[0], "1.4.0-beta.1", "semver orders 1.4.0-beta.1 before 1.4.0");
        assert_eq!(pick("1.2.0 - 1.3.0", &tags), ["1.2.0"], "a hyphen range names no pre-release");
    }

    #[test]
    fn tags_that_are_versions() {
        assert_eq!(tag_version("v1.2.3").map(|v| v.to_string()).as_deref(), Some("1.2.3"));
        assert_eq!(tag_version("1.2.3_build.7").map(|v| v.to_string()).as_deref(), Some("1.2.3+build.7"));
        for not in ["latest", "1.2", "v", "", "release-1.2.3", "1.2.3.4.x"] {
            assert_eq!(tag_version(not), None, "{not}");
        }
        assert_eq!(pick(">=1", &["v1.0.0", "1.0.0"]), ["1.0.0", "v1.0.0"], "ties broken by tag");
    }

    #[test]
    fn bad_ranges_and_misses_are_explained() {
        assert!(VersionRange::parse("").is_err());
        let err = VersionRange::parse("newest please").unwrap_err();
        assert!(err.contains("is not a version range"), "{err}");
        let range = VersionRange::parse(">=2").unwrap();
        let tags: Vec<String> = ["1.0.0", "1.1.0", "2.0.0-rc.1", "latest"].map(String::from).into();
        let message = no_match("image r/x", &range, &tags);
        assert!(message.contains("4 tags seen; the newest versions are 2.0.0-rc.1, 1.1.0, 1.0.0"), "{message}");
        assert!(message.contains(">=1.0.0-0"), "{message}");
        assert!(no_match("x", &range, &[]).ends_with("it has no tags"));
    }
}
