//! `Bundle`: where a bundle's content comes from (the user's `spec`) and what is served now (the
//! server's `status`, see [`super::status`]). Its defaults and its validation live here, next to
//! the fields they concern; the server's `strategy::bundle` says how the API stores, prints and deletes one.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::meta::{dns1123_subdomain_errors, parse_duration};
use super::source::{HttpSource, Source, TAG_PLACEHOLDER, VERSION_PLACEHOLDER};
use super::status::BundleStatus;
use super::versions::VersionRange;
use super::{Cause, API_VERSION};

/// A bundle of content (operator bundle, Helm chart, manifests) and where it comes from.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct Bundle {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: BundleSpec,
    #[serde(default)]
    pub status: Option<BundleStatus>,
}

/// `apiVersion` and `kind` are written from the type, never stored in it.
impl Serialize for Bundle {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        #[serde(rename_all = "camelCase")]
        struct Wire<'a> {
            api_version: &'static str,
            kind: &'static str,
            metadata: &'a ObjectMeta,
            spec: &'a BundleSpec,
            #[serde(skip_serializing_if = "Option::is_none")]
            status: &'a Option<BundleStatus>,
        }
        let wire = Wire {
            api_version: API_VERSION,
            kind: Bundle::KIND,
            metadata: &self.metadata,
            spec: &self.spec,
            status: &self.status,
        };
        wire.serialize(serializer)
    }
}

impl Bundle {
    pub const KIND: &'static str = "Bundle";
    pub const PLURAL: &'static str = "bundles";

    /// A Bundle named `name` with `spec`, for a client to create.
    pub fn new(name: &str, spec: BundleSpec) -> Bundle {
        Bundle { metadata: ObjectMeta { name: Some(name.into()), ..Default::default() }, spec, status: None }
    }

    pub fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or("")
    }

    pub fn namespace(&self) -> &str {
        self.metadata.namespace.as_deref().unwrap_or("")
    }

    pub fn uid(&self) -> &str {
        self.metadata.uid.as_deref().unwrap_or("")
    }

    /// `metadata.generation` (1 before the server set it).
    pub fn generation(&self) -> i64 {
        self.metadata.generation.unwrap_or(1)
    }

    pub fn is_deleting(&self) -> bool {
        self.metadata.deletion_timestamp.is_some()
    }

    /// Whether content arrives by upload (an upload source is the only source).
    pub fn takes_uploads(&self) -> bool {
        self.spec.sources.iter().any(|s| s.upload.is_some())
    }

    /// The status to change: the current one, or an empty one for a Bundle that has none yet.
    pub fn status_or_default(&self) -> BundleStatus {
        self.status.clone().unwrap_or_default()
    }

    /// The `Unpacked` condition's reason, if it was written for the current generation.
    pub fn unpacked_reason(&self) -> Option<&str> {
        self.status.as_ref()?.reason_for_generation(self.generation())
    }

    /// Whether the content served is still what every source asks for: each source's pin in
    /// `status.resolvedSources` was resolved from the source as it is now
    /// ([`crate::ResolvedSource::resolved_from`]). A spec change that keeps this true (history
    /// limit, format, poll interval, pause) changes no content: the served content is checked
    /// against the new spec instead of being fetched again.
    pub fn still_pinned(&self) -> bool {
        let Some(status) = self.status.as_ref().filter(|s| s.serves_content()) else { return false };
        let pins = &status.resolved_sources;
        !self.spec.sources.is_empty()
            && pins.len() == self.spec.sources.len()
            && pins.iter().zip(&self.spec.sources).all(|(pin, source)| pin.resolved_from(source))
    }

    /// The value of the [`REFRESH_ANNOTATION`], if set.
    pub fn refresh_annotation(&self) -> Option<&str> {
        self.metadata.annotations.as_ref()?.get(REFRESH_ANNOTATION).map(String::as_str)
    }

    /// The value of the [`REFRESH_ANNOTATION`] when it asks for a refresh not acted on yet.
    pub fn refresh_requested(&self) -> Option<&str> {
        let value = self.refresh_annotation()?;
        let handled = self.status.as_ref().and_then(|s| s.last_handled_refresh.as_deref());
        (!value.is_empty() && handled != Some(value)).then_some(value)
    }

    /// Whether the status says the current generation's content is served (`Unpacked=True`,
    /// written for this generation): what `kubectl wait --for=condition=Unpacked` waits for.
    pub fn is_unpacked(&self) -> bool {
        self.status.as_ref().is_some_and(|s| s.unpacked_for(self.generation()))
    }
}

