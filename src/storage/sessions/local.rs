//! Upload sessions on this server's disk (embedded store): one spool file per session under
//! `DATA_DIR/uploads/ID` beside a small JSON sidecar `ID.json` (its [`SessionMeta`]). A piece is
//! appended and fsynced, then the sidecar is replaced atomically (write, fsync, rename, fsync the
//! directory) before the piece is acknowledged, so an acknowledged offset survives a crash; bytes
//! past the sidecar's offset (a piece cut short) are cut off before the next append.

use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;

use super::{
    now_ms, receive, AppendError, Piece, PieceBody, PieceSink, SessionLocks, SessionMeta, SessionStore, UploadSessions,
};

/// Sessions as files in one directory.
pub struct LocalSessions {
    dir: PathBuf,
}

impl LocalSessions {
    pub fn open(dir: &Path) -> io::Result<LocalSessions> {
        fs::create_dir_all(dir)?;
        // Its entry in the data directory: a session's sidecar, synced in here, is only reachable
        // through it after a power cut.
        if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            File::open(parent)?.sync_all()?;
        }
        Ok(LocalSessions { dir: dir.to_owned() })
    }

    fn data_path(&self, id: &str) -> PathBuf {
        self.dir.join(id)
    }

    fn meta_path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    async fn append_piece(
        &self,
        id: &str,
        meta: &mut SessionMeta,
        piece: Piece,
        body: PieceBody,
        max_total: u64,
    ) -> Result<(), AppendError> {
        let offset = meta.offset;
        let file = OpenOptions::new().write(true).open(self.data_path(id))?;
        // Whatever lies past the durable offset was never acknowledged.
        file.set_len(offset)?;
        let mut writer = SpoolWriter::new(file, offset);
        let position = receive(piece, offset, body, max_total, &mut writer).await?;
        writer.write_batch(true).await?;
        meta.offset = position;
        meta.last_activity_ms = now_ms();
        let (dir, id, saved) = (self.dir.clone(), id.to_string(), meta.clone());
        tokio::task::spawn_blocking(move || write_meta(&dir, &id, &saved)).await.map_err(io::Error::other)??;
        Ok(())
    }
}

impl SessionStore for LocalSessions {
    fn create(&self, id: &str, meta: &SessionMeta) -> io::Result<()> {
        File::create(self.data_path(id))?.sync_all()?;
        write_meta(&self.dir, id, meta)
    }

    fn load(&self, id: &str) -> io::Result<Option<SessionMeta>> {
        let meta: Option<SessionMeta> = match fs::read(self.meta_path(id)) {
            Ok(bytes) => serde_json::from_slice(&bytes).ok(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        // A record whose bytes are gone is no session: a save that raced a removal (a cut DELETE's
        // removal goes on after its request released the session's lock) leaves one.
        if meta.as_ref().is_some_and(|m| !m.committed) && !self.data_path(id).exists() {
            let _ = fs::remove_file(self.meta_path(id));
            return Ok(None);
        }
        Ok(meta)
    }

    fn append<'a>(
        &'a self,
        id: &'a str,
        meta: &'a mut SessionMeta,
        piece: Piece,
        body: PieceBody,
        max_total: u64,
    ) -> BoxFuture<'a, Result<(), AppendError>> {
        Box::pin(self.append_piece(id, meta, piece, body, max_total))
    }

    fn open_data(&self, id: &str, _meta: &SessionMeta) -> io::Result<Box<dyn Read + Send>> {
        Ok(Box::new(File::open(self.data_path(id))?))
    }

    fn local_data(&self, id: &str) -> Option<PathBuf> {
        Some(self.data_path(id))
    }

