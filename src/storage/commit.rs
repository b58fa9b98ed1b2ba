//! Group commit: an object write is acknowledged once durable, but concurrent writers share flushes.
//!
//! A write applies its batch under the object lock (which fixes resourceVersion order) and flushes
//! after releasing it. The flush is serialised by its own lock: a writer that gets it flushes every
//! batch applied so far — the resourceVersion counter is in each batch and batches are applied in
//! order, so the counter read just before a flush names the newest write the flush covers — and
//! the writers queued behind it find their write already durable and return without flushing.
//!
//! sled blocks every batch while a flush runs, so writers that arrived during one flush could not
//! apply before the next one started: each flush would cover one write. The flusher therefore
//! first lets the writers already between the object lock and their batch apply (for at most as
//! long as the previous flush took, so a fast disk waits next to nothing; asleep, woken by the
//! last of them), then flushes them all.
//!
//! Readers see a change only once it is durable ([`Store::durable_resource_version`]): those that
//! follow the change log (watches, the garbage collector, the unpack reconciler) stop at it, a list
//! is at it, and a read of one object whose last change is newer waits for the flush covering that
//! change. No client is shown a write that a crash could still undo.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use std::sync::Arc;

use super::{Result, Store};

/// The longest a flusher waits for writers about to apply their batches.
const MAX_GATHER: Duration = Duration::from_millis(2);

/// Group-commit state of a store.
#[derive(Default)]
pub(super) struct Commits {
    /// Serialises flushes of object writes.
    flush_lock: std::sync::Mutex<()>,
    /// The newest resourceVersion a flush made durable.
    durable_rv: AtomicU64,
    /// Writers that entered [`Store::write_objects`] and have not applied their batch yet.
    applying: AtomicUsize,
    /// A flusher is waiting for `applying` to reach zero; the last writer to apply wakes it.
    gathering: AtomicBool,
    gather_lock: std::sync::Mutex<()>,
    gathered: std::sync::Condvar,
    /// How long the last flush took (nanoseconds): the most worth waiting for more writers.
    last_flush_nanos: AtomicU64,
    /// Bumped after every flush attempt of object writes, made durable or failed: what writers
    /// acknowledged asynchronously ([`Store::acknowledge`]) wait on instead of holding a thread.
    flush_rounds: tokio::sync::watch::Sender<u64>,
    /// An asynchronous writer is flushing on the blocking pool for all of them.
    async_flusher: AtomicBool,
    /// Flushes made by object writes, and the writes acknowledged (metrics).
    flushes: AtomicU64,
    writes: AtomicU64,
    batches: AtomicU64,
}

impl Commits {
    /// Moves the durable resourceVersion up to `rv`: writes of other replicas, durable in etcd.
    pub(super) fn durable_at_least(&self, rv: u64) {
        self.durable_rv.fetch_max(rv, Ordering::AcqRel);
    }
}

/// A writer on its way to applying its batch; see [`Store::applying`].
pub(super) struct Applying<'a>(&'a Commits);

impl Drop for Applying<'_> {
    fn drop(&mut self) {
        let commits = self.0;
        // SeqCst with the flusher's store of `gathering` and load of `applying`: either it sees
        // this decrement or this sees it waiting.
        if commits.applying.fetch_sub(1, Ordering::SeqCst) == 1 && commits.gathering.load(Ordering::SeqCst) {
            let _lock = commits.gather_lock.lock().unwrap_or_else(|e| e.into_inner());
            commits.gathered.notify_one();
        }
    }
}

/// The asynchronous writer flushing for the others; when it is done or gone, another may.
struct Leading<'a>(&'a Commits);

impl Drop for Leading<'_> {
    fn drop(&mut self) {
        // Cleared before the waiters are woken, so that one of them can take over.
        self.0.async_flusher.store(false, Ordering::SeqCst);
        self.0.flush_rounds.send_modify(|n| *n = n.wrapping_add(1));
    }
}

