//! Where chunked uploads keep their bytes between requests. Embedded: one spool file per session
//! under `DATA_DIR/uploads/ID` beside a small JSON sidecar `ID.json` (the Bundle it belongs to, the
//! encoding, timestamps and the durable offset). A piece is appended and fsynced, then the sidecar
//! is replaced atomically (write, fsync, rename, fsync the directory) before the piece is
//! acknowledged, so an acknowledged offset survives a crash; bytes past the sidecar's offset (a
//! piece cut short) are cut off before the next append. Replicated: the same record in etcd and
//! each piece an object in the bucket ([`super::upload_shared`]), so any replica takes the next
//! piece or the commit. Memory does not grow with the upload: bytes go straight to the file or
//! the bucket. Sessions idle longer than the timeout are removed by [`Spool::sweep`].

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use serde::{Deserialize, Serialize};

use super::upload_shared::SharedSpool;
use crate::storage::remote::Remote;

/// What the sidecar of a session records.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SessionMeta {
    pub namespace: String,
    pub name: String,
    /// The Bundle's uid: a re-created Bundle of the same name does not inherit the session.
    pub uid: String,
    /// `Content-Encoding` given when the session started (empty: sniffed at commit).
    pub encoding: String,
    /// Milliseconds since the Unix epoch.
    pub created_ms: u64,
    pub last_activity_ms: u64,
    /// Bytes received and durable.
    pub offset: u64,
    /// The upload was committed (its bytes are gone; the sidecar stays until it expires so a
    /// re-sent commit gets the Bundle instead of a 404).
    #[serde(default)]
    pub committed: bool,
    /// Replicated store: the pieces' objects, in upload order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parts: Vec<Part>,
    /// Replicated store: the replica running the commit (a re-sent commit on another replica
    /// waits for it while that replica lives).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub committing: Option<String>,
    /// Replicated store: the etcd revision this record was read at (the guard of its next write).
    #[serde(skip)]
    pub revision: i64,
}

/// One piece's bytes in the bucket (replicated store).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Part {
    pub start: u64,
    pub len: u64,
    pub object: String,
}

impl SessionMeta {
    pub fn new(namespace: &str, name: &str, uid: &str, encoding: &str) -> SessionMeta {
        let now = now_ms();
        SessionMeta {
            namespace: namespace.into(),
            name: name.into(),
            uid: uid.into(),
            encoding: encoding.into(),
            created_ms: now,
            last_activity_ms: now,
            offset: 0,
            committed: false,
            parts: Vec::new(),
            committing: None,
            revision: 0,
        }
    }
}

/// Why a piece was not appended.
#[derive(Debug, thiserror::Error)]
pub enum AppendError {
    #[error("the piece starts at byte {start}, past the {offset} bytes received so far")]
    Gap { start: u64, offset: u64 },
    #[error("the upload would exceed the maximum of {limit} bytes")]
    TooLarge { limit: u64 },
    #[error("the piece declared {declared} bytes but {received} arrived")]
    Short { declared: u64, received: u64 },
    #[error("reading the request body: {0}")]
    Body(io::Error),
    #[error("another piece of this upload was appended at the same time; ask for the offset and send from there")]
    Raced,
    #[error("writing the upload spool: {0}")]
    Io(#[from] io::Error),
}

/// A piece: where it starts in the upload and, when the client said, where it ends (inclusive).
#[derive(Clone, Copy, Debug)]
pub struct Piece {
    pub start: u64,
    pub end: Option<u64>,
}

/// All upload sessions of one server.
pub struct Spool {
    dir: PathBuf,
    /// Set in replicated mode: sessions live in etcd and the bucket, `dir` is unused.
    shared: Option<SharedSpool>,
    timeout: Duration,
    /// One lock per session in use: requests on one session run one after another.
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl Spool {
    pub fn open(dir: &Path, timeout: Duration) -> io::Result<Spool> {
        fs::create_dir_all(dir)?;
        // Its entry in the data directory: a session's sidecar, synced in here, is only reachable
        // through it after a power cut.
        if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            File::open(parent)?.sync_all()?;
        }
        Ok(Spool { dir: dir.to_owned(), shared: None, timeout, locks: Mutex::default() })
    }

