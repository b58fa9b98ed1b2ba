//! Object writes applied in groups: one sled batch for all the writes waiting at once.
//!
//! sled rolls its log buffer twice for every batch it applies (each roll a buffer write handed to
//! its I/O threads, waking all seven of them): for a create that cost more than everything else it
//! stores. So in embedded mode a writer queues its writes, and whichever writer holds the object
//! lock applies every write queued when it got there, each at its own resourceVersion, as one
//! batch, and leaves each writer its outcome; a writer whose writes were applied for it finds them
//! done once it gets the lock. The lock still orders resourceVersions as before.
//!
//! A write is built on the state before its group, so a group holds only writes with disjoint
//! keys: a write that reads or writes a key an earlier write of the group touches closes the group,
//! and is built again on the state the group leaves. A write refused (its precondition) is refused
//! alone. A group is one atomic batch: after a crash none or all of it is there, and none of it is
//! acknowledged before the flush covering it ([`super::commit`]).
//!
//! Replicated mode groups the same way: a group is one transaction, compared
//! against the resourceVersion counter it was built on and within `--etcd-max-txn-ops`. It is
//! built from the object cache when that holds this replica's last write; a group whose
//! comparison failed (another replica wrote meanwhile), or a write refused on the cache's state, is
//! built again from etcd.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;

use super::meta::{Batch, Reads};
use super::objects::{key_revision, BuiltWrite, RV_COUNTER};
use super::{ObjectWrite, Result, StorageError, Store};

/// Writes applied in one group, at most (a group's batch holds their objects).
const MAX_GROUP: usize = 64;

/// Writes waiting for the holder of the object lock, in arrival order.
#[derive(Default)]
pub(super) struct ApplyQueue {
    waiting: Mutex<Vec<Arc<QueuedWrite>>>,
}

struct QueuedWrite {
    writes: Vec<ObjectWrite>,
    /// Cancelled when whoever asked for the writes stopped waiting for them (an abandoned request):
    /// a write not yet applied then never is. Applied later, a client that gave up on it could see
    /// it land after its own next writes (a create retried elsewhere, then deleted, coming back).
    abandoned: CancellationToken,
    /// Set by whoever applied (or refused) the writes.
    outcome: Mutex<Option<Result<BuiltWrite>>>,
}

impl QueuedWrite {
    fn settle(&self, outcome: Result<BuiltWrite>) {
        *self.outcome.lock().unwrap_or_else(|e| e.into_inner()) = Some(outcome);
    }

    fn settled(&self) -> bool {
        self.outcome.lock().unwrap_or_else(|e| e.into_inner()).is_some()
    }

    /// The keys the writes read before they are built: their objects, and the revision records a
    /// put names.
    fn read_keys(&self) -> Vec<Vec<u8>> {
        let mut keys = Vec::with_capacity(self.writes.len());
        for write in &self.writes {
            match write {
                ObjectWrite::Put { key, revision, .. } => {
                    keys.push(key.encode());
                    keys.extend(revision.map(key_revision));
                }
                ObjectWrite::Delete { key, .. } => keys.push(key.encode()),
            }
        }
        keys
    }
}

impl Store {
    /// Applies `writes` in a group with the writes waiting beside them, unless `abandoned` is
    /// cancelled first ([`StorageError::Cancelled`]).
    pub(super) fn apply_queued(&self, writes: Vec<ObjectWrite>, abandoned: CancellationToken) -> Result<BuiltWrite> {
        let queued = Arc::new(QueuedWrite { writes, abandoned, outcome: Mutex::new(None) });
        let queue = &self.inner.apply_queue;
        queue.waiting.lock().unwrap_or_else(|e| e.into_inner()).push(queued.clone());
        {
            let _objects = self.lock_objects();
            if !queued.settled() {
                let waiting = std::mem::take(&mut *queue.waiting.lock().unwrap_or_else(|e| e.into_inner()));
                self.apply_groups(&waiting);
            }
        }
        let outcome = queued.outcome.lock().unwrap_or_else(|e| e.into_inner()).take();
        outcome.unwrap_or_else(|| Err(StorageError::Corrupt("an object write was queued but never applied".into())))
    }

