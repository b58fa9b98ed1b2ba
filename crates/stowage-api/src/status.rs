//! `Bundle.status`, written only by the server, following the API conventions: `observedGeneration`,
//! a `phase` for people, and conditions for machines —
//!
//! - `Unpacked`: whether the *current* spec's content is unpacked (`True`/`Unpacked`; `False` with
//!   `Pending`, `Unpacking`, `AwaitingUpload`, `PullFailed`, `InvalidFormat`, `ContentDeleted`, …);
//! - `Available`: whether some content is served (`True` while the last good revision keeps being
//!   served after a newer spec failed — the status says both things; `False` with the reason while
//!   nothing is);
//! - `Paused` (Bundles with sources to fetch): `spec.paused` is honoured.
//!
//! Every condition is there from the first status write, and every write stamps them all with the
//! generation it speaks for, so `kubectl wait --for=condition=Available=false` has something to
//! match and no condition looks stale. Every transition is a method here, so the shape is written
//! once; `lastTransitionTime` changes only when a condition's status does.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::meta::now_timestamp;
use super::source::ResolvedSource;

pub const UNPACKED: &str = "Unpacked";
pub const AVAILABLE: &str = "Available";
pub const PAUSED: &str = "Paused";
/// `Unpacked` reasons that mean "work in progress or waiting": not a final answer for a generation.
pub const UNFINISHED_REASONS: [&str; 4] = ["Pending", "Unpacking", "PullFailed", "StorageFailed"];

/// What is served now, and how the work on the current spec stands.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BundleStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Pending`, `Unpacking`, `Unpacked` or `Failed`: for people; machines read the conditions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Each source pinned, in `spec.sources` order, for the newest content (`latestContentName`):
    /// what is served unless `spec.revision` chooses an older revision.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resolved_sources: Vec<ResolvedSource>,
    /// The BundleContent served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_name: Option<String>,
    /// The newest BundleContent unpacked or uploaded; `contentName` too unless `spec.revision`
    /// chooses another. Absent in statuses written before rollbacks existed: `contentName`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latest_content_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format_details: Option<FormatDetails>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    /// For each source with a version range, its newest matching tags as last resolved.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub available_versions: Vec<AvailableVersions>,
    /// When the sources are resolved next: the next poll (`spec.pollInterval`) or the retry of a
    /// transient failure. Kept so a restart keeps the schedule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_poll_time: Option<String>,
    /// The last value of the `content.stowage.dev/refresh` annotation acted on: a new value
    /// resolves every source again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_handled_refresh: Option<String>,
}

/// `status.availableVersions[]`: what one source's version range sees.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AvailableVersions {
    /// Index into `spec.sources`.
    pub source: usize,
    /// The newest matching tags, newest first (at most [`super::versions::SHOWN`]).
    #[serde(default)]
    pub versions: Vec<String>,
}

/// `metav1.Condition`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    #[serde(default)]
    pub reason: String,
    #[serde(default)]
    pub message: String,
    #[serde(default)]
    pub last_transition_time: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

impl Condition {
    pub fn is_true(&self) -> bool {
        self.status == "True"
    }
}

/// What the format inspector found: objects by kind (plain, registry-v1), chart and version (helm),
/// package and ClusterServiceVersion (registry-v1).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FormatDetails {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub objects: BTreeMap<String, u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chart: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub package: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_service_version: Option<String>,
}

/// The content a Bundle serves, as its status and its BundleContent describe it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Served {
    /// The BundleContent's name.
    pub content: String,
    pub digest: String,
    pub files: u64,
    pub size: u64,
    /// The format found (empty: none detected, none asked for).
    pub format: String,
    pub format_details: FormatDetails,
    pub resolved: Vec<ResolvedSource>,
}

impl BundleStatus {
    /// The status a Bundle is created with: nothing served yet, and (with sources to fetch)
    /// whether it is paused.
    pub fn initial(generation: i64, takes_uploads: bool, paused: bool) -> BundleStatus {
        let mut status = BundleStatus { phase: Some("Pending".into()), ..Default::default() };
        status.observed(generation);
        if takes_uploads {
            let waiting = "waiting for content to be uploaded to the content subresource";
            status.set_condition(generation, UNPACKED, false, "AwaitingUpload", waiting);
            status.set_condition(
                generation,
                AVAILABLE,
                false,
                "AwaitingUpload",
                "nothing is served until content is uploaded",
            );
        } else if paused {
            status.paused(generation);
        } else {
            status.set_condition(generation, UNPACKED, false, "Pending", "waiting to be unpacked");
            status.set_condition(generation, AVAILABLE, false, NO_CONTENT, "nothing is served yet");
            status.active(generation);
        }
        status
    }

