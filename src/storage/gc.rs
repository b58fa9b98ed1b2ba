//! Garbage collection and crash recovery.
//!
//! Releasing a revision is one key: its record goes, and with it the only path to its manifest.
//! Chunks are then collected by mark and sweep: every finalized revision's manifest is walked (root,
//! pages, segment lists, file chunks) into a [`LiveSet`], and every chunk index entry that is
//! neither marked nor pinned by a writer is deleted. A writer that records its manifest while a
//! pass runs bumps a generation counter before it unpins; the sweep, under the pins lock, sees the
//! counter moved and marks the new manifests before it deletes anything. Packs whose bytes are
//! mostly dead are then rewritten at a bounded rate ([`COMPACTION_BYTES_PER_SEC`]).
//!
//! On open, revisions left `Staging` by a crash are released and their staging files removed; then,
//! on the collector while the store already serves, a full pass collects chunks that were written
//! but never reached by a manifest, so opening does not grow with the store.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::chunks::{chunk_key, decode_block, BlockBuilder, ChunkRef, Hash, Location, SWEEP_GROUP};
use super::manifest::ChunkList;
use super::objects::key_revision;
use super::packs::ScannedBlock;
use super::{decode_json, encode_json, key, Result, RevisionId, RevisionRecord, RevisionState, StorageError, Store};

/// What a collection pass did.
#[derive(Debug, Default, Clone, Copy)]
pub struct GcReport {
    pub revisions_released: u64,
    pub chunks_removed: u64,
    pub packs_compacted: u64,
}

/// A pack is compacted once less than this fraction of it is still referenced: the dead share of
/// the packs stays under a fifth, at the cost of copying up to four live bytes per dead one.
const COMPACT_BELOW_LIVE: f64 = 0.8;
/// The active pack is sealed for compaction once this many of its bytes are dead (and it is
/// mostly dead): small enough to matter on a nearly full disk, big enough not to litter small packs.
const ROLL_ACTIVE_DEAD_BYTES: u64 = 4 << 20;
/// Live bytes compaction copies per second at most, so that it never takes the disk from readers
/// and writers for long.
pub const COMPACTION_BYTES_PER_SEC: u64 = 64 << 20;
/// Bits of the mark filter (8 MiB): memory of a pass is this, whatever the store holds.
pub(super) const LIVE_SET_BITS: usize = 1 << 26;
/// Probes per chunk in the mark filter.
const LIVE_SET_PROBES: usize = 4;

/// The revisions a pass has marked, with the plan each had then.
pub(super) type Marked = HashMap<RevisionId, String>;

/// The chunks a pass found reachable: a Bloom filter, so its memory is fixed. A false positive
/// keeps a dead chunk until a later pass (each pass salts its probes differently); a live chunk is
/// never missed.
pub(super) struct LiveSet {
    bits: Vec<u64>,
    salt: u64,
}

impl LiveSet {
    pub(super) fn new(bits: usize) -> LiveSet {
        // Any value that differs between passes will do.
        let salt = std::collections::hash_map::RandomState::new().hash_one(Instant::now());
        LiveSet { bits: vec![0; bits.div_ceil(64).max(1)], salt }
    }

    fn probes(&self, hash: &Hash) -> [(usize, u64); LIVE_SET_PROBES] {
        let len = self.bits.len() as u64 * 64;
        std::array::from_fn(|i| {
            // Chunk hashes are BLAKE3 digests: any eight of their bytes are uniformly distributed.
            let word = hash.get(i * 8..i * 8 + 8).and_then(|b| b.try_into().ok()).map_or(0, u64::from_le_bytes);
            let bit = (word ^ self.salt.rotate_left(i as u32 * 16)) % len;
            ((bit / 64) as usize, 1u64 << (bit % 64))
        })
    }

    pub(super) fn insert(&mut self, hash: &Hash) {
        for (word, mask) in self.probes(hash) {
            if let Some(w) = self.bits.get_mut(word) {
                *w |= mask;
            }
        }
    }