    /// Applies `waiting` in as few groups as their keys allow, settling every one. Under the
    /// object lock.
    fn apply_groups(&self, waiting: &[Arc<QueuedWrite>]) {
        let backend = self.backend();
        let max_ops = backend.group_ops();
        let mut cached = backend.cached_write_reads();
        let mut rest = waiting;
        while !rest.is_empty() {
            let from_cache = cached.is_some();
            let reads = cached.unwrap_or(Reads::Map(self.tree()));
            let counter = match reads.get(RV_COUNTER) {
                Ok(counter) => counter,
                Err(_) if from_cache => {
                    cached = None;
                    continue;
                }
                Err(e) => return rest.iter().for_each(|q| q.settle(Err(shared_failure(&e)))),
            };
            let current = match counter.as_deref().map(super::read_be).transpose() {
                Ok(rv) => rv.unwrap_or(0),
                Err(e) => return rest.iter().for_each(|q| q.settle(Err(shared_failure(&e)))),
            };
            let group_start = rest;
            let mut batch = Batch::default();
            let mut touched: HashSet<Vec<u8>> = HashSet::new();
            let mut members: Vec<(&Arc<QueuedWrite>, BuiltWrite)> = Vec::new();
            let mut rebuild = false;
            while let Some((queued, after)) = rest.split_first() {
                if members.len() == MAX_GROUP {
                    break;
                }
                if queued.abandoned.is_cancelled() {
                    tracing::debug!(
                        writes = ?queued.writes.iter().map(ObjectWrite::describe).collect::<Vec<_>>(),
                        "write abandoned before its turn: not applied"
                    );
                    queued.settle(Err(StorageError::Cancelled));
                    rest = after;
                    continue;
                }
                let reads_of = queued.read_keys();
                if reads_of.iter().any(|k| touched.contains(k)) {
                    break;
                }
                let rv = current + members.len() as u64 + 1;
                let (own, built) = match self.object_batch(reads, rv, &queued.writes) {
                    Ok(made) => made,
                    // Refused on the cache's state, which may be behind etcd's: decided on etcd's.
                    Err(_) if from_cache => {
                        rebuild = true;
                        break;
                    }
                    Err(e) => {
                        // Refused on the state before the group, which its keys share with the
                        // state after the writes before it.
                        queued.settle(Err(e));
                        rest = after;
                        continue;
                    }
                };
                let written: Vec<&[u8]> = own.keys().filter(|k| *k != RV_COUNTER).collect();
                if written.iter().any(|k| touched.contains(*k)) {
                    break;
                }
                // A write alone over the limit is refused by the backend, with the reason.
                if !members.is_empty() && batch.len() + written.len() + 1 > max_ops {
                    break;
                }
                touched.extend(reads_of);
                touched.extend(written.iter().map(|k| k.to_vec()));
                batch.extend(own);
                members.push((queued, built));
                rest = after;
            }
            if rebuild {
                cached = None;
                rest = group_start;
                continue;
            }
            if members.is_empty() {
                continue;
            }
            match backend.apply_group(self, batch, counter.as_deref()) {
                Ok(true) => {
                    tracing::debug!(
                        from_cache,
                        counter = current,
                        writes = ?members.iter().flat_map(|(q, _)| q.writes.iter().map(ObjectWrite::describe)).collect::<Vec<_>>(),
                        "write group applied"
                    );
                    self.batch_applied();
                    members.into_iter().for_each(|(queued, built)| queued.settle(Ok(built)));
                }
                // Another replica moved the counter: the same writes, built on etcd's state.
                Ok(false) => {
                    cached = None;
                    rest = group_start;
                }
                Err(e) => members.into_iter().for_each(|(queued, _)| queued.settle(Err(shared_failure(&e)))),
            }
        }
    }
}