    /// The status left when the BundleContent served was deleted: nothing is served.
    pub fn content_deleted(generation: i64, content: &str) -> BundleStatus {
        let mut status = BundleStatus { phase: Some("Pending".into()), ..Default::default() };
        status.observed(generation);
        let message = format!("BundleContent {content:?} was deleted");
        status.set_condition(generation, UNPACKED, false, "ContentDeleted", &message);
        status.set_condition(generation, AVAILABLE, false, "ContentDeleted", &format!("nothing is served: {message}"));
        status
    }

    pub fn condition(&self, kind: &str) -> Option<&Condition> {
        self.conditions.iter().find(|c| c.type_ == kind)
    }

    /// The `Unpacked` reason, if it was written for `generation`.
    pub fn reason_for_generation(&self, generation: i64) -> Option<&str> {
        let unpacked = self.condition(UNPACKED)?;
        (unpacked.observed_generation == Some(generation)).then_some(unpacked.reason.as_str())
    }

    /// `Unpacked=True` written for `generation`.
    pub fn unpacked_for(&self, generation: i64) -> bool {
        self.condition(UNPACKED).is_some_and(|c| c.is_true() && c.observed_generation == Some(generation))
    }

    /// `Paused=True`, written for `generation`.
    pub fn is_marked_paused(&self, generation: i64) -> bool {
        self.condition(PAUSED).is_some_and(|c| c.is_true() && c.observed_generation == Some(generation))
    }

    /// The newest BundleContent ([`Self::latest_content_name`], else the one served).
    pub fn latest_content(&self) -> Option<&str> {
        self.latest_content_name.as_deref().or(self.content_name.as_deref()).filter(|c| !c.is_empty())
    }

    /// Whether what is served is not the newest content (`spec.revision` chose another).
    pub fn serves_older(&self) -> bool {
        self.serves_content() && self.latest_content() != self.content_name.as_deref()
    }

    /// Whether a BundleContent is served.
    pub fn serves_content(&self) -> bool {
        self.content_name.as_deref().is_some_and(|c| !c.is_empty())
    }

    /// Sets condition `kind`, keeping its `lastTransitionTime` unless its status flips.
    pub fn set_condition(&mut self, generation: i64, kind: &str, state: bool, reason: &str, message: &str) {
        let state = if state { "True" } else { "False" };
        let previous = self.conditions.iter().position(|c| c.type_ == kind);
        let transition = previous
            .and_then(|i| self.conditions.get(i))
            .filter(|c| c.status == state)
            .map(|c| c.last_transition_time.clone())
            .unwrap_or_else(now_timestamp);
        let condition = Condition {
            type_: kind.into(),
            status: state.into(),
            reason: reason.into(),
            message: message.into(),
            last_transition_time: transition,
            observed_generation: Some(generation),
        };
        match previous.and_then(|i| self.conditions.get_mut(i)) {
            Some(slot) => *slot = condition,
            None => self.conditions.push(condition),
        }
    }

    pub fn remove_condition(&mut self, kind: &str) {
        self.conditions.retain(|c| c.type_ != kind);
    }

    /// The status speaks for `generation`, and so does every condition: each still says what is
    /// true, and the transitions rewrite those that changed.
    fn observed(&mut self, generation: i64) {
        self.observed_generation = Some(generation);
        for condition in &mut self.conditions {
            condition.observed_generation = Some(generation);
        }
    }

    /// `Paused=False` (sources are fetched), for a Bundle with sources to fetch.
    fn active(&mut self, generation: i64) {
        self.set_condition(generation, PAUSED, false, "Active", ACTIVE_MESSAGE);
    }

    /// `Available=False` with `reason` when nothing is served (left as it is otherwise).
    fn unless_served(&mut self, generation: i64, reason: &str, message: &str) {
        if !self.serves_content() {
            self.set_condition(generation, AVAILABLE, false, reason, message);
        }
    }

    /// `; still serving NAME (DIGEST)` when something is served, for messages about newer work.
    fn serving_note(&self) -> String {
        match self.content_name.as_deref().filter(|s| !s.is_empty()) {
            Some(content) => format!("; still serving {content} ({})", self.digest.as_deref().unwrap_or("")),
            None => String::new(),
        }
    }

    /// Work on `generation` has started.
    pub fn unpacking(&mut self, generation: i64) {
        let note = self.serving_note();
        self.observed(generation);
        self.phase = Some("Unpacking".into());
        self.next_poll_time = None;
        self.active(generation);
        self.set_condition(generation, UNPACKED, false, "Unpacking", &format!("fetching the sources{note}"));
        self.unless_served(generation, NO_CONTENT, "nothing is served yet");
    }

