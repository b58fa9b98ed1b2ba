//! What a push uploads: a directory packed as a zstd-compressed tar, or an archive file taken as is
//! (tar, tar.gz, tar.zst, told apart by their first bytes). A packed directory is hashed as it is
//! packed; a file as its pieces are sent (hashing it first cost a whole read before the first
//! byte went out). The commit carries the sha256; an interrupted push is recognised when it is run
//! again by [`Archive::identity`].

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::ClientError;

/// How an archive's tar is compressed: its upload's `Content-Encoding`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
    Zstd,
}

impl Compression {
    /// The archive kind its first bytes name (at least 512 for a plain tar), if it is one.
    pub fn sniff(head: &[u8]) -> Option<Compression> {
        match head {
            [0x1f, 0x8b, ..] => Some(Compression::Gzip),
            [0x28, 0xb5, 0x2f, 0xfd, ..] => Some(Compression::Zstd),
            _ if is_tar_header(head) => Some(Compression::None),
            _ => None,
        }
    }

    /// The `Content-Encoding` the server reads it with (none for a plain tar).
    pub fn content_encoding(self) -> Option<&'static str> {
        match self {
            Compression::None => None,
            Compression::Gzip => Some("gzip"),
            Compression::Zstd => Some("zstd"),
        }
    }
}

/// A tar header block: `ustar` magic (POSIX and GNU), or failing that a valid checksum (v7 tars).
fn is_tar_header(head: &[u8]) -> bool {
    let Some(block) = head.get(..512) else { return false };
    if block.get(257..262) == Some(b"ustar") {
        return true;
    }
    let stored = block.get(148..156).and_then(|field| {
        let text = std::str::from_utf8(field).ok()?.trim_matches(|c: char| c == '\0' || c == ' ');
        u32::from_str_radix(text, 8).ok()
    });
    // The checksum counts its own field as eight spaces.
    let sum: u32 =
        block.iter().enumerate().map(|(i, b)| if (148..156).contains(&i) { 32 } else { u32::from(*b) }).sum();
    stored == Some(sum) && block.iter().any(|b| *b != 0)
}

/// Where a directory entry sorts among its siblings in the served order: by name, a
/// directory's as if it ended in `/` (so `a-b` and `a.d` before the directory `a`).
fn served_order_key(entry: &walkdir::DirEntry) -> Vec<u8> {
    use std::os::unix::ffi::OsStrExt;
    let mut key = entry.file_name().as_bytes().to_vec();
    if entry.file_type().is_dir() {
        key.push(b'/');
    }
    key
}

/// Bytes ready to upload.
#[derive(Debug)]
pub struct Archive {
    file: File,
    path: PathBuf,
    /// `sha256:<hex>`, when known before sending (a packed directory).
    digest: Option<String>,
    identity: String,
    len: u64,
    compression: Compression,
}

/// zstd worker threads packing a directory, at most.
const PACK_WORKERS: usize = 4;