super::namespaced_resource!(Bundle);

/// What the bundle contains and how it is kept.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BundleSpec {
    #[serde(default)]
    pub sources: Vec<Source>,
    /// Absent: detected from the content.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<Format>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<bool>,
    /// Old BundleContents kept beside the served one; defaulted to [`DEFAULT_HISTORY_LIMIT`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision_history_limit: Option<i64>,
    /// How often floating references are re-resolved (`10m`); absent: resolved once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub poll_interval: Option<String>,
    /// Accept content without files (by default such content is refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_empty: Option<bool>,
    /// A BundleContent of this Bundle to serve instead of the newest (a rollback). The sources
    /// are still resolved and new content stored (`status.latestContentName`), but not served
    /// until this is cleared; the history limit never prunes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
}

/// `spec.revisionHistoryLimit` when a Bundle is created without one (written into the spec).
pub const DEFAULT_HISTORY_LIMIT: i64 = 3;
/// An annotation whose new value (any: a timestamp is customary) resolves every source again
/// now, as Flux's `reconcile.fluxcd.io/requestedAt` does; the value acted on is kept in
/// `status.lastHandledRefresh`.
pub const REFRESH_ANNOTATION: &str = "content.stowage.dev/refresh";

/// The shortest `spec.pollInterval` honoured (re-resolving is not free for the source).
pub const MIN_POLL_INTERVAL: Duration = Duration::from_secs(1);

impl BundleSpec {
    /// Fills in what a user left out. The one place defaults are decided; the API writes them
    /// into the stored object on every create and update, so every reader sees them.
    pub fn apply_defaults(&mut self) {
        self.revision_history_limit.get_or_insert(DEFAULT_HISTORY_LIMIT);
    }

    pub fn is_paused(&self) -> bool {
        self.paused == Some(true)
    }

    pub fn allows_empty(&self) -> bool {
        self.allow_empty == Some(true)
    }

    /// The BundleContent `spec.revision` chooses, if set.
    pub fn chosen_revision(&self) -> Option<&str> {
        self.revision.as_deref().filter(|r| !r.is_empty())
    }

    /// Old contents to keep (a stored spec always has one; a negative value never validates).
    pub fn history_limit(&self) -> usize {
        let limit = self.revision_history_limit.unwrap_or(DEFAULT_HISTORY_LIMIT);
        usize::try_from(limit).unwrap_or(0)
    }

    /// `spec.pollInterval`, at least [`MIN_POLL_INTERVAL`]; `None` when not set.
    pub fn poll_interval(&self) -> Option<Duration> {
        let text = self.poll_interval.as_deref().filter(|s| !s.is_empty())?;
        parse_duration(text).map(|d| d.max(MIN_POLL_INTERVAL))
    }

