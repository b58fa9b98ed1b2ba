//! One entry of a revision: a regular file, a symlink or a directory the archive named, with its
//! permission bits. Entries are stored in the revision's manifest ([`super::manifest`], which
//! records the kind and the mode of each) and served as the deterministic tar ([`super::tarfmt`]).

use super::manifest::ChunkList;
use super::tarfmt;

/// What an entry of a revision is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryKind {
    File,
    Symlink,
    /// A directory the archive named (its path ends with `/`); directories only implied by the
    /// paths of their contents are not entries.
    Directory,
}

/// The permission bits an entry keeps (setuid, setgid and sticky are never kept).
pub const PERMISSION_BITS: u32 = 0o777;

/// One entry (regular file, symlink or directory) of a revision.
#[derive(Clone, Debug)]
pub struct FileEntry {
    /// Relative path; a directory's ends with `/` (so it sorts right before its contents).
    pub path: String,
    pub kind: EntryKind,
    /// The target of a symlink (`None` for anything else).
    pub target: Option<String>,
    /// Permission bits (at most [`PERMISSION_BITS`]); a symlink is served as 0777 whatever this is.
    pub mode: u32,
    pub size: u64,
    /// Hex sha256 of the file's bytes (of the target string for symlinks, of nothing for
    /// directories).
    pub sha256: String,
    /// Offset of this entry's header in the served tar; set when the revision is finalized.
    pub tar_offset: u64,
    /// Where a regular file's chunk list is.
    pub(crate) chunks: ChunkList,
}

impl FileEntry {
    pub fn is_symlink(&self) -> bool {
        self.kind == EntryKind::Symlink
    }

    pub fn is_dir(&self) -> bool {
        self.kind == EntryKind::Directory
    }

    /// Unix permission bits as served.
    pub fn mode(&self) -> u32 {
        match self.kind {
            EntryKind::Symlink => 0o777,
            EntryKind::File | EntryKind::Directory => self.mode & PERMISSION_BITS,
        }
    }

    /// Bytes of data the entry carries in the tar (none for a symlink or a directory).
    pub(super) fn data_size(&self) -> u64 {
        match self.kind {
            EntryKind::File => self.size,
            EntryKind::Symlink | EntryKind::Directory => 0,
        }
    }

    /// Data plus padding to the next tar block.
    pub(super) fn tar_data_len(&self) -> u64 {
        tarfmt::padded(self.data_size())
    }

    pub(super) fn header_spec(&self) -> tarfmt::HeaderSpec<'_> {
        let kind = match self.kind {
            EntryKind::File => tarfmt::Kind::File { size: self.size },
            EntryKind::Symlink => tarfmt::Kind::Symlink(self.target.as_deref().unwrap_or_default()),
            EntryKind::Directory => tarfmt::Kind::Directory,
        };
        tarfmt::HeaderSpec { path: &self.path, kind, mode: self.mode() }
    }
}
