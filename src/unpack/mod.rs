//! Untrusted content in, validated file trees out.
//!
//! [`tar_ingest`] reads a tar (optionally gzip or zstd), rejects anything unsafe or malformed, and
//! hands each accepted entry to an [`EntrySink`] (in practice a storage revision writer). The
//! sources — OCI images ([`oci`]), git ([`git`]) and http ([`http`]) — resolve a Bundle's floating
//! references (a tag range through [`crate::api::versions`]) and stream their content into the
//! same kind of sink; [`source`] holds what they share, [`error`] how they fail, [`trust`] and
//! [`source_credentials`] the extra CAs and per-host credentials an operator gives every source,
//! and [`download_spool`] what they downloaded, so an interrupted unpack resumes where it stopped.
//! Every source writes through a [`sink::TreeSink`] (limits,
//! destinations, the [`format`] inspector) into a storage revision that [`revisions`] attaches to
//! a BundleContent; [`reconcile`] is the loop that drives Bundles, writing their status.

pub mod download_spool;
pub mod error;
pub mod format;
pub mod git;
pub mod http;
pub mod metrics;
pub mod oci;
pub mod read_ahead;
pub mod reconcile;
pub mod releases;
pub mod revisions;
pub mod secrets;
pub mod sink;
pub mod source;
pub mod source_credentials;
pub mod tar_ingest;
pub mod trust;

use std::io::Read;

pub use error::UnpackError;
pub use source::{Credentials, NetworkPolicy, ResolvedSource, Source, SourceContext, UnpackLimits};

/// Receives the entries of a validated archive. Paths are relative, normalised (`a/b/c`, no `.`,
/// `..`, leading `/` or trailing `/`), unique, and never both a file and a directory. Modes are
/// permission bits only (`mode & 0o777`: setuid, setgid and sticky are dropped).
pub trait EntrySink {
    type Error: std::error::Error + Send + Sync + 'static;
    /// A regular file of `size` bytes with permission bits `mode`; `data` yields exactly its bytes.
    fn file(&mut self, path: &str, mode: u32, size: u64, data: &mut dyn Read) -> Result<(), Self::Error>;
    /// A directory the archive names, once (directories only implied by their contents' paths
    /// are not reported; an empty directory is reported), in any order relative to its contents.
    fn dir(&mut self, path: &str, mode: u32) -> Result<(), Self::Error>;
    /// A symbolic link whose target stays inside the tree (already checked).
    fn symlink(&mut self, path: &str, target: &str) -> Result<(), Self::Error>;
    /// A hard link to an earlier regular file (or hard link, itself a copy) `target` of the same
    /// archive: stored as a copy.
    fn hardlink(&mut self, path: &str, target: &str) -> Result<(), Self::Error>;
}