    /// The declared format's name (empty: detect).
    pub fn format_name(&self) -> &'static str {
        self.format.map_or("", Format::as_str)
    }

    /// Everything wrong with the spec, as field causes (`spec.…` paths).
    pub fn validate(&self) -> Vec<Cause> {
        let mut causes = Vec::new();
        if self.sources.is_empty() {
            causes.push(Cause::required("spec.sources", "at least one source is required"));
        }
        for (i, source) in self.sources.iter().enumerate() {
            causes.extend(validate_source(&format!("spec.sources[{i}]"), source));
        }
        let uploads = self.sources.iter().filter(|s| s.upload.is_some()).count();
        if uploads > 0 && self.sources.len() > 1 {
            causes.push(Cause::invalid(
                "spec.sources",
                &json!(format!("{} sources", self.sources.len())),
                "an upload source must be the only source",
            ));
        }
        if let Some(limit) = self.revision_history_limit.filter(|l| *l < 0) {
            causes.push(Cause::invalid(
                "spec.revisionHistoryLimit",
                &json!(limit),
                "must be greater than or equal to 0",
            ));
        }
        if let Some(revision) = self.chosen_revision() {
            if let Some(error) = dns1123_subdomain_errors(revision).into_iter().next() {
                causes.push(Cause::invalid("spec.revision", &json!(revision), error));
            }
        }
        let poll = self.poll_interval.as_deref().unwrap_or("");
        if !poll.is_empty() && parse_duration(poll).is_none() {
            causes.push(Cause::invalid(
                "spec.pollInterval",
                &json!(poll),
                "must be a non-negative duration such as 30s, 10m or 1h30m, and at most 2562047h (about 292 years)",
            ));
        }
        causes
    }
}

fn validate_source(path: &str, source: &Source) -> Vec<Cause> {
    let mut causes = Vec::new();
    let kinds = source.kinds();
    if kinds.len() != 1 {
        causes.push(Cause::invalid(path, &json!(kinds), "must specify exactly one of image, git, http, upload"));
    }
    let required = |field: &str, value: &str, causes: &mut Vec<Cause>| {
        if value.is_empty() {
            causes.push(Cause::required(format!("{path}.{field}"), "must be set"));
        }
    };
    let range = |field: &str, value: &str, causes: &mut Vec<Cause>| {
        if let Err(problem) = VersionRange::parse(value) {
            causes.push(Cause::invalid(format!("{path}.{field}"), &json!(value), problem));
        }
    };
    if let Some(image) = &source.image {
        required("image.ref", &image.reference, &mut causes);
        if !image.semver.is_empty() {
            range("image.semver", &image.semver, &mut causes);
            let last = image.reference.rsplit('/').next().unwrap_or("");
            if last.contains(':') || image.reference.contains('@') {
                causes.push(Cause::invalid(
                    format!("{path}.image.ref"),
                    &json!(image.reference),
                    "must name a repository without a tag or digest when image.semver picks the tag",
                ));
            }
        }
    }
    if let Some(git) = &source.git {
        required("git.repository", &git.repository, &mut causes);
        let r = &git.reference;
        let refs = [&r.commit, &r.tag, &r.branch, &r.semver].iter().filter(|v| !v.is_empty()).count();
        if refs > 1 {
            causes.push(Cause::invalid(
                format!("{path}.git.ref"),
                &serde_json::to_value(r).unwrap_or_default(),
                "at most one of commit, tag, branch, semver",
            ));
        }
        if !r.semver.is_empty() {
            range("git.ref.semver", &r.semver, &mut causes);
        }
    }
    if let Some(http) = &source.http {
        causes.extend(validate_http(path, http));
    }
    for (field, secret) in source.secret_refs() {
        // Secrets are read from the Bundle's own namespace only: a name, never `ns/name`.
        if let Some(error) = dns1123_subdomain_errors(secret).into_iter().next() {
            causes.push(Cause::invalid(format!("{path}.{field}"), &json!(secret), error));
        }
    }
    let destination = &source.destination;
    if !destination.is_empty()
        && (destination.starts_with('/') || destination.split('/').any(|c| c == ".." || c == "."))
    {
        causes.push(Cause::invalid(
            format!("{path}.destination"),
            &json!(destination),
            "must be a relative path without '.' or '..' components",
        ));
    }
    causes
}