impl Archive {
    /// `dir` as a zstd-compressed tar in an anonymous temporary file (symlinks kept as links).
    pub fn pack(dir: &Path) -> Result<Archive, ClientError> {
        let path = std::env::temp_dir().join(format!("stowage-push-{}", uuid::Uuid::new_v4()));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|source| ClientError::Io { path: path.clone(), source })?;
        // Unlinked at once: the open handle keeps it until the push ends, whatever happens.
        let _ = std::fs::remove_file(&path);
        let spool = |source| ClientError::Io { path: path.clone(), source };
        let hashing = Hashing { inner: std::io::BufWriter::new(file), sha: Sha256::new(), len: 0 };
        let mut encoder = zstd::Encoder::new(hashing, 3).map_err(spool)?;
        // Compressed on zstd's worker threads while this one walks and reads the tree (the output
        // is the same for any number of workers, so a resumed push finds its session).
        let workers = std::thread::available_parallelism().map_or(1, |n| n.get().min(PACK_WORKERS));
        encoder.multithread(workers as u32).map_err(spool)?;
        let mut builder = tar::Builder::new(encoder);
        builder.follow_symlinks(false);
        // In path order, the order the server serves the tree in: an upload in that order is laid
        // out as it arrives, without spooling (`storage::revision`).
        let walk =
            walkdir::WalkDir::new(dir).min_depth(1).sort_by(|a, b| served_order_key(a).cmp(&served_order_key(b)));
        for entry in walk {
            let entry = entry.map_err(|e| {
                let path = e.path().unwrap_or(dir).to_owned();
                ClientError::Io { path, source: e.into() }
            })?;
            let io = |source| ClientError::Io { path: entry.path().to_owned(), source };
            let name = entry.path().strip_prefix(dir).unwrap_or(entry.path());
            match entry.file_type().is_dir() {
                true => builder.append_dir(name, entry.path()).map_err(io)?,
                false => builder.append_path_with_name(entry.path(), name).map_err(io)?,
            }
        }
        let mut hashing = builder.into_inner().and_then(|encoder| encoder.finish()).map_err(spool)?;
        hashing.flush().map_err(spool)?;
        let digest = format!("sha256:{}", hex::encode(hashing.sha.finalize()));
        let file = hashing.inner.into_inner().map_err(|e| spool(e.into_error()))?;
        let (identity, digest) = (digest.clone(), Some(digest));
        Ok(Archive { file, path: dir.to_owned(), digest, identity, len: hashing.len, compression: Compression::Zstd })
    }

    /// The archive file at `path`, read in place; anything but a tar, tar.gz or tar.zst is refused.
    pub fn open(path: &Path) -> Result<Archive, ClientError> {
        let io = |source| ClientError::Io { path: path.to_owned(), source };
        let file = File::open(path).map_err(io)?;
        let mut head = Vec::with_capacity(512);
        (&file).take(512).read_to_end(&mut head).map_err(io)?;
        let compression = Compression::sniff(&head).ok_or_else(|| ClientError::NotAnArchive(path.to_owned()))?;
        let meta = file.metadata().map_err(io)?;
        let shown = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_owned());
        let identity = format!(
            "file {} dev {} inode {} size {} modified {}.{:09}",
            shown.display(),
            meta.dev(),
            meta.ino(),
            meta.len(),
            meta.mtime(),
            meta.mtime_nsec()
        );
        Ok(Archive { file, path: path.to_owned(), digest: None, identity, len: meta.len(), compression })
    }

    /// `sha256:<hex>` of the bytes, if known before sending them.
    pub fn digest(&self) -> Option<&str> {
        self.digest.as_deref()
    }

    /// What tells these bytes from others across runs: the sha256 of a packed directory; for a
    /// file taken as is, its path, inode, size and modification time. (A file changed in place
    /// without any of them changing is caught at the commit: the sha256 the push sends is of the
    /// bytes read now.)
    pub fn identity(&self) -> &str {
        &self.identity
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn compression(&self) -> Compression {
        self.compression
    }

    /// `len` bytes from `offset`.
    pub(super) fn read_at(&self, offset: u64, len: u64) -> Result<Vec<u8>, ClientError> {
        let mut piece = vec![0u8; len as usize];
        self.file
            .read_exact_at(&mut piece, offset)
            .map_err(|source| ClientError::Io { path: self.path.clone(), source })?;
        Ok(piece)
    }
}

/// The sha256 of an archive whose digest was not known before sending: each byte is hashed once,
/// in order, as the pieces are read; bytes the server held already (a resumed push) and any not
/// sent at all are read for it alone.
pub(super) struct RunningDigest {
    sha: Sha256,
    /// Bytes hashed so far, from the first.
    hashed: u64,
}

impl RunningDigest {
    pub fn new() -> RunningDigest {
        RunningDigest { sha: Sha256::new(), hashed: 0 }
    }

    /// `piece`, read at `offset`: its bytes not hashed yet are (the bytes before it first).
    pub fn piece(&mut self, archive: &Archive, offset: u64, piece: &[u8]) -> Result<(), ClientError> {
        self.catch_up(archive, offset)?;
        let skip = usize::try_from(self.hashed - offset).unwrap_or(usize::MAX);
        if let Some(fresh) = piece.get(skip..) {
            self.sha.update(fresh);
            self.hashed += fresh.len() as u64;
        }
        Ok(())
    }

    /// `sha256:<hex>` of the whole archive.
    pub fn finish(mut self, archive: &Archive) -> Result<String, ClientError> {
        self.catch_up(archive, archive.len())?;
        Ok(format!("sha256:{}", hex::encode(self.sha.finalize())))
    }

    fn catch_up(&mut self, archive: &Archive, to: u64) -> Result<(), ClientError> {
        if self.hashed >= to {
            return Ok(());
        }
        let mut buf = vec![0u8; 1 << 20];
        while self.hashed < to {
            let want = buf.len().min(usize::try_from(to - self.hashed).unwrap_or(usize::MAX));
            let chunk = buf.get_mut(..want).unwrap_or_default();
            archive
                .file
                .read_exact_at(chunk, self.hashed)
                .map_err(|source| ClientError::Io { path: archive.path.clone(), source })?;
            self.sha.update(&*chunk);
            self.hashed += want as u64;
        }
        Ok(())
    }
}