    /// Sessions in the replicated store, shared by every replica.
    pub fn shared(remote: Arc<Remote>, timeout: Duration) -> Spool {
        Spool { dir: PathBuf::new(), shared: Some(SharedSpool::new(remote)), timeout, locks: Mutex::default() }
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Session IDs are UUIDs; anything else names no session (and never a path).
    pub fn valid_id(id: &str) -> bool {
        id.len() == 36 && uuid::Uuid::parse_str(id).is_ok()
    }

    fn data_path(&self, id: &str) -> PathBuf {
        self.dir.join(id)
    }

    fn meta_path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    /// The lock of session `id` (callers hold it for the whole request).
    pub fn lock(&self, id: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.locks.lock().unwrap_or_else(|e| e.into_inner());
        locks.entry(id.to_string()).or_default().clone()
    }

    /// Starts a session; returns its ID. Blocking.
    pub fn create(&self, meta: &SessionMeta) -> io::Result<String> {
        let id = uuid::Uuid::new_v4().to_string();
        let lock = self.lock(&id);
        let _guard = lock.try_lock().map_err(io::Error::other)?;
        if let Some(shared) = &self.shared {
            shared.create(&id, meta)?;
            return Ok(id);
        }
        File::create(self.data_path(&id))?.sync_all()?;
        write_meta(&self.dir, &id, meta)?;
        Ok(id)
    }

    /// The session's sidecar, or `None` when there is no such session. Blocking.
    pub fn load(&self, id: &str) -> io::Result<Option<SessionMeta>> {
        if !Spool::valid_id(id) {
            return Ok(None);
        }
        if let Some(shared) = &self.shared {
            return shared.load(id);
        }
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

    /// The session's bytes, for reading at commit (the first `meta.offset` of them count).
    /// Blocking.
    pub fn open_data(&self, id: &str, meta: &SessionMeta) -> io::Result<Box<dyn io::Read + Send>> {
        if let Some(shared) = &self.shared {
            return Ok(Box::new(shared.reader(meta)));
        }
        Ok(Box::new(File::open(self.data_path(id))?))
    }

    /// Session `id`'s spool file, when its bytes are on this server's disk (embedded store).
    pub fn local_data(&self, id: &str) -> Option<PathBuf> {
        self.shared.is_none().then(|| self.data_path(id))
    }

    /// Makes this server the one committing session `id`: at once in the embedded store (the
    /// session's lock is enough); in the replicated one, once no other live replica is committing
    /// it. `meta` is the record as it stands after (committed, if the other replica finished).
    pub async fn claim_commit(&self, id: &str, meta: &mut SessionMeta) -> io::Result<()> {
        match &self.shared {
            Some(shared) => shared.claim_commit(id, meta).await,
            None => Ok(()),
        }
    }

    /// Gives up a claim after a commit that failed (replicated store). Blocking.
    pub fn release_commit(&self, id: &str, meta: &mut SessionMeta) -> io::Result<()> {
        match &self.shared {
            Some(shared) => shared.release_commit(id, meta),
            None => Ok(()),
        }
    }

    /// Records that session `id` was committed and drops its bytes. Blocking.
    pub fn mark_committed(&self, id: &str, meta: &mut SessionMeta) -> io::Result<()> {
        meta.committed = true;
        meta.last_activity_ms = now_ms();
        if let Some(shared) = &self.shared {
            return shared.mark_committed(id, meta);
        }
        write_meta(&self.dir, id, meta)?;
        match fs::remove_file(self.data_path(id)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// Removes a session's files (sidecar first: a spool file without one is no session).
    /// Blocking.
    pub fn remove(&self, id: &str) -> io::Result<()> {
        if let Some(shared) = &self.shared {
            shared.remove(id)?;
            self.locks.lock().unwrap_or_else(|e| e.into_inner()).remove(id);
            return Ok(());
        }
        for path in [self.meta_path(id), self.data_path(id), self.dir.join(format!("{id}.json.tmp"))] {
            match fs::remove_file(&path) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        self.locks.lock().unwrap_or_else(|e| e.into_inner()).remove(id);
        Ok(())
    }

    /// Appends `body` as `piece` to session `id` at `meta.offset`: bytes before the offset (a
    /// re-sent piece) are skipped, a piece starting past it is refused. The bytes are durable and
    /// `meta` saved before this returns. The caller holds the session's lock.
    pub async fn append<S, E>(
        &self,
        id: &str,
        meta: &mut SessionMeta,
        piece: Piece,
        body: S,
        max_total: u64,
    ) -> Result<(), AppendError>
    where
        S: Stream<Item = Result<Bytes, E>> + Unpin,
        E: std::error::Error + Send + Sync + 'static,
    {
        check_piece(piece, meta.offset, max_total)?;
        if let Some(shared) = &self.shared {
            return shared.append(id, meta, piece, body, max_total).await;
        }
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

    /// Sessions open: started, neither committed nor removed (`/metrics`). Embedded, the spool
    /// files (a commit or a removal deletes its session's); replicated, the records of every
    /// replica's sessions not marked committed. Blocking.
    pub fn open_sessions(&self) -> io::Result<u64> {
        if let Some(shared) = &self.shared {
            return shared.open_sessions();
        }
        let mut open = 0;
        for entry in fs::read_dir(&self.dir)? {
            if entry?.file_name().to_str().is_some_and(Spool::valid_id) {
                open += 1;
            }
        }
        Ok(open)
    }

    /// Removes sessions idle for longer than the timeout, and leftovers of sessions that never
    /// got a sidecar; sessions in use are left alone. Then drops the locks no request holds of IDs
    /// that name no session (requests for unknown IDs, sessions removed here or, replicated, by
    /// another replica). Returns how many sessions were removed. Blocking.
    pub fn sweep(&self) -> usize {
        if let Some(shared) = &self.shared {
            // Only the leader removes sessions, but every replica has locks of its own.
            let removed = shared.sweep(self.timeout);
            self.prune_shared_locks(shared);
            return removed;
        }
        let Ok(entries) = fs::read_dir(&self.dir) else { return 0 };
        let mut ids: Vec<String> = entries
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().to_str().map(str::to_owned))
            .filter_map(|name| name.split('.').next().map(str::to_owned))
            .filter(|id| Spool::valid_id(id))
            .collect();
        ids.sort();
        ids.dedup();
        let now = now_ms();
        let timeout = u64::try_from(self.timeout.as_millis()).unwrap_or(u64::MAX);
        let mut removed = 0;
        for id in ids {
            let lock = self.lock(&id);
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
                    removed += 1;
                    tracing::info!(upload = %id, "removed an expired upload session");
                }
                Err(e) => tracing::warn!(upload = %id, error = %e, "removing an expired upload session"),
            }
        }
        self.prune_locks(|id| self.meta_path(id).exists());
        removed
    }

    /// Drops the locks no request holds or waits for whose ID `exists` says names no session.
    /// Dropping an unused lock never lets two requests on one session run together (the next
    /// request makes a new one); keeping those of existing sessions only saves the churn.
    fn prune_locks(&self, exists: impl Fn(&str) -> bool) {
        let mut locks = self.locks.lock().unwrap_or_else(|e| e.into_inner());
        locks.retain(|id, lock| lock_in_use(lock) || exists(id));
    }

    /// [`Spool::prune_locks`] in the replicated store, where the sessions are etcd's records
    /// (read outside the map's lock; a failed read drops nothing).
    fn prune_shared_locks(&self, shared: &SharedSpool) {
        let unused = self.locks.lock().unwrap_or_else(|e| e.into_inner()).values().any(|lock| !lock_in_use(lock));
        if !unused {
            return;
        }
        match shared.session_ids() {
            Ok(sessions) => self.prune_locks(|id| sessions.contains(id)),
            Err(e) => tracing::warn!(error = %e, "listing upload sessions to drop unused locks"),
        }
    }
}

/// Whether a request holds or waits for a session's lock, asked under the map's lock: every
/// holder or waiter keeps a clone of it (one taken from [`Spool::lock`] and not locked yet too).
fn lock_in_use(lock: &Arc<tokio::sync::Mutex<()>>) -> bool {
    Arc::strong_count(lock) > 1 || lock.try_lock().is_err()
}

/// Refuses a piece that starts past the bytes received, or ends past the limit.
fn check_piece(piece: Piece, offset: u64, max_total: u64) -> Result<(), AppendError> {
    if piece.start > offset {
        return Err(AppendError::Gap { start: piece.start, offset });
    }
    if piece.end.is_some_and(|end| end >= max_total) {
        return Err(AppendError::TooLarge { limit: max_total });
    }
    Ok(())
}

/// Where a piece's new bytes go.
pub(super) trait PieceSink {
    async fn write(&mut self, bytes: Bytes) -> io::Result<()>;
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

/// Reads `body` as `piece` of an upload holding `offset` bytes: skips what it re-sends, writes
/// the rest to `sink`, checks the limit and the declared length. Returns the new offset.
pub(super) async fn receive<S, E>(
    piece: Piece,
    offset: u64,
    mut body: S,
    max_total: u64,
    sink: &mut impl PieceSink,
) -> Result<u64, AppendError>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
    E: std::error::Error + Send + Sync + 'static,
{
    let mut skip = offset - piece.start;
    let mut position = offset;
    let mut received = 0u64;
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| AppendError::Body(io::Error::other(e)))?;
        received += chunk.len() as u64;
        let fresh = match usize::try_from(skip) {
            Ok(skip_now) if skip_now >= chunk.len() => {
                skip -= chunk.len() as u64;
                continue;
            }
            Ok(skip_now) => chunk.slice(skip_now..),
            Err(_) => {
                skip -= chunk.len() as u64;
                continue;
            }
        };
        skip = 0;
        position += fresh.len() as u64;
        if position > max_total {
            return Err(AppendError::TooLarge { limit: max_total });
        }
        sink.write(fresh).await?;
    }
    if let Some(end) = piece.end {
        let declared = end + 1 - piece.start;
        if received != declared {
            return Err(AppendError::Short { declared, received });
        }
    }
    Ok(position)
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

/// Sweeps `spool` now and then every so often (a quarter of the timeout, between 1 s and 1 min)
/// until shutdown.
pub fn spawn_sweeper(spool: Arc<Spool>, shutdown: tokio_util::sync::CancellationToken) -> tokio::task::JoinHandle<()> {
    let every = (spool.timeout() / 4).clamp(Duration::from_secs(1), Duration::from_secs(60));
    tokio::spawn(async move {
        let mut timer = tokio::time::interval(every);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = timer.tick() => {}
            }
            let spool = spool.clone();
            let _ = tokio::task::spawn_blocking(move || spool.sweep()).await;
        }
    })
}

pub(super) fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(parts: &[&[u8]]) -> impl Stream<Item = Result<Bytes, io::Error>> + Unpin {
        futures_util::stream::iter(parts.iter().map(|p| Ok(Bytes::copy_from_slice(p))).collect::<Vec<_>>())
    }

