//! The watch cache: one follower of the change log per store, shared by every watch (the design of
//! kube-apiserver's watch cache).
//!
//! A thread reads the log as writes land, decodes each change once into an [`Arc`]ed
//! [`CachedEvent`] together with its full-object watch line (serialised once, shared as `Bytes`),
//! and keeps the most recent events in a bounded ring. Watchers are woken through a
//! `tokio::sync::watch` channel carrying the ring's end, take the events after their position out of
//! the ring and filter them themselves. Writers only notify the follower (a broadcast send), and the
//! follower never waits for a watcher, so a slow watcher delays no one but itself; one whose
//! position fell out of the ring reads the store's log directly until it catches up
//! ([`Window::Behind`]).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use axum::body::Bytes;
use serde::Serialize;
use serde_json::Value;
use tokio::sync::{broadcast, watch};

use crate::storage::{ChangeEvent, StorageError, Store};

/// Most events the ring keeps.
const MAX_EVENTS: usize = 4096;
/// Most bytes of watch lines the ring keeps (the decoded objects take a few times more).
const MAX_LINE_BYTES: usize = 16 << 20;
/// Log entries read per step.
const BATCH: usize = 512;
/// How long the follower waits after a failed log read before it tries again.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// One change as every watcher sees it: decoded once.
pub struct CachedEvent {
    pub rv: u64,
    pub change: ChangeEvent,
    /// `{"type":…,"object":…}` and a newline, for the change's own type and object: what a watcher
    /// of full objects sends for it unless a selector transition turns it into another type.
    pub line: Bytes,
}

/// What the ring holds after a watcher's position.
pub enum Window {
    /// Every event after it, oldest first (at most about one batch; empty when there are none yet).
    Events(Vec<Arc<CachedEvent>>),
    /// The ring no longer (or not yet) reaches back to it: read the store's log.
    Behind,
}

/// A store's shared watch cache.
pub struct WatchCache {
    ring: Mutex<Ring>,
    /// The ring's end: changes whenever events were added.
    ticks: watch::Sender<u64>,
    /// The store, while it is open (the cache must not keep it open).
    store: Box<dyn Fn() -> Option<Store> + Send + Sync>,
}

/// Every change with a resourceVersion in `(start, end]`, oldest first.
struct Ring {
    events: VecDeque<Arc<CachedEvent>>,
    start: u64,
    end: u64,
    line_bytes: usize,
    /// Most events and line bytes it keeps.
    limits: (usize, usize),
}

/// The caches of the open stores (a process normally has one).
static CACHES: Mutex<Vec<Arc<WatchCache>>> = Mutex::new(Vec::new());

/// The watch cache of `store`, started with the first watch.
pub fn shared(store: &Store) -> std::io::Result<Arc<WatchCache>> {
    let mut caches = CACHES.lock().unwrap_or_else(PoisonError::into_inner);
    caches.retain(|cache| (cache.store)().is_some());
    if let Some(cache) = caches.iter().find(|cache| (cache.store)().is_some_and(|s| s.same_store(store))) {
        return Ok(cache.clone());
    }
    let cache = Arc::new(WatchCache {
        // Until the follower has read where the log is, every watcher reads the log itself.
        ring: Mutex::new(Ring::new(u64::MAX, (MAX_EVENTS, MAX_LINE_BYTES))),
        ticks: watch::Sender::new(0),
        store: Box::new(store.downgrade()),
    });
    let notifications = store.subscribe();
    let follower = cache.clone();
    std::thread::Builder::new().name("watch-cache".into()).spawn(move || follower.follow(notifications))?;
    caches.push(cache.clone());
    Ok(cache)
}

