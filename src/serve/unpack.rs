//! Flags of the unpacker: registries and hosts, credentials, concurrency and content limits.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::unpack::download_spool::Downloads;
use crate::unpack::metrics::UnpackMetrics;
use crate::unpack::reconcile::ReconcilerConfig;
use crate::unpack::secrets::{CredentialSource, SecretStore};
use crate::unpack::{NetworkPolicy, UnpackLimits};

#[derive(Clone, Debug, clap::Args)]
pub struct UnpackOptions {
    /// A docker config file (`{"auths": {…}}`) with registry credentials, for images without a
    /// `pullSecret`; re-read at every pull.
    #[arg(long, value_name = "FILE")]
    pub registry_config: Option<PathBuf>,
    /// Per-host credentials for git and http sources without an `authSecret`: YAML or JSON,
    /// `{"hosts": {"HOST[:PORT]": {"username": …, "password": …} | {"token": …}}}`; re-read at
    /// every attempt.
    #[arg(long, value_name = "FILE")]
    pub source_credentials: Option<PathBuf>,
    /// A PEM bundle of certificate authorities trusted, besides the system's, by every source
    /// (registries, git, http); re-read at every attempt.
    #[arg(long, value_name = "FILE")]
    pub source_ca_file: Option<PathBuf>,
    /// A registry reached over plain http instead of https (repeatable).
    #[arg(long, value_name = "HOST:PORT")]
    pub insecure_registry: Vec<String>,
    /// A git or http source host that may be reached over plain http (repeatable).
    #[arg(long, value_name = "HOST:PORT")]
    pub insecure_source_host: Vec<String>,
    /// Unpacks running at once.
    #[arg(long, default_value_t = 4)]
    pub unpack_concurrency: usize,
    /// Largest total size of one Bundle's files, uploaded or pulled (compression-bomb limit).
    #[arg(long, default_value_t = UnpackLimits::default().max_total_bytes)]
    pub max_unpacked_bytes: u64,
    /// Most files, symlinks and directories in one Bundle.
    #[arg(long, default_value_t = UnpackLimits::default().max_files)]
    pub max_files: u64,
    /// Largest single file in bytes.
    #[arg(long, default_value_t = UnpackLimits::default().max_file_bytes)]
    pub max_file_bytes: u64,
    /// Longest path in bytes.
    #[arg(long, default_value_t = UnpackLimits::default().max_path_bytes)]
    pub max_path_bytes: usize,
    /// Most unpacked bytes per downloaded or uploaded byte (checked past 1 MiB).
    #[arg(long, default_value_t = UnpackLimits::default().max_expansion_ratio)]
    pub max_expansion_ratio: u64,
    /// Most bytes one git fetch may download (and keep on disk under DATA_DIR/tmp/git).
    #[arg(long, default_value_t = UnpackLimits::default().max_git_fetch_bytes)]
    pub max_git_fetch_bytes: u64,
    /// Largest file of a git source: each is held whole in memory while its pack is checked.
    #[arg(long, default_value_t = UnpackLimits::default().max_git_file_bytes)]
    pub max_git_file_bytes: u64,
}

impl UnpackOptions {
    pub fn limits(&self) -> UnpackLimits {
        UnpackLimits {
            max_total_bytes: self.max_unpacked_bytes,
            max_files: self.max_files,
            max_file_bytes: self.max_file_bytes,
            max_path_bytes: self.max_path_bytes,
            max_expansion_ratio: self.max_expansion_ratio.max(1),
            max_git_fetch_bytes: self.max_git_fetch_bytes,
            max_git_file_bytes: self.max_git_file_bytes,
        }
    }

    /// The reconciler's configuration; empties `DATA_DIR/tmp/git` (what a crash left behind).
    pub fn reconciler(
        &self,
        cluster: Option<kube::Client>,
        data_dir: &Path,
        metrics: UnpackMetrics,
        events: crate::events::EventRecorder,
    ) -> ReconcilerConfig {
        let scratch_dir = data_dir.join("tmp").join("git");
        crate::unpack::git::clean_scratch(&scratch_dir);
        ReconcilerConfig {
            concurrency: self.unpack_concurrency.max(1),
            limits: self.limits(),
            network: Arc::new(NetworkPolicy {
                insecure_registries: self.insecure_registry.clone(),
                insecure_hosts: self.insecure_source_host.clone(),
                source_ca_file: self.source_ca_file.clone(),
            }),
            credentials: CredentialSource {
                secrets: cluster.map_or(SecretStore::None, SecretStore::Cluster),
                registry_config: self.registry_config.clone(),
                source_credentials: self.source_credentials.clone(),
            },
            scratch_dir,
            downloads: Downloads::new(data_dir.join("tmp").join("downloads")),
            metrics,
            events,
        }
    }
}
