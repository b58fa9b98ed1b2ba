//! Ingest of a chunked upload while its pieces arrive, so that its commit waits only for the bytes
//! of the last piece. Ingesting everything at commit made a push take the time of its pieces plus
//! the time of an ingest (`kubectl stowage push` of 1 GiB: 3 s of pieces, then 3.6 s of commit).
//!
//! The first piece of a session (embedded store) starts a writer on a thread of its own that reads
//! the session's spool file up to the acknowledged offset ([`Tail`]), waits there for the next
//! piece, and feeds the same validator and writer as a single PUT ([`super::ingest::ingest`]). The
//! commit says where the bytes end and takes the revision if
//! - the ingest succeeded,
//! - the bytes hash to the commit's digest,
//! - and the Bundle's spec is still the generation the ingest checked against.
//!
//! Otherwise the revision is dropped (which releases it) and the commit ingests from the spool as
//! before, so every refusal reads as it did. A session resumed after a restart is ingested at
//! commit too.
//!
//! Bounds: at most [`MAX_RUNNING`] at once per server (a further session is ingested at commit),
//! each a writer's memory and one thread. A session removed (DELETE, the idle sweep) or a server
//! shutting down stops its ingest within [`POLL`].

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufReader, Read};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::ingest::{ingest, Ingested, UploadTarget};
use crate::apiserver::status::{ApiError, ApiResult};
use crate::apiserver::AppState;
use crate::unpack::source::HashingReader;
use crate::unpack::tar_ingest::Encoding;

/// Sessions ingested as their pieces arrive, at most, per server.
pub const MAX_RUNNING: usize = 2;
/// How often a waiting ingest checks that its session and the server are still there.
const POLL: Duration = Duration::from_millis(250);

/// The ingests of one server's sessions, by session id.
#[derive(Default)]
pub struct EarlyIngests {
    running: Mutex<HashMap<String, Arc<Early>>>,
}

/// One session's ingest.
struct Early {
    progress: Mutex<Progress>,
    more: Condvar,
    outcome: Mutex<Option<oneshot::Receiver<Outcome>>>,
    /// The spec generation the content is checked against.
    generation: i64,
}

#[derive(Default)]
struct Progress {
    /// Bytes acknowledged: in the spool file for good.
    durable: u64,
    /// Where the bytes end, once the commit came.
    end: Option<u64>,
    stopped: bool,
}

/// What an ingest came to: the revision, and the sha256 of the bytes it read (all of them, up to
/// the end the commit gave, when it succeeded).
struct Outcome {
    ingested: ApiResult<Ingested>,
    sha256: String,
}

impl EarlyIngests {
    /// After a piece was appended to session `id`, which now holds `durable` bytes: hands them
    /// to its ingest; starts one if the piece was the session's first (`first`) and the session
    /// has its bytes on this server's disk.
    pub(super) fn piece_added(
        self: &Arc<Self>,
        app: &AppState,
        id: &str,
        durable: u64,
        first: bool,
        start: impl FnOnce() -> Option<Start>,
    ) {
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(early) = running.get(id) {
            early.advance(durable);
            return;
        }
        if !first || running.len() >= MAX_RUNNING {
            return;
        }
        let Some(start) = start() else { return };
        let Some(path) = app.uploads.local_data(id) else { return };
        let file = match File::open(&path) {
            Ok(file) => file,
            Err(e) => {
                tracing::debug!(upload = %id, error = %e, "the spool file did not open: the commit ingests");
                return;
            }
        };
        let (send, receive) = oneshot::channel();
        let early = Arc::new(Early {
            progress: Mutex::new(Progress { durable, ..Progress::default() }),
            more: Condvar::new(),
            outcome: Mutex::new(Some(receive)),
            generation: start.target.generation,
        });
        let tail = Tail { file, path, pos: 0, early: early.clone(), shutdown: app.shutdown.clone() };
        let (store, limits) = (app.store.clone(), app.limits.unpack);
        let (registry, own, session) = (Arc::downgrade(self), early.clone(), id.to_string());
        let spawned = std::thread::Builder::new().name("stowage-upload".into()).spawn(move || {
            let mut reader = HashingReader::new(BufReader::with_capacity(1 << 20, tail));
            let mut ingested = ingest(&store, limits, &start.target, &mut reader, start.encoding, |_| Ok(()));
            // The bytes after the archive (a tar's padding) count toward the digest too.
            if ingested.is_ok() {
                if let Err(e) = io::copy(&mut reader, &mut io::sink()) {
                    ingested = Err(ApiError::internal(format!("reading the spool: {e}")));
                }
            }
            if ingested.is_err() {
                // Its slot is free for another session; the commit will ingest from the spool.
                if let Some(registry) = registry.upgrade() {
                    registry.forget(&session, &own);
                }
            }
            let _ = send.send(Outcome { ingested, sha256: reader.hex_digest() });
        });
        match spawned {
            Ok(_) => {
                running.insert(id.to_string(), early);
            }
            Err(e) => tracing::warn!(upload = %id, error = %e, "could not start ingesting an upload early"),
        }
    }

