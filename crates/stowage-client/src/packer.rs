//! Packing an upload on a thread while its first pieces are sent: a directory as a tar in the
//! served order, or a plain tar file as it is, compressed with zstd into an unlinked temporary file
//! and hashed as it is written. The sender waits for each piece's first bytes
//! ([`Packer::piece`]); packing before sending cost the whole packing time before the first byte
//! went out, the server idle meanwhile.
//!
//! zstd runs on the packing thread itself: with its 8 MiB window it packs faster than the server
//! takes the bytes in, and its worker threads cost more CPU (and several times the memory) on the
//! machine the server often shares. The bytes are the same on every run for the same input, so a
//! push run again takes up its session where it stopped.

use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use sha2::{Digest, Sha256};
use tokio::sync::watch;

use super::ClientError;

/// The zstd level: three times smaller than the tar for manifests, at a few hundred MB/s per core.
const LEVEL: i32 = 3;
/// zstd's window, 8 MiB (level 3's own is 2 MiB): manifest trees repeat files farther apart than
/// that (a chart's versions, a bundle's CRDs). With it the 1 GiB bench tar packs 3.4× smaller in
/// half the CPU time and decodes in half the time; the corpus packs 2.2× smaller. The server's
/// decoder takes windows up to 128 MiB.
const WINDOW_LOG: u32 = 23;
/// How bytes are packed, part of a packed archive's identity: a push interrupted under another
/// packing (an older plugin) is not taken up with bytes that differ from those it sent.
pub(super) const PACKING: &str = "zstd level 3, window 2^23";
/// Packed bytes written to the file at once (the sender is told after each write).
const WRITE_BYTES: usize = 1 << 20;

/// What is packed.
pub(super) enum Input {
    /// A directory, walked in the served order.
    Tree(PathBuf),
    /// A plain tar (a file, or any reader), compressed as it is.
    Tar(Box<dyn Read + Send>, PathBuf),
}

/// How far packing went.
#[derive(Clone, Debug)]
enum Progress {
    Written(u64),
    Done { len: u64, digest: String },
    Failed { path: PathBuf, kind: std::io::ErrorKind, message: String },
}

/// Bytes being packed on a thread; dropping it stops the thread at its next write.
#[derive(Debug)]
pub(super) struct Packer {
    file: File,
    /// The temporary file's name, in errors.
    temp: PathBuf,
    progress: watch::Receiver<Progress>,
    stop: Arc<AtomicBool>,
}

impl Packer {
    /// Starts packing `input` (`path` names it in errors).
    pub fn start(input: Input, path: &Path) -> Result<Packer, ClientError> {
        let temp = std::env::temp_dir().join(format!("stowage-push-{}", uuid::Uuid::new_v4()));
        let io = |source| ClientError::Io { path: temp.clone(), source };
        let file = std::fs::OpenOptions::new().read(true).write(true).create_new(true).open(&temp).map_err(io)?;
        // Unlinked at once: the open handles keep it until the push ends, whatever happens.
        let _ = std::fs::remove_file(&temp);
        let writer = file.try_clone().map_err(io)?;
        let (tell, progress) = watch::channel(Progress::Written(0));
        let stop = Arc::new(AtomicBool::new(false));
        let output = Output { file: writer, path: temp.clone(), sha: Sha256::new(), len: 0, tell, stop: stop.clone() };
        let named = path.to_owned();
        std::thread::Builder::new()
            .name("stowage-pack".into())
            .spawn(move || pack(input, &named, output))
            .map_err(|source| ClientError::Io { path: path.to_owned(), source })?;
        Ok(Packer { file, temp, progress, stop })
    }

    /// The packed length, once packing ended.
    pub fn len(&self) -> Option<u64> {
        match &*self.progress.borrow() {
            Progress::Done { len, .. } => Some(*len),
            _ => None,
        }
    }

    /// `sha256:<hex>` of the packed bytes, once packing ended.
    pub fn digest(&self) -> Option<String> {
        match &*self.progress.borrow() {
            Progress::Done { digest, .. } => Some(digest.clone()),
            _ => None,
        }
    }

