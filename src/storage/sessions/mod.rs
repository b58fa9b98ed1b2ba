//! Where chunked uploads keep their bytes between requests: upload sessions, each a record (the
//! Bundle it belongs to, the encoding, timestamps and the durable offset) and the bytes received.
//! [`UploadSessions`] is what the API uses; it holds what every backend shares (one lock per
//! session in use, the idle timeout, the checks of a piece) and hands the rest to a
//! [`SessionStore`]:
//!
//! - [`local::LocalSessions`] (embedded store): a spool file per session under `DATA_DIR/uploads/ID`
//!   beside a small JSON sidecar `ID.json`, both fsynced before a piece is acknowledged;
//! - [`shared::SharedSessions`] (replicated store): the record in etcd and each piece an object in
//!   the bucket, so any replica takes the next piece or the commit.
//!
//! Memory does not grow with the upload: bytes go straight to the file or the bucket. Sessions
//! idle longer than the timeout are removed by [`UploadSessions::sweep`].

pub mod local;
pub mod shared;

use std::collections::{HashMap, HashSet};
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use futures_util::future::BoxFuture;
use futures_util::stream::BoxStream;
use futures_util::{Stream, StreamExt};
use serde::{Deserialize, Serialize};

use super::Store;

/// What the record of a session holds.
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
    /// The upload was committed (its bytes are gone; the record stays until it expires so a
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

impl AppendError {
    /// Where the client is to send from, when the piece started past the bytes received.
    pub fn resume_at(&self) -> Option<u64> {
        match self {
            AppendError::Gap { offset, .. } => Some(*offset),
            _ => None,
        }
    }
}

/// A piece: where it starts in the upload and, when the client said, where it ends (inclusive).
#[derive(Clone, Copy, Debug)]
pub struct Piece {
    pub start: u64,
    pub end: Option<u64>,
}

/// A piece's bytes as they arrive.
pub type PieceBody = BoxStream<'static, io::Result<Bytes>>;

/// What differs between keeping sessions on this server's disk and in the shared store. Every
/// method but the two async ones blocks. The caller holds the session's lock ([`SessionLocks`])
/// for any method naming a session.
pub trait SessionStore: Send + Sync {
    /// Writes the record of a new session (refused if the ID exists).
    fn create(&self, id: &str, meta: &SessionMeta) -> io::Result<()>;

    /// The session's record, or `None` when there is no such session (`id` is a valid ID).
    fn load(&self, id: &str) -> io::Result<Option<SessionMeta>>;

    /// Appends `body` as `piece` at `meta.offset` (checked already to start at or before it):
    /// bytes before the offset (a re-sent piece) are skipped. The bytes are durable and `meta`
    /// saved before this returns.
    fn append<'a>(
        &'a self,
        id: &'a str,
        meta: &'a mut SessionMeta,
        piece: Piece,
        body: PieceBody,
        max_total: u64,
    ) -> BoxFuture<'a, Result<(), AppendError>>;

    /// The session's bytes, for reading at commit (the first `meta.offset` of them count).
    fn open_data(&self, id: &str, meta: &SessionMeta) -> io::Result<Box<dyn Read + Send>>;

    /// Session `id`'s spool file, when its bytes are on this server's disk.
    fn local_data(&self, id: &str) -> Option<PathBuf>;

    /// Makes this server the one committing session `id`: at once on a server's own disk (the
    /// session's lock is enough); in the shared store, once no other live replica is committing
    /// it. `meta` is the record as it stands after (committed, if the other replica finished).
    fn claim_commit<'a>(&'a self, id: &'a str, meta: &'a mut SessionMeta) -> BoxFuture<'a, io::Result<()>>;

    /// Gives up a claim after a commit that failed.
    fn release_commit(&self, id: &str, meta: &mut SessionMeta) -> io::Result<()>;

    /// Records that session `id` was committed (`meta.committed` is set) and drops its bytes.
    fn mark_committed(&self, id: &str, meta: &mut SessionMeta) -> io::Result<()>;

    /// Removes the session's record and bytes.
    fn remove(&self, id: &str) -> io::Result<()>;

    /// Sessions open: started, neither committed nor removed (`/metrics`).
    fn open_sessions(&self) -> io::Result<u64>;

    /// Removes sessions idle for longer than `timeout` (and leftovers of sessions that never got
    /// a record), leaving alone those whose lock in `locks` a request holds. Returns how many.
    fn sweep_expired(&self, timeout: Duration, locks: &SessionLocks) -> usize;

    /// The IDs of every session that has a record (expired or not).
    fn session_ids(&self) -> io::Result<HashSet<String>>;
}

