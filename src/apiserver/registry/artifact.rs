//! What a revision looks like to an OCI client: media types, the image config and manifest (or
//! Helm's chart artifact), tag grammar, and the names an image layer would misread.
//!
//! Everything here is a pure function of stored facts (the served tar's digest and size, the
//! chart's metadata, the bundle's annotations), serialised from fixed structs rather than maps, so
//! the same revision gives byte-identical manifests, hence the same digests, on every replica,
//! after every restart, and across upgrades that do not change this file.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

pub const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const IMAGE_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
/// An uncompressed layer: the served tar is one as it is.
pub const TAR_LAYER: &str = "application/vnd.oci.image.layer.v1.tar";
pub const HELM_CONFIG: &str = "application/vnd.cncf.helm.config.v1+json";
pub const HELM_LAYER: &str = "application/vnd.cncf.helm.chart.content.v1.tar+gzip";

/// The platform every image is described as: bundle content runs nowhere, but clients (podman,
/// the kubelet) pick or warn by platform, and linux/amd64 is what bundle images are built as.
pub const OS: &str = "linux";
pub const ARCHITECTURE: &str = "amd64";

/// A small blob built here (a config or a manifest) and its digest.
#[derive(Clone, Debug, PartialEq)]
pub struct Built {
    pub bytes: Vec<u8>,
    pub digest: String,
}

impl Built {
    fn of(value: &impl Serialize) -> Built {
        let bytes = serde_json::to_vec(value).unwrap_or_default();
        let digest = sha256_digest(&bytes);
        Built { bytes, digest }
    }

    pub fn size(&self) -> u64 {
        self.bytes.len() as u64
    }
}

pub fn sha256_digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// A content descriptor.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Descriptor {
    #[serde(rename = "mediaType")]
    pub media_type: &'static str,
    pub digest: String,
    pub size: u64,
}

#[derive(Serialize)]
struct Manifest<'a> {
    #[serde(rename = "schemaVersion")]
    schema_version: u32,
    #[serde(rename = "mediaType")]
    media_type: &'static str,
    config: &'a Descriptor,
    layers: [&'a Descriptor; 1],
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    annotations: BTreeMap<&'static str, String>,
}

#[derive(Serialize)]
struct ImageConfig<'a> {
    architecture: &'static str,
    os: &'static str,
    config: RuntimeConfig<'a>,
    rootfs: RootFs<'a>,
}

#[derive(Serialize)]
struct RuntimeConfig<'a> {
    #[serde(rename = "Labels", skip_serializing_if = "BTreeMap::is_empty")]
    labels: &'a BTreeMap<String, String>,
}

#[derive(Serialize)]
struct RootFs<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    diff_ids: [&'a str; 1],
}

/// The config of an image whose one layer is the served tar (`tar_digest`, which is also its
/// diff_id: the layer is uncompressed), labelled with `labels` (a registry+v1 bundle's
/// annotations, so it is a valid bundle image).
pub fn image_config(tar_digest: &str, labels: &BTreeMap<String, String>) -> Built {
    Built::of(&ImageConfig {
        architecture: ARCHITECTURE,
        os: OS,
        config: RuntimeConfig { labels },
        rootfs: RootFs { kind: "layers", diff_ids: [tar_digest] },
    })
}

/// The image manifest naming `config` and the one `layer`.
pub fn manifest(config: &Descriptor, layer: &Descriptor, annotations: BTreeMap<&'static str, String>) -> Built {
    Built::of(&Manifest { schema_version: 2, media_type: MANIFEST, config, layers: [layer], annotations })
}

/// Helm's chart config: `Chart.yaml` as JSON (what `helm push` stores), keys in sorted order.
pub fn helm_config(chart_yaml: &[u8]) -> Result<Built, String> {
    let value: Value = serde_yaml_ng::from_slice(chart_yaml).map_err(|e| format!("Chart.yaml does not parse: {e}"))?;
    if !value.is_object() {
        return Err("Chart.yaml is not a mapping".into());
    }
    Ok(Built::of(&sorted(value)))
}

/// Helm's manifest annotations (`helm push` sets them; `helm show` reads the title and version).
pub fn helm_annotations(chart: &str, version: &str) -> BTreeMap<&'static str, String> {
    BTreeMap::from([
        ("org.opencontainers.image.title", chart.to_string()),
        ("org.opencontainers.image.version", version.to_string()),
    ])
}

/// A JSON value whose maps serialise in key order whatever serde_json's features are.
fn sorted(value: Value) -> Value {
    match value {
        Value::Object(map) => {
            let ordered: BTreeMap<String, Value> = map.into_iter().map(|(k, v)| (k, sorted(v))).collect();
            Value::Object(ordered.into_iter().collect())
        }
        Value::Array(items) => Value::Array(items.into_iter().map(sorted).collect()),
        other => other,
    }
}