    /// `generation`'s content is served.
    pub fn unpacked(&mut self, generation: i64, served: Served) {
        self.observed(generation);
        self.phase = Some("Unpacked".into());
        self.next_poll_time = None;
        let summary = format!("{} ({} files, {} bytes)", served.digest, served.files, served.size);
        self.set_condition(generation, UNPACKED, true, "Unpacked", &format!("unpacked {summary}"));
        let serving = format!("serving {}: {summary}", served.content);
        self.set_condition(generation, AVAILABLE, true, "Serving", &serving);
        if self.condition(PAUSED).is_some() {
            self.active(generation); // uploads have no Paused condition
        }
        self.resolved_sources = served.resolved;
        self.latest_content_name = Some(served.content.clone());
        self.content_name = Some(served.content);
        self.digest = Some(served.digest);
        self.format = Some(served.format);
        self.format_details = Some(served.format_details);
        self.files = Some(served.files);
        self.size = Some(served.size);
    }

    /// `generation` serves `chosen`, the BundleContent `spec.revision` names, while the newest
    /// content (and the pins in `resolvedSources`) stay recorded as they are.
    pub fn serves_chosen(&mut self, generation: i64, chosen: Served) {
        let (latest, pins) = (self.latest_content().map(str::to_owned), std::mem::take(&mut self.resolved_sources));
        let content = chosen.content.clone();
        self.unpacked(generation, Served { resolved: pins, ..chosen });
        self.latest_content_name = latest.or(Some(content.clone()));
        let newest = match self.latest_content_name.as_deref() {
            Some(latest) if latest != content => format!("; the newest content, {latest}, is not served"),
            _ => String::new(),
        };
        let summary = format!(
            "{} ({} files, {} bytes)",
            self.digest.as_deref().unwrap_or(""),
            self.files.unwrap_or(0),
            self.size.unwrap_or(0)
        );
        let why = format!("serving {content} because spec.revision chooses it{newest}");
        self.set_condition(generation, UNPACKED, true, "Unpacked", &why);
        self.set_condition(
            generation,
            AVAILABLE,
            true,
            "Serving",
            &format!("serving {content} (spec.revision): {summary}"),
        );
    }

    /// `spec.revision` names no BundleContent of this Bundle (`message` says which): whatever was
    /// served stays served.
    pub fn chosen_missing(&mut self, generation: i64, message: &str) {
        self.failed(generation, REVISION_NOT_FOUND, message);
    }

    /// `generation` failed with `reason`; whatever was served before stays served.
    pub fn failed(&mut self, generation: i64, reason: &str, message: &str) {
        let note = self.serving_note();
        self.observed(generation);
        self.phase = Some("Failed".into());
        self.set_condition(generation, UNPACKED, false, reason, &format!("{message}{note}"));
        self.unless_served(generation, reason, &format!("nothing is served: {message}"));
    }

    /// Every condition, and the status, now speak for `generation`, unchanged otherwise: a spec
    /// change that leaves what they say true (an upload Bundle still waiting for its content).
    pub fn restamp(&mut self, generation: i64) {
        self.observed(generation);
    }

    /// The content served was checked against `generation`'s spec and is not valid for it
    /// (`reason`, `message`); it stays served, and `Available` says so for `generation` too.
    pub fn recheck_failed(&mut self, generation: i64, reason: &str, message: &str) {
        self.failed(generation, reason, message);
        self.restamp(generation);
    }

    /// The sources are resolved again after `after` (`None`: not on a schedule).
    pub fn schedule(&mut self, after: Option<std::time::Duration>) {
        self.next_poll_time = after.map(super::meta::timestamp_after);
    }

    /// `spec.paused`: nothing is fetched; what is served stays served. Unless the status already
    /// answered for `generation` (the sources did not change: see [`super::ResolvedSource::resolved_from`]),
    /// `Unpacked` says this generation is not unpacked because of the pause.
    pub fn paused(&mut self, generation: i64) {
        let answered = self.condition(UNPACKED).is_some_and(|c| c.observed_generation == Some(generation));
        if !answered {
            let note = self.serving_note();
            let message = format!("spec.paused is true: generation {generation} is not unpacked{note}");
            self.set_condition(generation, UNPACKED, false, "Paused", &message);
            self.unless_served(generation, NO_CONTENT, "nothing is served: spec.paused is true");
        }
        if self.condition(AVAILABLE).is_none() {
            self.set_condition(generation, AVAILABLE, false, NO_CONTENT, "nothing is served: spec.paused is true");
        }
        self.observed(generation);
        self.next_poll_time = None;
        self.set_condition(generation, PAUSED, true, "Paused", PAUSED_MESSAGE);
    }

    /// The refresh asked for with the annotation's `value` was acted on.
    pub fn refreshed(&mut self, value: &str) {
        self.last_handled_refresh = Some(value.to_owned());
    }
}