    pub(super) fn contains(&self, hash: &Hash) -> bool {
        self.probes(hash).into_iter().all(|(word, mask)| self.bits.get(word).is_some_and(|w| w & mask != 0))
    }
}

impl Store {
    pub(super) fn recover(&self) -> Result<()> {
        // On a disk at the floor even recovery's small writes could make sled fail for good; the
        // staging revisions are unreachable anyway and are released at a later open.
        if let Err(e) = self.ensure_space(super::WriteKind::Metadata) {
            tracing::warn!(error = %e, "recovery postponed to the next start");
            return Ok(());
        }
        let mut batch = super::meta::Batch::default();
        for item in self.tree().scan_prefix(b"v") {
            let (k, v) = item?;
            let mut record: RevisionRecord = decode_json(&v)?;
            if record.state == RevisionState::Staging {
                tracing::info!(revision = record.id, "releasing a revision a crash left unfinished");
                record.state = RevisionState::Deleting;
                batch.insert(k, encode_json(&record));
            }
        }
        self.tree().apply_batch(batch)?;
        // No writer runs yet: every staging directory is a crashed writer's.
        let _ = std::fs::remove_dir_all(self.staging_root());
        // The full pass walks every manifest: O(store), so it runs on the collector while the
        // store serves. Concurrent writers are safe against it as against any pass (pins and the
        // manifest generation), so nothing a committed revision references can go.
        self.inner.recovery_due.store(true, Ordering::Release);
        self.request_gc();
        Ok(())
    }

    /// The rest of recovery, on the collector: a full pass collects chunks that were written but
    /// never reached by a manifest, then packs the previous run left mostly dead are compacted.
    fn finish_recovery(&self) -> Result<GcReport> {
        // The compaction below too: passes requested meanwhile compact as well.
        let _guard = self.inner.gc_lock.lock().unwrap_or_else(|e| e.into_inner());
        // A damaged manifest or pack stops the pass before it deletes anything it could not
        // account for, but must not stop the store: every other revision still serves.
        let mut report = match self.collect_locked(true) {
            Ok(report) => report,
            Err(e @ StorageError::Corrupt(_)) => {
                tracing::error!(error = %e, "collection after open stopped: unreferenced chunks stay until a pass succeeds");
                GcReport::default()
            }
            Err(e) => return Err(e),
        };
        // The previous run's active pack is sealed now: it may be worth compacting.
        match self.compact_packs() {
            Ok(compacted) => report.packs_compacted += compacted,
            Err(e @ StorageError::Corrupt(_)) => tracing::error!(error = %e, "compaction after open stopped"),
            Err(e) => return Err(e),
        }
        if report.revisions_released > 0 || report.chunks_removed > 0 {
            tracing::info!(?report, "recovered the store");
        }
        Ok(report)
    }

    /// Frees every `Deleting` revision, then sweeps chunks no manifest reaches.
    pub fn collect(&self) -> Result<GcReport> {
        self.collect_with(false)
    }

    fn collect_with(&self, full: bool) -> Result<GcReport> {
        let _guard = self.inner.gc_lock.lock().unwrap_or_else(|e| e.into_inner());
        self.collect_locked(full)
    }

    /// A pass, under the collection lock.
    fn collect_locked(&self, mut full: bool) -> Result<GcReport> {
        let mut report = GcReport::default();
        // One replica collects: the leader (every embedded store leads).
        if !self.is_leader() {
            return Ok(report);
        }
        full |= self.inner.sweep_due.swap(false, Ordering::AcqRel);
        full |= self.backend().release_orphaned_staging(self)? > 0;
        self.ensure_space(super::WriteKind::Metadata)?;
        // A read that fails fails the pass, rather than passing for the end of the revisions.
        let mut deleting: Vec<RevisionId> = Vec::new();
        for item in self.tree().scan_prefix(b"v") {
            let (_, v) = item?;
            let record = decode_json::<RevisionRecord>(&v).ok();
            if let Some(record) = record.filter(|r| r.state == RevisionState::Deleting) {
                deleting.push(record.id);
            }
        }
        for id in deleting {
            // A writer that gave up removed its files; one that crashed left them for `recover`.
            let _ = std::fs::remove_dir_all(self.staging_dir(id));
            self.tree().remove(key_revision(id))?;
            report.revisions_released += 1;
        }
        if full || report.revisions_released > 0 {
            report.chunks_removed = self.backend().mark_and_sweep(self)?;
            self.inner.counters.swept();
        }
        self.flush()?;
        if report.revisions_released > 0 {
            give_back_freed_memory();
        }
        // Pack use only changes when chunks go; the scan behind compaction is O(store).
        if report.chunks_removed > 0 {
            report.packs_compacted = self.compact_packs()?;
        }
        Ok(report)
    }