    #[test]
    fn a_record_left_without_its_bytes_is_no_session() {
        let tmp = tempfile::tempdir().unwrap();
        let spool = Spool::open(tmp.path(), Duration::from_secs(60)).unwrap();
        let meta = SessionMeta::new("ns", "b", "uid", "");
        let id = spool.create(&meta).unwrap();
        spool.remove(&id).unwrap();
        // What a save racing the removal leaves.
        write_meta(&spool.dir, &id, &meta).unwrap();
        assert!(spool.load(&id).unwrap().is_none());
        assert!(!spool.meta_path(&id).exists(), "the stray record is removed");
    }

    #[tokio::test]
    async fn append_skips_overlap_refuses_gaps_and_survives_reopen() {
        let tmp = tempfile::tempdir().unwrap();
        let spool = Spool::open(tmp.path(), Duration::from_secs(60)).unwrap();
        let mut meta = SessionMeta::new("ns", "b", "uid", "");
        let id = spool.create(&meta).unwrap();
        spool.append(&id, &mut meta, Piece { start: 0, end: Some(4) }, body(&[b"he", b"llo"]), 100).await.unwrap();
        // A re-sent piece overlapping the first two bytes.
        spool.append(&id, &mut meta, Piece { start: 3, end: None }, body(&[b"lo", b" world"]), 100).await.unwrap();
        assert_eq!(meta.offset, 11);
        let gap = spool.append(&id, &mut meta, Piece { start: 12, end: None }, body(&[b"x"]), 100).await;
        assert!(matches!(gap, Err(AppendError::Gap { start: 12, offset: 11 })), "{gap:?}");
        let short = spool.append(&id, &mut meta, Piece { start: 11, end: Some(20) }, body(&[b"!"]), 100).await;
        assert!(matches!(short, Err(AppendError::Short { .. })), "{short:?}");
        let big = spool.append(&id, &mut meta, Piece { start: 11, end: None }, body(&[&[0u8; 90]]), 100).await;
        assert!(matches!(big, Err(AppendError::TooLarge { limit: 100 })), "{big:?}");
        // Reopened: the sidecar's offset holds, unacknowledged bytes are cut at the next append.
        let spool = Spool::open(tmp.path(), Duration::from_secs(60)).unwrap();
        let mut meta = spool.load(&id).unwrap().unwrap();
        assert_eq!(meta.offset, 11);
        spool.append(&id, &mut meta, Piece { start: 11, end: None }, body(&[b"!"]), 100).await.unwrap();
        assert_eq!(fs::read(tmp.path().join(&id)).unwrap(), b"hello world!");
        assert_eq!(spool.load("../etc/passwd").unwrap(), None);
    }

