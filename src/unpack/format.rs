//! Bundle formats: which one a tree is, and whether it is a valid one.
//!
//! - `plain`: a `manifests/` tree of YAML/JSON Kubernetes objects;
//! - `registry-v1`: `manifests/` with a ClusterServiceVersion, and `metadata/annotations.yaml`
//!   declaring `operators.operatorframework.io.bundle.mediatype.v1: registry+v1`;
//! - `helm`: a chart — `Chart.yaml` at the root or in the one top-level directory (how chart
//!   tarballs and Helm OCI artifacts unpack).
//!
//! The [`Inspector`] sees the few files that decide this while they stream into the store (object
//! files are parsed then, one at a time, so memory follows the largest manifest, not the bundle),
//! and [`Inspector::finish`] names the format or the file that makes the bundle invalid. Formats
//! are read at the root of the whole tree; a refusal says what the root holds, where each source
//! was placed (`spec.sources[].destination`) and what was expected there. A tree composed of
//! several sources, each under its own destination, with no format asked for, is served as it
//! is (no format): the sources chose its layout.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

use super::error::UnpackError;
use crate::api::FormatDetails;

pub const PLAIN: &str = "plain";
pub const REGISTRY_V1: &str = "registry-v1";
pub const HELM: &str = "helm";

/// Largest object or metadata file parsed (etcd stores objects of at most 1.5 MiB).
pub const MAX_INSPECTED_BYTES: u64 = 8 << 20;

/// Where a registry+v1 bundle declares itself (and its package and channels).
pub const ANNOTATIONS_FILE: &str = "metadata/annotations.yaml";

const MEDIATYPE_ANNOTATION: &str = "operators.operatorframework.io.bundle.mediatype.v1";
const PACKAGE_ANNOTATION: &str = "operators.operatorframework.io.bundle.package.v1";

/// Distinct kinds counted in `formatDetails.objects`; the others are counted under [`OTHER_KINDS`].
const MAX_KINDS: usize = 256;
/// Longer kinds (Kubernetes' are at most 63 characters) are counted under [`OTHER_KINDS`] too.
const MAX_KIND_BYTES: usize = 253;
const OTHER_KINDS: &str = "(other kinds)";
/// Top-level names remembered (for detection and for saying what was found).
const MAX_TOP_LEVEL: usize = 64;
/// Top-level names a message lists.
const MAX_FOUND_SHOWN: usize = 8;

/// A chart's name and version.
type Chart = (String, String);

/// What a valid bundle contains.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FormatReport {
    /// `plain`, `registry-v1`, `helm`, or empty when nothing was detected and none was asked for.
    pub format: String,
    /// Objects by kind in `manifests/` (plain, registry-v1).
    pub objects: BTreeMap<String, u64>,
    /// `chart`/`version` (helm), `package`/`clusterServiceVersion` (registry-v1).
    pub facts: BTreeMap<&'static str, String>,
}

impl FormatReport {
    /// `status.formatDetails` / `BundleContent.spec.formatDetails`.
    pub fn details(&self) -> FormatDetails {
        let fact = |key: &str| self.facts.get(key).cloned();
        FormatDetails {
            objects: self.objects.clone(),
            chart: fact("chart"),
            version: fact("version"),
            package: fact("package"),
            cluster_service_version: fact("clusterServiceVersion"),
        }
    }
}

/// Watches a tree go by; see the module docs.
#[derive(Debug, Default)]
pub struct Inspector {
    objects: BTreeMap<String, u64>,
    object_files: u64,
    /// The first object file that failed to parse: (path, problem).
    invalid_object: Option<(String, String)>,
    annotations: Option<Result<BTreeMap<String, String>, String>>,
    csv: Option<(String, String)>,
    /// Chart.yaml files at the root or one level down: (path, parsed or problem) of the root one
    /// and of the first other one, and how many there were (all that [`Inspector::finish`] needs:
    /// a tree of a million charts costs no more than one of two).
    root_chart: Option<(String, Result<Chart, String>)>,
    other_chart: Option<(String, Result<Chart, String>)>,
    charts: u64,
    /// Top-level names (`dir/` for directories), at most [`MAX_TOP_LEVEL`].
    top_level: std::collections::BTreeSet<String>,
    /// Where each source's files went (`dir/`, or empty for the root), in `spec.sources` order.
    destinations: Vec<String>,
}

impl Inspector {
    /// Whether `path` (final, with the destination prefix) must be shown to [`Inspector::observe`].
    pub fn wants(path: &str) -> bool {
        is_object_file(path) || path == ANNOTATIONS_FILE || is_chart_file(path)
    }

