//! Source: OCI images and artifacts (Helm charts) from a registry.
//!
//! [`resolve`] turns a reference into the digest it names now (one HEAD for a tag, nothing at all
//! for a digest-pinned reference); [`tags`] lists a repository's tags for a version range. [`fetch`] pulls exactly that digest: the manifest (verified),
//! the platform's manifest when it is an index, then every layer streamed through the validating
//! tar reader, topmost first, through [`layers::LayerSink`] which applies OCI whiteouts. Every
//! byte is checked against its descriptor's sha256 and size as it flows; nothing is buffered
//! whole except manifests and tokens, which are read with a bound ([`registry`]).
//!
//! With a download spool ([`SourceContext::downloads`]) every layer's compressed bytes are also
//! kept on disk as they stream: a later attempt reads the layers already downloaded from disk
//! (the same digest check) and asks the registry only for the rest of the one that was cut off
//! (`Range: bytes=N-`; a registry that answers with the whole blob has its first N bytes skipped).
//! Bytes from disk that fail the checks are dropped and the next attempt downloads the layer whole.

mod blob;
mod client;
pub mod docker_config;
pub mod layers;
mod manifest;
mod registry;

use std::io::Read;

use oci_client::Reference;

use self::client::{auth_for, block_on, parse_reference, until_cancelled};
use self::manifest::{check_digest, layer_encoding, select_platform, Descriptor, Manifest};
use self::registry::Registry;
use super::download_spool;
use super::error::UnpackError;
use super::source::{ImageSource, ResolvedSource, Sink, SourceContext};
use super::tar_ingest;

/// What `spec` points at now, fetching metadata only. Returns a value equal to `previous` when
/// nothing changed; performs no network I/O for a source pinned by digest.
pub async fn resolve(
    spec: &ImageSource,
    ctx: &SourceContext,
    previous: Option<&ResolvedSource>,
) -> Result<ResolvedSource, UnpackError> {
    let reference = parse_reference(&spec.reference)?;
    let digest = match reference.digest() {
        Some(digest) => digest.to_owned(),
        None => {
            let auth = auth_for(&reference, ctx.credentials.as_ref())?;
            let tag = reference.tag().unwrap_or("latest");
            until_cancelled(ctx, async {
                let registry = Registry::connect(&ctx.network, &reference, &auth, &spec.reference).await?;
                registry.resolve(tag, &spec.reference).await
            })
            .await?
        }
    };
    check_digest(&digest, &spec.reference)?;
    if let Some(previous @ ResolvedSource::Image { reference: r, digest: d, .. }) = previous {
        if *r == spec.reference && *d == digest {
            return Ok(previous.clone());
        }
    }
    Ok(ResolvedSource::image(&spec.reference, digest, String::new()))
}

/// Every tag of `spec.reference`'s repository, for a version range to choose from.
pub async fn tags(spec: &ImageSource, ctx: &SourceContext) -> Result<Vec<String>, UnpackError> {
    let reference = parse_reference(&spec.reference)?;
    let auth = auth_for(&reference, ctx.credentials.as_ref())?;
    until_cancelled(ctx, async {
        let registry = Registry::connect(&ctx.network, &reference, &auth, &spec.reference).await?;
        registry.tags(&format!("image {}", spec.reference)).await
    })
    .await
}

/// Streams exactly the content `pinned` names into `sink`, verifying every digest; returns the
/// pinned identity with `manifest` set to the platform manifest taken from an index. Blocking: run
/// on a blocking thread. On error the sink may hold a partial tree: discard it.
pub fn fetch(
    spec: &ImageSource,
    ctx: &SourceContext,
    pinned: &ResolvedSource,
    sink: &mut Sink<'_>,
) -> Result<ResolvedSource, UnpackError> {
    let ResolvedSource::Image { digest, .. } = pinned else {
        return Err(UnpackError::Unsupported(format!("{}: not pinned to an image digest", spec.reference)));
    };
    check_digest(digest, &spec.reference)?;
    let named = parse_reference(&spec.reference)?;
    let by_digest = Reference::with_digest(named.registry().to_owned(), named.repository().to_owned(), digest.clone());
    let auth = auth_for(&named, ctx.credentials.as_ref())?;
    let registry = block_on(ctx, Registry::connect(&ctx.network, &by_digest, &auth, &spec.reference))?;
    let puller = Puller { ctx, registry: &registry, name: &spec.reference };

    let top = puller.manifest(digest)?;
    let (image, platform_manifest) = if top.is_index() {
        let entry = select_platform(&top, &spec.platform, &spec.reference)?;
        check_digest(&entry.digest, &spec.reference)?;
        let image = puller.manifest(&entry.digest)?;
        if image.is_index() {
            return Err(UnpackError::Unsupported(format!(
                "{}: nested image indexes are not supported",
                spec.reference
            )));
        }
        (image, entry.digest.clone())
    } else {
        (top, String::new())
    };
    if image.layers.is_empty() {
        return Err(UnpackError::Unsupported(format!("{}: the image has no layers", spec.reference)));
    }
    // Refuse unsupported layers before writing anything.
    let mut layers = Vec::with_capacity(image.layers.len());
    for layer in &image.layers {
        check_digest(&layer.digest, &spec.reference)?;
        if let Some(encoding) =
            layer_encoding(&layer.media_type, &format!("{} layer {}", spec.reference, layer.digest))?
        {
            layers.push((layer, encoding));
        }
    }
    let mut layer_sink = layers::LayerSink::new(sink);
    for (layer, encoding) in layers.into_iter().rev() {
        ctx.check_cancelled()?;
        puller.layer(layer, encoding, &mut layer_sink)?;
        layer_sink.finish_layer();
    }
    Ok(ResolvedSource::image(&spec.reference, digest.clone(), platform_manifest))
}

