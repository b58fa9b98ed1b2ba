//! The store's one seam between its two backends: every decision that differs between the
//! embedded store (sled and pack files in the data directory) and the replicated one (etcd and
//! object storage, shared by several replicas) is a method of [`Backend`], so the rest of the
//! store reads the same for both. What the backends *store* is already behind
//! [`super::meta::Meta`] (the map) and [`super::blocks::BlockStore`] (the blocks); this is the
//! *policy* around them: how writes are made durable, when a write is refused, how
//! resourceVersions and revision ids are allocated, when a writer's chunks are pinned and looked
//! up, how a manifest is recorded, who collects, and what readiness means.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::chunks::{chunk_key, pin_key, BlockBuilder, Hash, Location, LocationCache, MANIFESTS_KEY};
use super::meta::{Batch, Meta, Reads};
use super::objects::RV_COUNTER;
use super::packs::BlockAt;
use super::remote::{EtcdMeta, Mirror, Remote};
use super::{durability, read_be, Inner, Result, StorageError, Store, WriteKind};

/// What differs between the embedded and the replicated store.
///
/// Why an enum rather than a trait: there are exactly two backends, both defined here and never
/// supplied from outside, and each difference is a decision over the store's shared state (its
/// map, pins, apply queue, counters) rather than a separate object. A trait would have to be
/// handed that state in every method, or hold a pointer back into the store; an enum keeps each
/// decision one `match` in this one file, where both sides are read and checked together. Callers
/// ask a question named for what they need (`writable`, `pin_chunk`, `record_while_pinned`,
/// `leads`, …), never which backend it is.
pub(super) enum Backend {
    Embedded(Embedded),
    Replicated(Replicated),
}

/// sled and the files it leaves unsynced.
pub(super) struct Embedded {
    pub db: sled::Db,
    /// sled's log file, opened to fdatasync it after sled's own flush.
    pub log: std::fs::File,
    /// What sled writes without syncing (its directory, blob files), synced at every flush.
    pub files: durability::SledFiles,
}

/// etcd and object storage, and what a replica keeps of them.
pub(super) struct Replicated {
    pub remote: Arc<Remote>,
    /// The map in etcd (the same one [`Meta::Etcd`] holds), for its transactions with comparisons.
    pub etcd: Arc<EtcdMeta>,
    /// Where recently read chunks are, so a download does not ask etcd per chunk.
    pub locations: LocationCache,
    /// The objects, change log and counters in memory, fed by etcd's watch (`None`:
    /// `--object-cache-bytes 0`, every read goes to etcd).
    pub mirror: Option<Arc<Mirror>>,
    /// The etcd revision of this replica's last object write.
    pub last_write: std::sync::atomic::AtomicI64,
}

/// How long a write waits for the object cache to hold this replica's previous write before it
/// reads etcd instead.
const OWN_WRITE_WAIT: Duration = Duration::from_millis(20);

/// Tells the store's followers that the counter reached `value` (another replica's write, or one
/// the object cache now holds); `false` once the store is closed.
fn announce(inner: &std::sync::Weak<Inner>, value: &[u8]) -> bool {
    let Some(inner) = inner.upgrade() else { return false };
    if let Ok(rv) = read_be(value) {
        inner.commits.durable_at_least(rv);
        let _ = inner.events.send(rv);
    }
    true
}

/// One of the store's health checks, as `/livez`, `/readyz` and `/healthz` list them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HealthCheck {
    pub name: &'static str,
    /// Listed by `/livez` and `/healthz` too (else by `/readyz` only: a restart would not fix it).
    pub liveness: bool,
    /// Asks the network: run it on a blocking thread.
    pub blocking: bool,
}

/// Embedded: whether a failed sync poisoned the store, in all three lists.
const EMBEDDED_CHECKS: &[HealthCheck] = &[HealthCheck { name: "store", liveness: true, blocking: false }];
/// Replicated: etcd answers, the lease is held, the bucket answers; readiness only.
const REPLICATED_CHECKS: &[HealthCheck] = &[
    HealthCheck { name: "etcd", liveness: false, blocking: true },
    HealthCheck { name: "lease", liveness: false, blocking: true },
    HealthCheck { name: "object-storage", liveness: false, blocking: true },
];

/// What `/metrics` shows of the backend beyond the store's own counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BackendMetrics {
    /// Whether this replica leads; `None` where there is no election (every embedded store leads).
    pub leader: Option<bool>,
}

