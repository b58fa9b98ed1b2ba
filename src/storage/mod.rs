//! The store: API objects (with resourceVersions and a change log) and bundle content (revisions
//! of content-addressed chunks), over one of two backends. Embedded ([`Store::open`]): a sled
//! database for the metadata map and append-only pack files for blocks, in the data directory.
//! Replicated ([`Store::open_replicated`]): the same map in etcd and blocks as objects in
//! S3-compatible storage ([`remote`]), shared by several replicas. The rest of the store is written
//! once against the map ([`meta`]) and the block surface ([`blocks`]).
//!
//! The map holds only small metadata — API objects, the chunk index and one record per revision;
//! chunk payloads, zstd-compressed by us, go into blocks, and so do revision manifests
//! ([`manifest`]): the file records of a revision are chunks too, so a revision costs the map one
//! key however many files it has. Uploads are staged in plain files ([`staging`]). Every
//! acknowledged write is durable first (embedded: packs fsynced, then sled flushed, with what sled
//! leaves unsynced and directory entries; a failed sync poisons the store: [`durability`]), and
//! every multi-key change that must be atomic is one batch (one sled batch, or one etcd
//! transaction). A batch is held in memory whole, so every batch is bounded. Nothing outside this
//! module sees sled or etcd.
//!
//! The replicated store (etcd for the map, object storage for the blocks) runs the same code:
//! the map and the blocks are [`meta::Meta`] and [`blocks::BlockStore`], and every decision that
//! differs between the two (durability, writability, allocation of resourceVersions and revision
//! ids, pinning, recording manifests, collection, readiness) is made in [`backend`]. Chunked
//! upload sessions, on this server's disk or in the shared store, are [`sessions`].
//!
//! Chunks are collected by mark and sweep ([`gc`]; against other replicas' writers, [`gc_shared`]):
//! what no finalized revision's manifest reaches and no writer has pinned goes. Releasing a
//! revision is deleting its record.
//!
//! Layout of the map (first byte = record kind, integers big-endian so keys sort; in etcd, under
//! `<prefix>/s/`):
//!
//! | key | value |
//! |---|---|
//! | `c` hash(32) | where the chunk is: its block in the pack files, and its range in it ([`chunks`]) |
//! | `v` rev(8) | [`RevisionRecord`] (JSON), naming its manifest's root chunk |
//! | `o` resource `/` namespace `/` name | an API object ([`objects`]) |
//! | `d` namespace `/` owner(16) resource `/` name | an object's owner reference: owner = hash of its uid ([`objects`]) |
//! | `l` rv(8) index(4) | change-log entry for watches, one per change of a write |
//! | `p` hash(32) `/` replica | replicated only: a writer's pin, attached to its replica's lease |
//! | `m` name | counters |
//!
//! Stores written before manifests (`f` file, `k` segment, `t` tar-index, `r` reference-count and
//! `z` candidate keys) are converted at open ([`migrate`]).

mod apply_queue;
mod backend;
mod blocks;
mod chunker;
mod chunks;
mod commit;
mod counters;
mod durability;
mod entry;
mod frame_cache;
mod frames;
mod gc;
mod gc_shared;
mod hashing;
mod listing;
mod manifest;
mod meta;
mod migrate;
mod objects;
mod packs;
mod read;
pub mod remote;
mod repack;
mod revision;
mod seal;
pub mod sessions;
mod space;
mod staging;
mod tar_blocks;
pub mod tarfmt;

use std::path::Path;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

pub use backend::{BackendMetrics, HealthCheck};
pub use commit::{CommitCounts, PendingWrite};
pub use counters::StoreCounts;
pub use entry::{EntryKind, FileEntry, PERMISSION_BITS};
pub use frames::{FrameStats, ZstdDownload};
pub use gc::GcReport;
pub use listing::{ListCursor, ListFilter, ListPage, ListQuery, ListSink, Listed};
pub use objects::{
    ChangeEvent, ChangedObject, ConsistentRead, ObjectKey, ObjectWrite, Precondition, StoredObject, WriteOutcome,
};
pub use read::{FileListing, RangeSpec, Sink, TarCursor};
pub use revision::{PendingRevision, RevisionWriter};
pub use space::{is_out_of_space, WriteKind, DEFAULT_MIN_FREE_BYTES};

/// The rule a [`StorageError::DuplicatePath`] broke, as its message words it.
pub const DUPLICATE_PATH: &str = "duplicate path";

