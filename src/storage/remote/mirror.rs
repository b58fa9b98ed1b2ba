//! The replica's own copy of what the read paths read — the API objects, the change log, the
//! owner index and the counters (the `d`, `l`, `m` and `o` keys) — in memory, fed by an etcd
//! watch: a full list at one etcd revision, then every event after it, in order. kube-apiserver's
//! watch cache, for the same reason: etcd stays the place of writes and order, and a GET or a LIST
//! costs memory reads instead of etcd round trips.
//!
//! **Consistent reads.** A read that must be as new as a quorum read (a GET, a LIST or a watch
//! without a resourceVersion) first asks etcd for the resourceVersion counter with one linearizable
//! GET, then waits until the mirror has applied the etcd revision that wrote it
//! ([`Mirror::catch_up`]). Every object write moves the counter in the same transaction, so
//! everything any write acknowledged before the read began is in the mirror once it waits no more.
//! Concurrent readers share GETs ([`Barrier`], two in flight at most): a reader waits for a GET
//! that *started* after it arrived, so sharing never makes it older. A GET awaits the shared GET
//! on the async runtime instead ([`Mirror::caught_up_now`]: no thread parked per reader) and is
//! answered there if the mirror has applied it at once, else on a blocking thread as any other
//! read. A mirror that does not catch up within [`CATCH_UP_WAIT`] (its watch stalled, etcd
//! unreachable from the watch but not from the GET) is marked behind and serves nothing until it
//! has applied what that read saw: reads go to etcd, at once (a read of a mirror already behind
//! does not wait again, nor raise the mark: under steady writes a raised mark would keep a slow
//! watch behind for ever).
//!
//! **Bounded.** The keys and values held are counted; past the bound (`--object-cache-bytes`) the
//! mirror empties itself, every read goes to etcd (`stowage_object_cache_reads_total{source="etcd"}`
//! says how many), and it tries a full list again after [`RELOAD_AFTER`]. The same happens when
//! etcd compacted the revision the watch would resume from.
//!
//! **Never a wrong answer.** A read asks the mirror only while it [`Mirror::serves`]; a scan that
//! finds the mirror emptied or reloaded between its pages goes on in etcd from where it was
//! (newer state, which the store's readers accept: sled's scans are no snapshot either). Each
//! watch response is applied under one write lock, so a reader never sees half of a transaction.
//! One seam remains: a list whose objects came from etcd while the cache was off, and whose change
//! log is then read from the cache just reloaded, can find an object newer than the log it read
//! and answer 410 Expired (a fresh list starts over once; a client relists on 410).

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock, Weak};
use std::time::Duration;

use etcd_client::{Client, EventType, GetOptions, WatchOptions};
use sled::IVec;

use super::{remote_error, EtcdMeta, RemoteMetrics};
use crate::storage::{Result, StorageError};

/// The first and the first-not-mirrored store key: `d`, `l`, `m`, `o` (the chunk index `c`, pins
/// `p` and revision records `v` stay in etcd: writers and downloads read those).
const FIRST: &[u8] = b"d";
const END: &[u8] = b"p";
/// How long a consistent read waits for the mirror before it reads etcd instead (kube-apiserver
/// waits 3 s for its cache; shorter in unit tests, which wait it out on purpose).
pub const CATCH_UP_WAIT: Duration = Duration::from_millis(if cfg!(test) { 300 } else { 3000 });
/// Longest a reader waits for a shared check of etcd before it gives up with an error (the etcd
/// client's own request timeout is 10 s).
const BARRIER_WAIT: Duration = Duration::from_secs(15);
/// After the mirror outgrew its bound: the next full list is tried this much later.
pub const RELOAD_AFTER: Duration = Duration::from_secs(30);
/// Keys per page of the initial list, and per page a scan copies out of the map.
const LIST_PAGE: i64 = 1000;
const SCAN_PAGE: usize = 256;
/// Charged per key besides its bytes (the map's node and the two `IVec`s).
const ENTRY_OVERHEAD: u64 = 64;

/// The mirror of one replica.
pub struct Mirror {
    state: RwLock<State>,
    /// The etcd revision applied (mirrored from `state`, for waiters).
    applied: Mutex<i64>,
    advanced: Condvar,
    /// A consistent read saw the counter written at this revision but the mirror had not caught
    /// up in time: it serves nothing until it has.
    wanted: AtomicI64,
    barrier: Arc<Barrier>,
    limit: u64,
    /// Pages scans copied out, for [`crate::storage::meta::Reads::pages_read`].
    pages: AtomicU64,
    metrics: RemoteMetrics,
    /// Tests: events are held back (the watch goes on, nothing is applied) while set.
    #[cfg(test)]
    paused: std::sync::atomic::AtomicBool,
}