    /// Where writers stage uploads.
    pub(super) fn staging_root(&self) -> std::path::PathBuf {
        self.inner.dir.join("staging")
    }

    pub(super) fn staging_dir(&self, id: RevisionId) -> std::path::PathBuf {
        super::staging::dir_of(&self.staging_root(), id)
    }

    /// Called by a writer after its manifest is recorded and before it unpins.
    pub(super) fn manifest_recorded(&self) {
        self.inner.manifest_generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Marks every finalized revision's chunks, then deletes the index entries of the others.
    /// Returns the chunks removed.
    pub(super) fn mark_and_sweep(&self) -> Result<u64> {
        let mut live = LiveSet::new(LIVE_SET_BITS);
        let mut marked = Marked::new();
        let mut generation = self.inner.manifest_generation.load(Ordering::Acquire);
        self.mark_new(&mut live, &mut marked)?;
        let mut removed = 0;
        let mut after: Vec<u8> = key(b'c', &[]);
        loop {
            let group = sweep_group(self.tree().range(after.clone()..key(b'c' + 1, &[])), &after)?;
            let Some(last) = group.last() else { return Ok(removed) };
            after = chunk_key(last);
            let pins = self.lock_pins();
            let now = self.inner.manifest_generation.load(Ordering::Acquire);
            if now != generation {
                // A writer recorded a manifest (and may have unpinned) since the mark.
                generation = now;
                self.mark_new(&mut live, &mut marked)?;
            }
            let mut batch = super::meta::Batch::default();
            for hash in &group {
                if !live.contains(hash) && !pins.is_pinned(hash) {
                    batch.remove(chunk_key(hash));
                    removed += 1;
                }
            }
            self.tree().apply_batch(batch)?;
        }
    }

    /// Marks the chunks of finalized revisions not marked yet (or marked with another plan: the
    /// repacker gave them a new one).
    pub(super) fn mark_new(&self, live: &mut LiveSet, marked: &mut Marked) -> Result<()> {
        for item in self.tree().scan_prefix(b"v") {
            let (_, v) = item?;
            let record: RevisionRecord = decode_json(&v)?;
            if record.state == RevisionState::Deleting
                || record.manifest.is_empty()
                || marked.get(&record.id) == Some(&record.frames)
            {
                continue;
            }
            self.mark_revision(&record, live)?;
            marked.insert(record.id, record.frames);
        }
        Ok(())
    }

    fn mark_revision(&self, record: &RevisionRecord, live: &mut LiveSet) -> Result<()> {
        let root = record.manifest_root()?;
        live.insert(&root.hash);
        for chunk in self.plan_chunks(record)? {
            live.insert(&chunk);
        }
        let manifest = self.manifest_of(record)?;
        for page in &manifest.pages {
            live.insert(&page.chunk.hash);
            for entry in self.page(&page.chunk)? {
                match &entry.chunks {
                    ChunkList::Inline(refs) => refs.iter().for_each(|r| live.insert(&r.hash)),
                    ChunkList::Segments(segments) => {
                        for (_, segment) in segments {
                            live.insert(&segment.hash);
                            for r in ChunkRef::decode_all(&self.get_chunk(segment)?.0)? {
                                live.insert(&r.hash);
                            }
                        }
                    }
                    ChunkList::None | ChunkList::Staged { .. } => {}
                }
            }
        }
        Ok(())
    }

    /// Rewrites packs that are mostly dead: live chunks are copied into new blocks in the active
    /// pack (fsynced before the index points at the copies), then the old file is deleted.
    fn compact_packs(&self) -> Result<u64> {
        let packs = &self.inner.packs;
        let (mut active, mut ids) = self.sealed_packs(false)?;
        let mut live = self.live_bytes_by_pack()?;
        // Dead bytes in the active pack would stay until the next start or roll-over (128 MiB) —
        // forever on a full disk, where nothing new is written: seal it once it is mostly dead.
        if let Some(id) = active {
            let (size, live_bytes) = (packs.size(id)?, live.get(&id).copied().unwrap_or(0));
            let dead = size.saturating_sub(live_bytes);
            // Or once less than half of it is live: a small store whose blocks the repacker
            // rewrote would otherwise keep the old ones until it grew.
            if mostly_dead(live_bytes, size) && (dead >= ROLL_ACTIVE_DEAD_BYTES || live_bytes < size / 2) {
                (active, ids) = self.sealed_packs(true)?;
                live = self.live_bytes_by_pack()?;
            }
        }
        let mut compacted = 0;
        for id in ids {
            if Some(id) == active {
                continue;
            }
            let size = packs.size(id)?;
            let live_bytes = live.get(&id).copied().unwrap_or(0);
            if live_bytes == 0 || mostly_dead(live_bytes, size) {
                // Copying live chunks takes space before it frees more: in the reserve (where it
                // matters most) only if the copy leaves the floor free.
                if live_bytes > 0 && self.ensure_room_for(super::WriteKind::Metadata, live_bytes).is_err() {
                    continue;
                }
                if live_bytes > 0 {
                    self.compact_pack(id)?;
                }
                self.flush()?;
                packs.remove(id)?;
                self.inner.blocks.forget_pack(id);
                self.inner.counters.compacted(live_bytes);
                compacted += 1;
            }
        }
        Ok(compacted)
    }

    /// The active pack and all pack ids, taken while no writer is between appending a block and
    /// indexing it: every pack but the active one then has its index complete, so a live count
    /// scanned afterwards is exact for it. With `roll`, the active pack is sealed first.
    fn sealed_packs(&self, roll: bool) -> Result<(Option<u64>, Vec<u64>)> {
        let _sealing = self.inner.sealing.write().unwrap_or_else(|e| e.into_inner());
        if roll {
            self.inner.packs.roll();
        }
        Ok((self.inner.packs.active_id(), self.inner.packs.list()?))
    }

    /// Stored bytes of indexed chunks (filler included, [`Location::stored_share`]), per pack.
    fn live_bytes_by_pack(&self) -> Result<HashMap<u64, u64>> {
        let mut live: HashMap<u64, u64> = HashMap::new();
        for item in self.tree().scan_prefix(b"c") {
            let (_, v) = item?;
            let at = Location::decode(&v)?;
            *live.entry(at.block.pack).or_insert(0) += at.stored_share();
        }
        Ok(live)
    }

    fn compact_pack(&self, id: u64) -> Result<()> {
        let mut pace = Pace::new(COMPACTION_BYTES_PER_SEC);
        let mut builder = BlockBuilder::default();
        let mut moved: Vec<Location> = Vec::new();
        self.inner.packs.scan(id, |mut scanned| {
            // A block whose every chunk is still indexed in it is copied whole: no recompression,
            // and its payload stays the one the frame plans anchored to it name.
            if let Some(olds) = self.indexed_whole(&scanned, &builder)? {
                self.copy_block(&scanned, &olds)?;
                pace.copied(scanned.at.stored_len as u64);
                return Ok(());
            }
            let mut block: Option<Vec<u8>> = None;
            for member in &scanned.members {
                let Some(at) = self.chunk_location(&member.hash)? else { continue };
                if at.block != scanned.at || builder.contains(&member.hash) {
                    continue; // dead here: swept, or indexed elsewhere
                }
                if block.is_none() {
                    block = Some(decode_block(&scanned.at, std::mem::take(&mut scanned.payload))?);
                }
                let Some(raw) = block.as_deref() else { continue };
                let range = member.offset as usize..(member.offset + member.len) as usize;
                let Some(data) = raw.get(range) else { continue };
                if blake3::hash(data).as_bytes() != &member.hash {
                    tracing::error!(chunk = %hex::encode(member.hash), pack = id, "damaged chunk left in place");
                    continue;
                }
                builder.push(member.hash, data);
                moved.push(at);
                if builder.is_full() {
                    self.seal_relocated(&mut builder, &mut moved)?;
                    pace.copied(super::chunks::BLOCK_TARGET as u64);
                }
            }
            Ok(())
        })?;
        self.seal_relocated(&mut builder, &mut moved)
    }

    /// Where each chunk of a scanned block is, if the index places all of them in it.
    fn indexed_whole(&self, scanned: &ScannedBlock, building: &BlockBuilder) -> Result<Option<Vec<Location>>> {
        let mut olds = Vec::with_capacity(scanned.members.len());
        for member in &scanned.members {
            match self.chunk_location(&member.hash)? {
                Some(at) if at.block == scanned.at && !building.contains(&member.hash) => olds.push(at),
                _ => return Ok(None),
            }
        }
        Ok(Some(olds).filter(|o| !o.is_empty()))
    }

    /// Appends a scanned block's record as it is, makes it durable, then moves its chunks' index
    /// entries (`olds`, parallel to its members) to the copy.
    fn copy_block(&self, scanned: &ScannedBlock, olds: &[Location]) -> Result<()> {
        let (at, members_len) = (&scanned.at, olds.first().map_or(0, |o| o.members_len));
        self.append_moved(at.codec, at.raw_len, &scanned.members, olds, members_len, &scanned.payload).map(|_| ())
    }

    /// Whether the collection recovery owes since open has not finished yet: until then, chunks a
    /// crash left unreferenced still take space (nothing else differs).
    pub fn recovering(&self) -> bool {
        self.inner.recovery_due.load(Ordering::Acquire)
    }

    /// Waits up to `timeout` for that collection to finish; whether it did. Once it did, the
    /// collector holds no handle: dropping the caller's closes the store.
    pub fn wait_recovered(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while self.recovering() {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        true
    }

    /// Asks the background collector for a pass that sweeps, though no revision was released.
    pub(super) fn request_sweep(&self) {
        self.inner.sweep_due.store(true, Ordering::Release);
        self.request_gc();
    }

    /// Asks the background collector for a pass (coalesced; never blocks).
    pub fn request_gc(&self) {
        let _ = self.inner.gc_requests.try_send(());
    }
}

/// The next group of a sweep: the hashes of up to [`SWEEP_GROUP`] chunk index entries from
/// `items`, a scan starting at `after` (the last key of the previous group, skipped). A failed read
/// fails the group, and with it the pass: an empty group ends a sweep as done, so a read that
/// failed must not look like the end of the index.
pub(super) fn sweep_group(items: super::meta::MetaIter<'_>, after: &[u8]) -> Result<Vec<Hash>> {
    let mut group = Vec::new();
    for item in items {
        let (k, _) = item?;
        if k.as_ref() == after {
            continue;
        }
        if let Some(hash) = k.get(1..33).and_then(|h| Hash::try_from(h).ok()) {
            group.push(hash);
            if group.len() >= SWEEP_GROUP {
                break;
            }
        }
    }
    Ok(group)
}

/// Returns the heap pages freed by a release to the OS. glibc keeps freed memory in its arenas
/// (a release of a revision with many files frees tens of MiB of sled nodes and batches), which
/// otherwise stays in the RSS as if still used.
fn give_back_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free heap memory; it has no preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Keeps a copy at or under a rate by sleeping after each block.
struct Pace {
    started: Instant,
    bytes: u64,
    per_sec: u64,
}

impl Pace {
    fn new(per_sec: u64) -> Pace {
        Pace { started: Instant::now(), bytes: 0, per_sec: per_sec.max(1) }
    }

    fn copied(&mut self, bytes: u64) {
        self.bytes += bytes;
        let due = Duration::from_secs_f64(self.bytes as f64 / self.per_sec as f64);
        if let Some(ahead) = due.checked_sub(self.started.elapsed()) {
            std::thread::sleep(ahead);
        }
    }
}

fn mostly_dead(live_bytes: u64, size: u64) -> bool {
    (live_bytes as f64) < size as f64 * COMPACT_BELOW_LIVE
}

/// Runs collection passes on request until the store is dropped.
pub(super) fn spawn_collector(
    store: std::sync::Weak<super::Inner>,
    recovery_due: std::sync::Arc<std::sync::atomic::AtomicBool>,
    requests: std::sync::mpsc::Receiver<()>,
) {
    let spawned = std::thread::Builder::new().name("stowage-gc".into()).spawn(move || loop {
        // Replicated: also a full pass now and then, on whichever replica leads — writers that
        // died on other replicas leave work no request here announces.
        let periodic = store.upgrade().and_then(|inner| inner.backend.collect_every());
        let full = match periodic {
            None => match requests.recv() {
                Ok(()) => false,
                Err(_) => return,
            },
            Some(every) => match requests.recv_timeout(every) {
                Ok(()) => false,
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => true,
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return,
            },
        };
        while requests.try_recv().is_ok() {}
        // The pass recovery asked for (until one succeeds: a failed one is tried again at the
        // next request).
        let recovery = recovery_due.load(Ordering::Acquire);
        let passed = {
            let Some(inner) = store.upgrade() else { return };
            let store = Store { inner };
            let result = if recovery { store.finish_recovery() } else { store.collect_with(full) };
            match result {
                Ok(report) => {
                    tracing::debug!(?report, "garbage collection");
                    true
                }
                Err(e) => {
                    tracing::warn!(error = %e, "garbage collection failed");
                    false
                }
            }
        };
        // Cleared only once this thread let go of the store: whoever waits for recovery to end
        // and then drops its handle closes the store itself, with nothing left writing to it.
        if recovery && passed {
            recovery_due.store(false, Ordering::Release);
        }
    });
    if let Err(e) = spawned {
        tracing::error!(error = %e, "could not start the garbage collector");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(hash: &Hash) -> Result<(sled::IVec, sled::IVec)> {
        Ok((sled::IVec::from(chunk_key(hash)), sled::IVec::from(&b"at"[..])))
    }

    fn failed_page() -> Result<(sled::IVec, sled::IVec)> {
        Err(StorageError::Remote("etcd: a page of the scan failed".into()))
    }

    #[test]
    fn a_failed_scan_fails_the_sweep_group_instead_of_ending_it() {
        let (a, b) = ([1u8; 32], [2u8; 32]);
        let start = key(b'c', &[]);
        // The scan's first page fails: no group (an empty one would end the sweep as done).
        let first: super::super::meta::MetaIter<'_> = Box::new(vec![failed_page()].into_iter());
        assert!(matches!(sweep_group(first, &start), Err(StorageError::Remote(_))));
        // A later page fails: the whole group fails, so none of it is deleted.
        let later: super::super::meta::MetaIter<'_> = Box::new(vec![entry(&a), failed_page(), entry(&b)].into_iter());
        assert!(matches!(sweep_group(later, &start), Err(StorageError::Remote(_))));
        // Without errors: the previous group's last key is skipped, the others come in order.
        let fine: super::super::meta::MetaIter<'_> = Box::new(vec![entry(&a), entry(&b)].into_iter());
        assert_eq!(sweep_group(fine, &chunk_key(&a)).unwrap(), vec![b]);
        let empty: super::super::meta::MetaIter<'_> = Box::new(std::iter::empty());
        assert!(sweep_group(empty, &start).unwrap().is_empty());
    }
}