/// Whether `tag` is an OCI tag: `[a-zA-Z0-9_][a-zA-Z0-9._-]{0,127}`.
pub fn is_tag(tag: &str) -> bool {
    let mut chars = tag.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
    first_ok && tag.len() <= 128 && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

/// The tag of a kept revision: its BundleContent name where that is a tag, else `rev-` and the
/// first 16 hex digits of its digest (names may be up to 253 characters).
pub fn revision_tag(content_name: &str, digest: &str) -> String {
    if is_tag(content_name) {
        return content_name.to_string();
    }
    let hex: String = digest.trim_start_matches("sha256:").chars().take(16).collect();
    format!("rev-{hex}")
}

/// The tag Helm looks for: the chart's version with `+` written `_` (a tag cannot hold `+`).
pub fn chart_version_tag(version: &str) -> Option<String> {
    let tag = version.replace('+', "_");
    is_tag(&tag).then_some(tag)
}

/// Whether `path` names something an image layer would read as a whiteout (`.wh.NAME` deletes
/// NAME from lower layers, `.wh..wh..opq` makes a directory opaque): such a tree cannot be
/// served as an image without losing those files.
pub fn is_whiteout(path: &str) -> bool {
    path.trim_end_matches('/').rsplit('/').next().is_some_and(|name| name.starts_with(".wh."))
}

/// Whether `reference` is a digest (`algorithm:hex`) rather than a tag.
pub fn is_digest(reference: &str) -> bool {
    reference.contains(':')
}

/// A sha256 digest in canonical form, or why not (other algorithms are not stored).
pub fn parse_digest(reference: &str) -> Result<&str, String> {
    let Some(hex) = reference.strip_prefix("sha256:") else {
        return Err(format!("digest {reference:?} is not supported: only sha256 digests are served"));
    };
    if hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        Ok(reference)
    } else {
        Err(format!("digest {reference:?} is not a sha256 digest (64 lower-case hex digits)"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TAR: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";

    #[test]
    fn config_and_manifest_are_stable_bytes() {
        let labels = BTreeMap::from([("b".to_string(), "2".to_string()), ("a".to_string(), "1".to_string())]);
        let config = image_config(TAR, &labels);
        assert_eq!(
            String::from_utf8(config.bytes.clone()).unwrap(),
            format!(
                r#"{{"architecture":"amd64","os":"linux","config":{{"Labels":{{"a":"1","b":"2"}}}},"rootfs":{{"type":"layers","diff_ids":["{TAR}"]}}}}"#
            )
        );
        assert_eq!(config, image_config(TAR, &labels.clone()));
        let config_d = Descriptor { media_type: IMAGE_CONFIG, digest: config.digest.clone(), size: config.size() };
        let layer = Descriptor { media_type: TAR_LAYER, digest: TAR.into(), size: 10240 };
        let m = manifest(&config_d, &layer, BTreeMap::new());
        let text = String::from_utf8(m.bytes.clone()).unwrap();
        assert!(text
            .starts_with(r#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":"#));
        assert!(!text.contains("annotations"));
        assert_eq!(m.digest, sha256_digest(&m.bytes));
    }

    #[test]
    fn plain_config_has_no_labels_key() {
        let config = image_config(TAR, &BTreeMap::new());
        assert!(!String::from_utf8(config.bytes).unwrap().contains("Labels"));
    }

    #[test]
    fn helm_config_is_chart_yaml_as_sorted_json() {
        let built =
            helm_config(b"version: 1.2.3\nname: demo\napiVersion: v2\nmaintainers:\n- {name: z, email: a}\n").unwrap();
        assert_eq!(
            String::from_utf8(built.bytes).unwrap(),
            r#"{"apiVersion":"v2","maintainers":[{"email":"a","name":"z"}],"name":"demo","version":"1.2.3"}"#
        );
        assert!(helm_config(b"- a\n").is_err());
        assert!(helm_config(b"a: [").is_err());
    }

    #[test]
    fn tags() {
        assert!(is_tag("latest") && is_tag("_x") && is_tag("1.2.3-rc.1") && is_tag(&"a".repeat(128)));
        assert!(!is_tag("") && !is_tag(".x") && !is_tag("-x") && !is_tag("a+b") && !is_tag(&"a".repeat(129)));
        assert_eq!(revision_tag("app-0123456789", TAR), "app-0123456789");
        assert_eq!(revision_tag(&"a".repeat(200), TAR), "rev-1111111111111111");
        assert_eq!(chart_version_tag("1.2.3+build.4").as_deref(), Some("1.2.3_build.4"));
        assert_eq!(chart_version_tag("1 2"), None);
    }

    #[test]
    fn whiteouts() {
        assert!(is_whiteout(".wh.a") && is_whiteout("x/.wh..wh..opq") && is_whiteout("x/.wh.d/"));
        assert!(!is_whiteout("x/a.wh.b") && !is_whiteout("wh.x") && !is_whiteout(".whx"));
    }

    #[test]
    fn digests() {
        assert!(parse_digest(TAR).is_ok());
        assert!(parse_digest("sha512:00").is_err());
        assert!(parse_digest("sha256:ABC").is_err());
        assert!(is_digest(TAR) && !is_digest("latest"));
    }
}