    /// Records every path (for the shape of the tree): its top-level name, `dir/` for a directory.
    pub fn saw(&mut self, path: &str) {
        let top = match path.split_once('/') {
            Some((dir, _)) => format!("{dir}/"),
            None => path.to_string(),
        };
        if self.top_level.len() < MAX_TOP_LEVEL || self.top_level.contains(&top) {
            self.top_level.insert(top);
        }
    }

    /// The sources' destinations, in order (`dir/`, empty for the root), for messages.
    pub fn set_destinations(&mut self, destinations: Vec<String>) {
        self.destinations = destinations;
    }

    /// Where the sources were placed, when any has a destination: ` (spec.sources[0] is placed
    /// under from-git/, spec.sources[1] under charts/kps/)`.
    fn placement(&self) -> String {
        if self.destinations.iter().all(String::is_empty) {
            return String::new();
        }
        let placed: Vec<String> = self
            .destinations
            .iter()
            .enumerate()
            .map(|(i, d)| match d.is_empty() {
                true => format!("spec.sources[{i}] at the root"),
                false => format!("spec.sources[{i}] under {}", quoted(d)),
            })
            .collect();
        format!(" ({})", placed.join(", "))
    }

    /// How to make YAML files lying at the root a plain bundle: `; …` naming the source to move,
    /// or nothing when there are none.
    fn root_yaml_hint(&self) -> String {
        let yaml = self.top_level.iter().any(|n| !n.ends_with('/') && is_yaml_name(n));
        if !yaml {
            return String::new();
        }
        let at_root: Vec<usize> =
            self.destinations.iter().enumerate().filter(|(_, d)| d.is_empty()).map(|(i, _)| i).collect();
        let fix = match at_root.as_slice() {
            [i] => format!("set spec.sources[{i}].destination to manifests"),
            _ => "move them under manifests/".to_string(),
        };
        format!("; a plain bundle keeps its YAML or JSON objects under manifests/, not at the root: {fix}")
    }

    /// Several sources, each under a destination of its own: a layout the Bundle chose.
    fn is_composition(&self) -> bool {
        self.destinations.len() > 1 && self.destinations.iter().all(|d| !d.is_empty())
    }

    /// What the root holds, for messages: `found README.md, docs/` (the first few names).
    fn found(&self) -> String {
        if self.top_level.is_empty() {
            return "found nothing".to_string();
        }
        let shown: Vec<String> = self.top_level.iter().take(MAX_FOUND_SHOWN).map(|n| quoted(n)).collect();
        let more = match self.top_level.len().saturating_sub(MAX_FOUND_SHOWN) {
            0 => String::new(),
            n if self.top_level.len() >= MAX_TOP_LEVEL => format!(" and {n} or more others"),
            n => format!(" and {n} others"),
        };
        format!("found {}{more}", shown.join(", "))
    }

    /// Looks at the bytes of a file [`Inspector::wants`].
    pub fn observe(&mut self, path: &str, bytes: &[u8]) {
        if is_object_file(path) {
            self.object_files += 1;
            match parse_objects(bytes) {
                Ok(kinds) => {
                    for (kind, name) in kinds {
                        if kind == "ClusterServiceVersion" && self.csv.is_none() {
                            self.csv = Some((path.to_string(), name));
                        }
                        // Counted by kind, in a bounded map: odd or endless kinds share one entry.
                        let kind = if kind.len() > MAX_KIND_BYTES
                            || (self.objects.len() >= MAX_KINDS && !self.objects.contains_key(&kind))
                        {
                            OTHER_KINDS.to_string()
                        } else {
                            kind
                        };
                        *self.objects.entry(kind).or_default() += 1;
                    }
                }
                Err(problem) => {
                    if self.invalid_object.is_none() {
                        self.invalid_object = Some((path.to_string(), problem));
                    }
                }
            }
        } else if path == ANNOTATIONS_FILE {
            self.annotations = Some(parse_annotations(bytes));
        } else if is_chart_file(path) {
            self.saw_chart(path, parse_chart(bytes));
        }
    }

    fn saw_chart(&mut self, path: &str, chart: Result<Chart, String>) {
        self.charts += 1;
        if path == "Chart.yaml" {
            self.root_chart = Some((path.to_string(), chart));
        } else if self.other_chart.is_none() {
            self.other_chart = Some((path.to_string(), chart));
        }
    }

    /// A file too large to parse: invalid if it is an object file.
    pub fn too_large(&mut self, path: &str) {
        let problem = format!("the file is larger than {} MiB, the most that is parsed", MAX_INSPECTED_BYTES >> 20);
        if is_object_file(path) && self.invalid_object.is_none() {
            self.invalid_object = Some((path.to_string(), problem));
        } else if path == ANNOTATIONS_FILE {
            self.annotations = Some(Err(problem));
        } else if is_chart_file(path) {
            self.saw_chart(path, Err(problem));
        }
    }

