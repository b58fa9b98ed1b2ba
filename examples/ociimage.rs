//! Writes an OCI image layout (for `skopeo copy oci:DIR:TAG docker://…`) whose layers are
//! directories, or generated data — for benchmarks (`scripts/bench.sh unpack`).
//!
//! Usage: ociimage OUT_DIR TAG LAYER...
//!   LAYER = dir:PATH            the tree under PATH (gzip)
//!         | random:FILES:BYTES  FILES files of BYTES pseudo-random (incompressible) bytes each
//!                               under data/LAYER_INDEX/ (gzip, fastest level)

// A benchmark tool run by scripts/bench.sh: any surprise should stop it loudly.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

use std::fs::File;
use std::io::{self, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// A writer that hashes and counts what passes.
struct Hashing<W> {
    inner: W,
    sha: Sha256,
    len: u64,
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.sha.update(&buf[..n]);
        self.len += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Deterministic incompressible bytes (xorshift64*).
struct Noise(u64);

impl Read for Noise {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        for chunk in buf.chunks_mut(8) {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            let bytes = self.0.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes();
            chunk.copy_from_slice(&bytes[..chunk.len()]);
        }
        Ok(buf.len())
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [out, tag, layers @ ..] = args.as_slice() else {
        return Err("usage: ociimage OUT_DIR TAG LAYER... (dir:PATH | random:FILES:BYTES)".into());
    };
    let out = PathBuf::from(out);
    let blobs = out.join("blobs/sha256");
    std::fs::create_dir_all(&blobs)?;
    let mut descriptors = Vec::new();
    let mut diff_ids = Vec::new();
    for (index, spec) in layers.iter().enumerate() {
        let tmp = out.join("layer.tmp");
        let (digest, size, diff_id) = write_layer(&tmp, index, spec)?;
        std::fs::rename(&tmp, blobs.join(&digest))?;
        descriptors.push(serde_json::json!({
            "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
            "digest": format!("sha256:{digest}"), "size": size,
        }));
        diff_ids.push(format!("sha256:{diff_id}"));
    }
    let config = serde_json::json!({
        "architecture": "amd64", "os": "linux", "config": {},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    });
    let config_desc = put_json(&blobs, &config, "application/vnd.oci.image.config.v1+json")?;
    let manifest = serde_json::json!({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": config_desc, "layers": descriptors,
    });
    let mut manifest_desc = put_json(&blobs, &manifest, "application/vnd.oci.image.manifest.v1+json")?;
    manifest_desc["annotations"] = serde_json::json!({"org.opencontainers.image.ref.name": tag});
    let index = serde_json::json!({"schemaVersion": 2, "manifests": [manifest_desc]});
    std::fs::write(out.join("index.json"), serde_json::to_vec(&index)?)?;
    std::fs::write(out.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#)?;
    Ok(())
}

fn put_json(blobs: &Path, value: &serde_json::Value, media_type: &str) -> io::Result<serde_json::Value> {
    let bytes = serde_json::to_vec(value)?;
    let digest = hex::encode(Sha256::digest(&bytes));
    std::fs::write(blobs.join(&digest), &bytes)?;
    Ok(serde_json::json!({"mediaType": media_type, "digest": format!("sha256:{digest}"), "size": bytes.len()}))
}

/// Writes one gzip layer to `path`; returns (blob digest, blob size, diff id), hex.
fn write_layer(path: &Path, index: usize, spec: &str) -> Result<(String, u64, String), Box<dyn std::error::Error>> {
    let blob = Hashing { inner: BufWriter::new(File::create(path)?), sha: Sha256::new(), len: 0 };
    let level = if spec.starts_with("random:") { flate2::Compression::fast() } else { flate2::Compression::default() };
    let gzip = flate2::write::GzEncoder::new(blob, level);
    let tar_stream = Hashing { inner: gzip, sha: Sha256::new(), len: 0 };
    let mut builder = tar::Builder::new(tar_stream);
    builder.mode(tar::HeaderMode::Deterministic);
    if let Some(dir) = spec.strip_prefix("dir:") {
        builder.append_dir_all(".", dir)?;
    } else if let Some(rest) = spec.strip_prefix("random:") {
        let (files, bytes) = rest.split_once(':').ok_or("random:FILES:BYTES")?;
        let (files, bytes): (u64, u64) = (files.parse()?, bytes.parse()?);
        for file in 0..files {
            let mut header = tar::Header::new_gnu();
            header.set_size(bytes);
            header.set_mode(0o644);
            header.set_entry_type(tar::EntryType::Regular);
            let name = format!("data/{index}/file-{file:05}.bin");
            let seed = (index as u64 + 1) * 1_000_003 + file + 1;
            builder.append_data(&mut header, name, Noise(seed).take(bytes))?;
        }
    } else {
        return Err(format!("unknown layer {spec:?}").into());
    }
    let tar_stream = builder.into_inner()?;
    let diff_id = hex::encode(tar_stream.sha.finalize());
    let mut blob = tar_stream.inner.finish()?;
    blob.flush()?;
    Ok((hex::encode(blob.sha.finalize()), blob.len, diff_id))
}