/// Identifies one stored content revision.
pub type RevisionId = u64;

/// Everything that can go wrong below the API.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("storage engine: {0}")]
    Engine(sled::Error),
    #[error("storage I/O: {0}")]
    Io(std::io::Error),
    /// etcd or the object storage failed or could not be reached (replicated mode).
    #[error("the shared store is unavailable: {0}")]
    Remote(String),
    /// The data directory's filesystem is (nearly) full: see [`space`]. Its message says so.
    #[error("{0}")]
    InsufficientStorage(String),
    #[error("corrupt store: {0}")]
    Corrupt(String),
    #[error("{0} not found")]
    NotFound(String),
    #[error("{0} already exists")]
    AlreadyExists(String),
    #[error("the object has been modified; please apply your changes to the latest version and try again")]
    Conflict(String),
    #[error("invalid entry {path:?}: {reason}")]
    InvalidEntry { path: String, reason: String },
    /// An entry whose path the revision already has (a file, link or directory added before).
    #[error("invalid entry {path:?}: {DUPLICATE_PATH}")]
    DuplicatePath { path: String },
    /// Whoever asked went away: a reader stopped reading, or a write was abandoned before its turn.
    #[error("the caller went away")]
    Cancelled,
    /// A resourceVersion older than the change log still covers.
    #[error("resource version {0} is too old")]
    Expired(u64),
    /// A resourceVersion the store has not reached yet.
    #[error("too large resource version: {requested}, current: {current}")]
    TooNew { requested: u64, current: u64 },
    /// A sync or flush failed earlier: nothing since can be trusted durable, so writes are refused
    /// until a restart ([`durability`]). Holds what failed.
    #[error(
        "the store could not make a write durable ({0}); writes are refused until stowage restarts; reads still work"
    )]
    Poisoned(String),
}

pub type Result<T, E = StorageError> = std::result::Result<T, E>;

/// A full disk is classified here, once, whichever layer met it.
impl From<std::io::Error> for StorageError {
    fn from(err: std::io::Error) -> StorageError {
        if space::is_out_of_space(&err) {
            StorageError::InsufficientStorage(format!("the data directory is out of space: {err}"))
        } else {
            StorageError::Io(err)
        }
    }
}

impl From<sled::Error> for StorageError {
    fn from(err: sled::Error) -> StorageError {
        match err {
            sled::Error::Io(io) if space::is_out_of_space(&io) => io.into(),
            other => StorageError::Engine(other),
        }
    }
}

/// Lifecycle of a revision: written while `Staging`, served once `Committed`, released while
/// `Deleting`. Only `Committed` revisions are ever reachable from API objects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RevisionState {
    Staging,
    Committed,
    Deleting,
}

/// Metadata of one revision.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RevisionRecord {
    pub id: RevisionId,
    pub state: RevisionState,
    /// `sha256:<hex>` of the deterministic tar; empty until finalized.
    #[serde(default)]
    pub digest: String,
    #[serde(default)]
    pub tar_size: u64,
    #[serde(default)]
    pub files: u64,
    /// Sum of file sizes.
    #[serde(default)]
    pub size: u64,
    /// Compressed bytes of the chunks the revision references (before cross-revision dedup).
    #[serde(default)]
    pub stored_size: u64,
    /// The replica writing a `Staging` revision (replicated mode): its writer is gone, and the
    /// revision can be released, once that replica's lease is.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub writer: String,
    /// Hex BLAKE3 of the manifest's root chunk; empty until finalized.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub manifest: String,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub manifest_len: u32,
    /// Hex BLAKE3 of the root chunk of the revision's frame plan ([`frames`]); empty for a
    /// revision finalized before plans (its zstd downloads are compressed afresh).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub frames: String,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub frames_len: u32,
    /// Whether the plan's entries name a member chunk of their block (so a block compaction
    /// copied whole is found again through the chunk index; [`frames`]).
    #[serde(default, skip_serializing_if = "is_false")]
    pub frames_anchored: bool,
    /// Whether the repacker has been over the revision's blocks ([`repack`]): done, or found
    /// nothing worth recompressing.
    #[serde(default, skip_serializing_if = "is_false")]
    pub repacked: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl RevisionRecord {
    /// Whether its content did not compress (stored at 90 % or more of its size): compressing a
    /// download of it again would cost a core and save next to nothing.
    pub fn compresses_poorly(&self) -> bool {
        self.size > 0 && self.stored_size.saturating_mul(10) >= self.size.saturating_mul(9)
    }

    /// Whether the repacker has still to go over it ([`repack`]): committed, not gone over yet.
    pub(crate) fn repack_due(&self) -> bool {
        self.state == RevisionState::Committed && !self.repacked && !self.manifest.is_empty()
    }

    /// Whether compressing its tar again could gain: its blocks take at most half of it (content
    /// that hardly compressed the first time gains nothing from a higher level).
    pub(crate) fn recompresses(&self) -> bool {
        self.stored_size <= self.tar_size / 2
    }

    /// The manifest's root chunk (an error for a revision not finalized).
    pub(crate) fn manifest_root(&self) -> Result<chunks::ChunkRef> {
        self.root(&self.manifest, self.manifest_len, "has no manifest")
    }

    /// The frame plan's root chunk, if the revision has one.
    pub(crate) fn frames_root(&self) -> Result<Option<chunks::ChunkRef>> {
        if self.frames.is_empty() {
            return Ok(None);
        }
        self.root(&self.frames, self.frames_len, "has a malformed frame plan").map(Some)
    }

    /// A root chunk named in hex.
    fn root(&self, hex_hash: &str, len: u32, unreadable: &str) -> Result<chunks::ChunkRef> {
        let mut hash = [0u8; 32];
        hex::decode_to_slice(hex_hash, &mut hash)
            .map_err(|_| StorageError::Corrupt(format!("revision {} {unreadable}", self.id)))?;
        Ok(chunks::ChunkRef { hash, len })
    }
}

