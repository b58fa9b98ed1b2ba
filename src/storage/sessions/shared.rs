//! Upload sessions in the replicated store, so that the pieces and the commit of one upload may
//! reach different replicas (behind a Service, each request goes to any of them):
//!
//! - the session's record ([`SessionMeta`]) is the etcd key `<prefix>/uploads/ID`, rewritten only
//!   by a transaction that compares the revision it was read at, so two replicas cannot both
//!   extend the same offset;
//! - each piece's new bytes are one object `uploads/ID/OFFSET-RANDOM` in the bucket, written whole
//!   (multipart past [`PART_CHUNK`]) before the record names it; the commit reads the objects in
//!   order;
//! - the commit claims the record for its replica: a commit re-sent to another replica (the
//!   aggregator cut the first at 60 s) waits while the claimant lives, then answers from the
//!   committed record or takes over;
//! - the leader's sweep removes expired sessions, and objects no record names (a piece whose
//!   replica died between its PUT and its record) once they are older than [`ORPHAN_GRACE`].

use std::collections::{HashMap, HashSet};
use std::io::{self, Read};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp};
use futures_util::future::BoxFuture;
use futures_util::StreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload, WriteMultipart};

use super::{now_ms, receive, AppendError, Part, Piece, PieceBody, PieceSink, SessionLocks, SessionMeta, SessionStore};
use crate::storage::remote::Remote;

/// Bytes buffered before a piece's object becomes a multipart upload, and the size of its parts
/// (S3's minimum part is 5 MiB): at most two of them are in memory per piece being received.
const PART_CHUNK: usize = 8 << 20;
/// Bytes fetched from the bucket per request while a commit reads the pieces.
const READ_CHUNK: u64 = 4 << 20;
/// A piece's object that no record names is removed only after this long: its replica records
/// it right after the PUT returns.
const ORPHAN_GRACE: Duration = Duration::from_secs(300);
/// How often a re-sent commit looks whether the replica committing the session is done.
const CLAIM_POLL: Duration = Duration::from_millis(500);

/// Sessions in etcd and the bucket, shared by every replica.
pub struct SharedSessions {
    remote: Arc<Remote>,
}

fn io_error(what: &str, err: impl std::fmt::Display) -> io::Error {
    io::Error::other(format!("{what}: {err}"))
}

impl SharedSessions {
    pub fn new(remote: Arc<Remote>) -> SharedSessions {
        SharedSessions { remote }
    }

    fn record_key(&self, id: &str) -> Vec<u8> {
        self.remote.key(format!("uploads/{id}").as_bytes())
    }

    fn objects_of(id: &str) -> ObjectPath {
        ObjectPath::from(format!("uploads/{id}"))
    }