#[derive(Default)]
struct State {
    map: BTreeMap<IVec, IVec>,
    bytes: u64,
    /// A full list is installed and the watch after it has lost nothing.
    active: bool,
    /// Changes on every install and every emptying: a scan across two generations is no scan.
    generation: u64,
}

fn charge(key: &[u8], value: &[u8]) -> u64 {
    key.len() as u64 + value.len() as u64 + ENTRY_OVERHEAD
}

impl Mirror {
    /// An empty mirror holding at most `limit` bytes; nothing is served until [`Mirror::follow`]
    /// has installed a list.
    pub fn new(limit: u64, metrics: RemoteMetrics) -> Arc<Mirror> {
        Arc::new(Mirror {
            state: RwLock::new(State::default()),
            applied: Mutex::new(0),
            advanced: Condvar::new(),
            wanted: AtomicI64::new(0),
            barrier: Arc::default(),
            limit,
            pages: AtomicU64::new(0),
            metrics,
            #[cfg(test)]
            paused: Default::default(),
        })
    }

    /// Tests: holds back (or, `false`, resumes applying) the watch's events, as a watch that
    /// stalled and came back would.
    #[cfg(test)]
    pub fn pause(&self, paused: bool) {
        self.paused.store(paused, Ordering::SeqCst);
    }

    #[cfg(test)]
    fn is_paused(&self) -> bool {
        self.paused.load(Ordering::SeqCst)
    }

    #[cfg(not(test))]
    fn is_paused(&self) -> bool {
        false
    }

    /// Starts following etcd on the remote runtime: lists, then watches, reloading after
    /// compaction or an outgrown bound, until the mirror is dropped. `changed` gets the
    /// resourceVersion counter after every response that moved it.
    pub fn follow(self: &Arc<Self>, etcd: &EtcdMeta, changed: impl Fn(&[u8]) + Send + Sync + 'static) {
        let client = etcd.remote().etcd_client();
        let base = etcd.full_key(b"");
        let counter = crate::storage::objects::RV_COUNTER.to_vec();
        etcd.remote().spawn(follow(Arc::downgrade(self), client, base, counter, changed));
    }

    /// Whether reads may be answered here: a list is installed and no consistent read is waiting
    /// for a revision the mirror has not applied.
    pub fn serves(&self) -> bool {
        let applied = *lock(&self.applied);
        applied >= self.wanted.load(Ordering::Acquire) && read(&self.state).active
    }

    /// The consistent-read step: learns (sharing one etcd GET with concurrent readers) the
    /// revision of the last object write, then waits until the mirror has applied it. `false`:
    /// it did not in time, and [`Mirror::serves`] says no until it has.
    pub fn catch_up(&self, etcd: &EtcdMeta, counter: &[u8]) -> Result<bool> {
        let written_at = self.barrier.pass(|| etcd.mod_revision(counter))?;
        // While empty (loading, outgrown) nothing is worth waiting for: etcd answers at once. The
        // mark below still keeps a mirror that becomes active meanwhile from serving this reader
        // older data. Nor while already marked behind (its watch stalled): one reader waited
        // CATCH_UP_WAIT in vain, the next go to etcd at once, and leave the mark where it is so
        // that a mirror catching up under steady writes is not held back by every newer read.
        let behind = *lock(&self.applied) < self.wanted.load(Ordering::Acquire);
        let wait = if behind { Duration::ZERO } else { CATCH_UP_WAIT };
        let caught_up = read(&self.state).active && self.wait_applied(written_at, wait) && read(&self.state).active;
        if !caught_up && !behind {
            self.wanted.fetch_max(written_at, Ordering::AcqRel);
        }
        Ok(caught_up)
    }

    /// [`Mirror::catch_up`] for a reader on the async runtime, which must not block: the shared
    /// check is awaited (a reader waiting for it holds no thread), and `true` only if the mirror
    /// has applied that revision at once and serves. `false` waits for nothing and marks nothing:
    /// the reader then reads on a blocking thread, which checks again ([`Mirror::catch_up`]).
    pub async fn caught_up_now(&self, etcd: &Arc<EtcdMeta>, counter: &[u8]) -> Result<bool> {
        let (etcd, counter) = (etcd.clone(), counter.to_vec());
        let written_at = self
            .barrier
            .pass_async(move |round| {
                let remote = etcd.remote().clone();
                remote.spawn(async move { round.settle(etcd.mod_revision_async(&counter).await) });
            })
            .await?;
        Ok(*lock(&self.applied) >= written_at && self.serves())
    }