/// Counts reported by `/metrics` and the benchmarks.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StoreStats {
    pub chunks: u64,
    pub chunk_stored_bytes: u64,
    pub chunk_raw_bytes: u64,
    pub revisions_committed: u64,
    pub revisions_staging: u64,
    pub revisions_deleting: u64,
    /// Committed revisions the repacker has still to go over ([`repack`]).
    pub revisions_repack_pending: u64,
    pub disk_bytes: u64,
}

/// Tuning knobs of the store.
#[derive(Clone, Debug)]
pub struct StoreOptions {
    /// sled's page cache (`cache_capacity`): the memory the store keeps however much it holds.
    /// sled counts pages by their serialised size, and freed nodes leave the heap fragmented, so
    /// it costs about three to four times this in RSS once a million keys went through it: 16 MiB
    /// keeps a 1,000,000-file refusal under 200 MiB, repeatedly; 32 MiB let it creep to ~290 MiB
    /// (`docs/benchmarks.md`). The hot metadata (objects, the chunk index of content being served)
    /// of a typical store fits.
    pub cache_bytes: u64,
    /// zstd level for chunks.
    pub zstd_level: i32,
    /// Change-log entries kept for watches.
    pub change_log_len: u64,
    /// Bytes (compressed) the change log may hold: with whole objects in every entry, a busy
    /// store's log would otherwise outweigh its content many times.
    pub change_log_bytes: u64,
    /// Free bytes on the data directory's filesystem below which new content is refused
    /// ([`space`]).
    pub min_free_bytes: u64,
    /// Freshly compressed frames of zstd downloads kept in memory for the next download of the same
    /// stretch ([`frames`]): the parts of a revision its stored blocks do not cover (chunks
    /// repeated in it or shared with others) cost compression once, not per download.
    pub frame_cache_bytes: u64,
    /// zstd level committed revisions are recompressed at in the background, as long blocks
    /// ([`repack`]); 0 turns the repacker off.
    pub repack_level: i32,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            cache_bytes: 16 << 20,
            zstd_level: 3,
            change_log_len: 100_000,
            change_log_bytes: 1 << 20,
            min_free_bytes: DEFAULT_MIN_FREE_BYTES,
            frame_cache_bytes: 64 << 20,
            repack_level: repack::REPACK_LEVEL,
        }
    }
}

/// The store handle; cheap to clone, safe to share between threads. All methods block: call them
/// from `spawn_blocking` in async code.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