fn validate_http(path: &str, http: &HttpSource) -> Vec<Cause> {
    let mut causes = Vec::new();
    let is_url = |url: &str| url.starts_with("https://") || url.starts_with("http://");
    let url = &http.url;
    if !is_url(url) {
        causes.push(Cause::invalid(format!("{path}.http.url"), &json!(url), "must be an http or https URL"));
    }
    let sha = &http.sha256;
    let valid_sha = sha.len() == 64 && sha.bytes().all(|b| b.is_ascii_hexdigit());
    if !sha.is_empty() && !valid_sha {
        causes.push(Cause::invalid(format!("{path}.http.sha256"), &json!(sha), "must be 64 hexadecimal digits"));
    }
    let placeholders = url.contains(VERSION_PLACEHOLDER) || url.contains(TAG_PLACEHOLDER);
    match &http.releases {
        None if placeholders => causes.push(Cause::invalid(
            format!("{path}.http.url"),
            &json!(url),
            "{version} and {tag} are filled only for a release asset: set http.releases",
        )),
        None => {}
        Some(releases) => {
            if !placeholders {
                causes.push(Cause::invalid(
                    format!("{path}.http.url"),
                    &json!(url),
                    "a release asset's URL must hold {version} or {tag}",
                ));
            }
            if !sha.is_empty() {
                causes.push(Cause::invalid(
                    format!("{path}.http.sha256"),
                    &json!(sha),
                    "cannot be set with http.releases: every release is a different file",
                ));
            }
            if !is_url(&releases.repository) {
                causes.push(Cause::invalid(
                    format!("{path}.http.releases.repository"),
                    &json!(releases.repository),
                    "must be the http or https URL of the git repository whose tags are the releases",
                ));
            }
            if let Err(problem) = VersionRange::parse(&releases.semver) {
                causes.push(Cause::invalid(format!("{path}.http.releases.semver"), &json!(releases.semver), problem));
            }
        }
    }
    causes
}

/// `spec.format`: how the content is checked and described.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Format {
    /// Any tree; `manifests/` objects are counted by kind.
    #[serde(rename = "plain")]
    Plain,
    /// An OLM registry+v1 bundle (`metadata/annotations.yaml`, a ClusterServiceVersion).
    #[serde(rename = "registry-v1")]
    RegistryV1,
    /// A Helm chart (`Chart.yaml`).
    #[serde(rename = "helm")]
    Helm,
}

/// The formats' names, as the schema's enum lists them.
pub const FORMATS: [&str; 3] = ["plain", "registry-v1", "helm"];