    /// The format (`declared` = `spec.format`, empty to detect) and what the bundle holds, or the
    /// file that makes it invalid. `strict`: an undetected or invalid tree is an error (pulled
    /// sources); otherwise, unless a format is declared, it is accepted with an empty format
    /// (uploads: bring your own tree).
    pub fn finish(self, declared: &str, strict: bool) -> Result<FormatReport, UnpackError> {
        if declared.is_empty() && !strict {
            return Ok(self.finish("", true).unwrap_or_default());
        }
        let format = match declared {
            "" => match self.detect() {
                Some(format) => format,
                None if self.is_composition() => return Ok(FormatReport::default()),
                None => {
                    let (found, placement, hint) = (self.found(), self.placement(), self.root_yaml_hint());
                    return Err(invalid(
                        "",
                        ".",
                        format!(
                            "no bundle format detected: {found} at the root{placement}; expected manifests/ (plain), \
                             metadata/annotations.yaml (registry-v1) or Chart.yaml (helm) at the root{hint}"
                        ),
                    ));
                }
            },
            other => other,
        };
        match format {
            PLAIN => self.plain(),
            REGISTRY_V1 => self.registry_v1(),
            HELM => self.helm(),
            other => Err(invalid("", ".", format!("unknown format {other:?}: expected plain, registry-v1 or helm"))),
        }
    }

    fn detect(&self) -> Option<&'static str> {
        if self.annotations.is_some() {
            Some(REGISTRY_V1)
        } else if self.charts > 0 {
            Some(HELM)
        } else if self.top_level.contains("manifests/") {
            Some(PLAIN)
        } else {
            None
        }
    }

    /// The object files under `manifests/` of a `format` bundle: all parse, and there is one.
    fn manifests(&self, format: &str) -> Result<(), UnpackError> {
        if let Some((path, problem)) = &self.invalid_object {
            return Err(invalid(format, path, format!("{}: {problem}", quoted(path))));
        }
        if self.object_files == 0 {
            let problem = match self.top_level.contains("manifests/") {
                true => "manifests/ holds no YAML or JSON object files (*.yaml, *.yml, *.json)".to_string(),
                false => format!(
                    "there is no manifests/ directory ({} at the root{}){}",
                    self.found(),
                    self.placement(),
                    self.root_yaml_hint()
                ),
            };
            return Err(invalid(format, "manifests/", problem));
        }
        Ok(())
    }

    fn plain(self) -> Result<FormatReport, UnpackError> {
        self.manifests(PLAIN)?;
        Ok(FormatReport { format: PLAIN.into(), objects: self.objects, ..FormatReport::default() })
    }

    fn registry_v1(self) -> Result<FormatReport, UnpackError> {
        const FILE: &str = ANNOTATIONS_FILE;
        let problem = |text: String| invalid(REGISTRY_V1, FILE, text);
        let annotations = match &self.annotations {
            None => {
                return Err(problem(format!("{FILE} is missing ({} at the root{})", self.found(), self.placement())))
            }
            Some(Err(p)) => return Err(problem(format!("{FILE}: {p}"))),
            Some(Ok(a)) => a,
        };
        match annotations.get(MEDIATYPE_ANNOTATION).map(String::as_str) {
            Some("registry+v1") => {}
            Some(other) => {
                return Err(problem(format!("{FILE}: {MEDIATYPE_ANNOTATION} is {other:?}, expected \"registry+v1\"")))
            }
            None => return Err(problem(format!("{FILE}: {MEDIATYPE_ANNOTATION} is not set"))),
        }
        let package = annotations.get(PACKAGE_ANNOTATION).cloned().unwrap_or_default();
        self.manifests(REGISTRY_V1)?;
        let Some((_, csv)) = &self.csv else {
            let kinds: Vec<&str> = self.objects.keys().map(String::as_str).take(MAX_FOUND_SHOWN).collect();
            let problem = format!("manifests/ holds no ClusterServiceVersion (found {})", kinds.join(", "));
            return Err(invalid(REGISTRY_V1, "manifests/", problem));
        };
        let facts = BTreeMap::from([("package", package), ("clusterServiceVersion", csv.clone())]);
        Ok(FormatReport { format: REGISTRY_V1.into(), objects: self.objects, facts })
    }

    fn helm(self) -> Result<FormatReport, UnpackError> {
        let chart = match (&self.root_chart, &self.other_chart) {
            (Some(chart), _) => chart,
            (None, Some(chart)) if self.top_level.len() == 1 && self.charts == 1 => chart,
            (None, None) => {
                let found = self.found();
                let placement = self.placement();
                return Err(invalid(
                    HELM,
                    "Chart.yaml",
                    format!("no Chart.yaml at the root or in a single top-level directory ({found}{placement})"),
                ));
            }
            (None, Some((path, _))) => {
                return Err(invalid(
                    HELM,
                    path,
                    format!(
                        "{} is not at the root, and its directory is not the only top-level one ({})",
                        quoted(path),
                        self.found()
                    ),
                ))
            }
        };
        match &chart.1 {
            Err(problem) => Err(invalid(HELM, &chart.0, format!("{}: {problem}", quoted(&chart.0)))),
            Ok((name, version)) => Ok(FormatReport {
                format: HELM.into(),
                facts: BTreeMap::from([("chart", name.clone()), ("version", version.clone())]),
                ..FormatReport::default()
            }),
        }
    }
}