/// An object write applied but not yet known durable: no reader sees it, and a crash may undo
/// it. [`Store::acknowledge`] waits for the flush covering it.
#[must_use = "a write is acknowledged only once durable"]
pub struct PendingWrite {
    pub(super) outcome: super::WriteOutcome,
    /// A revision changed state: the collector should look once it is durable.
    pub(super) collect: bool,
}

/// Object writes acknowledged durable, and the flushes they took.
#[derive(Debug, Clone, Copy, Default)]
pub struct CommitCounts {
    pub writes: u64,
    pub flushes: u64,
    /// Database batches they were applied in ([`super::apply_queue`]; embedded mode).
    pub batches: u64,
}

impl Store {
    /// At open: whatever the database holds after a restart is on disk.
    pub(super) fn start_commits(&self) -> Result<()> {
        let recovered = self.current_resource_version()?;
        self.inner.commits.durable_rv.store(recovered, Ordering::Release);
        Ok(())
    }

    /// Counts a batch of object writes applied.
    pub(super) fn batch_applied(&self) {
        self.inner.commits.batches.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a writer as about to apply a batch until the returned guard is dropped.
    pub(super) fn applying(&self) -> Applying<'_> {
        let commits = &self.inner.commits;
        commits.applying.fetch_add(1, Ordering::SeqCst);
        Applying(commits)
    }

    /// Returns once `pending` is durable, flushing if no concurrent writer's flush already
    /// covered it (blocking: for the blocking pool and the store's own threads).
    pub(super) fn make_durable(&self, pending: PendingWrite) -> Result<super::WriteOutcome> {
        self.flush_covering(pending.outcome.resource_version)?;
        Ok(self.acknowledged(pending))
    }

