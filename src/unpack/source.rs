//! What every source needs to know: its spec (from `Bundle.spec.sources[]`), the context a fetch
//! runs in (network policy, credentials, limits, cancellation), and the pinned identity a fetch
//! resolves to (`Bundle.status.resolvedSources[]`).
//!
//! A source has two operations: `resolve` (metadata only: what a floating tag, branch or URL
//! points at now) and `fetch` (stream exactly that pinned content into an [`EntrySink`]). `fetch`
//! is synchronous and runs on a blocking thread; it reaches async clients through
//! [`SourceContext::runtime`] (`block_on`, `ReadAhead`).

use std::io::Read;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

pub use crate::api::{GitRef, GitSource, HttpSource, ImageSource, ResolvedSource, Source};

use super::download_spool::Spool;
use super::error::UnpackError;
use super::read_ahead::ReadAhead;
use super::tar_ingest::IngestLimits;
use super::EntrySink;
use crate::storage::{Store, WriteKind};

/// The sink every source writes into: errors are [`UnpackError`]s.
pub type Sink<'a> = dyn EntrySink<Error = UnpackError> + 'a;

/// Credentials for one source, taken from its Secret (or `--registry-config`, or
/// `--source-credentials`). Compared to tell whether refused credentials were replaced.
#[derive(Clone, PartialEq, Eq)]
pub enum Credentials {
    /// `username`/`password` keys of a basic-auth (or Opaque) Secret.
    Basic { username: String, password: String },
    /// The `token` key of a Secret: sent as `Authorization: Bearer`.
    Bearer(String),
    /// A docker config file's bytes (`.dockerconfigjson`, or the `--registry-config` file):
    /// `{"auths": {"host[:port]": {"auth": base64(user:pass)} | {"username", "password"}}}`.
    DockerConfig(Vec<u8>),
}

impl std::fmt::Debug for Credentials {
    // Never print secrets, not even in debug logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credentials::Basic { username, .. } => write!(f, "Basic({username}, <redacted>)"),
            Credentials::Bearer(_) => f.write_str("Bearer(<redacted>)"),
            Credentials::DockerConfig(_) => f.write_str("DockerConfig(<redacted>)"),
        }
    }
}

/// Which hosts may be reached without TLS, and which certificate authorities are trusted besides
/// the system's; everything else is https with verified certificates.
#[derive(Clone, Debug, Default)]
pub struct NetworkPolicy {
    /// `HOST:PORT` of registries reached over plain http (`--insecure-registry`).
    pub insecure_registries: Vec<String>,
    /// `HOST:PORT` of git and http sources reached over plain http (`--insecure-source-host`).
    pub insecure_hosts: Vec<String>,
    /// A PEM bundle of extra CAs for every source (`--source-ca-file`), read at each client
    /// build ([`super::trust::extra_roots`]).
    pub source_ca_file: Option<PathBuf>,
}

impl NetworkPolicy {
    /// Whether a plain-http URL to `host_port` may be used by git and http sources.
    pub fn allows_plain_http(&self, host_port: &str) -> bool {
        self.insecure_hosts.iter().any(|h| h.eq_ignore_ascii_case(host_port))
    }
}

/// Limits on what one Bundle may unpack to, across all of its sources.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnpackLimits {
    /// Total bytes of all files.
    pub max_total_bytes: u64,
    /// Number of files, symlinks and directories (the entries stored).
    pub max_files: u64,
    /// Bytes of any single file.
    pub max_file_bytes: u64,
    /// Bytes of a path (after the destination prefix).
    pub max_path_bytes: usize,
    /// Unpacked bytes per downloaded (compressed) byte, checked once past 1 MiB unpacked.
    pub max_expansion_ratio: u64,
    /// Bytes one git fetch may download (its packs, over all attempts), and so put on disk.
    pub max_git_fetch_bytes: u64,
    /// Bytes of any one git object (a file): gix holds an object whole in memory while it
    /// checks a received pack and while it reads the object back, so this bounds that memory.
    pub max_git_file_bytes: u64,
}

impl Default for UnpackLimits {
    fn default() -> Self {
        UnpackLimits {
            max_total_bytes: 64 << 30,
            max_files: 1_000_000,
            max_file_bytes: 16 << 30,
            max_path_bytes: 4096,
            max_expansion_ratio: 250,
            max_git_fetch_bytes: 1 << 30,
            max_git_file_bytes: 256 << 20,
        }
    }
}

impl UnpackLimits {
    /// Per-archive limits for [`super::tar_ingest::ingest`].
    pub fn ingest(&self) -> IngestLimits {
        IngestLimits {
            max_unpacked_bytes: self.max_total_bytes,
            // Directories and headers count as entries too: leave room beyond the file limit.
            max_entries: self.max_files.saturating_mul(4).max(1024),
            max_path_bytes: self.max_path_bytes,
        }
    }
}

/// Bytes downloaded so far for one unpack, for the expansion-ratio limit.
#[derive(Debug, Default)]
pub struct Budget {
    downloaded: AtomicU64,
}