/// How many more bytes of a layer are read after its archive failed, to tell tampering apart
/// from a broken archive.
const MAX_READ_AFTER_ERROR: u64 = 16 << 20;

/// One image's pulls, all from the same repository with the same credentials.
struct Puller<'a> {
    ctx: &'a SourceContext,
    /// The image's repository.
    registry: &'a Registry,
    /// The reference as the user wrote it, for messages.
    name: &'a str,
}

impl Puller<'_> {
    /// The manifest or index `digest`, its bytes checked against the digest.
    fn manifest(&self, digest: &str) -> Result<Manifest, UnpackError> {
        let what = format!("{} manifest {digest}", self.name);
        let bytes = block_on(self.ctx, self.registry.manifest(digest, &what))?;
        let actual = format!("sha256:{}", hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&bytes)));
        if actual != digest {
            return Err(UnpackError::DigestMismatch { what, expected: digest.to_owned(), actual });
        }
        self.ctx.budget.add_downloaded(bytes.len() as u64);
        Manifest::parse(&bytes, &what)
    }

    /// Streams one layer into `sink`, then checks its size and digest. With a download spool the
    /// layer is read from it as far as an earlier attempt got, and kept there once verified.
    fn layer(
        &self,
        layer: &Descriptor,
        encoding: tar_ingest::Encoding,
        sink: &mut layers::LayerSink<'_, '_>,
    ) -> Result<(), UnpackError> {
        let what = format!("{} layer {}", self.name, layer.digest);
        // Only the digest: a descriptor's `urls` must never send us to other hosts.
        let digest: &str = &layer.digest;
        let Some(spool) = &self.ctx.downloads else {
            let (_, stream) = block_on(self.ctx, self.registry.blob(digest, 0, &what))?;
            return self.ingest(self.ctx.read_ahead(stream), layer, encoding, sink, &what);
        };
        let download = spool.open(&digest.replace(':', "-"), Some(layer.size), &self.ctx.scratch)?;
        let result =
            download.reader(self.rest(digest, &what)).and_then(|raw| self.ingest(raw, layer, encoding, sink, &what));
        download.settle(result)
    }

    /// The network rest of a layer's blob from an offset (`0`: the whole blob).
    fn rest<'s>(&'s self, digest: &'s str, what: &'s str) -> download_spool::OpenRest<'s> {
        Box::new(move |offset| {
            let (start, stream) = block_on(self.ctx, self.registry.blob(digest, offset, what))?;
            let body = Box::new(self.ctx.read_ahead(stream));
            Ok(if start == offset { download_spool::Rest::From(body) } else { download_spool::Rest::Whole(body) })
        })
    }

    /// Ingests the raw bytes of one layer, checking its size and digest as they flow.
    fn ingest(
        &self,
        raw: impl Read,
        layer: &Descriptor,
        encoding: tar_ingest::Encoding,
        sink: &mut layers::LayerSink<'_, '_>,
        what: &str,
    ) -> Result<(), UnpackError> {
        let raw = self.ctx.download_reader(raw);
        let mut verified = blob::VerifyingReader::new(raw, what.to_owned(), layer.digest.clone(), layer.size);
        let limits = self.ctx.limits.ingest();
        let err = match tar_ingest::ingest(&mut verified, encoding, &limits, sink) {
            Ok(_) => return verified.finish(),
            Err(e) => UnpackError::from_ingest(what, e),
        };
        if matches!(err, UnpackError::DigestMismatch { .. } | UnpackError::Cancelled) {
            return Err(err);
        }
        // A tampered blob usually surfaces first as a corrupt archive: when the rest of it is
        // short, read it and name the real cause.
        Err(verified.mismatch_within(MAX_READ_AFTER_ERROR).unwrap_or(err))
    }
}
