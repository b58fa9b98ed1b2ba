//! What a push uploads: a directory packed as a zstd-compressed tar, a plain tar compressed with
//! zstd, both as they are sent ([`super::packer`]), or a tar.gz or tar.zst file taken as is (told
//! apart by their first bytes). Packed bytes are hashed as they are packed; a file taken as is as
//! its pieces are sent (hashing it first cost a whole read before the first byte went out). The
//! commit carries the sha256; an interrupted push is recognised when it is run again by
//! [`Archive::identity`].

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::packer::{Input, Packer, PACKING};
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

/// `dir`'s entries (not itself) in the served order: an upload in that order is laid out as it
/// arrives, without spooling (`storage::revision`).
pub(super) fn walk(dir: &Path) -> impl Iterator<Item = Result<walkdir::DirEntry, ClientError>> + '_ {
    let walk = walkdir::WalkDir::new(dir).min_depth(1).sort_by(|a, b| served_order_key(a).cmp(&served_order_key(b)));
    walk.into_iter().map(move |entry| {
        entry.map_err(|e| {
            let path = e.path().unwrap_or(dir).to_owned();
            ClientError::Io { path, source: e.into() }
        })
    })
}

/// Bytes to upload: a file sent as it is, or packed on a thread as the pieces go.
#[derive(Debug)]
pub struct Archive {
    path: PathBuf,
    identity: String,
    compression: Compression,
    bytes: Bytes,
}

#[derive(Debug)]
enum Bytes {
    /// A compressed archive file, hashed as its pieces are read ([`RunningDigest`]).
    AsIs { file: File, len: u64 },
    /// zstd packed on a thread, hashed as written.
    Packed(Packer),
}

impl Archive {
    /// `dir` as a zstd-compressed tar (symlinks kept as links), packed as it is sent.
    pub fn pack(dir: &Path) -> Result<Archive, ClientError> {
        // Packing starts first: the walk for the identity runs beside it.
        let packer = Packer::start(Input::Tree(dir.to_owned()), dir)?;
        Ok(Archive::packed(dir.to_owned(), &tree_identity(dir)?, packer))
    }

    /// Bytes `packer` packs from what `identity` names: the packing is part of their identity.
    fn packed(path: PathBuf, identity: &str, packer: Packer) -> Archive {
        let identity = format!("{identity}, packed as {PACKING}");
        Archive { path, identity, compression: Compression::Zstd, bytes: Bytes::Packed(packer) }
    }

    /// The archive file at `path`; anything but a tar, tar.gz or tar.zst is refused. A tar.gz or
    /// tar.zst is sent as it is, a plain tar compressed with zstd as it is sent.
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
        let path = path.to_owned();
        match compression {
            Compression::None => {
                (&file).seek(SeekFrom::Start(0)).map_err(io)?;
                let packer = Packer::start(Input::Tar(Box::new(file), path.clone()), &path)?;
                Ok(Archive::packed(path, &identity, packer))
            }
            _ => Ok(Archive { path, identity, compression, bytes: Bytes::AsIs { file, len: meta.len() } }),
        }
    }

    /// `sha256:<hex>` of the bytes, once known: a packed archive's when packing ended; a file's
    /// sent as it is comes from [`RunningDigest`].
    pub fn digest(&self) -> Option<String> {
        match &self.bytes {
            Bytes::AsIs { .. } => None,
            Bytes::Packed(packer) => packer.digest(),
        }
    }

    /// What tells these bytes from others across runs: for a directory, its entries' paths,
    /// kinds, modes, sizes, inodes and modification times; for a file, its path, inode, size and
    /// modification time; for bytes packed here, how they are packed. (Content changed without
    /// any of them changing is caught at the commit: the sha256 the push sends is of the bytes
    /// sent now.)
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// The length of the bytes sent, once known (a packed archive's when packing ended).
    pub fn known_len(&self) -> Option<u64> {
        match &self.bytes {
            Bytes::AsIs { len, .. } => Some(*len),
            Bytes::Packed(packer) => packer.len(),
        }
    }

    /// How the bytes sent are compressed: the upload's `Content-Encoding`.
    pub fn compression(&self) -> Compression {
        self.compression
    }

    /// Whether the digest comes from [`RunningDigest`] (the bytes are not hashed as packed).
    pub(super) fn needs_running_digest(&self) -> bool {
        matches!(self.bytes, Bytes::AsIs { .. })
    }

    /// Up to `len` bytes from `offset`, waiting for them to be packed: fewer at the end, none past it.
    pub(super) async fn piece(&self, offset: u64, len: u64) -> Result<Vec<u8>, ClientError> {
        match &self.bytes {
            Bytes::AsIs { len: total, .. } => {
                let end = offset.saturating_add(len).min(*total);
                let mut piece = vec![0u8; usize::try_from(end.saturating_sub(offset)).unwrap_or(0)];
                self.read_exact_at(&mut piece, offset)?;
                Ok(piece)
            }
            Bytes::Packed(packer) => packer.piece(offset, len).await,
        }
    }

    /// All the bytes, piece by piece.
    #[cfg(test)]
    pub(super) async fn whole(&self) -> Result<Vec<u8>, ClientError> {
        let mut all = Vec::new();
        loop {
            let piece = self.piece(all.len() as u64, u64::MAX / 2).await?;
            if piece.is_empty() {
                return Ok(all);
            }
            all.extend_from_slice(&piece);
        }
    }

    /// Reads `buf.len()` bytes at `offset` of a file sent as it is.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> Result<(), ClientError> {
        let io = |source| ClientError::Io { path: self.path.clone(), source };
        match &self.bytes {
            Bytes::AsIs { file, .. } => file.read_exact_at(buf, offset).map_err(io),
            Bytes::Packed(_) => Err(io(std::io::Error::other("a packed archive is hashed as it is packed"))),
        }
    }
}