struct Inner {
    /// What differs between the embedded and the replicated store ([`backend`]).
    backend: backend::Backend,
    meta: meta::Meta,
    options: StoreOptions,
    dir: std::path::PathBuf,
    /// Serialises object writes so resourceVersions are allocated in commit order.
    object_lock: Mutex<()>,
    /// Object writes waiting to be applied by the holder of `object_lock` ([`apply_queue`]).
    apply_queue: apply_queue::ApplyQueue,
    /// Flushes of object writes, shared by concurrent writers ([`commit`]).
    commits: commit::Commits,
    /// Flushes, collection passes and compactions since open ([`counters`]).
    counters: counters::Counters,
    /// Chunks writers hold until their manifest is recorded; see [`chunks`] and [`gc`].
    pins: Mutex<chunks::Pins>,
    /// Bumped whenever a finalize records a manifest: a collection in progress marks it too.
    manifest_generation: std::sync::atomic::AtomicU64,
    manifests: manifest::ManifestCache,
    /// The SHA-256 of files hashed lately, so a file met again is not hashed again ([`hashing`]).
    known_digests: hashing::KnownDigests,
    /// Compressed bytes in the change log, and the lock of its trimming.
    log_bytes: std::sync::atomic::AtomicU64,
    log_trim: Mutex<()>,
    /// Set by recovery at open, cleared once the collector's full pass after it succeeded.
    recovery_due: Arc<std::sync::atomic::AtomicBool>,
    /// Serialises garbage collection passes.
    gc_lock: Mutex<()>,
    /// Set when chunks became unreferenced without a revision released (the repacker replaced a
    /// plan): the next pass sweeps.
    sweep_due: std::sync::atomic::AtomicBool,
    /// Held (shared) by a writer from appending a block until its chunks are indexed; rolling the
    /// active pack takes it exclusively, so a rolled pack has no block whose index is still to come.
    sealing: std::sync::RwLock<()>,
    events: tokio::sync::broadcast::Sender<u64>,
    gc_requests: std::sync::mpsc::SyncSender<()>,
    /// Revisions whose fresh zstd frames are to be made ahead of their first download ([`frames`]).
    warm_requests: std::sync::mpsc::SyncSender<RevisionId>,
    packs: blocks::BlockStore,
    blocks: chunks::BlockCache,
    fresh_frames: frame_cache::FrameCache,
    space: space::SpaceGuard,
    /// Set by the first failed sync: writes refused from then on ([`durability`]).
    poison: Arc<durability::Poison>,
}