impl Backend {
    pub(super) fn replicated(remote: Arc<Remote>, etcd: Arc<EtcdMeta>) -> Backend {
        let mirror = match remote.options.object_cache_bytes {
            0 => None,
            bytes => Some(Mirror::new(bytes, remote.metrics().clone())),
        };
        Backend::Replicated(Replicated {
            remote,
            etcd,
            locations: LocationCache::default(),
            mirror,
            last_write: Default::default(),
        })
    }

    /// The replica's object cache (`None`: embedded, or `--object-cache-bytes 0`).
    pub(super) fn mirror(&self) -> Option<&Arc<Mirror>> {
        match self {
            Backend::Replicated(r) => r.mirror.as_ref(),
            Backend::Embedded(_) => None,
        }
    }

    /// Where the read paths read the map: the replica's mirror while it serves, else the map.
    pub(super) fn reads<'a>(&'a self, meta: &'a Meta) -> Reads<'a> {
        match self {
            Backend::Replicated(Replicated { mirror: Some(mirror), etcd, .. }) => Reads::Mirror(mirror, etcd),
            _ => Reads::Map(meta),
        }
    }

    /// Before a read that must be as new as a quorum read (a GET or a fresh LIST): with an object
    /// cache, waits until it holds every write acknowledged before the call (or marks it behind,
    /// so the read goes to etcd). Without one there is nothing to wait for: the map is read.
    pub(super) fn fresh_reads(&self) -> Result<()> {
        if let Backend::Replicated(Replicated { mirror: Some(mirror), etcd, .. }) = self {
            let caught_up = mirror.catch_up(etcd, RV_COUNTER)?;
            mirror.count_read(caught_up && mirror.serves());
        }
        Ok(())
    }

    /// [`Backend::fresh_reads`] for a reader on the async runtime: `true` if the replica's object
    /// cache holds every write acknowledged before the call and serves, so the read may be
    /// answered from memory at once; `false` otherwise (embedded too), and the read then goes to
    /// a blocking thread, which waits or reads etcd.
    pub(super) async fn fresh_reads_now(&self) -> Result<bool> {
        let Backend::Replicated(Replicated { mirror: Some(mirror), etcd, .. }) = self else { return Ok(false) };
        let caught_up = mirror.caught_up_now(etcd, RV_COUNTER).await?;
        if caught_up {
            mirror.count_read(true);
        }
        Ok(caught_up)
    }

    /// Makes what was written durable. Replicated: etcd and object storage acknowledge only what
    /// they made durable, so nothing is left to do.
    pub(super) fn flush(&self, inner: &Inner) -> Result<()> {
        let Backend::Embedded(embedded) = self else { return Ok(()) };
        let poison = &inner.poison;
        // Pack data first: an index entry must never be durable before the bytes it points at.
        inner.packs.sync()?;
        embedded.db.flush().map_err(|e| poison.poison("flushing the database", e))?;
        // Blob files and renamed snapshots before the log that names them.
        embedded.files.sync().map_err(|e| poison.poison("syncing the database's files", e))?;
        // sled 0.34 ends its flush with sync_file_range, which writes the log's pages but neither
        // flushes the drive's cache nor records the file's new blocks: enough for a killed
        // process, not for a power cut. fdatasync of the log makes it durable.
        embedded.log.sync_data().map_err(|e| poison.poison("fdatasync of the database log", e))?;
        inner.counters.flushed();
        Ok(())
    }

    /// Whether a write of this kind may start: embedded, the data directory's free space;
    /// replicated, this replica's lease (pins taken under a lapsed one may be gone).
    pub(super) fn writable(&self, inner: &Inner, kind: WriteKind) -> Result<()> {
        match self {
            Backend::Embedded(_) => inner.space.check(kind),
            Backend::Replicated(r) => r.remote.writable(),
        }
    }

    /// [`Backend::writable`] for a write of `bytes` that must leave the threshold free.
    pub(super) fn writable_for(&self, inner: &Inner, kind: WriteKind, bytes: u64) -> Result<()> {
        match self {
            Backend::Embedded(_) => inner.space.check_room_for(kind, bytes),
            Backend::Replicated(r) => r.remote.writable(),
        }
    }

    /// Whether the store can serve: replicated, etcd and object storage answer and this replica
    /// holds its lease.
    pub(super) fn readiness(&self) -> Result<()> {
        match self {
            Backend::Embedded(_) => Ok(()),
            Backend::Replicated(r) => r.remote.reachable(),
        }
    }

