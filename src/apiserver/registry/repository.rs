//! A Bundle as an OCI repository (`<namespace>/<bundle>`): its kept revisions, their tags, and each
//! revision's artifact — an image whose one layer is the served tar, or Helm's chart artifact.
//!
//! What an artifact needs beyond the revision record (the bundle's annotations, the chart layer's
//! digest, whether the tree holds whiteout names) is read from the stored tree once and kept in
//! [`Facts`], keyed by format and tar digest: content-addressed, so never stale, and the same on
//! every replica. The cache is bounded by entry count; a revision that falls out is read again.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use crate::api::{Bundle, BundleContent, BundleContentSpec};
use crate::storage::{ObjectKey, RangeSpec, RevisionId, RevisionRecord, StorageError, Store};
use crate::strategy::bundle::BUNDLE;
use crate::strategy::bundlecontent::BUNDLE_CONTENT;
use crate::strategy::decode_or_default;
use crate::unpack::format;

use super::artifact::{self, Built, Descriptor};
use super::chart_layer::{self, ChartLayer};

/// Revisions whose facts are kept (each a few hundred bytes plus a chart's config).
const FACTS_KEPT: usize = 4096;
/// Largest `metadata/annotations.yaml` or `Chart.yaml` read into a config.
const MAX_METADATA_BYTES: u64 = 1 << 20;

/// One kept revision of the Bundle.
pub struct Revision {
    pub content_name: String,
    /// `metadata.creationTimestamp`, in seconds.
    pub created: i64,
    pub spec: BundleContentSpec,
    pub id: RevisionId,
    pub record: RevisionRecord,
}

/// A Bundle and the revisions it keeps.
pub struct Repository {
    /// The BundleContent the Bundle serves now (`latest`).
    pub served: Option<String>,
    pub revisions: Vec<Revision>,
}

impl Repository {
    /// The Bundle `namespace/name` and its finalized revisions; `None` if there is no such Bundle.
    pub fn load(store: &Store, namespace: &str, name: &str) -> Result<Option<Repository>, StorageError> {
        let Some(object) = store.get_object(&ObjectKey::new(BUNDLE.plural, namespace, name))? else {
            return Ok(None);
        };
        let bundle: Bundle = decode_or_default(&object.value);
        let mut revisions = Vec::new();
        for (resource, dependent) in store.dependents(namespace, bundle.uid())? {
            let Some(id) = dependent.revision.filter(|_| resource == BUNDLE_CONTENT.plural) else { continue };
            let content: BundleContent = decode_or_default(&dependent.value);
            let record = store.revision(id)?;
            if record.digest.is_empty() {
                continue;
            }
            let created = content.metadata.creation_timestamp.as_ref().map_or(0, |t| t.0.as_second());
            revisions.push(Revision {
                content_name: content.name().to_string(),
                created,
                spec: content.spec,
                id,
                record,
            });
        }
        revisions.sort_by(|a, b| (a.created, &a.content_name).cmp(&(b.created, &b.content_name)));
        Ok(Some(Repository { served: bundle.status.and_then(|s| s.content_name), revisions }))
    }

    /// Every tag and the revision it names: `latest` (the served revision), one per kept revision
    /// ([`artifact::revision_tag`]), and for charts the chart version (the served revision's if it
    /// has that version, else the newest that does).
    pub fn tags(&self) -> BTreeMap<String, usize> {
        let mut tags = BTreeMap::new();
        let served = self.revisions.iter().position(|r| Some(&r.content_name) == self.served.as_ref());
        for (i, revision) in self.revisions.iter().enumerate() {
            if revision.spec.format == format::HELM {
                if let Some(tag) = revision.spec.format_details.version.as_deref().and_then(artifact::chart_version_tag)
                {
                    let keep_served = served.is_some_and(|s| s != i && tags.get(&tag) == Some(&s));
                    if !keep_served {
                        tags.insert(tag, i);
                    }
                }
            }
        }
        for (i, revision) in self.revisions.iter().enumerate() {
            tags.insert(artifact::revision_tag(&revision.content_name, &revision.record.digest), i);
        }
        if let Some(served) = served {
            tags.insert("latest".to_string(), served);
        }
        tags
    }

    pub fn by_tag(&self, tag: &str) -> Option<&Revision> {
        self.tags().get(tag).and_then(|&i| self.revisions.get(i))
    }
}

/// Where an artifact's layer bytes come from.
#[derive(Clone, Debug)]
pub enum LayerSource {
    /// The served tar of the revision, as it is.
    Tar { revision: RevisionId, size: u64 },
    /// Helm's chart layer, built from the chart at `root`.
    Chart { revision: RevisionId, root: String, name: String },
}

/// A revision as an OCI artifact.
pub struct Artifact {
    pub manifest: Built,
    pub config: Built,
    pub layer: Descriptor,
    pub source: LayerSource,
}

/// What a revision's artifact needs from its tree, read once.
struct Facts {
    config: Built,
    config_type: &'static str,
    layer: Descriptor,
    chart: Option<(String, String)>,
    annotations: BTreeMap<&'static str, String>,
}

/// A revision's facts, or why it cannot be an artifact.
type FactsOrProblem = Result<Arc<Facts>, String>;

/// The bounded cache of [`Facts`], by (format, tar digest).
#[derive(Default)]
pub struct Artifacts {
    facts: Mutex<HashMap<(String, String), FactsOrProblem>>,
}