    /// Writes the record of a new session (refused if the ID exists). Blocking.
    fn create_record(&self, id: &str, meta: &SessionMeta) -> io::Result<()> {
        let key = self.record_key(id);
        let value = serde_json::to_vec(meta).map_err(io::Error::other)?;
        let mut etcd = self.remote.etcd_client();
        let txn = Txn::new()
            .when(vec![Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then(vec![TxnOp::put(key, value, None)]);
        let answer = self.remote.block_on(async move { etcd.txn(txn).await }).map_err(|e| io_error("etcd", e))?;
        if !answer.succeeded() {
            return Err(io::Error::other(format!("upload session {id} exists already")));
        }
        Ok(())
    }

    /// The session's record. Blocking.
    fn load_record(&self, id: &str) -> io::Result<Option<SessionMeta>> {
        let remote = self.remote.clone();
        let key = self.record_key(id);
        self.remote.block_on(async move { load(&remote, key).await })
    }

    /// Replaces the record if nobody wrote it since `meta` was read; on success `meta` carries
    /// the new revision.
    async fn save_if(&self, id: &str, meta: &mut SessionMeta) -> io::Result<bool> {
        let key = self.record_key(id);
        let value = serde_json::to_vec(&*meta).map_err(io::Error::other)?;
        let txn = Txn::new()
            .when(vec![Compare::mod_revision(key.clone(), CompareOp::Equal, meta.revision)])
            .and_then(vec![TxnOp::put(key, value, None)]);
        let answer = self.remote.etcd_client().txn(txn).await.map_err(|e| io_error("etcd", e))?;
        if answer.succeeded() {
            meta.revision = answer.header().map_or(0, |h| h.revision());
        }
        Ok(answer.succeeded())
    }

    /// Stores the piece's new bytes as one object, then records it. See [`SessionStore::append`].
    async fn append_piece(
        &self,
        id: &str,
        meta: &mut SessionMeta,
        piece: Piece,
        body: PieceBody,
        max_total: u64,
    ) -> Result<(), AppendError> {
        let offset = meta.offset;
        let object = format!("uploads/{id}/{offset:016x}-{}", uuid::Uuid::new_v4().simple());
        let mut sink = ObjectSink::new(self.remote.object_store(), ObjectPath::from(object.as_str()));
        let position = match receive(piece, offset, body, max_total, &mut sink).await {
            Ok(position) => position,
            Err(e) => {
                sink.abort().await;
                return Err(e);
            }
        };
        let mut updated = meta.clone();
        updated.last_activity_ms = now_ms();
        if position > offset {
            sink.finish().await?;
            updated.offset = position;
            updated.parts.push(Part { start: offset, len: position - offset, object: object.clone() });
        }
        if !self.save_if(id, &mut updated).await? {
            if position > offset {
                let _ = self.remote.object_store().delete(&ObjectPath::from(object.as_str())).await;
            }
            return Err(AppendError::Raced);
        }
        *meta = updated;
        Ok(())
    }

    /// The pieces' bytes in order, fetched as they are read. Blocking reads.
    fn reader(&self, meta: &SessionMeta) -> PartsReader {
        PartsReader {
            remote: self.remote.clone(),
            parts: meta.parts.clone(),
            part: 0,
            at: 0,
            buffer: Bytes::new(),
            left: meta.offset,
        }
    }

    /// See [`SessionStore::claim_commit`].
    async fn claim(&self, id: &str, meta: &mut SessionMeta) -> io::Result<()> {
        let me = self.remote.replica_id().to_owned();
        loop {
            if meta.committed || meta.committing.as_deref() == Some(me.as_str()) {
                return Ok(());
            }
            let busy = match &meta.committing {
                Some(other) => {
                    let remote = self.remote.clone();
                    let live = tokio::task::spawn_blocking(move || remote.live_replicas())
                        .await
                        .map_err(io::Error::other)?
                        .map_err(|e| io_error("etcd", e))?;
                    live.contains(other)
                }
                None => false,
            };
            if !busy {
                let mut claimed = meta.clone();
                claimed.committing = Some(me.clone());
                if self.save_if(id, &mut claimed).await? {
                    *meta = claimed;
                    return Ok(());
                }
            } else {
                tokio::time::sleep(CLAIM_POLL).await;
            }
            *meta = load(&self.remote, self.record_key(id))
                .await?
                .ok_or_else(|| io::Error::other(format!("upload session {id} was removed while committing")))?;
        }
    }

    /// Clears this replica's claim. Blocking.
    fn release_claim(&self, id: &str, meta: &mut SessionMeta) -> io::Result<()> {
        self.remote.block_on(async {
            for _ in 0..8 {
                if meta.committing.as_deref() != Some(self.remote.replica_id()) {
                    return Ok(());
                }
                let mut released = meta.clone();
                released.committing = None;
                if self.save_if(id, &mut released).await? {
                    *meta = released;
                    return Ok(());
                }
                match load(&self.remote, self.record_key(id)).await? {
                    Some(now) => *meta = now,
                    None => return Ok(()),
                }
            }
            Err(io::Error::other("the upload session's record kept changing"))
        })
    }

    /// Records the commit (the record stays until it expires, so a re-sent commit gets the
    /// Bundle) and deletes the pieces' objects. `meta.committed` is already set. Blocking.
    fn record_commit(&self, id: &str, meta: &mut SessionMeta) -> io::Result<()> {
        let parts = std::mem::take(&mut meta.parts);
        meta.committing = None;
        self.remote.block_on(async {
            let mut saved = false;
            for _ in 0..8 {
                if self.save_if(id, meta).await? {
                    saved = true;
                    break;
                }
                // Only a stray append can have raced the claim: the commit stands regardless.
                let Some(mut now) = load(&self.remote, self.record_key(id)).await? else { break };
                now.committed = true;
                now.committing = None;
                now.parts.clear();
                now.last_activity_ms = meta.last_activity_ms;
                *meta = now;
            }
            if !saved {
                return Err(io::Error::other("the upload session's record kept changing"));
            }
            let store = self.remote.object_store();
            for part in parts {
                // Left over, the sweep removes it later.
                let _ = store.delete(&ObjectPath::from(part.object.as_str())).await;
            }
            Ok(())
        })
    }

    /// Removes the session's record, then its objects. Blocking.
    fn remove_session(&self, id: &str) -> io::Result<()> {
        let key = self.record_key(id);
        let mut etcd = self.remote.etcd_client();
        self.remote.block_on(async move { etcd.delete(key, None).await }).map_err(|e| io_error("etcd", e))?;
        self.remote.block_on(delete_under(self.remote.object_store(), Self::objects_of(id), Duration::ZERO, &[]));
        Ok(())
    }

    /// Records of sessions not marked committed, of every replica. Blocking.
    fn count_open(&self) -> io::Result<u64> {
        let prefix = self.remote.key(b"uploads/");
        let mut etcd = self.remote.etcd_client();
        let answer = self
            .remote
            .block_on(async move { etcd.get(prefix, Some(GetOptions::new().with_prefix())).await })
            .map_err(|e| io_error("etcd", e))?;
        let open = answer
            .kvs()
            .iter()
            .filter(|kv| serde_json::from_slice::<SessionMeta>(kv.value()).is_ok_and(|meta| !meta.committed))
            .count();
        Ok(open as u64)
    }

    /// The IDs of every replica's sessions that have a record (expired or not). Blocking.
    fn record_ids(&self) -> io::Result<HashSet<String>> {
        let prefix = self.remote.key(b"uploads/");
        let mut etcd = self.remote.etcd_client();
        let list = prefix.clone();
        let answer = self
            .remote
            .block_on(async move { etcd.get(list, Some(GetOptions::new().with_prefix().with_keys_only())).await })
            .map_err(|e| io_error("etcd", e))?;
        Ok(answer
            .kvs()
            .iter()
            .filter_map(|kv| kv.key().get(prefix.len()..))
            .map(|id| String::from_utf8_lossy(id).into_owned())
            .collect())
    }

    /// On the leader only: removes sessions idle longer than `timeout` (unless a live replica is
    /// committing one) and objects no record names. Blocking.
    fn sweep(&self, timeout: Duration) -> usize {
        if !self.remote.is_leader() {
            return 0;
        }
        match self.remote.block_on(self.sweep_async(timeout)) {
            Ok(removed) => removed,
            Err(e) => {
                tracing::warn!(error = %e, "sweeping upload sessions");
                0
            }
        }
    }

    async fn sweep_async(&self, timeout: Duration) -> io::Result<usize> {
        let prefix = self.remote.key(b"uploads/");
        let answer = self
            .remote
            .etcd_client()
            .get(prefix.clone(), Some(GetOptions::new().with_prefix()))
            .await
            .map_err(|e| io_error("etcd", e))?;
        let live = self.remote.live_replicas().map_err(|e| io_error("etcd", e))?;
        let timeout_ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        let now = now_ms();
        let mut records: HashMap<String, SessionMeta> = HashMap::new();
        let mut expired: HashSet<String> = HashSet::new();
        let mut removed = 0;
        for kv in answer.kvs() {
            let Some(id) = kv.key().get(prefix.len()..).map(|k| String::from_utf8_lossy(k).into_owned()) else {
                continue;
            };
            let Ok(mut meta) = serde_json::from_slice::<SessionMeta>(kv.value()) else { continue };
            meta.revision = kv.mod_revision();
            let claimed = meta.committing.as_ref().is_some_and(|r| live.contains(r));
            if claimed || now.saturating_sub(meta.last_activity_ms) <= timeout_ms {
                records.insert(id, meta);
                continue;
            }
            let txn = Txn::new()
                .when(vec![Compare::mod_revision(kv.key().to_vec(), CompareOp::Equal, meta.revision)])
                .and_then(vec![TxnOp::delete(kv.key().to_vec(), None)]);
            let deleted = self.remote.etcd_client().txn(txn).await.map_err(|e| io_error("etcd", e))?;
            if deleted.succeeded() {
                removed += 1;
                expired.insert(id.clone());
                tracing::info!(upload = %id, "removed an expired upload session");
            }
        }
        // Objects of expired sessions at once; of sessions without a record (removed, or created
        // after the records were read) and pieces never recorded, past the grace period.
        let store = self.remote.object_store();
        for id in &expired {
            delete_under(store.clone(), Self::objects_of(id), Duration::ZERO, &[]).await;
        }
        let mut listing = store.list(Some(&ObjectPath::from("uploads")));
        let mut sessions: HashSet<String> = HashSet::new();
        while let Some(object) = listing.next().await {
            let object = object.map_err(|e| io_error("object storage", e))?;
            if let Some(id) = object.location.parts().nth(1) {
                sessions.insert(id.as_ref().to_owned());
            }
        }
        for id in sessions.difference(&expired) {
            let keep: Vec<String> =
                records.get(id).map(|m| m.parts.iter().map(|p| p.object.clone()).collect()).unwrap_or_default();
            delete_under(store.clone(), Self::objects_of(id), ORPHAN_GRACE, &keep).await;
        }
        Ok(removed)
    }
}

impl SessionStore for SharedSessions {
    fn create(&self, id: &str, meta: &SessionMeta) -> io::Result<()> {
        self.create_record(id, meta)
    }

    fn load(&self, id: &str) -> io::Result<Option<SessionMeta>> {
        self.load_record(id)
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

    fn open_data(&self, _id: &str, meta: &SessionMeta) -> io::Result<Box<dyn Read + Send>> {
        Ok(Box::new(self.reader(meta)))
    }

    /// The bytes are in the bucket.
    fn local_data(&self, _id: &str) -> Option<PathBuf> {
        None
    }

    fn claim_commit<'a>(&'a self, id: &'a str, meta: &'a mut SessionMeta) -> BoxFuture<'a, io::Result<()>> {
        Box::pin(self.claim(id, meta))
    }

    fn release_commit(&self, id: &str, meta: &mut SessionMeta) -> io::Result<()> {
        self.release_claim(id, meta)
    }

    fn mark_committed(&self, id: &str, meta: &mut SessionMeta) -> io::Result<()> {
        self.record_commit(id, meta)
    }

    fn remove(&self, id: &str) -> io::Result<()> {
        self.remove_session(id)
    }

    fn open_sessions(&self) -> io::Result<u64> {
        self.count_open()
    }

    /// Only the leader removes sessions; the locks are this replica's own, and those of removed
    /// sessions go when the locks are pruned.
    fn sweep_expired(&self, timeout: Duration, _locks: &SessionLocks) -> usize {
        self.sweep(timeout)
    }

    fn session_ids(&self) -> io::Result<HashSet<String>> {
        self.record_ids()
    }
}

async fn load(remote: &Remote, key: Vec<u8>) -> io::Result<Option<SessionMeta>> {
    let answer = remote.etcd_client().get(key, None).await.map_err(|e| io_error("etcd", e))?;
    let Some(kv) = answer.kvs().first() else { return Ok(None) };
    // An unreadable record names no session, as an unreadable sidecar does.
    let Ok(mut meta) = serde_json::from_slice::<SessionMeta>(kv.value()) else { return Ok(None) };
    meta.revision = kv.mod_revision();
    Ok(Some(meta))
}

/// Deletes the objects under `prefix` older than `grace`, except those in `keep`; best effort.
async fn delete_under(store: Arc<dyn ObjectStore>, prefix: ObjectPath, grace: Duration, keep: &[String]) {
    let cutoff = chrono::Utc::now() - chrono::Duration::from_std(grace).unwrap_or_default();
    let mut listing = store.list(Some(&prefix));
    let mut doomed = Vec::new();
    while let Some(Ok(object)) = listing.next().await {
        if object.last_modified <= cutoff && !keep.iter().any(|k| k.as_str() == object.location.as_ref()) {
            doomed.push(object.location);
        }
    }
    for path in doomed {
        if let Err(e) = store.delete(&path).await {
            tracing::warn!(object = %path, error = %e, "removing an upload piece");
        }
    }
}

/// A piece's object being written: buffered up to [`PART_CHUNK`], then a multipart upload with
/// one part in flight at a time.
struct ObjectSink {
    store: Arc<dyn ObjectStore>,
    path: ObjectPath,
    buffered: Vec<u8>,
    multipart: Option<WriteMultipart>,
}

impl ObjectSink {
    fn new(store: Arc<dyn ObjectStore>, path: ObjectPath) -> ObjectSink {
        ObjectSink { store, path, buffered: Vec::new(), multipart: None }
    }