    pub(super) fn health_checks(&self) -> &'static [HealthCheck] {
        match self {
            Backend::Embedded(_) => EMBEDDED_CHECKS,
            Backend::Replicated(_) => REPLICATED_CHECKS,
        }
    }

    /// Runs the health check `name`; `None` if the store has no such check.
    pub(super) fn health_check(&self, inner: &Inner, name: &str) -> Option<Result<(), String>> {
        let reason = |r: Result<()>| r.map_err(|e| e.to_string());
        Some(match (self, name) {
            (Backend::Embedded(_), "store") if inner.poison.is_poisoned() => {
                Err("a failed sync poisoned the store: writes are refused until stowage restarts".into())
            }
            (Backend::Embedded(_), "store") => Ok(()),
            (Backend::Replicated(r), "etcd") => reason(r.remote.etcd_reachable()),
            (Backend::Replicated(r), "lease") => reason(r.remote.lease_held()),
            (Backend::Replicated(r), "object-storage") => reason(r.remote.bucket_reachable()),
            _ => return None,
        })
    }

    pub(super) fn metrics(&self) -> BackendMetrics {
        match self {
            Backend::Embedded(_) => BackendMetrics { leader: None },
            Backend::Replicated(r) => BackendMetrics { leader: Some(r.remote.is_leader()) },
        }
    }

    /// Whether replicas elect a leader for singleton work (else this store always leads).
    pub(super) fn elects_leader(&self) -> bool {
        matches!(self, Backend::Replicated(_))
    }

    /// Whether this store runs singleton work (collection, the reconcile loop) now.
    pub(super) fn leads(&self) -> bool {
        match self {
            Backend::Embedded(_) => true,
            Backend::Replicated(r) => r.remote.is_leader(),
        }
    }

    /// Gives up leadership and presence at a graceful stop (replicated). Blocking.
    pub(super) fn resign(&self) {
        if let Backend::Replicated(r) = self {
            r.remote.resign();
        }
    }

    /// Whether reads are local (sled: memory or a local file), never network round trips.
    pub(super) fn reads_are_local(&self) -> bool {
        matches!(self, Backend::Embedded(_))
    }

    /// Bytes the store takes on this server's disk (replicated: none; the bucket's owner sees
    /// them).
    pub(super) fn disk_bytes(&self, inner: &Inner) -> Result<u64> {
        match self {
            Backend::Embedded(_) => Ok(super::dir_size(&inner.dir.join("db"))? + inner.packs.disk_bytes()?),
            Backend::Replicated(_) => Ok(0),
        }
    }

    // --- object writes and resourceVersions ---

    /// Operations one group of writes may take: etcd's transaction limit (the comparison is one).
    pub(super) fn group_ops(&self) -> usize {
        match self {
            Backend::Embedded(_) => usize::MAX,
            Backend::Replicated(r) => r.etcd.max_ops(),
        }
    }

    /// Whether a group of writes reads the counter and the objects from the object cache: when it
    /// holds this replica's own last write (it usually does: that write's event is already on its
    /// way), which saves an etcd round trip per key. The compare-and-swap on the counter vouches
    /// for what was read, since every object write moves it. Embedded: the map is read.
    ///
    /// `Some` of the cache alone ([`Reads::MirrorOnly`]): the counter and the objects must come
    /// from one source. Read from etcd while the cache was off and from the cache once it was back
    /// (older than the counter read), a write could pass its compare-and-swap on stale objects.
    pub(super) fn cached_write_reads(&self) -> Option<Reads<'_>> {
        let Backend::Replicated(Replicated { mirror: Some(mirror), last_write, .. }) = self else { return None };
        let ready = mirror.wait_applied(last_write.load(std::sync::atomic::Ordering::Acquire), OWN_WRITE_WAIT)
            && mirror.serves();
        ready.then_some(Reads::MirrorOnly(mirror))
    }

    /// Applies a group's batch. Embedded: at once (the object lock orders writers). Replicated: if
    /// the counter still holds `counter` (what the group was built on); `Ok(false)` if not.
    pub(super) fn apply_group(&self, store: &Store, batch: Batch, counter: Option<&[u8]>) -> Result<bool> {
        match self {
            Backend::Embedded(_) => {
                store.tree().apply_batch(batch)?;
                Ok(true)
            }
            Backend::Replicated(r) => match r.etcd.apply_if_at(batch, RV_COUNTER, counter)? {
                Some(revision) => {
                    r.last_write.fetch_max(revision, std::sync::atomic::Ordering::AcqRel);
                    Ok(true)
                }
                None => Ok(false),
            },
        }
    }

    /// Announces other replicas' writes like this one's, as etcd reports the resourceVersion
    /// counter moving (embedded: every write is this store's own), and starts the object cache.
    /// Both the cache and a watch of the counter alone announce: the cache once it holds the
    /// write, the counter's watch even while the cache is off.
    pub(super) fn follow_writes(&self, inner: std::sync::Weak<Inner>) {
        let Backend::Replicated(r) = self else { return };
        if let Some(mirror) = &r.mirror {
            let inner = inner.clone();
            mirror.follow(&r.etcd, move |value| {
                announce(&inner, value);
            });
        }
        r.remote.follow_key(r.etcd.full_key(RV_COUNTER), move |value| announce(&inner, value));
    }

    /// Brings the durable resourceVersion up to every write acknowledged before the call:
    /// embedded, it is already (`None`); replicated, read from etcd (through the object cache,
    /// once it has caught up), since other replicas write too: `Some` of what the store's reads
    /// now reach, which a list may be at.
    pub(super) fn catch_up_durable(&self, store: &Store) -> Result<Option<u64>> {
        let Backend::Replicated(_) = self else { return Ok(None) };
        self.fresh_reads()?;
        let rv = store.current_resource_version()?;
        store.inner.commits.durable_at_least(rv);
        Ok(Some(rv))
    }

    // --- revisions and their chunks ---

    /// A revision id never used before: sled's id generator, or a counter in etcd moved by
    /// compare-and-swap (replicas allocate concurrently).
    pub(super) fn next_revision_id(&self, meta: &Meta, counter: &[u8]) -> Result<u64> {
        if let Backend::Embedded(embedded) = self {
            return Ok(embedded.db.generate_id()?);
        }
        loop {
            let read = meta.get(counter)?;
            let next = read.as_deref().map(read_be).transpose()?.unwrap_or(0) + 1;
            if meta.compare_and_swap(counter, read.as_deref(), Some(&super::be(next)[..]))? {
                return Ok(next);
            }
        }
    }

    /// Who writes a `Staging` revision (replicated: this replica, whose lease's end releases it).
    pub(super) fn writer_id(&self) -> String {
        match self {
            Backend::Embedded(_) => String::new(),
            Backend::Replicated(r) => r.remote.replica_id().to_string(),
        }
    }

    /// The lease count a writer begins under (see [`Backend::record_while_pinned`]).
    pub(super) fn lease_epoch(&self) -> u64 {
        match self {
            Backend::Embedded(_) => 0,
            Backend::Replicated(r) => r.remote.lease_epoch(),
        }
    }

    /// Whether a writer learns at once which of its chunks the store holds (embedded: a lookup in
    /// the local index), or only when their block is sealed (replicated: one etcd transaction
    /// per block pins them and looks them up, instead of one per chunk).
    pub(super) fn finds_stored_chunks_at_put(&self) -> bool {
        matches!(self, Backend::Embedded(_))
    }

    /// Pins a writer's chunk `hash`; where the store holds it already, if it tells now (see
    /// [`Backend::finds_stored_chunks_at_put`]).
    pub(super) fn pin_chunk(&self, store: &Store, hash: Hash) -> Result<Option<Location>> {
        match self {
            Backend::Embedded(_) => store.pin_and_check(hash),
            Backend::Replicated(_) => {
                store.lock_pins().pin(hash);
                Ok(None)
            }
        }
    }

    /// At the seal of a block (replicated): pins the builder's chunks in etcd, then drops those
    /// the store already holds (pinned first, looked up after, in the same transactions: see
    /// [`super::gc_shared`]). Their bytes stay, as filler: the block remains the stretch of tar it
    /// was built as.
    /// The caller holds the pins' lock.
    pub(super) fn pin_at_seal(&self, builder: &mut BlockBuilder) -> Result<()> {
        let Backend::Replicated(r) = self else { return Ok(()) };
        let keys: Vec<Vec<u8>> = builder.members().iter().map(|m| pin_key(r.remote.replica_id(), &m.hash)).collect();
        let probes: Vec<Vec<u8>> = builder.members().iter().map(|m| chunk_key(&m.hash)).collect();
        let known = r.etcd.put_leased_and_probe_many(&keys, r.remote.lease(), &probes)?;
        if known.iter().any(|k| *k) {
            builder.drop_known(known);
        }
        Ok(())
    }

    /// The index entries of a sealed block's chunks. Embedded: one indexed meanwhile (by another
    /// writer) keeps its first copy, and this one becomes filler. Replicated: every member was
    /// absent when pinned, and one written meanwhile by another replica is simply pointed at this
    /// copy (both hold the same verified bytes); but a block is safe from collection for its
    /// grace period only (`remote::s3`), so it is indexed well within it, or not at all.
    pub(super) fn index_sealed(
        &self,
        meta: &Meta,
        block: BlockAt,
        builder: &BlockBuilder,
        appending: Instant,
    ) -> Result<Batch> {
        let members_len = builder.members_len();
        let mut batch = Batch::default();
        match self {
            Backend::Embedded(_) => {
                for m in builder.members() {
                    if !meta.contains_key(chunk_key(&m.hash))? {
                        batch.insert(chunk_key(&m.hash), Location::new(block, m, members_len).encode());
                    }
                }
            }
            Backend::Replicated(r) => {
                if appending.elapsed() > r.remote.options.block_grace / 2 {
                    return Err(StorageError::Remote("writing a block to object storage took too long".into()));
                }
                for m in builder.members() {
                    batch.insert(chunk_key(&m.hash), Location::new(block, m, members_len).encode());
                }
            }
        }
        Ok(batch)
    }

    /// The key of this replica's pin of `hash` in the shared map, removed with the writer's last
    /// pin of it (embedded: pins live in memory only).
    pub(super) fn shared_pin(&self, hash: &Hash) -> Option<Vec<u8>> {
        match self {
            Backend::Embedded(_) => None,
            Backend::Replicated(r) => Some(pin_key(r.remote.replica_id(), hash)),
        }
    }

    /// Writes a record that makes pinned chunks reachable (a writer's manifest). Replicated: only
    /// while this replica's lease is the one its pins were taken under — once it lapsed, the
    /// collector may have taken them, so the write is refused and the writer fails — and with
    /// [`MANIFESTS_KEY`] rewritten in the same transaction, so a collection in progress sees it.
    pub(super) fn record_while_pinned(
        &self,
        meta: &Meta,
        mut batch: Batch,
        key: &[u8],
        lease_epoch: u64,
    ) -> Result<()> {
        let Backend::Replicated(r) = self else { return meta.apply_batch(batch) };
        batch.insert(MANIFESTS_KEY, key);
        let lapsed = r.remote.lease_epoch() != lease_epoch;
        if lapsed || !r.etcd.apply_when(batch, vec![r.etcd.lease_held(r.remote.lease())])? || r.remote.lease_lost() {
            return Err(StorageError::Remote("this replica's etcd lease lapsed while it was writing".into()));
        }
        Ok(())
    }

    /// Where recently read chunks are, where each lookup would be a network round trip.
    pub(super) fn location_cache(&self) -> Option<&LocationCache> {
        match self {
            Backend::Embedded(_) => None,
            Backend::Replicated(r) => Some(&r.locations),
        }
    }

    // --- collection ---

    /// How often a full collection pass runs unasked: replicated, on whichever replica leads —
    /// writers that died on other replicas leave work no request here announces.
    pub(super) fn collect_every(&self) -> Option<Duration> {
        match self {
            Backend::Embedded(_) => None,
            Backend::Replicated(r) => Some(r.remote.options.collect_every),
        }
    }

    /// Before a collection pass: releases `Staging` revisions whose writer is gone (replicated:
    /// its replica's lease ended). Returns how many.
    pub(super) fn release_orphaned_staging(&self, store: &Store) -> Result<u64> {
        match self {
            Backend::Embedded(_) => Ok(0),
            Backend::Replicated(r) => store.release_staging_of_gone(&r.remote.live_replicas()?),
        }
    }

    /// Mark and sweep of chunks: against this store's writers, seen through its pins' lock
    /// (embedded), or against writers on every replica ([`super::gc_shared`]). Returns the chunks
    /// removed.
    pub(super) fn mark_and_sweep(&self, store: &Store) -> Result<u64> {
        match self {
            Backend::Embedded(_) => store.mark_and_sweep(),
            Backend::Replicated(r) => store.mark_and_sweep_shared(&r.etcd),
        }
    }

    // --- upload sessions ---

    /// Where upload sessions live: files under `dir` (embedded), or etcd and the bucket, shared
    /// by every replica (replicated).
    pub(super) fn session_store(
        &self,
        dir: &std::path::Path,
    ) -> std::io::Result<Arc<dyn super::sessions::SessionStore>> {
        Ok(match self {
            Backend::Embedded(_) => Arc::new(super::sessions::local::LocalSessions::open(dir)?),
            Backend::Replicated(r) => Arc::new(super::sessions::shared::SharedSessions::new(r.remote.clone())),
        })
    }
}