    /// Waits up to `wait` for the mirror to have applied etcd revision `revision`.
    pub fn wait_applied(&self, revision: i64, wait: Duration) -> bool {
        let applied = lock(&self.applied);
        let (applied, _) = self
            .advanced
            .wait_timeout_while(applied, wait, |applied| *applied < revision)
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *applied >= revision
    }

    /// The value at `key` if the mirror serves it (`None`: ask etcd).
    pub fn get(&self, key: &[u8]) -> Option<Option<IVec>> {
        if !self.serves() {
            return None;
        }
        let state = read(&self.state);
        state.active.then(|| state.map.get(key).cloned())
    }

    /// The keys in the range, a page at a time; if the mirror stops serving midway, the rest
    /// comes from etcd, and so do keys past the mirrored ones (a scan to the end of the map).
    /// `None` if it does not serve now or the range starts before the mirrored keys.
    pub fn range<'a>(
        &'a self,
        etcd: &'a EtcdMeta,
        start: Bound<Vec<u8>>,
        end: Bound<Vec<u8>>,
    ) -> Option<impl Iterator<Item = Result<(IVec, IVec)>> + Send + 'a> {
        let starts_inside = matches!(&start, Bound::Included(k) | Bound::Excluded(k) if k.as_slice() >= FIRST);
        if !starts_inside || !self.serves() {
            return None;
        }
        let (end, beyond) = if ends_inside(&end) { (end, None) } else { (Bound::Excluded(END.to_vec()), Some(end)) };
        let generation = read(&self.state).generation;
        Some(Scan {
            mirror: self,
            etcd,
            generation,
            next: start,
            end,
            beyond,
            page: Vec::new().into_iter(),
            fallback: None,
        })
    }

    /// Pages scans copied out so far.
    pub fn pages_read(&self) -> u64 {
        self.pages.load(Ordering::Acquire)
    }

    /// Bytes held (0 when not serving).
    pub fn bytes(&self) -> u64 {
        read(&self.state).bytes
    }

    /// Counts a read by where it was answered.
    pub fn count_read(&self, from_mirror: bool) {
        self.metrics.object_cache_read(from_mirror);
    }

    fn install(&self, map: BTreeMap<IVec, IVec>, bytes: u64, revision: i64) {
        let mut state = write(&self.state);
        state.map = map;
        state.bytes = bytes;
        state.active = true;
        state.generation += 1;
        drop(state);
        self.metrics.object_cache_state(true, bytes);
        self.advance(revision);
    }

    fn empty(&self, why: &str) {
        let mut state = write(&self.state);
        let was = std::mem::take(&mut state.map);
        state.bytes = 0;
        state.active = false;
        state.generation += 1;
        drop(state);
        drop(was);
        self.metrics.object_cache_state(false, 0);
        tracing::warn!(reason = why, "the object cache is off: reads go to etcd until it is reloaded");
    }

    /// Applies one watch response's events (all of one or more whole revisions). `Err` when the
    /// bound was passed; `Ok(counter)`, the counter's new value if it moved.
    fn apply(&self, events: &[etcd_client::Event], base: &[u8], counter: &[u8]) -> Result<Option<Vec<u8>>, ()> {
        let mut moved = None;
        let mut last = 0;
        let mut state = write(&self.state);
        for event in events {
            let Some(kv) = event.kv() else { continue };
            let Some(key) = kv.key().strip_prefix(base) else { continue };
            last = last.max(kv.mod_revision());
            match event.event_type() {
                EventType::Put => {
                    state.bytes += charge(key, kv.value());
                    if let Some(old) = state.map.insert(IVec::from(key), IVec::from(kv.value())) {
                        state.bytes = state.bytes.saturating_sub(charge(key, &old));
                    }
                    if key == counter {
                        moved = Some(kv.value().to_vec());
                    }
                }
                EventType::Delete => {
                    if let Some(old) = state.map.remove(key) {
                        state.bytes = state.bytes.saturating_sub(charge(key, &old));
                    }
                }
            }
        }
        let over = state.bytes > self.limit;
        let bytes = state.bytes;
        drop(state);
        if over {
            return Err(());
        }
        self.metrics.object_cache_state(true, bytes);
        self.advance(last);
        Ok(moved)
    }

    fn advance(&self, revision: i64) {
        let mut applied = lock(&self.applied);
        *applied = (*applied).max(revision);
        drop(applied);
        self.advanced.notify_all();
    }
}