impl Format {
    pub fn as_str(self) -> &'static str {
        match self {
            Format::Plain => "plain",
            Format::RegistryV1 => "registry-v1",
            Format::Helm => "helm",
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;
    use crate::source::{HttpSource, UploadSource};

    fn upload() -> Source {
        Source { upload: Some(UploadSource {}), ..Default::default() }
    }

    #[test]
    fn sources_must_name_exactly_one_kind() {
        let ok = BundleSpec { sources: vec![upload()], ..Default::default() };
        assert!(ok.validate().is_empty());
        let http = HttpSource { url: "https://x".into(), ..Default::default() };
        let two = BundleSpec { sources: vec![Source { http: Some(http), ..upload() }], ..Default::default() };
        assert_eq!(two.validate()[0].field, "spec.sources[0]");
        assert_eq!(BundleSpec::default().validate()[0].field, "spec.sources");
        let escape = Source { destination: "../x".into(), ..upload() };
        let escape = BundleSpec { sources: vec![escape], ..Default::default() };
        assert_eq!(escape.validate()[0].field, "spec.sources[0].destination");
    }

    #[test]
    fn version_ranges_are_checked_where_they_are_written() {
        let fields = |source: Value| -> Vec<String> {
            let source: Source = serde_json::from_value(source).unwrap();
            BundleSpec { sources: vec![source], ..Default::default() }.validate().into_iter().map(|c| c.field).collect()
        };
        assert!(fields(json!({"image": {"ref": "reg:5000/charts/kps", "semver": ">=88.4.0, <89"}})).is_empty());
        assert_eq!(fields(json!({"image": {"ref": "reg:5000/kps:1", "semver": "1.x"}})), ["spec.sources[0].image.ref"]);
        assert_eq!(fields(json!({"image": {"ref": "reg/kps", "semver": "newest"}})), ["spec.sources[0].image.semver"]);
        let git = |r: Value| fields(json!({"git": {"repository": "https://g/r", "ref": r}}));
        assert!(git(json!({"semver": "^1"})).is_empty());
        assert_eq!(git(json!({"semver": "^1", "tag": "v1"})), ["spec.sources[0].git.ref"]);
        let asset = "https://h/releases/download/{tag}/stack-{version}.tgz";
        let releases = json!({"repository": "https://h/stack", "semver": ">=1.2 <2"});
        assert!(fields(json!({"http": {"url": asset, "releases": releases}})).is_empty());
        assert_eq!(
            fields(json!({"http": {"url": asset}})),
            ["spec.sources[0].http.url"],
            "a placeholder without releases"
        );
        let fixed =
            json!({"http": {"url": "https://h/a.tgz", "sha256": "0".repeat(64), "releases": {"repository": "x"}}});
        assert_eq!(
            fields(fixed),
            [
                "spec.sources[0].http.url",
                "spec.sources[0].http.sha256",
                "spec.sources[0].http.releases.repository",
                "spec.sources[0].http.releases.semver"
            ]
        );
    }

    #[test]
    fn defaults_fill_only_what_is_missing() {
        let mut spec = BundleSpec::default();
        spec.apply_defaults();
        assert_eq!(spec.revision_history_limit, Some(DEFAULT_HISTORY_LIMIT));
        let mut zero = BundleSpec { revision_history_limit: Some(0), ..Default::default() };
        zero.apply_defaults();
        assert_eq!(zero.history_limit(), 0);
    }

    #[test]
    fn durations_beyond_go_range_are_refused_not_a_panic() {
        let huge = BundleSpec {
            sources: vec![upload()],
            poll_interval: Some("100000000000000000000h".into()),
            ..Default::default()
        };
        let causes = huge.validate();
        assert_eq!(causes.len(), 1, "{causes:?}");
        assert_eq!(causes[0].field, "spec.pollInterval");
    }

    #[test]
    fn poll_intervals_are_go_durations_never_negative() {
        let spec = |interval: &str| BundleSpec {
            sources: vec![upload()],
            poll_interval: Some(interval.into()),
            ..Default::default()
        };
        assert_eq!(spec("1.5h").poll_interval(), Some(Duration::from_secs(5400)));
        assert_eq!(spec("300ms").poll_interval(), Some(MIN_POLL_INTERVAL), "clamped to the minimum");
        assert_eq!(spec("0").poll_interval(), Some(MIN_POLL_INTERVAL), "as 0s always was");
        for good in ["0", "1.5h", "300ms", "2us"] {
            assert!(spec(good).validate().is_empty(), "{good}");
        }
        for bad in ["-1s", "10x"] {
            let causes = spec(bad).validate();
            assert_eq!(causes.len(), 1, "{bad}: {causes:?}");
            assert_eq!(causes[0].field, "spec.pollInterval");
            assert!(causes[0].message.contains("non-negative duration"), "{causes:?}");
            assert_eq!(spec(bad).poll_interval(), None, "{bad}");
        }
    }

    #[test]
    fn a_typed_bundle_writes_its_api_version_and_kind() {
        let bundle = Bundle::new("b", BundleSpec { sources: vec![upload()], ..Default::default() });
        let value = serde_json::to_value(&bundle).unwrap();
        assert_eq!(value["apiVersion"], API_VERSION);
        assert_eq!(value["kind"], "Bundle");
        assert_eq!(value["spec"]["sources"][0]["upload"], json!({}));
        let back: Bundle = serde_json::from_value(value).unwrap();
        assert_eq!(back, bundle);
    }
}