/// One lock per session in use: requests on one session run one after another.
#[derive(Default)]
pub struct SessionLocks {
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl SessionLocks {
    /// The lock of session `id` (callers hold it for the whole request).
    pub fn lock(&self, id: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.locks.lock().unwrap_or_else(|e| e.into_inner());
        locks.entry(id.to_string()).or_default().clone()
    }

    /// Drops the lock of a session that is gone.
    fn forget(&self, id: &str) {
        self.locks.lock().unwrap_or_else(|e| e.into_inner()).remove(id);
    }

    /// Whether some lock is held or waited for by no request.
    fn any_unused(&self) -> bool {
        self.locks.lock().unwrap_or_else(|e| e.into_inner()).values().any(|lock| !lock_in_use(lock))
    }

    /// Drops the locks no request holds or waits for whose ID `exists` says names no session.
    /// Dropping an unused lock never lets two requests on one session run together (the next
    /// request makes a new one); keeping those of existing sessions only saves the churn.
    fn prune(&self, exists: impl Fn(&str) -> bool) {
        let mut locks = self.locks.lock().unwrap_or_else(|e| e.into_inner());
        locks.retain(|id, lock| lock_in_use(lock) || exists(id));
    }

    #[cfg(test)]
    pub(crate) fn holds(&self, id: &str) -> bool {
        self.locks.lock().unwrap_or_else(|e| e.into_inner()).contains_key(id)
    }
}

/// Whether a request holds or waits for a session's lock, asked under the map's lock: every
/// holder or waiter keeps a clone of it (one taken from [`SessionLocks::lock`] and not locked yet
/// too).
fn lock_in_use(lock: &Arc<tokio::sync::Mutex<()>>) -> bool {
    Arc::strong_count(lock) > 1 || lock.try_lock().is_err()
}

/// All upload sessions of one server.
pub struct UploadSessions {
    store: Arc<dyn SessionStore>,
    timeout: Duration,
    locks: SessionLocks,
}

impl UploadSessions {
    /// The sessions of `store`'s server: under `dir` on this server's disk (embedded store), or in
    /// the shared store beside the content (replicated; `dir` is unused).
    pub fn open(store: &Store, dir: &Path, timeout: Duration) -> io::Result<UploadSessions> {
        Ok(UploadSessions::with(store.inner.backend.session_store(dir)?, timeout))
    }

    /// Sessions on this server's disk, under `dir`.
    pub fn local(dir: &Path, timeout: Duration) -> io::Result<UploadSessions> {
        Ok(UploadSessions::with(Arc::new(local::LocalSessions::open(dir)?), timeout))
    }

