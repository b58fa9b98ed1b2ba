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
//! and [`Inspector::finish`] names the format or the file that makes the bundle invalid.

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

const MEDIATYPE_ANNOTATION: &str = "operators.operatorframework.io.bundle.mediatype.v1";
const PACKAGE_ANNOTATION: &str = "operators.operatorframework.io.bundle.package.v1";

/// Distinct kinds counted in `formatDetails.objects`; the others are counted under [`OTHER_KINDS`].
const MAX_KINDS: usize = 256;
/// Longer kinds (Kubernetes' are at most 63 characters) are counted under [`OTHER_KINDS`] too.
const MAX_KIND_BYTES: usize = 253;
const OTHER_KINDS: &str = "(other kinds)";

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
    top_level: std::collections::BTreeSet<String>,
}

impl Inspector {
    /// Whether `path` (final, with the destination prefix) must be shown to [`Inspector::observe`].
    pub fn wants(path: &str) -> bool {
        is_object_file(path) || path == "metadata/annotations.yaml" || is_chart_file(path)
    }

    /// Records every path (for the shape of the tree).
    pub fn saw(&mut self, path: &str) {
        let top = path.split('/').next().unwrap_or(path);
        if self.top_level.len() < 64 || self.top_level.contains(top) {
            self.top_level.insert(top.to_string());
        }
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
        } else if path == "metadata/annotations.yaml" {
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
        let problem = format!("larger than {} MiB; not a Kubernetes object", MAX_INSPECTED_BYTES >> 20);
        if is_object_file(path) && self.invalid_object.is_none() {
            self.invalid_object = Some((path.to_string(), problem));
        } else if path == "metadata/annotations.yaml" {
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
                None => {
                    return Err(invalid(
                        ".",
                        "no bundle found: expected manifests/ (plain), metadata/annotations.yaml with \
                         manifests/ (registry-v1) or Chart.yaml (helm) at the root; set spec.sources[].destination \
                         or pick the right directory",
                    ))
                }
            },
            other => other,
        };
        match format {
            PLAIN => self.plain(),
            REGISTRY_V1 => self.registry_v1(),
            HELM => self.helm(),
            other => Err(invalid(".", &format!("unknown format {other:?}"))),
        }
    }

    fn detect(&self) -> Option<&'static str> {
        if self.annotations.is_some() {
            Some(REGISTRY_V1)
        } else if self.charts > 0 {
            Some(HELM)
        } else if self.top_level.contains("manifests") {
            Some(PLAIN)
        } else {
            None
        }
    }

    fn manifests(&self) -> Result<(), UnpackError> {
        if let Some((path, problem)) = &self.invalid_object {
            return Err(invalid(path, problem));
        }
        if self.object_files == 0 {
            return Err(invalid("manifests/", "no YAML or JSON object files"));
        }
        Ok(())
    }

    fn plain(self) -> Result<FormatReport, UnpackError> {
        self.manifests()?;
        Ok(FormatReport { format: PLAIN.into(), objects: self.objects, ..FormatReport::default() })
    }

    fn registry_v1(self) -> Result<FormatReport, UnpackError> {
        let annotations = match &self.annotations {
            None => return Err(invalid("metadata/annotations.yaml", "missing")),
            Some(Err(problem)) => return Err(invalid("metadata/annotations.yaml", problem)),
            Some(Ok(a)) => a,
        };
        match annotations.get(MEDIATYPE_ANNOTATION).map(String::as_str) {
            Some("registry+v1") => {}
            Some(other) => {
                return Err(invalid(
                    "metadata/annotations.yaml",
                    &format!("{MEDIATYPE_ANNOTATION} is {other:?}, expected \"registry+v1\""),
                ))
            }
            None => return Err(invalid("metadata/annotations.yaml", &format!("{MEDIATYPE_ANNOTATION} is missing"))),
        }
        let package = annotations.get(PACKAGE_ANNOTATION).cloned().unwrap_or_default();
        self.manifests()?;
        let Some((_, csv)) = &self.csv else {
            return Err(invalid("manifests/", "no ClusterServiceVersion"));
        };
        let facts = BTreeMap::from([("package", package), ("clusterServiceVersion", csv.clone())]);
        Ok(FormatReport { format: REGISTRY_V1.into(), objects: self.objects, facts })
    }

    fn helm(self) -> Result<FormatReport, UnpackError> {
        let chart = match (&self.root_chart, &self.other_chart) {
            (Some(chart), _) => chart,
            (None, Some(chart)) if self.top_level.len() == 1 && self.charts == 1 => chart,
            (None, None) => return Err(invalid("Chart.yaml", "missing")),
            (None, Some((path, _))) => {
                return Err(invalid(
                    path,
                    "a chart must be the only top-level directory, or have Chart.yaml at the root",
                ))
            }
        };
        match &chart.1 {
            Err(problem) => Err(invalid(&chart.0, problem)),
            Ok((name, version)) => Ok(FormatReport {
                format: HELM.into(),
                facts: BTreeMap::from([("chart", name.clone()), ("version", version.clone())]),
                ..FormatReport::default()
            }),
        }
    }
}

fn invalid(path: &str, problem: &str) -> UnpackError {
    UnpackError::InvalidFormat { path: path.to_string(), problem: problem.to_string() }
}

fn is_object_file(path: &str) -> bool {
    path.starts_with("manifests/") && [".yaml", ".yml", ".json"].iter().any(|ext| path.ends_with(ext))
}

fn is_chart_file(path: &str) -> bool {
    path == "Chart.yaml" || (path.ends_with("/Chart.yaml") && path.matches('/').count() == 1)
}

/// Every document must be an object with `apiVersion` and `kind`; returns (kind, name) of each.
fn parse_objects(bytes: &[u8]) -> Result<Vec<(String, String)>, String> {
    let mut found = Vec::new();
    for (i, document) in serde_yaml_ng::Deserializer::from_slice(bytes).enumerate() {
        let value = Value::deserialize(document).map_err(|e| format!("document {}: {e}", i + 1))?;
        if value.is_null() {
            continue; // an empty document (`---` at the end)
        }
        let Some(object) = value.as_object() else {
            return Err(format!("document {}: not a Kubernetes object (a mapping with apiVersion and kind)", i + 1));
        };
        let text = |key: &str| object.get(key).and_then(Value::as_str).filter(|s| !s.is_empty());
        let (Some(_), Some(kind)) = (text("apiVersion"), text("kind")) else {
            return Err(format!("document {}: apiVersion and kind are required", i + 1));
        };
        let name = object.get("metadata").and_then(|m| m.get("name")).and_then(Value::as_str).unwrap_or("");
        found.push((kind.to_string(), name.to_string()));
    }
    Ok(found)
}

fn parse_annotations(bytes: &[u8]) -> Result<BTreeMap<String, String>, String> {
    #[derive(Deserialize)]
    struct Annotations {
        annotations: BTreeMap<String, String>,
    }
    serde_yaml_ng::from_slice::<Annotations>(bytes).map(|a| a.annotations).map_err(|e| e.to_string())
}

fn parse_chart(bytes: &[u8]) -> Result<Chart, String> {
    let value: Value = serde_yaml_ng::from_slice(bytes).map_err(|e| e.to_string())?;
    let text = |key: &str| value.get(key).and_then(Value::as_str).unwrap_or("").to_string();
    let (name, version) = (text("name"), text("version"));
    if name.is_empty() || version.is_empty() {
        return Err("name and version are required".into());
    }
    Ok((name, version))
}

#[cfg(test)]
mod tests;