    /// Up to `len` bytes from `offset`, as many as are packed once 1 MiB of them is: fewer at the
    /// end, none past it. A piece goes as its first bytes are ready: waiting for all of a 16 MiB
    /// piece left the server idle while compressible input (a GiB of manifests is a few dozen MiB
    /// packed) was packed, and the packer idle while it was sent.
    pub async fn piece(&self, offset: u64, len: u64) -> Result<Vec<u8>, ClientError> {
        let want = offset.saturating_add(len);
        let first = offset.saturating_add(len.min(WRITE_BYTES as u64));
        let mut progress = self.progress.clone();
        let ready = progress.wait_for(|p| !matches!(p, Progress::Written(n) if *n < first)).await;
        let end = match ready.as_deref() {
            Ok(Progress::Written(n)) => want.min(*n),
            Ok(Progress::Done { len, .. }) => want.min(*len),
            Ok(Progress::Failed { path, kind, message }) => {
                let source = std::io::Error::new(*kind, message.clone());
                return Err(ClientError::Io { path: path.clone(), source });
            }
            Err(_) => return Err(ClientError::Protocol("packing stopped".into())),
        };
        let mut piece = vec![0u8; usize::try_from(end.saturating_sub(offset)).unwrap_or(0)];
        self.file
            .read_exact_at(&mut piece, offset)
            .map_err(|source| ClientError::Io { path: self.temp.clone(), source })?;
        Ok(piece)
    }
}

impl Drop for Packer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The packed file: hashed and counted as written, the sender told after each write.
struct Output {
    file: File,
    /// The temporary file's name, in errors (a full temporary directory is not the input's fault).
    path: PathBuf,
    sha: Sha256,
    len: u64,
    tell: watch::Sender<Progress>,
    stop: Arc<AtomicBool>,
}

impl Write for Output {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.stop.load(Ordering::Relaxed) {
            return Err(std::io::Error::other("the push ended"));
        }
        let n = self.file.write(buf).inspect_err(|e| {
            let failed = Progress::Failed { path: self.path.clone(), kind: e.kind(), message: e.to_string() };
            self.tell.send_replace(failed);
        })?;
        // `write` never reports more than it was given.
        self.sha.update(buf.get(..n).unwrap_or(buf));
        self.len += n as u64;
        self.tell.send_replace(Progress::Written(self.len));
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

/// The packing thread: packs, then says how it ended.
fn pack(input: Input, path: &Path, output: Output) {
    let tell = output.tell.clone();
    let ended = match compress(input, output) {
        // A failed write of the temporary file said so already.
        Err(_) if matches!(*tell.borrow(), Progress::Failed { .. }) => return,
        Ok(output) => {
            Progress::Done { len: output.len, digest: format!("sha256:{}", hex::encode(output.sha.finalize())) }
        }
        Err(ClientError::Io { path, source }) => {
            Progress::Failed { path, kind: source.kind(), message: source.to_string() }
        }
        Err(other) => {
            Progress::Failed { path: path.to_owned(), kind: std::io::ErrorKind::Other, message: other.to_string() }
        }
    };
    tell.send_replace(ended);
}

fn compress(input: Input, output: Output) -> Result<Output, ClientError> {
    let at = |path: &Path| {
        let path = path.to_owned();
        move |source| ClientError::Io { path, source }
    };
    let out = BufWriter::with_capacity(WRITE_BYTES, output);
    let mut encoder = zstd::Encoder::new(out, LEVEL).map_err(at(Path::new("zstd")))?;
    encoder.window_log(WINDOW_LOG).map_err(at(Path::new("zstd")))?;
    let encoder = match input {
        Input::Tree(dir) => {
            // The tar's 512-byte headers and 8 KiB copies reach zstd 1 MiB at a time, not in a
            // call each.
            let mut builder = tar::Builder::new(BufWriter::with_capacity(WRITE_BYTES, encoder));
            builder.follow_symlinks(false);
            // No hole probing: four `lseek`s per file for what manifests never have.
            builder.sparse(false);
            for entry in super::archive::walk(&dir) {
                let entry = entry?;
                let name = entry.path().strip_prefix(&dir).unwrap_or(entry.path());
                let file_type = entry.file_type();
                match () {
                    _ if file_type.is_dir() => builder.append_dir(name, entry.path()),
                    _ if file_type.is_file() => append_file(&mut builder, entry.path(), name),
                    _ => builder.append_path_with_name(entry.path(), name),
                }
                .map_err(at(entry.path()))?;
            }
            let buffered = builder.into_inner().map_err(at(&dir))?;
            buffered.into_inner().map_err(|e| at(&dir)(e.into_error()))?
        }
        Input::Tar(mut file, path) => {
            copy(&mut file, &mut encoder).map_err(at(&path))?;
            encoder
        }
    };
    let out = encoder.finish().map_err(at(Path::new("zstd")))?;
    out.into_inner().map_err(|e| ClientError::Io { path: PathBuf::from("zstd"), source: e.into_error() })
}

/// A regular file's entry, its header the tar crate's own from one `fstat` of the opened file,
/// its bytes read up to 1 MiB at a time (the crate's copy reads 8 KiB at a time).
fn append_file<W: Write>(builder: &mut tar::Builder<W>, path: &Path, name: &Path) -> std::io::Result<()> {
    let file = File::open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        // Replaced since the walk saw it: packed as what it is now.
        return builder.append_path_with_name(path, name);
    }
    let mut header = tar::Header::new_gnu();
    header.set_metadata_in_mode(&meta, tar::HeaderMode::Complete);
    let capacity = usize::try_from(meta.len()).unwrap_or(usize::MAX).clamp(1, WRITE_BYTES);
    builder.append_data(
        &mut header,
        name,
        std::io::BufReader::with_capacity(capacity, Exact { file, left: meta.len() }),
    )
}