impl Store {
    /// Opens (creating if needed) the store in `dir`, then finishes work a crash interrupted:
    /// staging revisions are released now, and unreferenced chunks collected in the background
    /// ([`Store::recovering`] until then).
    pub fn open(dir: &Path, options: StoreOptions) -> Result<Store> {
        std::fs::create_dir_all(dir)?;
        let space = space::SpaceGuard::new(dir, options.min_free_bytes);
        durability::remove_interrupted_snapshots(&dir.join("db"))?;
        let db = sled::Config::new()
            .path(dir.join("db"))
            .cache_capacity(options.cache_bytes)
            .mode(sled::Mode::LowSpace)
            .open()?;
        let tree = (*db).clone();
        // sled's log file (sled::Config's path joined with "db"); see [`Store::flush`].
        let db_log = std::fs::File::open(dir.join("db").join("db"))?;
        let sled_files = durability::SledFiles::open(&dir.join("db"))?;
        let poison = Arc::new(durability::Poison::default());
        let packs = packs::Packs::open(&dir.join("packs"), poison.clone())?;
        // The entries of `db/` and `packs/` in the data directory, and of the data directory in
        // its parent (created here the first time): without them the rest is unreachable.
        durability::sync_dir(dir)?;
        if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            if let Err(e) = durability::sync_dir(parent) {
                tracing::warn!(error = %e, dir = %parent.display(), "could not sync the data directory's parent");
            }
        }
        let embedded = backend::Embedded { db, log: db_log, files: sled_files };
        let store = Store::assemble(
            dir,
            options,
            space,
            poison,
            meta::Meta::Sled(tree),
            blocks::BlockStore::Files(packs),
            backend::Backend::Embedded(embedded),
        );
        store.start_commits()?;
        store.count_log_bytes()?;
        store.migrate()?;
        // A store from before the owner index gets it now (on a disk at the floor, at a later
        // start: until then dependents are found by a scan).
        if store.ensure_space(WriteKind::Metadata).is_ok() {
            store.build_owner_index()?;
        }
        store.recover()?;
        // Revisions a crash (or an older version) left unrepacked are gone over in the background.
        if store.repacks() {
            store.warm_zstd_frames(repack::AFTER_OPEN);
        }
        Ok(store)
    }

    /// Opens the replicated store: API objects, revision records and the chunk index in etcd,
    /// blocks in object storage, both reached through `remote`; `dir` only holds this replica's
    /// scratch (uploads being staged). Several replicas open the same store at once.
    pub fn open_replicated(dir: &Path, options: StoreOptions, remote: Arc<remote::Remote>) -> Result<Store> {
        std::fs::create_dir_all(dir)?;
        let space = space::SpaceGuard::new(dir, options.min_free_bytes);
        let poison = Arc::new(durability::Poison::default());
        let etcd = Arc::new(remote::EtcdMeta::new(remote.clone()));
        let meta = meta::Meta::Etcd(etcd.clone());
        let blocks = blocks::BlockStore::Remote(remote::S3Blocks::new(remote.clone(), &dir.join("block-cache")));
        let backend = backend::Backend::replicated(remote, etcd);
        let store = Store::assemble(dir, options, space, poison, meta, blocks, backend);
        store.start_commits()?;
        store.count_log_bytes()?;
        store.build_owner_index()?;
        store.follow_remote_writes();
        // This replica's own scratch only: other replicas' staging revisions are theirs.
        let _ = std::fs::remove_dir_all(store.staging_root());
        Ok(store)
    }

    fn assemble(
        dir: &Path,
        options: StoreOptions,
        space: space::SpaceGuard,
        poison: Arc<durability::Poison>,
        meta: meta::Meta,
        packs: blocks::BlockStore,
        backend: backend::Backend,
    ) -> Store {
        let (events, _) = tokio::sync::broadcast::channel(1024);
        let (gc_requests, gc_receiver) = std::sync::mpsc::sync_channel(1);
        let recovery_due = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let fresh_frames = frame_cache::FrameCache::new(options.frame_cache_bytes);
        let (warm_requests, warm_receiver) = std::sync::mpsc::sync_channel(frames::WARM_QUEUE);
        let store = Store {
            inner: Arc::new(Inner {
                backend,
                meta,
                options,
                dir: dir.to_path_buf(),
                object_lock: Mutex::new(()),
                apply_queue: apply_queue::ApplyQueue::default(),
                commits: commit::Commits::default(),
                counters: counters::Counters::default(),
                pins: Mutex::new(chunks::Pins::default()),
                manifest_generation: std::sync::atomic::AtomicU64::new(0),
                manifests: manifest::ManifestCache::default(),
                known_digests: hashing::KnownDigests::default(),
                log_bytes: std::sync::atomic::AtomicU64::new(0),
                log_trim: Mutex::new(()),
                recovery_due: recovery_due.clone(),
                gc_lock: Mutex::new(()),
                sweep_due: Default::default(),
                sealing: std::sync::RwLock::new(()),
                events,
                gc_requests,
                warm_requests,
                packs,
                blocks: chunks::BlockCache::default(),
                fresh_frames,
                space,
                poison,
            }),
        };
        gc::spawn_collector(Arc::downgrade(&store.inner), recovery_due, gc_receiver);
        frames::spawn_warmer(Arc::downgrade(&store.inner), warm_receiver);
        store
    }

    /// Makes everything written so far durable. Any failure poisons the store ([`durability`]).
    pub fn flush(&self) -> Result<()> {
        self.inner.poison.check()?;
        self.backend().flush(&self.inner)
    }

    /// Whether a failed sync poisoned the store: writes are refused until a restart.
    pub fn is_poisoned(&self) -> bool {
        self.inner.poison.is_poisoned()
    }

    /// `Err(InsufficientStorage)` when the data directory has too little free space for a write
    /// of this kind to start (see [`space`]). Checked by the store's own writers; the API checks
    /// it before requests that create or change anything. Being checked by every writer, it
    /// also refuses every write of a poisoned store (`Err(Poisoned)`, [`durability`]).
    pub fn ensure_space(&self, kind: WriteKind) -> Result<()> {
        self.inner.poison.check()?;
        self.backend().writable(&self.inner, kind)
    }

    /// Like [`Store::ensure_space`] for a write of `bytes` that must leave the threshold free.
    pub(crate) fn ensure_room_for(&self, kind: WriteKind, bytes: u64) -> Result<()> {
        self.inner.poison.check()?;
        self.backend().writable_for(&self.inner, kind, bytes)
    }

    /// Notified with the new resourceVersion after every object write.
    pub fn subscribe(&self) -> tokio::sync::broadcast::Receiver<u64> {
        self.inner.events.subscribe()
    }

    fn tree(&self) -> &meta::Meta {
        &self.inner.meta
    }

    /// The map as the read paths read it ([`backend::Backend::reads`]): what writers read and
    /// compare against is [`Store::tree`].
    fn reads(&self) -> meta::Reads<'_> {
        self.backend().reads(&self.inner.meta)
    }

    fn backend(&self) -> &backend::Backend {
        &self.inner.backend
    }

    /// Whether the store can serve (readiness): in replicated mode, etcd and object storage
    /// answer and this replica holds its lease. Blocking.
    pub fn readiness(&self) -> Result<()> {
        self.backend().readiness()
    }

    /// The store's health checks, in the order `/livez`, `/readyz` and `/healthz` list them.
    pub fn health_checks(&self) -> &'static [HealthCheck] {
        self.backend().health_checks()
    }

    /// Runs the health check `name` (one of [`Store::health_checks`]); `Err` says why it failed,
    /// `None` if the store has no such check. Blocking when the check says so.
    pub fn health_check(&self, name: &str) -> Option<std::result::Result<(), String>> {
        self.backend().health_check(&self.inner, name)
    }

    /// What `/metrics` shows of the backend (whether this replica leads).
    pub fn backend_metrics(&self) -> BackendMetrics {
        self.backend().metrics()
    }

    /// Whether replicas of this store elect a leader for singleton work; without an election the
    /// store always leads ([`Store::is_leader`]).
    pub fn elects_leader(&self) -> bool {
        self.backend().elects_leader()
    }

    /// Whether this store runs singleton work (the reconcile loop, the API's garbage collector,
    /// collection) now.
    pub fn is_leader(&self) -> bool {
        self.backend().leads()
    }

    /// At a graceful stop: leadership passes on now rather than when the lease would expire
    /// (replicated; nothing to do embedded). Blocking.
    pub fn resign(&self) {
        self.backend().resign()
    }

    /// Counts for metrics and benchmarks; scans chunk headers, so not for hot paths.
    pub fn stats(&self) -> Result<StoreStats> {
        let mut stats = StoreStats::default();
        for item in self.tree().scan_prefix(b"c") {
            let (_, value) = item?;
            let at = chunks::Location::decode(&value)?;
            stats.chunks += 1;
            stats.chunk_stored_bytes += at.stored_share();
            stats.chunk_raw_bytes += at.len as u64;
        }
        for item in self.tree().scan_prefix(b"v") {
            let (_, value) = item?;
            let record: RevisionRecord = decode_json(&value)?;
            stats.revisions_repack_pending += u64::from(record.repack_due() && self.repacks());
            match record.state {
                RevisionState::Committed => stats.revisions_committed += 1,
                RevisionState::Staging => stats.revisions_staging += 1,
                RevisionState::Deleting => stats.revisions_deleting += 1,
            }
        }
        stats.disk_bytes = self.backend().disk_bytes(&self.inner)?;
        Ok(stats)
    }
}

