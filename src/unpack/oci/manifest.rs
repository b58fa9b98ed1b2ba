//! Manifests and indexes as far as unpacking needs them: which platform to take from an index,
//! and how each layer's bytes are encoded (or whether the layer is content at all).

use serde::Deserialize;

use crate::unpack::error::{json_problem, UnpackError};
use crate::unpack::tar_ingest::Encoding;

/// Media types accepted when pulling a manifest by digest.
pub const ACCEPTED_MANIFESTS: &[&str] = &[
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
];

const INDEX_TYPES: &[&str] =
    &["application/vnd.oci.image.index.v1+json", "application/vnd.docker.distribution.manifest.list.v2+json"];

/// A descriptor (of a layer, config or manifest).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    #[serde(default)]
    pub media_type: String,
    pub digest: String,
    pub size: u64,
    #[serde(default)]
    pub platform: Option<Platform>,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct Platform {
    #[serde(default)]
    pub os: String,
    #[serde(default)]
    pub architecture: String,
    #[serde(default)]
    pub variant: Option<String>,
}

impl std::fmt::Display for Platform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.os, self.architecture)?;
        match self.variant.as_deref() {
            Some(v) if !v.is_empty() => write!(f, "/{v}"),
            _ => Ok(()),
        }
    }
}

/// An image manifest or an index, told apart by `mediaType` (or, when absent, by `manifests`).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    #[serde(default)]
    pub media_type: String,
    #[serde(default)]
    pub layers: Vec<Descriptor>,
    #[serde(default)]
    pub manifests: Option<Vec<Descriptor>>,
}

impl Manifest {
    pub fn parse(bytes: &[u8], what: &str) -> Result<Manifest, UnpackError> {
        serde_json::from_slice(bytes)
            .map_err(|e| UnpackError::Unsupported(format!("{what}: not an image manifest: it {}", json_problem(&e))))
    }

    pub fn is_index(&self) -> bool {
        INDEX_TYPES.contains(&self.media_type.as_str()) || (self.media_type.is_empty() && self.manifests.is_some())
    }
}

/// The manifest to take from an index for `wanted` (`os/arch[/variant]`). Empty `wanted` means
/// `linux/amd64` when present, else the index's only image. Attestations and other entries with
/// an `unknown` platform are never candidates.
pub fn select_platform<'m>(index: &'m Manifest, wanted: &str, what: &str) -> Result<&'m Descriptor, UnpackError> {
    let candidates: Vec<&Descriptor> = index
        .manifests
        .iter()
        .flatten()
        .filter(|d| d.platform.as_ref().is_none_or(|p| p.os != "unknown" && p.architecture != "unknown"))
        .collect();
    let wanted = wanted.trim();
    let matches = |d: &&Descriptor, os: &str, arch: &str, variant: Option<&str>| {
        d.platform.as_ref().is_some_and(|p| {
            p.os == os && p.architecture == arch && variant.is_none_or(|v| p.variant.as_deref() == Some(v))
        })
    };
    let found = if wanted.is_empty() {
        candidates.iter().find(|d| matches(d, "linux", "amd64", None)).or_else(|| {
            if candidates.len() == 1 {
                candidates.first()
            } else {
                None
            }
        })
    } else {
        let mut parts = wanted.splitn(3, '/');
        let (os, arch, variant) = (parts.next().unwrap_or_default(), parts.next().unwrap_or_default(), parts.next());
        if os.is_empty() || arch.is_empty() || variant.is_some_and(str::is_empty) {
            return Err(UnpackError::Unsupported(format!("platform {wanted:?} is not os/arch[/variant]")));
        }
        candidates.iter().find(|d| matches(d, os, arch, variant))
    };
    found.copied().ok_or_else(|| {
        let available: Vec<String> = candidates
            .iter()
            .map(|d| d.platform.as_ref().map_or_else(|| "unspecified".into(), |p| p.to_string()))
            .collect();
        let wanted = if wanted.is_empty() { "linux/amd64 (the default)" } else { wanted };
        UnpackError::Unsupported(format!("{what}: no image for platform {wanted}; available: {}", available.join(", ")))
    })
}