    async fn finish(self) -> io::Result<()> {
        match self.multipart {
            Some(upload) => upload.finish().await.map(drop),
            None => self.store.put(&self.path, PutPayload::from(self.buffered)).await.map(drop),
        }
        .map_err(|e| io_error("writing an upload piece to object storage", e))
    }

    async fn abort(self) {
        if let Some(upload) = self.multipart {
            let _ = upload.abort().await;
        }
    }
}

impl PieceSink for ObjectSink {
    async fn write(&mut self, bytes: Bytes) -> io::Result<()> {
        if let Some(upload) = &mut self.multipart {
            upload.wait_for_capacity(1).await.map_err(|e| io_error("writing an upload piece to object storage", e))?;
            upload.put(bytes);
            return Ok(());
        }
        self.buffered.extend_from_slice(&bytes);
        if self.buffered.len() >= PART_CHUNK {
            let upload = self
                .store
                .put_multipart(&self.path)
                .await
                .map_err(|e| io_error("writing an upload piece to object storage", e))?;
            let mut upload = WriteMultipart::new_with_chunk_size(upload, PART_CHUNK);
            upload.write(&std::mem::take(&mut self.buffered));
            self.multipart = Some(upload);
        }
        Ok(())
    }
}

/// Reads a session's pieces in order from the bucket, [`READ_CHUNK`] at a time.
struct PartsReader {
    remote: Arc<Remote>,
    parts: Vec<Part>,
    /// The part being read and the position in it.
    part: usize,
    at: u64,
    buffer: Bytes,
    /// Bytes of the upload not yet read.
    left: u64,
}

impl Read for PartsReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.buffer.is_empty() {
            if self.left == 0 {
                return Ok(0);
            }
            let Some(part) = self.parts.get(self.part) else {
                return Err(io::Error::other("the upload's recorded pieces end before its offset"));
            };
            if self.at >= part.len {
                self.part += 1;
                self.at = 0;
                continue;
            }
            let range = self.at..part.len.min(self.at + READ_CHUNK);
            let store = self.remote.object_store();
            let path = ObjectPath::from(part.object.as_str());
            let fetch = range.clone();
            let bytes = self
                .remote
                .block_on(async move { store.get_range(&path, fetch).await })
                .map_err(|e| io_error("reading an upload piece from object storage", e))?;
            if bytes.len() as u64 != range.end - range.start {
                return Err(io::Error::other("an upload piece in object storage is shorter than recorded"));
            }
            self.at = range.end;
            self.buffer = bytes;
        }
        let n = buf.len().min(self.buffer.len()).min(usize::try_from(self.left).unwrap_or(usize::MAX));
        let chunk = self.buffer.split_to(n);
        buf.get_mut(..n).unwrap_or_default().copy_from_slice(&chunk);
        self.left -= n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::super::UploadSessions;
    use super::*;