/// A directory's identity: the sha256 of what a walk sees of each entry, without reading files.
fn tree_identity(dir: &Path) -> Result<String, ClientError> {
    use std::os::unix::ffi::OsStrExt;
    let mut sha = Sha256::new();
    for entry in walk(dir) {
        let entry = entry?;
        let io = |source| ClientError::Io { path: entry.path().to_owned(), source };
        let meta = entry.metadata().map_err(|e| io(e.into()))?;
        let target = match meta.file_type().is_symlink() {
            true => std::fs::read_link(entry.path()).map_err(io)?,
            false => PathBuf::new(),
        };
        let name = entry.path().strip_prefix(dir).unwrap_or(entry.path());
        sha.update(name.as_os_str().as_bytes());
        sha.update([0]);
        sha.update(target.as_os_str().as_bytes());
        let stat = [meta.mode().into(), meta.len(), meta.ino(), meta.mtime() as u64, meta.mtime_nsec() as u64];
        for field in stat {
            sha.update(field.to_le_bytes());
        }
    }
    let shown = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_owned());
    Ok(format!("directory {} entries sha256:{}", shown.display(), hex::encode(sha.finalize())))
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

    /// `sha256:<hex>` of the whole archive (a file sent as it is).
    pub fn finish(mut self, archive: &Archive) -> Result<String, ClientError> {
        self.catch_up(archive, archive.known_len().unwrap_or(0))?;
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
            archive.read_exact_at(chunk, self.hashed)?;
            self.sha.update(&*chunk);
            self.hashed += want as u64;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

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

    /// However the pieces of a file taken as is went (in order, resumed part way, a piece
    /// re-sent after a failure, none sent), the digest is the file's sha256; its identity changes
    /// with its bytes.
    #[tokio::test]
    async fn a_files_digest_is_its_sha256_however_its_pieces_went() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.tar.zst");
        let mut tar = tar::Builder::new(Vec::new());
        let data = crate::tests::noise(7, 3_000_000);
        let mut header = tar::Header::new_gnu();
        header.set_size(data.len() as u64);
        header.set_cksum();
        tar.append_data(&mut header, "a", &data[..]).unwrap();
        std::fs::write(&path, zstd::encode_all(&tar.into_inner().unwrap()[..], 1).unwrap()).unwrap();
        let archive = Archive::open(&path).unwrap();
        assert_eq!(archive.compression(), Compression::Zstd);
        assert_eq!(archive.digest(), None, "not hashed before sending");
        let want = format!("sha256:{}", hex::encode(Sha256::digest(std::fs::read(&path).unwrap())));
        let (m, len) = (1u64 << 20, archive.known_len().unwrap());
        assert!(len > 2 * m, "{len}");
        let plans: [&[(u64, u64)]; 4] = [
            &[(0, m), (m, m), (2 * m, len - 2 * m)],
            &[(m + 7, m), (2 * m + 7, len - 2 * m - 7)],
            &[(0, m), (m, m), (m / 2, m), (3 * m / 2, len - 3 * m / 2)],
            &[],
        ];
        for plan in plans {
            let mut running = RunningDigest::new();
            for &(offset, len) in plan {
                running.piece(&archive, offset, &archive.piece(offset, len).await.unwrap()).unwrap();
            }
            assert_eq!(running.finish(&archive).unwrap(), want, "{plan:?}");
        }
        std::fs::OpenOptions::new().append(true).open(&path).unwrap().write_all(&[0u8; 512]).unwrap();
        assert_ne!(Archive::open(&path).unwrap().identity(), archive.identity());
    }

    /// A plain tar goes out zstd-compressed, the same bytes on every run (a push run again takes
    /// up its session), hashed as packed.
    #[tokio::test]
    async fn a_plain_tar_is_sent_compressed_the_same_every_time() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.tar");
        let mut tar = tar::Builder::new(Vec::new());
        for i in 0..40u32 {
            let data = format!("kind: ConfigMap\nmetadata:\n  name: c{i}\n").repeat(2_000);
            let mut header = tar::Header::new_gnu();
            header.set_size(data.len() as u64);
            header.set_cksum();
            tar.append_data(&mut header, format!("m/{i}.yaml"), data.as_bytes()).unwrap();
        }
        let tar = tar.into_inner().unwrap();
        std::fs::write(&path, &tar).unwrap();
        let mut sent = Vec::new();
        for _ in 0..2 {
            let archive = Archive::open(&path).unwrap();
            assert_eq!(archive.compression(), Compression::Zstd);
            let bytes = archive.whole().await.unwrap();
            assert_eq!(archive.known_len(), Some(bytes.len() as u64));
            let digest = format!("sha256:{}", hex::encode(Sha256::digest(&bytes)));
            assert_eq!(archive.digest(), Some(digest));
            assert!(archive.piece(bytes.len() as u64, 10).await.unwrap().is_empty(), "nothing past the end");
            assert!(zstd::decode_all(&bytes[..]).unwrap() == tar, "decodes to the tar");
            assert!(bytes.len() * 20 < tar.len(), "compressed: {} of {}", bytes.len(), tar.len());
            sent.push((archive.identity().to_string(), bytes));
        }
        assert!(sent[0] == sent[1], "the same identity and bytes on every run");
    }

    /// A pushed directory's tar lists its entries in the served order (so it is not spooled):
    /// `a-b` and `a.d/` before `a/`, unlike a walk of the tree. Its identity changes when an
    /// entry does.
    #[tokio::test]
    async fn a_packed_directory_is_in_path_order() {
        let dir = tempfile::tempdir().unwrap();
        for d in ["a/x", "a.d"] {
            std::fs::create_dir_all(dir.path().join(d)).unwrap();
        }
        for f in ["a/x/f", "a/z", "a-b", "a.d/y", "b"] {
            std::fs::write(dir.path().join(f), f).unwrap();
        }
        std::os::unix::fs::symlink("b", dir.path().join("a/link")).unwrap();
        let archive = Archive::pack(dir.path()).unwrap();
        let tar = zstd::decode_all(&archive.whole().await.unwrap()[..]).unwrap();
        let mut names = Vec::new();
        for entry in tar::Archive::new(&tar[..]).entries().unwrap() {
            let entry = entry.unwrap();
            let slash = if entry.header().entry_type().is_dir() { "/" } else { "" };
            names.push(format!("{}{slash}", entry.path().unwrap().display()));
        }
        assert_eq!(names, ["a-b", "a.d/", "a.d/y", "a/", "a/link", "a/x/", "a/x/f", "a/z", "b"]);
        assert_eq!(Archive::pack(dir.path()).unwrap().identity(), archive.identity());
        assert!(archive.identity().ends_with(PACKING), "names how it is packed: {}", archive.identity());
        std::fs::write(dir.path().join("a/z"), "longer").unwrap();
        assert_ne!(Archive::pack(dir.path()).unwrap().identity(), archive.identity());
    }
}