impl WatchCache {
    /// Notified (with the ring's end) whenever events were added.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.ticks.subscribe()
    }

    /// The events after resourceVersion `from`: about `max` of them, never splitting the changes of
    /// one resourceVersion.
    pub fn events_after(&self, from: u64, max: usize) -> Window {
        let ring = self.lock();
        if from < ring.start {
            return Window::Behind;
        }
        let first = ring.events.partition_point(|e| e.rv <= from);
        let mut out: Vec<Arc<CachedEvent>> = Vec::new();
        for event in ring.events.range(first..) {
            if out.len() >= max && out.last().is_some_and(|last| last.rv != event.rv) {
                break;
            }
            out.push(event.clone());
        }
        Window::Events(out)
    }

    fn lock(&self) -> MutexGuard<'_, Ring> {
        self.ring.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The follower thread: reads the log after every write until the store closes.
    fn follow(&self, mut notifications: broadcast::Receiver<u64>) {
        loop {
            let Some(store) = (self.store)() else { return };
            if let Err(e) = self.catch_up(&store) {
                tracing::warn!(error = %e, "watch cache: reading the change log failed; retrying");
                drop(store);
                std::thread::sleep(RETRY_AFTER);
                continue;
            }
            drop(store); // a closed store ends the notifications, and this thread
            match notifications.blocking_recv() {
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
    }

    /// Adds every change the log holds after the ring's end.
    fn catch_up(&self, store: &Store) -> Result<(), StorageError> {
        // The ring starts where the log's durable end is, never at a write still being flushed:
        // that write's event would then lie before the ring and its flush would add nothing to it,
        // so no watcher would be woken to read it from the log.
        if self.lock().start == u64::MAX {
            self.reset(store.durable_resource_version());
        }
        loop {
            let end = self.lock().end;
            let changes = store.changes_after(end, BATCH)?;
            if !store.log_covers(end)? {
                // The log moved on without us: start afresh where it is now (watchers still behind
                // read the log and get 410 Expired).
                self.reset(store.durable_resource_version());
                continue;
            }
            let Some(&(new_end, _)) = changes.last() else { return Ok(()) };
            let done = changes.len() < BATCH;
            let events: Vec<Arc<CachedEvent>> = changes
                .into_iter()
                .map(|(rv, change)| {
                    let line = event_line(&change.kind, &change.object);
                    Arc::new(CachedEvent { rv, change, line })
                })
                .collect();
            self.lock().append(events, new_end);
            self.ticks.send_replace(new_end);
            if done {
                return Ok(());
            }
        }
    }

    fn reset(&self, at: u64) {
        let mut ring = self.lock();
        *ring = Ring::new(at, ring.limits);
        drop(ring);
        self.ticks.send_replace(at);
    }
}

impl Ring {
    /// An empty ring at `at`.
    fn new(at: u64, limits: (usize, usize)) -> Ring {
        Ring { events: VecDeque::new(), start: at, end: at, line_bytes: 0, limits }
    }

    fn append(&mut self, events: Vec<Arc<CachedEvent>>, end: u64) {
        for event in events {
            self.line_bytes += event.line.len();
            self.events.push_back(event);
        }
        self.end = end;
        while self.events.len() > self.limits.0 || self.line_bytes > self.limits.1 {
            let Some(oldest) = self.events.pop_front() else { break };
            self.line_bytes -= oldest.line.len();
            self.start = oldest.rv;
            // Never half of one resourceVersion's changes.
            while self.events.front().is_some_and(|e| e.rv == self.start) {
                if let Some(e) = self.events.pop_front() {
                    self.line_bytes -= e.line.len();
                }
            }
        }
    }
}

/// One newline-terminated watch event.
pub fn event_line(kind: &str, object: &Value) -> Bytes {
    #[derive(Serialize)]
    struct Event<'a> {
        #[serde(rename = "type")]
        kind: &'a str,
        object: &'a Value,
    }
    let mut line = serde_json::to_vec(&Event { kind, object }).unwrap_or_default();
    line.push(b'\n');
    Bytes::from(line)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn event(rv: u64, name: &str) -> Arc<CachedEvent> {
        let object = json!({"metadata": {"name": name, "resourceVersion": rv.to_string()}});
        let change = ChangeEvent {
            kind: "ADDED".into(),
            resource: "bundles".into(),
            namespace: "ns".into(),
            name: name.into(),
            object,
            previous: None,
        };
        Arc::new(CachedEvent { rv, line: event_line(&change.kind, &change.object), change })
    }

    fn cache(ring: Ring) -> WatchCache {
        WatchCache { ring: Mutex::new(ring), ticks: watch::Sender::new(0), store: Box::new(|| None) }
    }

    fn window(cache: &WatchCache, from: u64, max: usize) -> Option<Vec<(u64, String)>> {
        match cache.events_after(from, max) {
            Window::Events(events) => Some(events.iter().map(|e| (e.rv, e.change.name.clone())).collect()),
            Window::Behind => None,
        }
    }

    #[test]
    fn a_cache_started_while_a_write_is_flushed_still_delivers_that_write() {
        use crate::storage::{ObjectKey, ObjectWrite, Precondition, StoreOptions};
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
        let create = |name: &str| ObjectWrite::Put {
            key: ObjectKey::new("bundles", "ns", name),
            object: json!({"metadata": {"name": name}}),
            precondition: Precondition::MustNotExist,
            revision: None,
        };
        store.write_objects(vec![create("first")]).unwrap();
        // The second write is applied but its flush has not happened yet when the first watch
        // starts the cache; a watcher at the first write must still get it.
        let held = store.hold_flushes();
        let writer = {
            let store = store.clone();
            std::thread::spawn(move || store.write_objects(vec![create("second")]).map(|o| o.resource_version))
        };
        while store.current_resource_version().unwrap() < 2 {
            std::thread::sleep(Duration::from_millis(5));
        }
        let cache = shared(&store).unwrap();
        while cache.lock().start == u64::MAX {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(window(&cache, 1, 10).is_some_and(|events| events.is_empty()), "nothing durable after 1 yet");
        drop(held);
        assert_eq!(writer.join().unwrap().unwrap(), 2);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            match window(&cache, 1, 10) {
                Some(events) if !events.is_empty() => break assert_eq!(events, vec![(2, "second".to_string())]),
                other => assert!(
                    std::time::Instant::now() < deadline,
                    "the flushed write never reached the cache: {other:?}"
                ),
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn the_ring_evicts_whole_resource_versions_and_sends_older_positions_to_the_log() {
        let mut ring = Ring::new(10, (3, usize::MAX));
        ring.append(vec![event(11, "a"), event(12, "b"), event(12, "c"), event(13, "d")], 13);
        // Four events over a limit of three: 11 goes; 12 stays whole.
        let cache = cache(ring);
        assert_eq!(window(&cache, 10, 10), None, "10 is before the ring");
        let all = window(&cache, 11, 10).unwrap();
        assert_eq!(all, [(12, "b".into()), (12, "c".into()), (13, "d".into())]);
        // A batch of one never splits resourceVersion 12.
        assert_eq!(window(&cache, 11, 1).unwrap(), [(12, "b".into()), (12, "c".into())]);
        assert_eq!(window(&cache, 12, 10).unwrap(), [(13, "d".into())]);
        assert_eq!(window(&cache, 13, 10).unwrap(), []);
        assert_eq!(window(&cache, 99, 10).unwrap(), [], "a position past the end waits for events");

        cache.lock().append(vec![event(14, "e")], 14);
        // Still four events: 12 goes, both of its changes.
        assert_eq!(window(&cache, 11, 10), None);
        assert_eq!(window(&cache, 12, 10).unwrap(), [(13, "d".into()), (14, "e".into())]);
    }

    #[test]
    fn the_ring_keeps_its_line_bytes_within_the_limit() {
        let one = event(1, "a").line.len();
        let mut ring = Ring::new(0, (usize::MAX, 2 * one));
        ring.append((1..=5).map(|rv| event(rv, "a")).collect(), 5);
        assert_eq!((ring.start, ring.end, ring.events.len()), (3, 5, 2));
        assert_eq!(ring.line_bytes, 2 * one);
    }

    #[test]
    fn an_unstarted_cache_sends_every_watcher_to_the_log() {
        let cache = cache(Ring::new(u64::MAX, (MAX_EVENTS, MAX_LINE_BYTES)));
        assert_eq!(window(&cache, 0, 10), None);
        assert_eq!(window(&cache, 12345, 10), None);
    }
}