/// Whether a range ending at `end` ends inside the mirrored keys.
fn ends_inside(end: &Bound<Vec<u8>>) -> bool {
    match end {
        Bound::Excluded(k) => k.as_slice() <= END,
        Bound::Included(k) => k.as_slice() < END,
        Bound::Unbounded => false,
    }
}

/// Whether no key lies in `(start, end)`, inverted ranges included.
fn empty_range(start: &Bound<Vec<u8>>, end: &Bound<Vec<u8>>) -> bool {
    match (start, end) {
        (Bound::Included(s), Bound::Included(e)) => s > e,
        (Bound::Included(s) | Bound::Excluded(s), Bound::Excluded(e)) | (Bound::Excluded(s), Bound::Included(e)) => {
            s >= e
        }
        _ => false,
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A scan of the mirror: pages copied out under the read lock (so the watch is never held up by
/// a reader), continued in etcd if the mirror changed generation between two pages.
struct Scan<'a> {
    mirror: &'a Mirror,
    etcd: &'a EtcdMeta,
    generation: u64,
    next: Bound<Vec<u8>>,
    end: Bound<Vec<u8>>,
    /// Where the scan goes on in etcd past the mirrored keys, if it does.
    beyond: Option<Bound<Vec<u8>>>,
    page: std::vec::IntoIter<(IVec, IVec)>,
    fallback: Option<crate::storage::meta::MetaIter<'a>>,
}

impl Scan<'_> {
    /// The rest of the scan, `[start, end)`, read from etcd from here on.
    fn go_on_in_etcd(&mut self, start: Bound<Vec<u8>>, end: Bound<Vec<u8>>) -> Option<Result<(IVec, IVec)>> {
        let rest = self.etcd.range(start, end);
        self.fallback.insert(Box::new(rest)).next()
    }
}

impl Iterator for Scan<'_> {
    type Item = Result<(IVec, IVec)>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Some(fallback) = &mut self.fallback {
            return fallback.next();
        }
        if let Some((key, value)) = self.page.next() {
            self.next = Bound::Excluded(key.to_vec());
            return Some(Ok((key, value)));
        }
        let state = read(&self.mirror.state);
        if state.generation != self.generation || !state.active {
            drop(state);
            let end = self.beyond.take().unwrap_or_else(|| self.end.clone());
            return self.go_on_in_etcd(self.next.clone(), end);
        }
        if empty_range(&self.next, &self.end) {
            // BTreeMap panics on an inverted range where sled and etcd answer nothing; the
            // readers ask for such ranges (a log read from a resourceVersion past the cache's).
            drop(state);
            let beyond = self.beyond.take()?;
            return self.go_on_in_etcd(self.next.clone(), beyond);
        }
        let range = (self.next.as_ref().map(|k| k.as_slice()), self.end.as_ref().map(|k| k.as_slice()));
        let page: Vec<(IVec, IVec)> =
            state.map.range::<[u8], _>(range).take(SCAN_PAGE).map(|(k, v)| (k.clone(), v.clone())).collect();
        drop(state);
        self.mirror.pages.fetch_add(1, Ordering::AcqRel);
        self.page = page.into_iter();
        match self.page.next() {
            Some((key, value)) => {
                self.next = Bound::Excluded(key.to_vec());
                Some(Ok((key, value)))
            }
            // The mirrored keys are done; the rest of the range is in etcd.
            None => {
                let beyond = self.beyond.take()?;
                self.go_on_in_etcd(Bound::Included(END.to_vec()), beyond)
            }
        }
    }
}

/// One etcd GET shared by the readers that arrive while another is in flight: a reader waits for
/// a GET that began after it arrived, so the answer is at least as new as its own would be. Up to
/// [`ROUNDS_IN_FLIGHT`] GETs run at once, so a reader arriving while one is under way starts the
/// next at once instead of waiting for the first to end (a round trip it could not use).
#[derive(Default)]
struct Barrier {
    state: Mutex<BarrierState>,
    done: Condvar,
    /// The newest round that ended, for readers that await it instead of waiting on `done`.
    ended: tokio::sync::watch::Sender<u64>,
}

/// GETs of the barrier at once, at most: two take a reader's wait from up to two round trips to
/// one, at one more GET per round trip for etcd.
const ROUNDS_IN_FLIGHT: usize = 2;