impl Budget {
    pub fn add_downloaded(&self, n: u64) {
        self.downloaded.fetch_add(n, Ordering::Relaxed);
    }
    pub fn downloaded(&self) -> u64 {
        self.downloaded.load(Ordering::Relaxed)
    }
}

/// Everything a fetch runs with.
#[derive(Clone)]
pub struct SourceContext {
    /// Handle of the async runtime, for `block_on` and `ReadAhead` from the blocking thread.
    pub runtime: tokio::runtime::Handle,
    /// Cancelled when the spec changes, the Bundle goes away or the server stops: stop promptly
    /// and return [`UnpackError::Cancelled`].
    pub cancel: CancellationToken,
    pub network: Arc<NetworkPolicy>,
    /// From the source's Secret; without one, the `--registry-config` file (images) or the
    /// `--source-credentials` entry for the host (git and http).
    pub credentials: Option<Credentials>,
    pub limits: UnpackLimits,
    pub budget: Arc<Budget>,
    /// Where temporary files go (git packs).
    pub scratch: Scratch,
    /// Where image layers and http files are spooled as they download, so that a later attempt
    /// resumes them ([`super::download_spool`]); `None`: not spooled.
    pub downloads: Option<Spool>,
}

/// Where a source keeps temporary files (the packs of a git fetch): normally `DATA_DIR/tmp/git`,
/// on the data directory's filesystem, where its free-space reserve is checked as they grow.
#[derive(Clone)]
pub struct Scratch {
    pub dir: PathBuf,
    /// The store whose free-space reserve (`--min-free-bytes`) temporary files must leave free.
    pub space: Option<Store>,
}

impl Default for Scratch {
    /// The system temp dir, unguarded (tests calling sources directly).
    fn default() -> Self {
        Scratch { dir: std::env::temp_dir().join("stowage-git"), space: None }
    }
}

impl Scratch {
    /// `Err` with the reason once the data directory is below its free-space reserve.
    pub fn check_space(&self) -> Result<(), UnpackError> {
        self.check_room_for(0)
    }

    /// Like [`Scratch::check_space`], for `bytes` about to be written.
    pub fn check_room_for(&self, bytes: u64) -> Result<(), UnpackError> {
        match &self.space {
            Some(store) => store.ensure_room_for(WriteKind::Content, bytes).map_err(UnpackError::Storage),
            None => Ok(()),
        }
    }
}

impl SourceContext {
    /// Fails with [`UnpackError::Cancelled`] once cancelled.
    pub fn check_cancelled(&self) -> Result<(), UnpackError> {
        if self.cancel.is_cancelled() {
            Err(UnpackError::Cancelled)
        } else {
            Ok(())
        }
    }

    /// A source's byte stream read ahead of the blocking thread that ingests it ([`ReadAhead`]:
    /// the network keeps a few batches ahead instead of taking turns with the reader), failing
    /// with [`UnpackError::Cancelled`] once the context is cancelled, also while the server is
    /// slow to send the next bytes.
    pub fn read_ahead<S>(&self, stream: S) -> ReadAhead
    where
        S: futures_util::Stream<Item = std::io::Result<bytes::Bytes>> + Send + Unpin + 'static,
    {
        let cancellable = futures_util::stream::unfold(Some((stream, self.cancel.clone())), |state| async move {
            let (mut stream, cancel) = state?;
            tokio::select! {
                biased;
                () = cancel.cancelled() => Some((Err(UnpackError::Cancelled.into_io()), None)),
                next = futures_util::StreamExt::next(&mut stream) => next.map(|item| (item, Some((stream, cancel)))),
            }
        });
        ReadAhead::spawn(&self.runtime, cancellable)
    }

    /// Wraps a reader of downloaded (still compressed) bytes: counts them for the expansion-ratio
    /// limit and stops with [`UnpackError::Cancelled`] (as an io error, see
    /// [`UnpackError::from_io`]) once the context is cancelled.
    pub fn download_reader<R: Read>(&self, inner: R) -> DownloadReader<R> {
        DownloadReader { inner, budget: self.budget.clone(), cancel: self.cancel.clone() }
    }
}

/// See [`SourceContext::download_reader`].
pub struct DownloadReader<R> {
    inner: R,
    budget: Arc<Budget>,
    cancel: CancellationToken,
}

impl<R: Read> Read for DownloadReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.cancel.is_cancelled() {
            return Err(UnpackError::Cancelled.into_io());
        }
        let n = self.inner.read(buf)?;
        self.budget.add_downloaded(n as u64);
        Ok(n)
    }
}

/// Hashes (SHA-256) every byte read through it: a download, or an upload's bytes, checked against
/// the digest its sender named once they are all read.
pub struct HashingReader<R> {
    inner: R,
    sha: sha2::Sha256,
}

impl<R> HashingReader<R> {
    pub fn new(inner: R) -> HashingReader<R> {
        HashingReader { inner, sha: sha2::Digest::new() }
    }

    /// The hex SHA-256 of the bytes read so far.
    pub fn hex_digest(&self) -> String {
        hex::encode(sha2::Digest::finalize(self.sha.clone()))
    }
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        sha2::Digest::update(&mut self.sha, buf.get(..n).unwrap_or_default());
        Ok(n)
    }
}