fn dir_size(dir: &Path) -> Result<u64> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let meta = entry.metadata()?;
        total += if meta.is_dir() { dir_size(&entry.path())? } else { meta.len() };
    }
    Ok(total)
}

fn decode_json<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T> {
    serde_json::from_slice(bytes).map_err(|e| StorageError::Corrupt(format!("undecodable record: {e}")))
}

fn encode_json<T: Serialize>(value: &T) -> Vec<u8> {
    // Serialising our own plain structs cannot fail.
    serde_json::to_vec(value).unwrap_or_default()
}

/// Key helpers: one byte of kind, then fixed-width big-endian integers and raw bytes.
fn key(kind: u8, parts: &[&[u8]]) -> Vec<u8> {
    let mut k = Vec::with_capacity(1 + parts.iter().map(|p| p.len()).sum::<usize>());
    k.push(kind);
    for p in parts {
        k.extend_from_slice(p);
    }
    k
}

fn be(n: u64) -> [u8; 8] {
    n.to_be_bytes()
}

fn read_be(bytes: &[u8]) -> Result<u64> {
    let arr: [u8; 8] =
        bytes.get(..8).and_then(|b| b.try_into().ok()).ok_or_else(|| StorageError::Corrupt("short integer".into()))?;
    Ok(u64::from_be_bytes(arr))
}

#[cfg(test)]
mod fidelity_tests;
#[cfg(test)]
mod frames_tests;
#[cfg(test)]
mod layout_tests;
#[cfg(test)]
pub(crate) mod remote_tests;
#[cfg(test)]
mod repack_tests;
#[cfg(test)]
mod replica_cache_tests;
#[cfg(test)]
mod scale_tests;
#[cfg(test)]
pub(crate) mod tests;