    fn with(store: Arc<dyn SessionStore>, timeout: Duration) -> UploadSessions {
        UploadSessions { store, timeout, locks: SessionLocks::default() }
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Session IDs are UUIDs; anything else names no session (and never a path).
    pub fn valid_id(id: &str) -> bool {
        id.len() == 36 && uuid::Uuid::parse_str(id).is_ok()
    }

    /// The lock of session `id` (callers hold it for the whole request).
    pub fn lock(&self, id: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.locks.lock(id)
    }

    /// Starts a session; returns its ID. Blocking.
    pub fn create(&self, meta: &SessionMeta) -> io::Result<String> {
        let id = uuid::Uuid::new_v4().to_string();
        let lock = self.lock(&id);
        let _guard = lock.try_lock().map_err(io::Error::other)?;
        self.store.create(&id, meta)?;
        Ok(id)
    }

    /// The session's record, or `None` when there is no such session. Blocking.
    pub fn load(&self, id: &str) -> io::Result<Option<SessionMeta>> {
        if !UploadSessions::valid_id(id) {
            return Ok(None);
        }
        self.store.load(id)
    }

    /// The session's bytes, for reading at commit (the first `meta.offset` of them count).
    /// Blocking.
    pub fn open_data(&self, id: &str, meta: &SessionMeta) -> io::Result<Box<dyn Read + Send>> {
        self.store.open_data(id, meta)
    }

    /// Session `id`'s spool file, when its bytes are on this server's disk (embedded store).
    pub fn local_data(&self, id: &str) -> Option<PathBuf> {
        self.store.local_data(id)
    }

    /// See [`SessionStore::claim_commit`].
    pub async fn claim_commit(&self, id: &str, meta: &mut SessionMeta) -> io::Result<()> {
        self.store.claim_commit(id, meta).await
    }

    /// Gives up a claim after a commit that failed (replicated store). Blocking.
    pub fn release_commit(&self, id: &str, meta: &mut SessionMeta) -> io::Result<()> {
        self.store.release_commit(id, meta)
    }

    /// Records that session `id` was committed and drops its bytes. Blocking.
    pub fn mark_committed(&self, id: &str, meta: &mut SessionMeta) -> io::Result<()> {
        meta.committed = true;
        meta.last_activity_ms = now_ms();
        self.store.mark_committed(id, meta)
    }

    /// Removes a session's record and bytes. Blocking.
    pub fn remove(&self, id: &str) -> io::Result<()> {
        self.store.remove(id)?;
        self.locks.forget(id);
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
        S: Stream<Item = Result<Bytes, E>> + Send + 'static,
        E: std::error::Error + Send + Sync + 'static,
    {
        check_piece(piece, meta.offset, max_total)?;
        let body = body.map(|chunk| chunk.map_err(io::Error::other)).boxed();
        self.store.append(id, meta, piece, body, max_total).await
    }

    /// Sessions open: started, neither committed nor removed (`/metrics`). Embedded, the spool
    /// files (a commit or a removal deletes its session's); replicated, the records of every
    /// replica's sessions not marked committed. Blocking.
    pub fn open_sessions(&self) -> io::Result<u64> {
        self.store.open_sessions()
    }

    /// Removes sessions idle for longer than the timeout, and leftovers of sessions that never
    /// got a record; sessions in use are left alone (replicated: only the leader removes
    /// sessions). Then drops the locks no request holds of IDs that name no session (requests
    /// for unknown IDs, sessions removed here or, replicated, by another replica): every server
    /// has locks of its own. Returns how many sessions were removed. Blocking.
    pub fn sweep(&self) -> usize {
        let removed = self.store.sweep_expired(self.timeout, &self.locks);
        self.prune_locks();
        removed
    }

    /// [`SessionLocks::prune`] against the sessions that have a record (read outside the map's
    /// lock; a failed read drops nothing).
    fn prune_locks(&self) {
        if !self.locks.any_unused() {
            return;
        }
        match self.store.session_ids() {
            Ok(sessions) => self.locks.prune(|id| sessions.contains(id)),
            Err(e) => tracing::warn!(error = %e, "listing upload sessions to drop unused locks"),
        }
    }

    #[cfg(test)]
    pub(crate) fn locks(&self) -> &SessionLocks {
        &self.locks
    }
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
trait PieceSink {
    async fn write(&mut self, bytes: Bytes) -> io::Result<()>;
}

/// Reads `body` as `piece` of an upload holding `offset` bytes: skips what it re-sends, writes
/// the rest to `sink`, checks the limit and the declared length. Returns the new offset.
async fn receive(
    piece: Piece,
    offset: u64,
    mut body: PieceBody,
    max_total: u64,
    sink: &mut impl PieceSink,
) -> Result<u64, AppendError> {
    let mut skip = offset - piece.start;
    let mut position = offset;
    let mut received = 0u64;
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(AppendError::Body)?;
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

/// Sweeps `sessions` now and then every so often (a quarter of the timeout, between 1 s and
/// 1 min) until shutdown.
pub fn spawn_sweeper(
    sessions: Arc<UploadSessions>,
    shutdown: tokio_util::sync::CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let every = (sessions.timeout() / 4).clamp(Duration::from_secs(1), Duration::from_secs(60));
    tokio::spawn(async move {
        let mut timer = tokio::time::interval(every);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = timer.tick() => {}
            }
            let sessions = sessions.clone();
            let _ = tokio::task::spawn_blocking(move || sessions.sweep()).await;
        }
    })
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)).unwrap_or(0)
}