#[derive(Default)]
struct BarrierState {
    started: u64,
    /// The newest round that ended, and its answer.
    finished: u64,
    running: usize,
    answer: Option<Result<i64, String>>,
}

impl BarrierState {
    /// Starts a round for a reader that needs round `needed` if it may (fewer than
    /// [`ROUNDS_IN_FLIGHT`] run, and none began since the reader came): the round's number.
    fn start_for(&mut self, needed: u64) -> Option<u64> {
        if self.running < ROUNDS_IN_FLIGHT && self.started < needed {
            self.running += 1;
            self.started += 1;
            return Some(self.started);
        }
        None
    }
}

fn no_answer_in_time() -> StorageError {
    StorageError::Remote("etcd: no answer to the consistency check in time".into())
}

impl Barrier {
    fn pass(self: &Arc<Self>, ask: impl FnOnce() -> Result<i64>) -> Result<i64> {
        let mut state = lock(&self.state);
        // The first GET to start from now on is the one this reader may use, or any after it.
        let needed = state.started + 1;
        let deadline = std::time::Instant::now() + BARRIER_WAIT;
        loop {
            if state.finished >= needed {
                return answer(&state.answer);
            }
            if let Some(mine) = state.start_for(needed) {
                drop(state);
                // Settles the round even if `ask` panics, so no reader waits for it for ever
                // (a thread parked here would also keep the process from exiting).
                let mut round = Round::new(self, mine);
                round.answer = ask().map_err(|e| e.to_string());
                let out = round.answer.clone();
                drop(round);
                return out.map_err(StorageError::Remote);
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Err(no_answer_in_time());
            }
            state = self.done.wait_timeout(state, left).unwrap_or_else(std::sync::PoisonError::into_inner).0;
        }
    }

    /// [`Barrier::pass`] awaited. A round this reader starts is handed to `start`, which runs it
    /// as a task of its own (setting its answer): a reader that goes away (its client hung up)
    /// then cancels no check that others wait for.
    async fn pass_async(self: &Arc<Self>, start: impl FnOnce(Round)) -> Result<i64> {
        let mut ended = self.ended.subscribe();
        let mut start = Some(start);
        let (needed, deadline) = {
            let state = lock(&self.state);
            (state.started + 1, tokio::time::Instant::now() + BARRIER_WAIT)
        };
        loop {
            {
                let mut state = lock(&self.state);
                if state.finished >= needed {
                    return answer(&state.answer);
                }
                // A reader starts one round at most (after it, `started >= needed`).
                if start.is_some() {
                    if let Some(mine) = state.start_for(needed) {
                        drop(state);
                        if let Some(start) = start.take() {
                            start(Round::new(self, mine));
                        }
                    }
                }
            }
            // Subscribed before the state was read: a round that ended since is seen here.
            if tokio::time::timeout_at(deadline, ended.changed()).await.is_err() {
                return Err(no_answer_in_time());
            }
        }
    }
}

/// One GET of the barrier; dropped, it hands its answer to the waiting readers (unless a newer
/// round ended first: its answer serves everyone this one would).
struct Round {
    barrier: Arc<Barrier>,
    mine: u64,
    answer: Result<i64, String>,
}

impl Round {
    fn new(barrier: &Arc<Barrier>, mine: u64) -> Round {
        Round { barrier: barrier.clone(), mine, answer: Err("the check of etcd was interrupted".into()) }
    }

    /// Ends the round with `answer`.
    fn settle(mut self, answer: Result<i64>) {
        self.answer = answer.map_err(|e| e.to_string());
    }
}

impl Drop for Round {
    fn drop(&mut self) {
        let mut state = lock(&self.barrier.state);
        state.running = state.running.saturating_sub(1);
        if self.mine > state.finished {
            state.finished = self.mine;
            state.answer = Some(self.answer.clone());
        }
        let finished = state.finished;
        drop(state);
        self.barrier.done.notify_all();
        self.barrier.ended.send_replace(finished);
    }
}

fn answer(answer: &Option<Result<i64, String>>) -> Result<i64> {
    match answer {
        Some(Ok(revision)) => Ok(*revision),
        Some(Err(e)) => Err(StorageError::Remote(e.clone())),
        None => Err(StorageError::Remote("etcd: no answer".into())),
    }
}

/// Why a watch ended.
enum Ended {
    /// The mirror was dropped: stop.
    Closed,
    /// List again (compacted, outgrown, or the watch was cancelled).
    Reload { after: Duration },
}