struct Hashing<W> {
    inner: W,
    sha: Sha256,
    len: u64,
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        // `write` never reports more than it was given.
        self.sha.update(buf.get(..n).unwrap_or(buf));
        self.len += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn archives_are_told_apart_by_their_first_bytes() {
        assert_eq!(Compression::sniff(&[0x1f, 0x8b, 8, 0]), Some(Compression::Gzip));
        assert_eq!(Compression::sniff(&[0x28, 0xb5, 0x2f, 0xfd, 0]), Some(Compression::Zstd));
        let mut tar = tar::Builder::new(Vec::new());
        let mut header = tar::Header::new_gnu();
        header.set_size(2);
        header.set_cksum();
        tar.append_data(&mut header, "a", &b"hi"[..]).unwrap();
        assert_eq!(Compression::sniff(&tar.into_inner().unwrap()), Some(Compression::None));
        let mut v7 = tar::Header::new_old();
        v7.set_path("a").unwrap();
        v7.set_cksum();
        assert_eq!(Compression::sniff(v7.as_bytes()), Some(Compression::None));
        assert_eq!(Compression::sniff(b"# a README, not an archive\n"), None);
        assert_eq!(Compression::sniff(&[0u8; 1024]), None);
    }

    /// However the pieces of a file went (in order, resumed part way, a piece re-sent after a
    /// failure, none sent), the digest is the file's sha256; its identity changes with its bytes.
    #[test]
    fn a_files_digest_is_its_sha256_however_its_pieces_went() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.tar");
        let mut tar = tar::Builder::new(Vec::new());
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        let mut header = tar::Header::new_gnu();
        header.set_size(data.len() as u64);
        header.set_cksum();
        tar.append_data(&mut header, "a", &data[..]).unwrap();
        std::fs::write(&path, tar.into_inner().unwrap()).unwrap();
        let archive = Archive::open(&path).unwrap();
        assert_eq!(archive.digest(), None, "not hashed before sending");
        let want = format!("sha256:{}", hex::encode(Sha256::digest(std::fs::read(&path).unwrap())));
        let m = 1u64 << 20;
        let plans: [&[(u64, u64)]; 4] = [
            &[(0, m), (m, m), (2 * m, archive.len() - 2 * m)],
            &[(m + 7, m), (2 * m + 7, archive.len() - 2 * m - 7)],
            &[(0, m), (m, m), (m / 2, m), (3 * m / 2, archive.len() - 3 * m / 2)],
            &[],
        ];
        for plan in plans {
            let mut running = RunningDigest::new();
            for &(offset, len) in plan {
                running.piece(&archive, offset, &archive.read_at(offset, len).unwrap()).unwrap();
            }
            assert_eq!(running.finish(&archive).unwrap(), want, "{plan:?}");
        }
        std::fs::OpenOptions::new().append(true).open(&path).unwrap().write_all(&[0u8; 512]).unwrap();
        assert_ne!(Archive::open(&path).unwrap().identity(), archive.identity());
    }

    /// A pushed directory's tar lists its entries in the served order (so it is not spooled):
    /// `a-b` and `a.d/` before `a/`, unlike a walk of the tree.
    #[test]
    fn a_packed_directory_is_in_path_order() {
        let dir = tempfile::tempdir().unwrap();
        for d in ["a/x", "a.d"] {
            std::fs::create_dir_all(dir.path().join(d)).unwrap();
        }
        for f in ["a/x/f", "a/z", "a-b", "a.d/y", "b"] {
            std::fs::write(dir.path().join(f), f).unwrap();
        }
        std::os::unix::fs::symlink("b", dir.path().join("a/link")).unwrap();
        let archive = Archive::pack(dir.path()).unwrap();
        let tar = zstd::decode_all(&archive.read_at(0, archive.len()).unwrap()[..]).unwrap();
        let mut names = Vec::new();
        for entry in tar::Archive::new(&tar[..]).entries().unwrap() {
            let entry = entry.unwrap();
            let slash = if entry.header().entry_type().is_dir() { "/" } else { "" };
            names.push(format!("{}{slash}", entry.path().unwrap().display()));
        }
        assert_eq!(names, ["a-b", "a.d/", "a.d/y", "a/", "a/link", "a/x/", "a/x/f", "a/z", "b"]);
    }
}
