//! Garbage collection and crash recovery.
//!
//! Releasing a revision drops its chunk references segment by segment, each drop atomic with the
//! removal of the segment record, so a crash mid-release never counts a reference twice; its file
//! and tar-index keys go in bounded batches, and its record last, so a release cut short is
//! finished by the next pass. The chunk
//! sweep then deletes unreferenced, unpinned chunks ([`super::chunks`]). On open, revisions left
//! `Staging` by a crash are released and the sweep collects chunks that were written but never
//! referenced.

use std::collections::HashMap;

use super::chunks::{decode_block, BlockBuilder, ChunkRef, Location};
use super::objects::key_revision;
use super::{be, decode_json, encode_json, key, Result, RevisionId, RevisionRecord, RevisionState, Store};

/// What a collection pass did.
#[derive(Debug, Default, Clone, Copy)]
pub struct GcReport {
    pub revisions_released: u64,
    pub chunks_removed: u64,
    pub packs_compacted: u64,
}

/// Keys removed per sled batch when a revision is released: a batch is held in memory whole.
pub(super) const RELEASE_BATCH: usize = 1024;
/// A pack is compacted once less than this fraction of it is still referenced.
const COMPACT_BELOW_LIVE: f64 = 0.5;
/// The active pack is sealed for compaction once this many of its bytes are dead (and it is
/// mostly dead): small enough to matter on a nearly full disk, big enough not to litter small packs.
const ROLL_ACTIVE_DEAD_BYTES: u64 = 4 << 20;

impl Store {
    pub(super) fn recover(&self) -> Result<()> {
        // On a disk at the floor even recovery's small writes could make sled fail for good; the
        // staging revisions are unreachable anyway and are released at a later open.
        if let Err(e) = self.ensure_space(super::WriteKind::Metadata) {
            tracing::warn!(error = %e, "recovery postponed to the next start");
            return Ok(());
        }
        let mut batch = sled::Batch::default();
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
        let mut report = self.collect()?;
        // The previous run's active pack is sealed now: it may be worth compacting.
        report.packs_compacted += self.compact_packs()?;
        if report.revisions_released > 0 || report.chunks_removed > 0 {
            tracing::info!(?report, "recovered the store");
        }
        Ok(())
    }

    /// Frees every `Deleting` revision, then sweeps unreferenced chunks.
    pub fn collect(&self) -> Result<GcReport> {
        let _guard = self.inner.gc_lock.lock().unwrap_or_else(|e| e.into_inner());
        self.ensure_space(super::WriteKind::Metadata)?;
        let mut report = GcReport::default();
        let deleting: Vec<RevisionId> = self
            .tree()
            .scan_prefix(b"v")
            .values()
            .filter_map(|v| v.ok())
            .filter_map(|v| decode_json::<RevisionRecord>(&v).ok())
            .filter(|r| r.state == RevisionState::Deleting)
            .map(|r| r.id)
            .collect();
        for id in deleting {
            self.free_revision(id)?;
            report.revisions_released += 1;
        }
        report.chunks_removed = self.sweep_chunks()?;
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

    fn free_revision(&self, id: RevisionId) -> Result<()> {
        for item in self.tree().scan_prefix(key(b'k', &[&be(id)])) {
            let (k, v) = item?;
            let refs = ChunkRef::decode_all(&v)?;
            let mut batch = sled::Batch::default();
            batch.remove(k);
            self.record_refs(batch, &refs, -1, &[])?;
        }
        // In bounded batches: one batch of every key of a 1,000,000-file revision held gigabytes
        // in sled until restart. A crash in between leaves the revision `Deleting` with fewer
        // keys, and the next pass (at the latest, the one at open) removes the rest.
        for prefix in [b'f', b't'] {
            let mut batch = sled::Batch::default();
            let mut batched = 0;
            for k in self.tree().scan_prefix(key(prefix, &[&be(id)])).keys() {
                batch.remove(k?);
                batched += 1;
                if batched == RELEASE_BATCH {
                    self.tree().apply_batch(std::mem::take(&mut batch))?;
                    batched = 0;
                }
            }
            self.tree().apply_batch(batch)?;
        }
        // The record goes last: while it is there, the revision is still to be released.
        self.tree().remove(key_revision(id))?;
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
            if size.saturating_sub(live_bytes) >= ROLL_ACTIVE_DEAD_BYTES && mostly_dead(live_bytes, size) {
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

    /// Stored bytes of indexed chunks, per pack.
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
        let mut builder = BlockBuilder::default();
        let mut moved: Vec<Location> = Vec::new();
        self.inner.packs.scan(id, |mut scanned| {
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
                }
            }
            Ok(())
        })?;
        self.seal_relocated(&mut builder, &mut moved)
    }

    /// Asks the background collector for a pass (coalesced; never blocks).
    pub fn request_gc(&self) {
        let _ = self.inner.gc_requests.try_send(());
    }
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

fn mostly_dead(live_bytes: u64, size: u64) -> bool {
    (live_bytes as f64) < size as f64 * COMPACT_BELOW_LIVE
}

/// Runs collection passes on request until the store is dropped.
pub(super) fn spawn_collector(store: std::sync::Weak<super::Inner>, requests: std::sync::mpsc::Receiver<()>) {
    let spawned = std::thread::Builder::new().name("stowage-gc".into()).spawn(move || {
        while requests.recv().is_ok() {
            while requests.try_recv().is_ok() {}
            let Some(inner) = store.upgrade() else { return };
            let store = Store { inner };
            match store.collect() {
                Ok(report) => tracing::debug!(?report, "garbage collection"),
                Err(e) => tracing::warn!(error = %e, "garbage collection failed"),
            }
        }
    });
    if let Err(e) = spawned {
        tracing::error!(error = %e, "could not start the garbage collector");
    }
}