    #[test]
    fn sweep_removes_idle_and_orphaned_sessions_only() {
        let tmp = tempfile::tempdir().unwrap();
        let spool = Spool::open(tmp.path(), Duration::from_secs(60)).unwrap();
        let fresh = spool.create(&SessionMeta::new("ns", "b", "uid", "")).unwrap();
        let mut old_meta = SessionMeta::new("ns", "b", "uid", "");
        old_meta.last_activity_ms -= 120_000;
        let old = spool.create(&old_meta).unwrap();
        let orphan = uuid::Uuid::new_v4().to_string();
        File::create(tmp.path().join(&orphan)).unwrap();
        File::create(tmp.path().join("unrelated")).unwrap();
        assert_eq!(spool.sweep(), 2);
        assert!(spool.load(&fresh).unwrap().is_some());
        assert!(spool.load(&old).unwrap().is_none());
        assert!(!tmp.path().join(&old).exists() && !tmp.path().join(&orphan).exists());
        assert!(tmp.path().join("unrelated").exists());
    }

    #[test]
    fn a_shared_sweep_drops_the_locks_of_unknown_sessions_only() {
        let backends = crate::storage::remote_tests::start_backends();
        let remote = Remote::connect(crate::storage::remote_tests::remote_options(&backends, "a")).unwrap();
        let spool = Spool::shared(remote, Duration::from_secs(60));
        let live = spool.create(&SessionMeta::new("ns", "b", "uid", "")).unwrap();
        // A request for an ID that names no session leaves its lock behind.
        let unknown = uuid::Uuid::new_v4().to_string();
        drop(spool.lock(&unknown));
        // A request in progress (a commit holds its session's lock throughout) keeps its lock,
        // whether or not the record exists; so does one that has its lock and not locked it yet.
        let (busy, waiting) = (uuid::Uuid::new_v4().to_string(), uuid::Uuid::new_v4().to_string());
        let busy_lock = spool.lock(&busy);
        let _held = busy_lock.try_lock().unwrap();
        let _waiting_lock = spool.lock(&waiting);
        spool.sweep();
        let locks = spool.locks.lock().unwrap();
        assert!(!locks.contains_key(&unknown), "the lock of an unknown session is dropped");
        assert!(locks.contains_key(&live), "the lock of a live session stays");
        assert!(locks.contains_key(&busy) && locks.contains_key(&waiting), "locks in use stay");
    }
}