/// The content is not a valid bundle of `format` (empty: of any format) because of `path`;
/// `problem` names the path itself, so the message reads `not a helm chart: Chart.yaml: …`.
fn invalid(format: &str, path: &str, problem: String) -> UnpackError {
    let problem = match format {
        PLAIN => format!("not a plain bundle: {problem}"),
        REGISTRY_V1 => format!("not a registry-v1 bundle: {problem}"),
        HELM => format!("not a helm chart: {problem}"),
        _ => problem,
    };
    UnpackError::InvalidFormat { path: path.to_string(), problem }
}

/// A path in a message: as it is when it is plain text, quoted (escaped) when it holds anything
/// that could be mistaken for the message's own punctuation or is not printable.
fn quoted(path: &str) -> String {
    let plain = path.chars().all(|c| c.is_alphanumeric() || "/._-+@~".contains(c));
    if plain && !path.is_empty() {
        path.to_string()
    } else {
        format!("{path:?}")
    }
}

fn is_object_file(path: &str) -> bool {
    path.starts_with("manifests/") && is_yaml_name(path)
}

fn is_yaml_name(name: &str) -> bool {
    [".yaml", ".yml", ".json"].iter().any(|ext| name.ends_with(ext))
}

fn is_chart_file(path: &str) -> bool {
    path == "Chart.yaml" || (path.ends_with("/Chart.yaml") && path.matches('/').count() == 1)
}

/// Every document must be an object with `apiVersion` and `kind`; returns (kind, name) of each.
fn parse_objects(bytes: &[u8]) -> Result<Vec<(String, String)>, String> {
    let mut found = Vec::new();
    for (i, document) in serde_yaml_ng::Deserializer::from_slice(bytes).enumerate() {
        let n = i + 1;
        let value = Value::deserialize(document).map_err(|e| format!("document {n} {}", yaml_problem(&e)))?;
        if value.is_null() {
            continue; // an empty document (`---` at the end)
        }
        let Some(object) = value.as_object() else {
            return Err(format!("document {n} is not a Kubernetes object (a mapping with apiVersion and kind)"));
        };
        let text = |key: &str| object.get(key).and_then(Value::as_str).filter(|s| !s.is_empty());
        let (Some(_), Some(kind)) = (text("apiVersion"), text("kind")) else {
            return Err(format!("document {n} has no apiVersion and kind (both are required)"));
        };
        let name = object.get("metadata").and_then(|m| m.get("name")).and_then(Value::as_str).unwrap_or("");
        found.push((kind.to_string(), name.to_string()));
    }
    Ok(found)
}

/// Why a YAML document did not parse, with where: the parser's own wording can quote the file
/// (`invalid type: string "…"`), so only its kind and position are kept.
fn yaml_problem(e: &serde_yaml_ng::Error) -> String {
    let at = e.location().map(|l| format!(" (line {}, column {})", l.line(), l.column())).unwrap_or_default();
    format!("is not valid YAML{at}")
}

/// `annotations:`, a mapping of strings to strings.
pub fn parse_annotations(bytes: &[u8]) -> Result<BTreeMap<String, String>, String> {
    let value: Value = serde_yaml_ng::from_slice(bytes).map_err(|e| format!("the file {}", yaml_problem(&e)))?;
    let Some(map) = value.get("annotations").and_then(Value::as_object) else {
        return Err("there is no `annotations` mapping".into());
    };
    let mut annotations = BTreeMap::new();
    for (key, value) in map {
        let Some(text) = value.as_str() else {
            return Err(format!("annotation {key:?} is not a string"));
        };
        annotations.insert(key.clone(), text.to_string());
    }
    Ok(annotations)
}

fn parse_chart(bytes: &[u8]) -> Result<Chart, String> {
    let value: Value = serde_yaml_ng::from_slice(bytes).map_err(|e| format!("the file {}", yaml_problem(&e)))?;
    let text = |key: &str| value.get(key).and_then(Value::as_str).unwrap_or("").to_string();
    let (name, version) = (text("name"), text("version"));
    if name.is_empty() || version.is_empty() {
        return Err("name and version are required".into());
    }
    Ok((name, version))
}

#[cfg(test)]
mod tests;