    /// At the commit of session `id`, whose bytes end at `end`: the revision its ingest made, if
    /// it made one of exactly those bytes, hashing to `sha256` (hex), checked against spec
    /// `generation`. `None`: the commit ingests from the spool.
    pub(super) async fn take(&self, id: &str, end: u64, sha256: &str, generation: i64) -> Option<Ingested> {
        let early = self.running.lock().unwrap_or_else(|e| e.into_inner()).remove(id)?;
        if early.generation != generation {
            early.stop();
            return None;
        }
        early.finish(end);
        let receive = early.outcome.lock().unwrap_or_else(|e| e.into_inner()).take()?;
        let outcome = receive.await.ok()?;
        match outcome.ingested {
            Ok(ingested) if outcome.sha256 == sha256 => Some(ingested),
            // Dropped: the commit ingests again and refuses in its own words.
            _ => None,
        }
    }

    /// Removes `early` if it is still session `id`'s ingest.
    fn forget(&self, id: &str, early: &Arc<Early>) {
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        if running.get(id).is_some_and(|found| Arc::ptr_eq(found, early)) {
            running.remove(id);
        }
    }

    /// Stops session `id`'s ingest (the session was aborted).
    pub(super) fn cancel(&self, id: &str) {
        if let Some(early) = self.running.lock().unwrap_or_else(|e| e.into_inner()).remove(id) {
            early.stop();
        }
    }
}

/// What an ingest checks the content against, and how the session's bytes are encoded.
pub(super) struct Start {
    pub target: UploadTarget,
    pub encoding: Encoding,
}

impl Early {
    fn update(&self, change: impl FnOnce(&mut Progress)) {
        change(&mut self.progress.lock().unwrap_or_else(|e| e.into_inner()));
        self.more.notify_all();
    }

    fn advance(&self, durable: u64) {
        self.update(|p| p.durable = p.durable.max(durable));
    }

    fn finish(&self, end: u64) {
        self.update(|p| p.end = Some(end));
    }

    fn stop(&self) {
        self.update(|p| p.stopped = true);
    }
}

/// A session's spool file read behind its acknowledged offset, up to the end the commit gives.
struct Tail {
    file: File,
    path: PathBuf,
    pos: u64,
    early: Arc<Early>,
    shutdown: CancellationToken,
}

impl Tail {
    /// Waits until bytes past `pos` are acknowledged (`Some(end of them)`) or the session's bytes
    /// end at `pos` (`None`).
    fn wait_for_bytes(&self) -> io::Result<Option<u64>> {
        let stopped = || io::Error::other("the upload session was aborted");
        let mut progress = self.early.progress.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if progress.stopped || self.shutdown.is_cancelled() {
                return Err(stopped());
            }
            if progress.durable > self.pos {
                return Ok(Some(progress.durable));
            }
            if progress.end.is_some_and(|end| end <= self.pos) {
                return Ok(None);
            }
            let (next, waited) = self.early.more.wait_timeout(progress, POLL).unwrap_or_else(|e| e.into_inner());
            progress = next;
            // The idle sweep removes a session's files, not its ingest.
            if waited.timed_out() && !self.path.exists() {
                return Err(stopped());
            }
        }
    }
}

impl Read for Tail {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let Some(durable) = self.wait_for_bytes()? else { return Ok(0) };
        let want = buf.len().min(usize::try_from(durable - self.pos).unwrap_or(usize::MAX));
        let Some(into) = buf.get_mut(..want) else { return Ok(0) };
        let n = self.file.read_at(into, self.pos)?;
        if n == 0 && want > 0 {
            return Err(io::Error::other("the spool file is shorter than its acknowledged offset"));
        }
        self.pos += n as u64;
        Ok(n)
    }
}