    /// The session's lock is the claim.
    fn claim_commit<'a>(&'a self, _id: &'a str, _meta: &'a mut SessionMeta) -> BoxFuture<'a, io::Result<()>> {
        Box::pin(async { Ok(()) })
    }

    fn release_commit(&self, _id: &str, _meta: &mut SessionMeta) -> io::Result<()> {
        Ok(())
    }

    fn mark_committed(&self, id: &str, meta: &mut SessionMeta) -> io::Result<()> {
        write_meta(&self.dir, id, meta)?;
        match fs::remove_file(self.data_path(id)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// Sidecar first: a spool file without one is no session.
    fn remove(&self, id: &str) -> io::Result<()> {
        for path in [self.meta_path(id), self.data_path(id), self.dir.join(format!("{id}.json.tmp"))] {
            match fs::remove_file(&path) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        Ok(())
    }

    /// The spool files: a commit or a removal deletes its session's.
    fn open_sessions(&self) -> io::Result<u64> {
        let mut open = 0;
        for entry in fs::read_dir(&self.dir)? {
            if entry?.file_name().to_str().is_some_and(UploadSessions::valid_id) {
                open += 1;
            }
        }
        Ok(open)
    }

    fn sweep_expired(&self, timeout: Duration, locks: &SessionLocks) -> usize {
        let Ok(entries) = fs::read_dir(&self.dir) else { return 0 };
        let mut ids: Vec<String> = entries
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().to_str().map(str::to_owned))
            .filter_map(|name| name.split('.').next().map(str::to_owned))
            .filter(|id| UploadSessions::valid_id(id))
            .collect();
        ids.sort();
        ids.dedup();
        let now = now_ms();
        let timeout = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        let mut removed = 0;
        for id in ids {
            let lock = locks.lock(&id);
            let Ok(_guard) = lock.try_lock() else { continue };
            let expired = match self.load(&id) {
                Ok(Some(meta)) => now.saturating_sub(meta.last_activity_ms) > timeout,
                Ok(None) => true,
                Err(_) => false,
            };
            if !expired {
                continue;
            }
            match self.remove(&id) {
                Ok(()) => {
                    locks.forget(&id);
                    removed += 1;
                    tracing::info!(upload = %id, "removed an expired upload session");
                }
                Err(e) => tracing::warn!(upload = %id, error = %e, "removing an expired upload session"),
            }
        }
        removed
    }

    /// The sessions with a sidecar.
    fn session_ids(&self) -> io::Result<HashSet<String>> {
        let mut ids = HashSet::new();
        for entry in fs::read_dir(&self.dir)? {
            let name = entry?.file_name();
            let id = name.to_str().and_then(|n| n.strip_suffix(".json"));
            if let Some(id) = id.filter(|id| UploadSessions::valid_id(id)) {
                ids.insert(id.to_owned());
            }
        }
        Ok(ids)
    }
}

/// Received bytes are written to the spool file in batches of about this many (one hand-off to a
/// blocking thread each, not one per network frame).
const WRITE_BATCH: usize = 1 << 20;
/// The disk's writeback of a piece is started after this many bytes of it.
const WRITEBACK_EVERY: u64 = 4 << 20;

/// A piece appended to its session's spool file, in batches written on a blocking thread. The
/// disk's writeback is started as the bytes arrive, so the fsync before the piece is acknowledged
/// waits for the last few MiB rather than for the whole piece (a 16 MiB piece took as long to
/// fsync as to arrive).
struct SpoolWriter {
    file: Arc<File>,
    /// Received and not written yet: at most about [`WRITE_BATCH`] bytes.
    batch: Vec<Bytes>,
    batched: usize,
    /// The file's length before the batch.
    written: u64,
    /// Where the writeback not yet started begins.
    writeback_from: u64,
}

impl SpoolWriter {
    /// Appends to `file`, which holds `len` bytes.
    fn new(file: File, len: u64) -> SpoolWriter {
        SpoolWriter { file: Arc::new(file), batch: Vec::new(), batched: 0, written: len, writeback_from: len }
    }

    /// Writes the batch; with `sync`, then makes the file's bytes durable.
    async fn write_batch(&mut self, sync: bool) -> io::Result<()> {
        let (file, batch, at) = (self.file.clone(), std::mem::take(&mut self.batch), self.written);
        let end = at + std::mem::take(&mut self.batched) as u64;
        let writeback = (!sync && end - self.writeback_from >= WRITEBACK_EVERY).then_some(self.writeback_from);
        tokio::task::spawn_blocking(move || {
            let mut pos = at;
            for bytes in &batch {
                std::os::unix::fs::FileExt::write_all_at(&*file, bytes, pos)?;
                pos += bytes.len() as u64;
            }
            if let Some(from) = writeback {
                start_writeback(&file, from, end - from);
            }
            if sync {
                file.sync_data()?;
            }
            Ok::<_, io::Error>(())
        })
        .await
        .map_err(io::Error::other)??;
        self.written = end;
        if writeback.is_some() {
            self.writeback_from = end;
        }
        Ok(())
    }
}

impl PieceSink for SpoolWriter {
    async fn write(&mut self, bytes: Bytes) -> io::Result<()> {
        self.batched += bytes.len();
        self.batch.push(bytes);
        if self.batched >= WRITE_BATCH {
            self.write_batch(false).await?;
        }
        Ok(())
    }
}

/// Starts writing the dirty pages of `len` bytes at `offset` to the disk without waiting for it
/// (the fsync that follows is what makes them durable). Only a hint: nothing to do where the call
/// is missing.
fn start_writeback(file: &File, offset: u64, len: u64) {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        let (Ok(offset), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else { return };
        // SAFETY: a plain system call on a descriptor the file owns for the whole call.
        unsafe { libc::sync_file_range(file.as_raw_fd(), offset, len, libc::SYNC_FILE_RANGE_WRITE) };
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (file, offset, len);
}

/// Replaces a sidecar atomically and durably: write, fsync, rename, fsync the directory.
fn write_meta(dir: &Path, id: &str, meta: &SessionMeta) -> io::Result<()> {
    let tmp = dir.join(format!("{id}.json.tmp"));
    let mut file = File::create(&tmp)?;
    file.write_all(&serde_json::to_vec(meta).map_err(io::Error::other)?)?;
    file.sync_all()?;
    fs::rename(&tmp, dir.join(format!("{id}.json")))?;
    File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use futures_util::Stream;

    use super::*;

    fn body(parts: &[&[u8]]) -> impl Stream<Item = Result<Bytes, io::Error>> + Send + 'static {
        futures_util::stream::iter(parts.iter().map(|p| Ok(Bytes::copy_from_slice(p))).collect::<Vec<_>>())
    }

    #[test]
    fn a_record_left_without_its_bytes_is_no_session() {
        let tmp = tempfile::tempdir().unwrap();
        let sessions = UploadSessions::local(tmp.path(), Duration::from_secs(60)).unwrap();
        let meta = SessionMeta::new("ns", "b", "uid", "");
        let id = sessions.create(&meta).unwrap();
        sessions.remove(&id).unwrap();
        // What a save racing the removal leaves.
        write_meta(tmp.path(), &id, &meta).unwrap();
        assert!(sessions.load(&id).unwrap().is_none());
        assert!(!tmp.path().join(format!("{id}.json")).exists(), "the stray record is removed");
    }

    #[tokio::test]
    async fn append_skips_overlap_refuses_gaps_and_survives_reopen() {
        let tmp = tempfile::tempdir().unwrap();
        let sessions = UploadSessions::local(tmp.path(), Duration::from_secs(60)).unwrap();
        let mut meta = SessionMeta::new("ns", "b", "uid", "");
        let id = sessions.create(&meta).unwrap();
        sessions.append(&id, &mut meta, Piece { start: 0, end: Some(4) }, body(&[b"he", b"llo"]), 100).await.unwrap();
        // A re-sent piece overlapping the first two bytes.
        sessions.append(&id, &mut meta, Piece { start: 3, end: None }, body(&[b"lo", b" world"]), 100).await.unwrap();
        assert_eq!(meta.offset, 11);
        let gap = sessions.append(&id, &mut meta, Piece { start: 12, end: None }, body(&[b"x"]), 100).await;
        assert!(matches!(gap, Err(AppendError::Gap { start: 12, offset: 11 })), "{gap:?}");
        let short = sessions.append(&id, &mut meta, Piece { start: 11, end: Some(20) }, body(&[b"!"]), 100).await;
        assert!(matches!(short, Err(AppendError::Short { .. })), "{short:?}");
        let big = sessions.append(&id, &mut meta, Piece { start: 11, end: None }, body(&[&[0u8; 90]]), 100).await;
        assert!(matches!(big, Err(AppendError::TooLarge { limit: 100 })), "{big:?}");
        // Reopened: the sidecar's offset holds, unacknowledged bytes are cut at the next append.
        let sessions = UploadSessions::local(tmp.path(), Duration::from_secs(60)).unwrap();
        let mut meta = sessions.load(&id).unwrap().unwrap();
        assert_eq!(meta.offset, 11);
        sessions.append(&id, &mut meta, Piece { start: 11, end: None }, body(&[b"!"]), 100).await.unwrap();
        assert_eq!(fs::read(tmp.path().join(&id)).unwrap(), b"hello world!");
        assert_eq!(sessions.load("../etc/passwd").unwrap(), None);
    }

    #[test]
    fn sweep_removes_idle_and_orphaned_sessions_only() {
        let tmp = tempfile::tempdir().unwrap();
        let sessions = UploadSessions::local(tmp.path(), Duration::from_secs(60)).unwrap();
        let fresh = sessions.create(&SessionMeta::new("ns", "b", "uid", "")).unwrap();
        let mut old_meta = SessionMeta::new("ns", "b", "uid", "");
        old_meta.last_activity_ms -= 120_000;
        let old = sessions.create(&old_meta).unwrap();
        let orphan = uuid::Uuid::new_v4().to_string();
        File::create(tmp.path().join(&orphan)).unwrap();
        File::create(tmp.path().join("unrelated")).unwrap();
        assert_eq!(sessions.sweep(), 2);
        assert!(sessions.load(&fresh).unwrap().is_some());
        assert!(sessions.load(&old).unwrap().is_none());
        assert!(!tmp.path().join(&old).exists() && !tmp.path().join(&orphan).exists());
        assert!(tmp.path().join("unrelated").exists());
    }

    #[test]
    fn a_sweep_drops_the_locks_of_unknown_sessions_only() {
        let tmp = tempfile::tempdir().unwrap();
        let sessions = UploadSessions::local(tmp.path(), Duration::from_secs(60)).unwrap();
        let live = sessions.create(&SessionMeta::new("ns", "b", "uid", "")).unwrap();
        drop(sessions.lock(&live));
        let unknown = uuid::Uuid::new_v4().to_string();
        drop(sessions.lock(&unknown));
        let busy = uuid::Uuid::new_v4().to_string();
        let busy_lock = sessions.lock(&busy);
        let _held = busy_lock.try_lock().unwrap();
        sessions.sweep();
        assert!(!sessions.locks().holds(&unknown), "the lock of an unknown session is dropped");
        assert!(sessions.locks().holds(&live), "the lock of a live session stays");
        assert!(sessions.locks().holds(&busy), "a lock in use stays");
    }
}
