//! One entry of a revision (regular file, symlink or directory) and its compact record under the
//! entry's `f` key: flags, size, sha256, chunk-list id, tar offset, then — only when needed — the
//! permission bits and the symlink target. Records of stores written before directories and modes
//! were kept decode as they were served (0755 with the executable flag, else 0644).

use super::{read_le, tarfmt, Result, StorageError};

/// What an entry of a revision is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryKind {
    File,
    Symlink,
    /// A directory the archive named (its path ends with `/`); directories only implied by the
    /// paths of their contents are not entries.
    Directory,
}

/// One entry (regular file, symlink or directory) of a revision.
#[derive(Clone, Debug)]
pub struct FileEntry {
    /// Relative path; a directory's ends with `/` (so it sorts right before its contents).
    pub path: String,
    pub kind: EntryKind,
    /// The target of a symlink (`None` for anything else).
    pub target: Option<String>,
    /// Permission bits (`0o777` at most: setuid, setgid and sticky are never kept); always
    /// `0o777` for a symlink.
    pub mode: u32,
    pub size: u64,
    /// Hex sha256 of the file's bytes (of the target string for symlinks, of nothing for
    /// directories).
    pub sha256: String,
    /// Internal id of the file's chunk list within the revision.
    pub file_id: u64,
    /// Offset of this entry's header in the served tar; set when the revision is finalized.
    pub tar_offset: u64,
}

/// The permission bits an entry keeps.
pub const PERMISSION_BITS: u32 = 0o777;

// Flags of a file record. Records written before directories and modes were kept have only the
// first two; without FLAG_MODE the mode is 0o755 with FLAG_EXECUTABLE, else 0o644 (what those
// records served), so the common modes cost no byte.
const FLAG_EXECUTABLE: u8 = 1;
const FLAG_SYMLINK: u8 = 2;
const FLAG_DIRECTORY: u8 = 4;
/// The record holds the mode (2 bytes, little-endian) after the fixed part.
const FLAG_MODE: u8 = 8;
/// flags(1) size(8) sha256(32) file_id(8) tar_offset(8), then the mode if FLAG_MODE, then the
/// symlink target.
const FILE_RECORD: usize = 1 + 8 + 32 + 8 + 8;

impl FileEntry {
    /// The compact record stored under the entry's `f` key (which holds the path).
    pub(super) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(FILE_RECORD + 2 + self.target.as_ref().map_or(0, String::len));
        let mode = self.mode & PERMISSION_BITS;
        let (kind_flag, default_mode) = match self.kind {
            EntryKind::File => (0, false),
            EntryKind::Symlink => (FLAG_SYMLINK, true),
            EntryKind::Directory => (FLAG_DIRECTORY, false),
        };
        let executable = mode & 0o100 != 0;
        let implied = if executable { 0o755 } else { 0o644 };
        let explicit = !default_mode && mode != implied;
        let flags = kind_flag
            | if executable && !default_mode { FLAG_EXECUTABLE } else { 0 }
            | if explicit { FLAG_MODE } else { 0 };
        out.push(flags);
        out.extend_from_slice(&self.size.to_le_bytes());
        let mut sha = [0u8; 32];
        // Our own hex from sha2; a malformed value cannot occur.
        let _ = hex::decode_to_slice(&self.sha256, &mut sha);
        out.extend_from_slice(&sha);
        out.extend_from_slice(&self.file_id.to_le_bytes());
        out.extend_from_slice(&self.tar_offset.to_le_bytes());
        if explicit {
            out.extend_from_slice(&(mode as u16).to_le_bytes());
        }
        if let Some(target) = self.target.as_ref().filter(|_| self.kind == EntryKind::Symlink) {
            out.extend_from_slice(target.as_bytes());
        }
        out
    }

    /// Decodes a record stored under `key` (`f`, revision, path).
    pub(super) fn decode(key: &[u8], value: &[u8]) -> Result<FileEntry> {
        let path = key.get(9..).and_then(|p| std::str::from_utf8(p).ok());
        FileEntry::decode_at(path.ok_or_else(|| StorageError::Corrupt("undecodable file key".into()))?, value)
    }

    /// Decodes the record of the entry at `path`.
    pub(super) fn decode_at(path: &str, value: &[u8]) -> Result<FileEntry> {
        let corrupt = || StorageError::Corrupt("undecodable file record".into());
        let (Some(&flags), Some(sha256)) = (value.first(), value.get(9..41)) else {
            return Err(corrupt());
        };
        let u64_at = |i: usize| value.get(i..).map_or(0, read_le);
        let kind = match (flags & FLAG_SYMLINK != 0, flags & FLAG_DIRECTORY != 0) {
            (false, false) => EntryKind::File,
            (true, false) => EntryKind::Symlink,
            (false, true) => EntryKind::Directory,
            (true, true) => return Err(corrupt()),
        };
        let (mode, rest) = if flags & FLAG_MODE != 0 {
            let bytes = value.get(FILE_RECORD..).and_then(<[u8]>::first_chunk::<2>).ok_or_else(corrupt)?;
            (u32::from(u16::from_le_bytes(*bytes)), value.get(FILE_RECORD + 2..))
        } else {
            let mode = match kind {
                EntryKind::Symlink => 0o777,
                _ if flags & FLAG_EXECUTABLE != 0 => 0o755,
                _ => 0o644,
            };
            (mode, value.get(FILE_RECORD..))
        };
        let rest = rest.ok_or_else(corrupt)?;
        let target = match kind {
            EntryKind::Symlink => Some(String::from_utf8(rest.to_vec()).map_err(|_| corrupt())?),
            _ => None,
        };
        Ok(FileEntry {
            path: path.to_string(),
            kind,
            target,
            mode: mode & PERMISSION_BITS,
            size: u64_at(1),
            sha256: hex::encode(sha256),
            file_id: u64_at(41),
            tar_offset: u64_at(49),
        })
    }

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
            _ => self.mode & PERMISSION_BITS,
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
        let kind = match (self.kind, self.target.as_deref()) {
            (EntryKind::Symlink, Some(target)) => tarfmt::Kind::Symlink(target),
            (EntryKind::Symlink, None) => tarfmt::Kind::Symlink(""),
            (EntryKind::Directory, _) => tarfmt::Kind::Directory,
            (EntryKind::File, _) => tarfmt::Kind::File { size: self.size },
        };
        tarfmt::HeaderSpec { path: &self.path, kind, mode: self.mode() }
    }
}