impl Artifacts {
    /// `revision` as an artifact; `Err` says, in plain words, why it cannot be one. Blocking.
    pub fn artifact(&self, store: &Store, revision: &Revision) -> Result<Result<Artifact, String>, StorageError> {
        let key = (revision.spec.format.clone(), revision.record.digest.clone());
        let cached = self.facts.lock().map(|facts| facts.get(&key).cloned()).unwrap_or(None);
        let facts = match cached {
            Some(facts) => facts,
            None => {
                let facts = read_facts(store, revision)?.map(Arc::new);
                if let Ok(mut cache) = self.facts.lock() {
                    if cache.len() >= FACTS_KEPT {
                        cache.clear();
                    }
                    cache.insert(key, facts.clone());
                }
                facts
            }
        };
        Ok(facts.map(|facts| {
            let config = Descriptor {
                media_type: facts.config_type,
                digest: facts.config.digest.clone(),
                size: facts.config.size(),
            };
            let source = match &facts.chart {
                Some((root, name)) => {
                    LayerSource::Chart { revision: revision.id, root: root.clone(), name: name.clone() }
                }
                None => LayerSource::Tar { revision: revision.id, size: revision.record.tar_size },
            };
            Artifact {
                manifest: artifact::manifest(&config, &facts.layer, facts.annotations.clone()),
                config: facts.config.clone(),
                layer: facts.layer.clone(),
                source,
            }
        }))
    }
}

fn read_facts(store: &Store, revision: &Revision) -> Result<Result<Facts, String>, StorageError> {
    if revision.spec.format == format::HELM {
        return read_chart_facts(store, revision);
    }
    // A name an image layer would take for a whiteout: refuse rather than serve a tree that every
    // client would unpack without those files.
    for entry in store.files(revision.id, "") {
        let entry = entry?;
        if artifact::is_whiteout(&entry.path) {
            return Ok(Err(format!(
                "{} cannot be served as an image: {:?} would be read as a whiteout by every image client",
                revision.content_name, entry.path
            )));
        }
    }
    let labels = if revision.spec.format == format::REGISTRY_V1 {
        let Some(bytes) = read_small(store, revision.id, format::ANNOTATIONS_FILE)? else {
            return Ok(Err(format!("{} has no {}", revision.content_name, format::ANNOTATIONS_FILE)));
        };
        match format::parse_annotations(&bytes) {
            Ok(annotations) => annotations,
            Err(problem) => {
                return Ok(Err(format!("{}: {}: {problem}", revision.content_name, format::ANNOTATIONS_FILE)))
            }
        }
    } else {
        BTreeMap::new()
    };
    let digest = revision.record.digest.clone();
    Ok(Ok(Facts {
        config: artifact::image_config(&digest, &labels),
        config_type: artifact::IMAGE_CONFIG,
        layer: Descriptor { media_type: artifact::TAR_LAYER, digest, size: revision.record.tar_size },
        chart: None,
        annotations: BTreeMap::new(),
    }))
}

fn read_chart_facts(store: &Store, revision: &Revision) -> Result<Result<Facts, String>, StorageError> {
    let details = &revision.spec.format_details;
    let (Some(name), Some(version)) = (details.chart.clone(), details.version.clone()) else {
        return Ok(Err(format!("{} names no chart and version", revision.content_name)));
    };
    let root = chart_root(store, revision.id)?;
    let Some(chart_yaml) = read_small(store, revision.id, &format!("{root}Chart.yaml"))? else {
        return Ok(Err(format!("{} has no Chart.yaml", revision.content_name)));
    };
    let config = match artifact::helm_config(&chart_yaml) {
        Ok(config) => config,
        Err(problem) => return Ok(Err(format!("{}: {problem}", revision.content_name))),
    };
    let (digest, size) = chart_layer::measure(store, ChartLayer::new(revision.id, &root, &name))?;
    Ok(Ok(Facts {
        config,
        config_type: artifact::HELM_CONFIG,
        layer: Descriptor { media_type: artifact::HELM_LAYER, digest, size },
        annotations: artifact::helm_annotations(&name, &version),
        chart: Some((root, name)),
    }))
}

/// Where the chart is: the root, or the one top-level directory (how chart tarballs unpack).
fn chart_root(store: &Store, revision: RevisionId) -> Result<String, StorageError> {
    if store.file(revision, "Chart.yaml")?.is_some() {
        return Ok(String::new());
    }
    match store.files(revision, "").next().transpose()? {
        Some(first) if first.is_dir() => Ok(first.path),
        _ => Ok(String::new()),
    }
}

/// A small regular file's bytes (`None` if absent, not a file, or larger than metadata may be).
fn read_small(store: &Store, revision: RevisionId, path: &str) -> Result<Option<Vec<u8>>, StorageError> {
    let Some(entry) = store.file(revision, path)? else { return Ok(None) };
    if entry.kind != crate::storage::EntryKind::File || entry.size > MAX_METADATA_BYTES {
        return Ok(None);
    }
    let mut bytes = Vec::with_capacity(entry.size as usize);
    store.read_file(revision, &entry, RangeSpec { start: 0, end: entry.size }, &mut |b| {
        bytes.extend_from_slice(b);
        Ok(())
    })?;
    Ok(Some(bytes))
}