    #[test]
    fn a_shared_sweep_drops_the_locks_of_unknown_sessions_only() {
        let backends = crate::storage::remote_tests::start_backends();
        let remote = Remote::connect(crate::storage::remote_tests::remote_options(&backends, "a")).unwrap();
        let sessions = UploadSessions::with(Arc::new(SharedSessions::new(remote)), Duration::from_secs(60));
        let live = sessions.create(&SessionMeta::new("ns", "b", "uid", "")).unwrap();
        // A request for an ID that names no session leaves its lock behind.
        let unknown = uuid::Uuid::new_v4().to_string();
        drop(sessions.lock(&unknown));
        // A request in progress (a commit holds its session's lock throughout) keeps its lock,
        // whether or not the record exists; so does one that has its lock and not locked it yet.
        let (busy, waiting) = (uuid::Uuid::new_v4().to_string(), uuid::Uuid::new_v4().to_string());
        let busy_lock = sessions.lock(&busy);
        let _held = busy_lock.try_lock().unwrap();
        let _waiting_lock = sessions.lock(&waiting);
        sessions.sweep();
        let locks = sessions.locks();
        assert!(!locks.holds(&unknown), "the lock of an unknown session is dropped");
        assert!(locks.holds(&live), "the lock of a live session stays");
        assert!(locks.holds(&busy) && locks.holds(&waiting), "locks in use stay");
    }
}