async fn follow(
    mirror: Weak<Mirror>,
    mut etcd: Client,
    base: Vec<u8>,
    counter: Vec<u8>,
    changed: impl Fn(&[u8]) + Send + Sync + 'static,
) {
    let start = [base.as_slice(), FIRST].concat();
    let end = [base.as_slice(), END].concat();
    loop {
        let listed = load(&mut etcd, &start, &end, &base, mirror.upgrade().map_or(0, |m| m.limit)).await;
        let Some(this) = mirror.upgrade() else { return };
        let revision = match listed {
            Ok(Some((map, bytes, revision))) => {
                this.install(map, bytes, revision);
                revision
            }
            Ok(None) => {
                this.empty("its bound (--object-cache-bytes) is smaller than the objects and change log");
                drop(this);
                tokio::time::sleep(RELOAD_AFTER).await;
                continue;
            }
            Err(e) => {
                drop(this);
                tracing::warn!(error = %e, "listing etcd for the object cache; trying again");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        drop(this);
        match watch(&mirror, &mut etcd, &start, &end, &base, &counter, revision, &changed).await {
            Ended::Closed => return,
            Ended::Reload { after } => tokio::time::sleep(after).await,
        }
    }
}

/// The mirrored keys at one revision, or `None` if they outgrow `limit`.
async fn load(
    etcd: &mut Client,
    start: &[u8],
    end: &[u8],
    base: &[u8],
    limit: u64,
) -> Result<Option<(BTreeMap<IVec, IVec>, u64, i64)>> {
    let (mut map, mut bytes, mut revision, mut from) = (BTreeMap::new(), 0u64, 0i64, start.to_vec());
    loop {
        let mut options = GetOptions::new().with_range(end.to_vec()).with_limit(LIST_PAGE);
        if revision > 0 {
            options = options.with_revision(revision);
        }
        let answer = etcd.get(from.clone(), Some(options)).await.map_err(|e| remote_error("etcd", e))?;
        if revision == 0 {
            revision = answer.header().map_or(0, |h| h.revision());
        }
        for kv in answer.kvs() {
            let key = kv.key().strip_prefix(base).unwrap_or_default();
            bytes += charge(key, kv.value());
            map.insert(IVec::from(key), IVec::from(kv.value()));
        }
        if bytes > limit {
            return Ok(None);
        }
        match answer.kvs().last() {
            Some(last) if answer.more() => from = [last.key(), &[0]].concat(),
            _ => return Ok(Some((map, bytes, revision))),
        }
    }
}

/// Applies events after `revision` until the watch must be given up.
#[allow(clippy::too_many_arguments)]
async fn watch(
    mirror: &Weak<Mirror>,
    etcd: &mut Client,
    start: &[u8],
    end: &[u8],
    base: &[u8],
    counter: &[u8],
    mut revision: i64,
    changed: &(impl Fn(&[u8]) + Send + Sync),
) -> Ended {
    loop {
        let options = WatchOptions::new().with_range(end.to_vec()).with_start_revision(revision + 1);
        let mut stream = match etcd.watch(start.to_vec(), Some(options)).await {
            Ok(stream) => stream,
            Err(e) => {
                tracing::warn!(error = %e, "etcd watch for the object cache; resuming");
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        loop {
            let answer = match stream.message().await {
                Ok(Some(answer)) => answer,
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!(error = %e, "etcd watch for the object cache interrupted; resuming");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    break;
                }
            };
            let Some(mut this) = mirror.upgrade() else { return Ended::Closed };
            while this.is_paused() {
                drop(this);
                tokio::time::sleep(Duration::from_millis(20)).await;
                let Some(again) = mirror.upgrade() else { return Ended::Closed };
                this = again;
            }
            if answer.compact_revision() > 0 || answer.canceled() {
                this.empty("etcd compacted the revision its watch was at");
                return Ended::Reload { after: Duration::ZERO };
            }
            match this.apply(answer.events(), base, counter) {
                Ok(moved) => {
                    if let Some(last) = answer.events().iter().filter_map(|e| e.kv()).map(|kv| kv.mod_revision()).max()
                    {
                        revision = revision.max(last);
                    }
                    if let Some(value) = moved {
                        changed(&value);
                    }
                }
                Err(()) => {
                    this.empty("its bound (--object-cache-bytes) was passed");
                    return Ended::Reload { after: RELOAD_AFTER };
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A GET of etcd that answers in the order it was asked, once `release` lets it.
    fn held_get(
        asked: &AtomicU64,
        entered: std::sync::mpsc::Sender<()>,
        release: std::sync::mpsc::Receiver<()>,
    ) -> Result<i64> {
        let n = asked.fetch_add(1, Ordering::SeqCst) as i64 + 1;
        entered.send(()).unwrap();
        release.recv().unwrap();
        Ok(n)
    }

    #[test]
    fn a_shared_get_began_after_the_reader_arrived() {
        let barrier = Arc::new(Barrier::default());
        let asked = Arc::new(AtomicU64::new(0));
        // Round 1 is held for the whole test: nobody arriving later may use it, nor wait for it.
        let (entered_tx, entered_rx) = std::sync::mpsc::channel();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let first = {
            let (barrier, asked) = (barrier.clone(), asked.clone());
            std::thread::spawn(move || barrier.pass(|| held_get(&asked, entered_tx, release_rx)))
        };
        entered_rx.recv().unwrap();
        // Later GETs answer once the gate opens.
        let gate = Arc::new((Mutex::new(false), Condvar::new()));
        let reader = || {
            let (barrier, asked, gate) = (barrier.clone(), asked.clone(), gate.clone());
            std::thread::spawn(move || {
                barrier.pass(|| {
                    let n = asked.fetch_add(1, Ordering::SeqCst) as i64 + 1;
                    let open = gate.0.lock().unwrap();
                    drop(gate.1.wait_while(open, |open| !*open).unwrap());
                    Ok(n)
                })
            })
        };
        // The next reader starts round 2 at once, beside round 1.
        let second = reader();
        while asked.load(Ordering::SeqCst) < 2 {
            std::thread::sleep(Duration::from_millis(1));
        }
        // Readers arriving while round 2 runs may not use it: they share round 3.
        let later: Vec<_> = (0..3).map(|_| reader()).collect();
        std::thread::sleep(Duration::from_millis(50));
        *gate.0.lock().unwrap() = true;
        gate.1.notify_all();
        assert_eq!(second.join().unwrap().unwrap(), 2);
        for reader in later {
            assert_eq!(reader.join().unwrap().unwrap(), 3, "a reader used a GET in flight when it came");
        }
        assert_eq!(asked.load(Ordering::SeqCst), 3, "the three later readers shared one GET");
        release_tx.send(()).unwrap();
        assert_eq!(first.join().unwrap().unwrap(), 1);
        // Round 1 ended after newer ones: a reader from now on still asks again.
        assert_eq!(barrier.pass(|| Ok(4)).unwrap(), 4);
    }

    #[test]
    fn readers_wait_when_both_rounds_are_in_flight() {
        let barrier = Arc::new(Barrier::default());
        let asked = Arc::new(AtomicU64::new(0));
        let mut releases = Vec::new();
        let mut held = Vec::new();
        for _ in 0..ROUNDS_IN_FLIGHT {
            let (entered_tx, entered_rx) = std::sync::mpsc::channel();
            let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
            let (b, a) = (barrier.clone(), asked.clone());
            held.push(std::thread::spawn(move || b.pass(|| held_get(&a, entered_tx, release_rx))));
            entered_rx.recv().unwrap();
            releases.push(release_tx);
        }
        let waiter = {
            let (b, a) = (barrier.clone(), asked.clone());
            std::thread::spawn(move || b.pass(|| Ok(a.fetch_add(1, Ordering::SeqCst) as i64 + 1)))
        };
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(asked.load(Ordering::SeqCst), ROUNDS_IN_FLIGHT as u64, "a third GET while two were in flight");
        assert!(!waiter.is_finished(), "a reader used a GET that began before it arrived");
        // One round ends; the waiter starts its own (both in flight began before it came).
        releases.remove(0).send(()).unwrap();
        assert_eq!(waiter.join().unwrap().unwrap(), ROUNDS_IN_FLIGHT as i64 + 1);
        releases.into_iter().for_each(|r| r.send(()).unwrap());
        held.into_iter().for_each(|h| drop(h.join().unwrap()));
    }

    #[test]
    fn a_check_that_panicked_leaves_no_reader_waiting() {
        let barrier = Arc::new(Barrier::default());
        let (entered_tx, entered_rx) = std::sync::mpsc::channel();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let first = {
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                barrier.pass(|| {
                    entered_tx.send(()).unwrap();
                    release_rx.recv().unwrap();
                    panic!("the etcd client's runtime is gone");
                })
            })
        };
        entered_rx.recv().unwrap();
        let waiter = {
            let barrier = barrier.clone();
            std::thread::spawn(move || barrier.pass(|| Ok(7)))
        };
        std::thread::sleep(Duration::from_millis(50));
        release_tx.send(()).unwrap();
        assert!(first.join().is_err());
        // The reader that waited runs the next check itself.
        assert_eq!(waiter.join().unwrap().unwrap(), 7);
        assert_eq!(barrier.pass(|| Ok(8)).unwrap(), 8);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn awaiting_readers_share_checks_that_outlive_the_reader_that_started_them() {
        let barrier = Arc::new(Barrier::default());
        let asked = Arc::new(AtomicU64::new(0));
        let (open, gate) = tokio::sync::watch::channel(false);
        // Each round a reader starts answers its number once the gate opens.
        let reader = |barrier: &Arc<Barrier>| {
            let (barrier, asked, gate) = (barrier.clone(), asked.clone(), gate.clone());
            tokio::spawn(async move {
                barrier
                    .pass_async(move |round| {
                        let n = asked.fetch_add(1, Ordering::SeqCst) as i64 + 1;
                        let mut gate = gate;
                        tokio::spawn(async move {
                            let _ = gate.wait_for(|open| *open).await;
                            round.settle(Ok(n));
                        });
                    })
                    .await
            })
        };
        let asked_until = |n: u64| {
            let asked = asked.clone();
            async move {
                while asked.load(Ordering::SeqCst) < n {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
        };
        let first = reader(&barrier);
        asked_until(1).await;
        let second = reader(&barrier);
        asked_until(2).await;
        // Both rounds in flight began before these came: they wait, and share round 3.
        let later: Vec<_> = (0..3).map(|_| reader(&barrier)).collect();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(asked.load(Ordering::SeqCst), 2, "a third GET while two were in flight");
        // The reader that started round 2 goes away (its client hung up); round 2 goes on.
        second.abort();
        open.send(true).unwrap();
        assert!(first.await.unwrap().unwrap() >= 1);
        for reader in later {
            assert_eq!(reader.await.unwrap().unwrap(), 3, "a reader used a GET in flight when it came");
        }
        assert_eq!(asked.load(Ordering::SeqCst), 3, "the three later readers shared one GET");
        // Rounds end on their own: round 2 may settle just after round 3 answered.
        let settled = || {
            let state = lock(&barrier.state);
            (state.finished, state.running)
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while settled() != (3, 0) && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(settled(), (3, 0), "round 2 was left unsettled");
        // A blocking reader after them asks again, through the same barrier.
        let blocking = barrier.clone();
        assert_eq!(tokio::task::spawn_blocking(move || blocking.pass(|| Ok(9))).await.unwrap().unwrap(), 9);
    }

    #[test]
    fn inverted_ranges_are_empty_not_a_panic() {
        let (a, b) = (b"l1".to_vec(), b"l2".to_vec());
        assert!(empty_range(&Bound::Included(b.clone()), &Bound::Excluded(a.clone())));
        assert!(empty_range(&Bound::Included(a.clone()), &Bound::Excluded(a.clone())));
        assert!(empty_range(&Bound::Excluded(a.clone()), &Bound::Included(a.clone())));
        assert!(!empty_range(&Bound::Included(a.clone()), &Bound::Included(a.clone())));
        assert!(!empty_range(&Bound::Included(a.clone()), &Bound::Excluded(b.clone())));
        assert!(!empty_range(&Bound::Excluded(a.clone()), &Bound::Unbounded));
        // What BTreeMap would have panicked on, answered as sled and etcd answer it.
        let map: BTreeMap<Vec<u8>, ()> = [(b"l0".to_vec(), ()), (b"l3".to_vec(), ())].into_iter().collect();
        let (start, end) = (Bound::Included(b), Bound::Excluded(a));
        assert!(empty_range(&start, &end));
        assert!(std::panic::catch_unwind(|| map.range::<Vec<u8>, _>((start, end)).count()).is_err());
    }

    #[test]
    fn ranges_past_the_mirrored_keys_go_on_in_etcd() {
        assert!(ends_inside(&Bound::Excluded(b"o/bundles0".to_vec())));
        assert!(ends_inside(&Bound::Excluded(END.to_vec())));
        assert!(!ends_inside(&Bound::Included(END.to_vec())));
        assert!(!ends_inside(&Bound::Excluded(b"v".to_vec())));
        assert!(!ends_inside(&Bound::Unbounded));
    }
}