/// A file's first `left` bytes, the length its tar header says: a file that ends sooner changed
/// while it was packed, an error rather than a tar whose next header is misplaced.
struct Exact {
    file: File,
    left: u64,
}

impl Read for Exact {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.left == 0 {
            return Ok(0);
        }
        let want = buf.len().min(usize::try_from(self.left).unwrap_or(usize::MAX));
        let n = self.file.read(buf.get_mut(..want).unwrap_or_default())?;
        if n == 0 {
            let message = "the file got shorter while it was packed";
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, message));
        }
        self.left -= n as u64;
        Ok(n)
    }
}

/// `std::io::copy` in 1 MiB reads.
fn copy(from: &mut dyn Read, to: &mut impl Write) -> std::io::Result<()> {
    let mut buf = vec![0u8; 1 << 20];
    loop {
        match from.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => to.write_all(buf.get(..n).unwrap_or_default())?,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader that hands out `first` bytes, then one byte at a time until it is let go.
    struct Gate {
        data: std::io::Cursor<Vec<u8>>,
        first: u64,
        open: std::sync::mpsc::Receiver<()>,
        released: bool,
    }

    impl Read for Gate {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let position = self.data.position();
            let mut limit = buf.len();
            if position < self.first {
                limit = limit.min((self.first - position) as usize);
            } else if !self.released {
                let wait = self.open.recv_timeout(std::time::Duration::from_millis(5));
                self.released = !matches!(wait, Err(std::sync::mpsc::RecvTimeoutError::Timeout));
                limit = limit.min(1);
            }
            self.data.read(buf.get_mut(..limit).unwrap_or_default())
        }
    }

    /// The first piece can go out while the input is still being read, and a piece past what
    /// is packed waits for it; the bytes decode to the input.
    #[tokio::test]
    async fn a_piece_goes_out_before_the_input_ends() {
        // Incompressible, so the packed bytes pass 1 MiB long before the gate.
        let input = crate::tests::noise(7, 48 << 20);
        let (let_go, open) = std::sync::mpsc::channel();
        let gate = Gate { data: std::io::Cursor::new(input.clone()), first: 40 << 20, open, released: false };
        let packer = Packer::start(Input::Tar(Box::new(gate), "gate".into()), Path::new("gate")).unwrap();
        let first = tokio::time::timeout(std::time::Duration::from_secs(30), packer.piece(0, 1 << 20)).await;
        assert_eq!(first.expect("the first piece before the input ends").unwrap().len(), 1 << 20);
        assert_eq!(packer.len(), None, "still packing");
        // A longer piece goes with what is packed so far, still before the input ends.
        let second =
            tokio::time::timeout(std::time::Duration::from_secs(30), packer.piece(1 << 20, u64::MAX / 2)).await;
        let second = second.expect("the second piece before the input ends").unwrap();
        assert!(second.len() >= 1 << 20, "at least 1 MiB: {}", second.len());
        assert_eq!(packer.len(), None, "still packing");
        let_go.send(()).unwrap();
        let mut sent = (1 << 20) + second.len() as u64;
        loop {
            let piece = packer.piece(sent, u64::MAX / 2).await.unwrap();
            if piece.is_empty() {
                break;
            }
            sent += piece.len() as u64;
        }
        let len = packer.len().unwrap();
        assert_eq!(len, sent);
        let mut all = packer.piece(0, len).await.unwrap();
        assert_eq!(all.len() as u64, len);
        assert_eq!(packer.digest().unwrap(), format!("sha256:{}", hex::encode(Sha256::digest(&all))));
        all = zstd::decode_all(&all[..]).unwrap();
        assert!(all == input, "decodes to the input");
    }

    /// A packed directory is byte for byte the tar the tar crate makes of it entry by entry:
    /// large, empty and executable files, a long name, a link.
    #[tokio::test]
    async fn a_packed_directory_is_the_tar_crates_own_tar() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let long = format!("d/{}", "n".repeat(150));
        std::fs::create_dir_all(dir.path().join("d")).unwrap();
        std::fs::write(dir.path().join("big"), crate::tests::noise(3, (3 << 20) + 5)).unwrap();
        std::fs::write(dir.path().join("empty"), b"").unwrap();
        std::fs::write(dir.path().join(&long), b"long").unwrap();
        std::fs::write(dir.path().join("run.sh"), b"#!/bin/sh\n").unwrap();
        std::fs::set_permissions(dir.path().join("run.sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::os::unix::fs::symlink("big", dir.path().join("d/link")).unwrap();
        let mut expected = tar::Builder::new(Vec::new());
        expected.follow_symlinks(false);
        expected.sparse(false);
        for entry in crate::archive::walk(dir.path()) {
            let entry = entry.unwrap();
            let name = entry.path().strip_prefix(dir.path()).unwrap();
            match entry.file_type().is_dir() {
                true => expected.append_dir(name, entry.path()).unwrap(),
                false => expected.append_path_with_name(entry.path(), name).unwrap(),
            }
        }
        let expected = expected.into_inner().unwrap();
        let archive = crate::Archive::pack(dir.path()).unwrap();
        let packed = zstd::decode_all(&archive.whole().await.unwrap()[..]).unwrap();
        assert!(packed == expected, "{} bytes packed, {} expected", packed.len(), expected.len());
    }

    /// A file met again 6 MiB further on packs as a reference to the first (zstd level 3's own
    /// 2 MiB window would pack it whole again).
    #[tokio::test]
    async fn a_file_met_again_megabytes_later_packs_small() {
        let dir = tempfile::tempdir().unwrap();
        let first = crate::tests::noise(1, 3 << 20);
        std::fs::write(dir.path().join("a"), &first).unwrap();
        std::fs::write(dir.path().join("b"), crate::tests::noise(2, 3 << 20)).unwrap();
        std::fs::write(dir.path().join("c"), &first).unwrap();
        let packed = crate::Archive::pack(dir.path()).unwrap().whole().await.unwrap();
        assert!(packed.len() < 7 << 20, "{} bytes packed for 6 MiB of distinct noise", packed.len());
    }

    /// A file that got shorter than its header says is an error, not a shifted tar.
    #[test]
    fn a_file_shorter_than_its_header_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), b"four").unwrap();
        let file = File::open(dir.path().join("f")).unwrap();
        let mut read = Vec::new();
        let error = Exact { file, left: 10 }.read_to_end(&mut read).unwrap_err();
        assert_eq!(error.to_string(), "the file got shorter while it was packed");
        assert_eq!(read, b"four");
        let file = File::open(dir.path().join("f")).unwrap();
        read.clear();
        Exact { file, left: 3 }.read_to_end(&mut read).unwrap();
        assert_eq!(read, b"fou", "no more than the header says");
    }

    /// A file that cannot be read ends the packing with an error naming it.
    #[tokio::test]
    async fn an_unreadable_input_is_an_error_naming_it() {
        struct Broken;
        impl Read for Broken {
            fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
                Err(std::io::Error::new(std::io::ErrorKind::PermissionDenied, "denied"))
            }
        }
        let packer = Packer::start(Input::Tar(Box::new(Broken), "x.tar".into()), Path::new("x.tar")).unwrap();
        let error = packer.piece(0, 10).await.unwrap_err();
        assert_eq!(error.to_string(), "x.tar: denied");
    }
}