/// How to read a layer: `Some(encoding)` for tar content, `None` for a layer that is not content
/// (Helm provenance, empty descriptors); anything else is refused rather than silently dropped.
pub fn layer_encoding(media_type: &str, what: &str) -> Result<Option<Encoding>, UnpackError> {
    Ok(Some(match media_type {
        "application/vnd.oci.image.layer.v1.tar" | "application/vnd.docker.image.rootfs.diff.tar" => Encoding::Identity,
        "application/vnd.oci.image.layer.v1.tar+gzip"
        | "application/vnd.docker.image.rootfs.diff.tar.gzip"
        | "application/vnd.cncf.helm.chart.content.v1.tar+gzip"
        | "application/tar+gzip" => Encoding::Gzip,
        "application/vnd.oci.image.layer.v1.tar+zstd" | "application/vnd.docker.image.rootfs.diff.tar.zstd" => {
            Encoding::Zstd
        }
        "application/vnd.cncf.helm.chart.provenance.v1.prov" | "application/vnd.oci.empty.v1+json" => return Ok(None),
        other => {
            return Err(UnpackError::Unsupported(format!("{what}: unsupported layer media type {other:?}")));
        }
    }))
}

/// Accepts only `sha256:<64 lower-case hex>`, the one algorithm we verify.
pub fn check_digest(digest: &str, what: &str) -> Result<(), UnpackError> {
    let hex = digest.strip_prefix("sha256:").unwrap_or_default();
    if hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        Ok(())
    } else {
        Err(UnpackError::Unsupported(format!("{what}: unsupported digest {digest:?} (only sha256 is supported)")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index(platforms: &[&str]) -> Manifest {
        let manifests = platforms
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let mut parts = p.split('/');
                let platform = Platform {
                    os: parts.next().unwrap_or_default().into(),
                    architecture: parts.next().unwrap_or_default().into(),
                    variant: parts.next().map(Into::into),
                };
                Descriptor { digest: format!("d{i}"), platform: Some(platform), ..Default::default() }
            })
            .collect();
        Manifest { manifests: Some(manifests), ..Default::default() }
    }

    #[test]
    fn platform_selection() {
        let idx = index(&["linux/arm64/v8", "linux/amd64", "linux/arm/v7", "unknown/unknown"]);
        assert_eq!(select_platform(&idx, "", "x").unwrap().digest, "d1");
        assert_eq!(select_platform(&idx, "linux/arm64", "x").unwrap().digest, "d0");
        assert_eq!(select_platform(&idx, "linux/arm/v7", "x").unwrap().digest, "d2");
        let err = select_platform(&idx, "windows/amd64", "x").unwrap_err().to_string();
        assert!(err.contains("linux/arm64/v8, linux/amd64, linux/arm/v7") && !err.contains("unknown"), "{err}");
        assert!(select_platform(&idx, "linux", "x").is_err());
        assert!(select_platform(&idx, "linux/arm/", "x").is_err());

        let single = index(&["linux/arm64", "unknown/unknown"]);
        assert_eq!(select_platform(&single, "", "x").unwrap().digest, "d0");
        let two = index(&["linux/arm64", "linux/s390x"]);
        assert!(matches!(select_platform(&two, "", "x"), Err(UnpackError::Unsupported(_))));
    }

    #[test]
    fn layer_media_types() {
        assert_eq!(layer_encoding("application/vnd.oci.image.layer.v1.tar+zstd", "l").unwrap(), Some(Encoding::Zstd));
        assert_eq!(layer_encoding("application/vnd.cncf.helm.chart.provenance.v1.prov", "l").unwrap(), None);
        assert!(layer_encoding("application/vnd.oci.image.layer.nondistributable.v1.tar+gzip", "l").is_err());
    }

    #[test]
    fn digests() {
        assert!(check_digest(&format!("sha256:{}", "a".repeat(64)), "d").is_ok());
        for bad in
            ["", "sha256:", "sha512:aa", &format!("sha256:{}", "A".repeat(64)), &format!("sha256:{}/", "a".repeat(63))]
        {
            assert!(check_digest(bad, "d").is_err(), "{bad}");
        }
    }
}