/// `Unpacked=False` while `spec.revision` names a BundleContent that is not there: waits for a
/// spec change.
pub const REVISION_NOT_FOUND: &str = "RevisionNotFound";
/// `Available=False` while nothing was ever served.
const NO_CONTENT: &str = "NoContent";
const PAUSED_MESSAGE: &str = "spec.paused is true: sources are not fetched";
const ACTIVE_MESSAGE: &str = "sources are fetched as the spec says";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_transition_time_moves_only_when_the_status_flips() {
        let mut status = BundleStatus::initial(1, false, false);
        status.conditions[0].last_transition_time = "2020-01-01T00:00:00Z".into();
        status.unpacking(2);
        assert_eq!(status.conditions[0].last_transition_time, "2020-01-01T00:00:00Z", "False → False");
        assert_eq!(status.reason_for_generation(2), Some("Unpacking"));
        assert_eq!(status.reason_for_generation(1), None);
        status.unpacked(2, Served { content: "b-0123".into(), digest: "sha256:01".into(), ..Default::default() });
        assert_ne!(status.conditions[0].last_transition_time, "2020-01-01T00:00:00Z", "False → True");
        assert!(status.unpacked_for(2));
        status.failed(3, "PullFailed", "registry said no");
        assert_eq!(
            status.condition(UNPACKED).map(|c| c.message.as_str()),
            Some("registry said no; still serving b-0123 (sha256:01)")
        );
        assert!(status.condition(AVAILABLE).is_some_and(Condition::is_true));
    }

    #[test]
    fn a_chosen_revision_is_served_while_the_newest_stays_recorded() {
        let mut status = BundleStatus::default();
        let pins = vec![ResolvedSource::Upload { digest: "sha256:02".into() }];
        status.unpacked(
            1,
            Served { content: "b-02".into(), digest: "sha256:02".into(), resolved: pins.clone(), ..Default::default() },
        );
        assert!(!status.serves_older());
        let old = Served { content: "b-01".into(), digest: "sha256:01".into(), files: 3, ..Default::default() };
        status.serves_chosen(2, old);
        assert_eq!((status.content_name.as_deref(), status.latest_content()), (Some("b-01"), Some("b-02")));
        assert_eq!((status.digest.as_deref(), status.files), (Some("sha256:01"), Some(3)));
        assert_eq!(status.resolved_sources, pins, "the pins stay those of the newest content");
        assert!(status.serves_older() && status.unpacked_for(2));
        let why = &status.condition(UNPACKED).map(|c| c.message.clone()).unwrap_or_default();
        assert_eq!(why, "serving b-01 because spec.revision chooses it; the newest content, b-02, is not served");
        status.chosen_missing(3, "spec.revision names \"x\"");
        assert_eq!(status.reason_for_generation(3), Some(REVISION_NOT_FOUND));
        assert_eq!(status.content_name.as_deref(), Some("b-01"), "what was served stays served");
        let newest =
            Served { content: "b-02".into(), digest: "sha256:02".into(), resolved: pins, ..Default::default() };
        status.unpacked(4, newest);
        assert!(!status.serves_older() && status.unpacked_for(4));
    }

    #[test]
    fn a_recheck_speaks_for_the_new_generation_in_every_condition() {
        let mut status = BundleStatus::default();
        let served = Served { content: "b-01".into(), digest: "sha256:01".into(), files: 2, ..Default::default() };
        let served_again = served.clone();
        status.unpacked(1, Served { format: "helm".into(), ..served });
        status.recheck_failed(2, "InvalidFormat", "not a plain bundle: there is no manifests/ directory");
        assert_eq!(status.observed_generation, Some(2));
        assert!(status.conditions.iter().all(|c| c.observed_generation == Some(2)), "{status:?}");
        assert_eq!(status.reason_for_generation(2), Some("InvalidFormat"));
        assert!(status.condition(AVAILABLE).is_some_and(Condition::is_true));
        let details = FormatDetails { chart: Some("demo".into()), ..Default::default() };
        let served = Served { format: "helm".into(), format_details: details.clone(), ..served_again };
        status.unpacked(3, served);
        assert!(status.unpacked_for(3) && status.conditions.iter().all(|c| c.observed_generation == Some(3)));
        assert_eq!((status.format.as_deref(), status.format_details.as_ref()), (Some("helm"), Some(&details)));
        assert_eq!((status.content_name.as_deref(), status.files), (Some("b-01"), Some(2)));
        let mut waiting = BundleStatus::initial(1, true, false);
        waiting.restamp(2);
        assert_eq!(waiting.reason_for_generation(2), Some("AwaitingUpload"));
    }
}
