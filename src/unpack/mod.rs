//! Untrusted archives in, validated file trees out.
//!
//! [`tar_ingest`] reads an uploaded tar (optionally gzip or zstd), rejects anything unsafe or
//! malformed, and hands each accepted entry to an [`EntrySink`] (in practice a storage revision
//! writer). Later sources (OCI images, git, http) feed the same sink.

pub mod tar_ingest;

use std::io::Read;

/// Receives the entries of a validated archive. Paths are relative, normalised (`a/b/c`, no `.`,
/// `..`, leading `/` or trailing `/`), unique, and never both a file and a directory.
pub trait EntrySink {
    type Error: std::error::Error + Send + Sync + 'static;
    /// A regular file; `data` yields exactly its bytes.
    fn file(&mut self, path: &str, executable: bool, data: &mut dyn Read) -> Result<(), Self::Error>;
    /// A symbolic link whose target stays inside the tree (already checked).
    fn symlink(&mut self, path: &str, target: &str) -> Result<(), Self::Error>;
    /// A hard link to an earlier regular file `target` of the same archive: stored as a copy.
    fn hardlink(&mut self, path: &str, target: &str) -> Result<(), Self::Error>;
}