/// A failure every writer of a group gets: what it says, kept where it matters to the caller.
fn shared_failure(e: &StorageError) -> StorageError {
    match e {
        StorageError::InsufficientStorage(s) => StorageError::InsufficientStorage(s.clone()),
        StorageError::Poisoned(s) => StorageError::Poisoned(s.clone()),
        StorageError::Corrupt(s) => StorageError::Corrupt(s.clone()),
        other => StorageError::Io(std::io::Error::other(other.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use crate::storage::{ObjectKey, ObjectWrite, Precondition, Store, StoreOptions, WriteOutcome};

    fn key(name: &str) -> ObjectKey {
        ObjectKey::new("bundles", "ns", name)
    }

    fn create(name: &str) -> ObjectWrite {
        ObjectWrite::Put {
            key: key(name),
            object: serde_json::json!({"metadata": {"name": name}}),
            precondition: Precondition::MustNotExist,
            revision: None,
        }
    }

    fn queued(store: &Store) -> usize {
        store.inner.apply_queue.waiting.lock().unwrap().len()
    }

    /// Runs each write on a thread of its own while the object lock is held, queued in the order
    /// given; then lets them apply. Returns their outcomes in that order.
    fn queue_then_apply(store: &Store, writes: Vec<ObjectWrite>) -> Vec<crate::storage::Result<WriteOutcome>> {
        let held = store.lock_objects();
        let threads: Vec<_> = writes
            .into_iter()
            .enumerate()
            .map(|(i, write)| {
                let thread = {
                    let store = store.clone();
                    std::thread::spawn(move || store.write_objects(vec![write]))
                };
                while queued(store) < i + 1 {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                thread
            })
            .collect();
        drop(held);
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    }

    #[test]
    fn writes_waiting_at_once_are_applied_in_one_batch_each_at_its_own_resource_version() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
        let before = store.commit_counts().batches;
        let outcomes = queue_then_apply(&store, (0..16).map(|i| create(&format!("b{i}"))).collect());
        let rvs: Vec<u64> = outcomes.into_iter().map(|o| o.unwrap().resource_version).collect();
        assert_eq!(rvs, (1..=16).collect::<Vec<u64>>(), "in queue order");
        assert_eq!(store.commit_counts().batches - before, 1, "one batch for the sixteen");
        let logged: Vec<u64> = store.changes_since(0).map(|c| c.unwrap().0).collect();
        assert_eq!(logged, rvs);
        drop(store);
        let reopened = Store::open(dir.path(), StoreOptions::default()).unwrap();
        assert_eq!(reopened.durable_resource_version(), 16);
        assert!(reopened.get_object(&key("b15")).unwrap().is_some());
    }

    /// A request dropped while its create waited for the lock (its connection abandoned): the
    /// create never lands, though the writes queued beside it do.
    #[test]
    fn a_write_abandoned_while_it_waits_is_never_applied() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
        let held = store.lock_objects();
        let abandoned = tokio_util::sync::CancellationToken::new();
        let threads: Vec<_> = ["a", "gone", "b"]
            .into_iter()
            .enumerate()
            .map(|(i, name)| {
                let (writer, token) = (store.clone(), abandoned.clone());
                let thread = std::thread::spawn(move || {
                    let token = if name == "gone" { token } else { tokio_util::sync::CancellationToken::new() };
                    let pending = writer.apply_objects_unless(vec![create(name)], token)?;
                    writer.make_durable(pending).map(|o| o.resource_version)
                });
                while queued(&store) < i + 1 {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                thread
            })
            .collect();
        abandoned.cancel();
        drop(held);
        let outcomes: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        assert!(matches!(outcomes[1], Err(crate::storage::StorageError::Cancelled)), "{outcomes:?}");
        assert_eq!(outcomes[0].as_ref().ok(), Some(&1));
        assert_eq!(outcomes[2].as_ref().ok(), Some(&2), "the write after it takes the next resourceVersion");
        assert!(store.get_object(&key("gone")).unwrap().is_none(), "an abandoned create was applied");
        assert!(store.get_object(&key("b")).unwrap().is_some());
    }

    #[test]
    fn a_write_sharing_a_key_with_an_earlier_one_sees_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
        let before = store.commit_counts().batches;
        // A delete without precondition of what the create before it makes: built on the state
        // before the create, it would find nothing to delete.
        let outcomes = queue_then_apply(
            &store,
            vec![
                create("x"),
                ObjectWrite::Delete { key: key("x"), precondition: Precondition::None },
                create("y"),
                create("x"),
                create("x"),
            ],
        );
        let rvs: Vec<Option<u64>> = outcomes.iter().map(|o| o.as_ref().ok().map(|w| w.resource_version)).collect();
        assert_eq!(rvs, vec![Some(1), Some(2), Some(3), Some(4), None], "{outcomes:?}");
        assert!(matches!(outcomes.last(), Some(Err(crate::storage::StorageError::AlreadyExists(_)))), "{outcomes:?}");
        let deleted = store.changes_since(0).map(|c| c.unwrap().1).find(|e| e.kind == "DELETED");
        assert!(deleted.is_some(), "the delete removed the created object");
        assert!(store.get_object(&key("x")).unwrap().is_some_and(|o| o.resource_version == 4));
        // {create x}, {delete x, create y}, {create x}, {create x: refused}
        assert_eq!(store.commit_counts().batches - before, 3);
    }
}