    /// [`Store::make_durable`] without holding a thread: the writes waiting at once share one
    /// flush, which one of them runs on the blocking pool while the others wait for it to end.
    /// (Thirty-two writers each blocking a thread on the flush lock spent a fifth of the server's
    /// time switching between them.)
    pub async fn acknowledge(&self, pending: PendingWrite) -> Result<super::WriteOutcome> {
        let rv = pending.outcome.resource_version;
        let commits = &self.inner.commits;
        let mut rounds = commits.flush_rounds.subscribe();
        while self.durable_resource_version() < rv {
            if commits.async_flusher.compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst).is_ok() {
                let _leading = Leading(commits);
                let store = self.clone();
                tokio::task::spawn_blocking(move || store.flush_covering(rv))
                    .await
                    .map_err(|e| super::StorageError::Io(std::io::Error::other(e)))??;
                break;
            }
            // The sender lives as long as the store, which `self` holds.
            let _ = rounds.changed().await;
        }
        Ok(self.acknowledged(pending))
    }

    fn acknowledged(&self, pending: PendingWrite) -> super::WriteOutcome {
        self.inner.commits.writes.fetch_add(1, Ordering::Relaxed);
        if pending.collect {
            self.request_gc();
        }
        pending.outcome
    }

    /// Returns once every object write up to `rv` is durable (flushing unless a flush covered it).
    pub(super) fn flush_covering(&self, rv: u64) -> Result<()> {
        let commits = &self.inner.commits;
        if self.durable_resource_version() >= rv {
            return Ok(());
        }
        let _flushing = self.lock_flushes();
        if self.durable_resource_version() >= rv {
            return Ok(()); // the flush we queued behind covered it
        }
        let gather = Duration::from_nanos(commits.last_flush_nanos.load(Ordering::Relaxed)).min(MAX_GATHER);
        // Asleep, not spinning: on a small machine the writers need the core this would take.
        commits.gathering.store(true, Ordering::SeqCst);
        let lock = commits.gather_lock.lock().unwrap_or_else(|e| e.into_inner());
        let waited = commits.gathered.wait_timeout_while(lock, gather, |_| commits.applying.load(Ordering::SeqCst) > 0);
        drop(waited);
        commits.gathering.store(false, Ordering::SeqCst);
        let flushed = self.flush_all_applied();
        // Asynchronous writers waiting on this flush look again, whether it worked or not.
        commits.flush_rounds.send_modify(|n| *n = n.wrapping_add(1));
        flushed
    }

    fn flush_all_applied(&self) -> Result<()> {
        let commits = &self.inner.commits;
        let applied = self.current_resource_version()?;
        let flush_started = Instant::now();
        self.flush()?;
        let took = u64::try_from(flush_started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        commits.last_flush_nanos.store(took, Ordering::Relaxed);
        commits.flushes.fetch_add(1, Ordering::Relaxed);
        commits.durable_rv.fetch_max(applied, Ordering::AcqRel);
        let _ = self.inner.events.send(applied);
        Ok(())
    }

    /// The newest resourceVersion whose write is durable. Change-log readers stop there.
    /// Replicated mode: other replicas' writes are announced like this one's, as etcd reports
    /// the resourceVersion counter moving.
    pub(super) fn follow_remote_writes(&self) {
        self.backend().follow_writes(Arc::downgrade(&self.inner));
    }

    /// A resourceVersion every write acknowledged before the call is at or below: the durable one
    /// (embedded); in replicated mode read from etcd, since other replicas write too.
    pub fn consistent_resource_version(&self) -> Result<u64> {
        match self.backend().catch_up_durable(self)? {
            Some(reached) => Ok(reached),
            None => Ok(self.durable_resource_version()),
        }
    }

    pub fn durable_resource_version(&self) -> u64 {
        self.inner.commits.durable_rv.load(Ordering::Acquire)
    }

    /// Holds every object write between applying its batch and its flush until the guard is
    /// dropped: the window a slow disk opens, for tests of what readers see in it.
    #[cfg(test)]
    pub(crate) fn hold_flushes(&self) -> std::sync::MutexGuard<'_, ()> {
        self.lock_flushes()
    }

    fn lock_flushes(&self) -> std::sync::MutexGuard<'_, ()> {
        // A poisoned lock guards no data: the flush state is in atomics.
        self.inner.commits.flush_lock.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Object writes acknowledged, and the flushes they took, since the store was opened.
    pub fn commit_counts(&self) -> CommitCounts {
        let commits = &self.inner.commits;
        CommitCounts {
            writes: commits.writes.load(Ordering::Relaxed),
            flushes: commits.flushes.load(Ordering::Relaxed),
            batches: commits.batches.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::storage::{ListQuery, ObjectKey, ObjectWrite, Precondition, Store, StoreOptions};

    fn put(name: &str) -> ObjectWrite {
        ObjectWrite::Put {
            key: ObjectKey::new("bundles", "ns", name),
            object: serde_json::json!({"metadata": {"name": name}}),
            precondition: Precondition::None,
            revision: None,
        }
    }

    /// Reads `name` on another thread; returns whether it was found and the durable
    /// resourceVersion when the read returned.
    fn get_elsewhere(store: &Store, name: &str) -> std::thread::JoinHandle<(Option<u64>, u64)> {
        let (store, key) = (store.clone(), ObjectKey::new("bundles", "ns", name));
        std::thread::spawn(move || {
            let found = store.get_object(&key).unwrap().map(|o| o.resource_version);
            (found, store.durable_resource_version())
        })
    }

    #[test]
    fn reads_never_see_a_write_before_it_is_durable() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
        store.write_objects(vec![put("first")]).unwrap();
        // Applied, not yet flushed: a crash now would take it back.
        let held = store.hold_flushes();
        let writer = {
            let store = store.clone();
            std::thread::spawn(move || {
                let delete = ObjectWrite::Delete {
                    key: ObjectKey::new("bundles", "ns", "first"),
                    precondition: Precondition::MustExist,
                };
                store.write_objects(vec![put("second"), delete]).unwrap().resource_version
            })
        };
        while store.current_resource_version().unwrap() < 2 {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let query = ListQuery { resource: "bundles", namespace: Some("ns"), at: None, after: None, limit: None };
        let list = store.list_page(&query, None).unwrap();
        let names: Vec<&str> = list.items.iter().filter_map(|o| o.pointer("/metadata/name")?.as_str()).collect();
        assert_eq!((names, list.resource_version), (vec!["first"], 1), "a list shows the durable state");
        let (second, first) = (get_elsewhere(&store, "second"), get_elsewhere(&store, "first"));
        drop(held);
        assert_eq!(writer.join().unwrap(), 2);
        // Each read returned the write's result only once it was durable.
        let (found, durable) = second.join().unwrap();
        assert!(found.is_none_or(|rv| rv <= durable), "second at {found:?} served when durable was {durable}");
        let (found, durable) = first.join().unwrap();
        assert!(found.is_some() || durable >= 2, "first served as deleted when durable was {durable}");
    }

    #[test]
    fn concurrent_writers_are_each_acknowledged_durable_and_logged_once_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let store = store.clone();
                std::thread::spawn(move || {
                    (0..50)
                        .map(|i| {
                            let name = format!("w{t}-{i}");
                            let write = ObjectWrite::Put {
                                key: ObjectKey::new("bundles", "ns", &name),
                                object: serde_json::json!({"metadata": {"name": name}}),
                                precondition: Precondition::MustNotExist,
                                revision: None,
                            };
                            let rv = store.write_objects(vec![write]).unwrap().resource_version;
                            // Acknowledged means durable: a log reader already sees it.
                            assert!(store.durable_resource_version() >= rv);
                            rv
                        })
                        .collect::<Vec<u64>>()
                })
            })
            .collect();
        let mut acknowledged: Vec<u64> = threads.into_iter().flat_map(|t| t.join().unwrap()).collect();
        acknowledged.sort_unstable();
        assert_eq!(acknowledged, (1..=400).collect::<Vec<u64>>());
        let logged: Vec<u64> = store.changes_since(0).map(|c| c.unwrap().0).collect();
        assert_eq!(logged, acknowledged);
        drop(store);
        let reopened = Store::open(dir.path(), StoreOptions::default()).unwrap();
        assert_eq!(reopened.durable_resource_version(), 400);
    }

    /// Writers acknowledged asynchronously while the disk is slow (the flush lock held) hold no
    /// thread: all of them apply, though the runtime has far fewer blocking threads than writers,
    /// and each is acknowledged only once durable, after the flush they share.
    #[test]
    fn asynchronous_writers_wait_for_a_slow_flush_without_holding_threads() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
        let runtime =
            tokio::runtime::Builder::new_multi_thread().worker_threads(2).max_blocking_threads(2).build().unwrap();
        let held = store.hold_flushes();
        let writers: Vec<_> = (0..64)
            .map(|i| {
                let store = store.clone();
                runtime.spawn(async move {
                    let write = put(&format!("w{i}"));
                    let applying = store.clone();
                    let pending = tokio::task::spawn_blocking(move || applying.apply_objects(vec![write]))
                        .await
                        .unwrap()
                        .unwrap();
                    let rv = store.acknowledge(pending).await.unwrap().resource_version;
                    assert!(store.durable_resource_version() >= rv, "acknowledged {rv} before it was durable");
                    rv
                })
            })
            .collect();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while store.current_resource_version().unwrap() < 64 {
            assert!(std::time::Instant::now() < deadline, "writers stuck behind the flush: threads held");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(store.durable_resource_version(), 0, "nothing is durable while the flush is held");
        drop(held);
        let mut acknowledged: Vec<u64> = writers.into_iter().map(|w| runtime.block_on(w).unwrap()).collect();
        acknowledged.sort_unstable();
        assert_eq!(acknowledged, (1..=64).collect::<Vec<u64>>());
        let counts = store.commit_counts();
        assert!(counts.flushes < 8, "64 writes that waited together took {} flushes", counts.flushes);
    }
}
