//! The repacker: a committed revision's blocks rewritten smaller, in the background.
//!
//! Uploads seal their new content at the upload's level (zstd-3) in blocks of about
//! [`super::chunks::BLOCK_TARGET`]: fast enough for the upload path, but each block is compressed
//! alone, so the matches between files a megabyte apart (the CRDs of a chart) are lost, and a
//! chunk repeated in the revision breaks the stretch of tar a block holds. Once a revision is
//! committed, the repacker reads its tar in stretches of [`REPACK_BLOCK`] and compresses each again
//! as one block at `StoreOptions::repack_level`, with a window as long as the block (the
//! kube-prometheus-stack chart: 669 kB of stored frames become one block of 429 kB). It keeps the
//! block only if it takes less than what the stretch's chunks take where they are (those in
//! another repacked block stay there and count for nothing): a chunk is stored once, so the index
//! moves them to it (compare-and-swap, as compaction moves them), and a later version that mostly
//! repeats an earlier one leaves the earlier one's blocks alone. The block is a stretch of the tar,
//! so zstd downloads send it as it is stored: the revision gets a new frame plan naming it, recorded by
//! compare-and-swap on its record, its entries *anchored* (each names a chunk of its block), so
//! when compaction later copies a block whole, downloads still find it. The old blocks are then
//! dead bytes that compaction reclaims.
//!
//! A crash at any point leaves either the old plan (whose blocks stay in their pack until a flush
//! made every move durable) or the new one; a revision not repacked yet is found again at the next
//! open (its record has no `repacked`). Bytes are read through the verified read path, so what is
//! recompressed is what a download would serve. Embedded store only: in object storage, rewriting
//! a block costs more than the space it saves.

use std::collections::HashSet;
use std::sync::Weak;

use super::chunks::{BlockBuilder, ChunkRef, Location, SealedBlock, CODEC_ZSTD_LONG};
use super::frame_cache::LONG_FRAME;
use super::frames::{read_identity, store_plan, PlanEntry};
use super::manifest::ChunkList;
use super::objects::key_revision;
use super::packs::{BlockAt, Member};
use super::read::RangeSpec;
use super::revision::WriterChunks;
use super::{decode_json, encode_json, EntryKind, Result, RevisionId, RevisionRecord, Store};

/// The longest block the repacker writes (and its compression window): the largest window every
/// zstd decoder accepts for HTTP (RFC 8878 §3.1.1.1.2 recommends 8 MiB at most).
pub(super) const REPACK_BLOCK: u64 = LONG_FRAME;
/// The repacker's level by default. Its context is capped (window 8 MiB, chain 4 Mi, hash 2 Mi
/// entries: about 35 MiB) against level 19's own 90 MiB, for 0.3 % more bytes.
pub const REPACK_LEVEL: i32 = 19;
/// What the store asks the repacker for at open: every revision left unrepacked, a moment later
/// (so a store opened and closed at once, by a tool or a test, is not held open by the scan).
pub(super) const AFTER_OPEN: RevisionId = RevisionId::MAX;
pub(super) const OPEN_DELAY: std::time::Duration = std::time::Duration::from_secs(1);
/// A stretch is rewritten only if that saves at least this share of its stored bytes.
const MIN_SAVING: f64 = 0.05;

impl Store {
    /// Whether this store repacks committed revisions.
    pub(super) fn repacks(&self) -> bool {
        self.inner.options.repack_level > 0 && self.backend().reads_are_local()
    }

    /// Committed revisions the repacker has not been over.
    pub(super) fn repack_pending(&self) -> Result<Vec<RevisionId>> {
        let mut pending = Vec::new();
        for item in self.tree().scan_prefix(b"v") {
            let (_, v) = item?;
            let record: RevisionRecord = decode_json(&v)?;
            if record.repack_due() {
                pending.push(record.id);
            }
        }
        Ok(pending)
    }

    /// The chunks that lie wholly in `[start, end)` of a revision's tar, with their tar offsets.
    fn chunks_in(&self, record: &RevisionRecord, start: u64, end: u64) -> Result<Vec<(u64, ChunkRef)>> {
        let manifest = self.manifest_of(record)?;
        let mut found = Vec::new();
        for page in manifest.pages.get(manifest.page_for_tar_offset(start)..).unwrap_or_default() {
            if page.first_tar_offset >= end {
                break;
            }
            for entry in self.page(&page.chunk)? {
                if entry.tar_offset >= end {
                    break;
                }
                if entry.kind != EntryKind::File {
                    continue;
                }
                let data_start = entry.tar_offset + super::tarfmt::header_len(&entry.header_spec());
                let mut push = |file_pos: u64, chunk: ChunkRef| {
                    let at = data_start + file_pos;
                    if at >= start && at + chunk.len as u64 <= end {
                        found.push((at, chunk));
                    }
                };
                match &entry.chunks {
                    ChunkList::Inline(refs) => {
                        let mut pos = 0;
                        for r in refs {
                            push(pos, *r);
                            pos += r.len as u64;
                        }
                    }
                    ChunkList::Segments(segments) => {
                        for (segment_start, segment) in segments {
                            let mut pos = *segment_start;
                            for r in ChunkRef::decode_all(&self.get_chunk(segment)?.0)? {
                                push(pos, r);
                                pos += r.len as u64;
                            }
                        }
                    }
                    ChunkList::None | ChunkList::Staged { .. } => {}
                }
            }
        }
        Ok(found)
    }

    /// The distinct chunks of `[start, end)`, as members of a block holding that stretch, with
    /// where each is now; only those the index places in `only` if given.
    fn members_in(
        &self,
        record: &RevisionRecord,
        start: u64,
        end: u64,
        only: Option<&BlockAt>,
    ) -> Result<Vec<(Member, Location)>> {
        let mut seen = HashSet::new();
        let mut members = Vec::new();
        for (at, chunk) in self.chunks_in(record, start, end)? {
            let Some(now) = self.chunk_location(&chunk.hash)? else { continue };
            if only.is_none_or(|b| *b == now.block) && seen.insert(chunk.hash) {
                members.push((Member { hash: chunk.hash, offset: (at - start) as u32, len: chunk.len }, now));
            }
        }
        Ok(members)
    }

    /// A plan entry with its anchor: the first chunk the index places in its block.
    fn anchored(&self, record: &RevisionRecord, entry: PlanEntry) -> Result<PlanEntry> {
        if entry.anchor.is_some() {
            return Ok(entry);
        }
        let end = entry.tar_start + entry.block.at.raw_len as u64;
        let members = self.members_in(record, entry.tar_start, end, Some(&entry.block.at))?;
        Ok(PlanEntry { anchor: members.first().map(|(m, _)| m.hash), ..entry })
    }

    /// Appends `payload` as the block holding `members` (its raw bytes `raw_len`), makes it
    /// durable, then moves each member's index entry to it.
    fn relocate_into(&self, raw_len: u32, members: &[(Member, Location)], payload: &[u8]) -> Result<SealedBlock> {
        let (list, olds): (Vec<Member>, Vec<Location>) = members.iter().copied().unzip();
        let members_len = list.iter().map(|m| m.len).sum::<u32>();
        // Space for history is content: refused in the reserve.
        self.ensure_space(super::WriteKind::Content)?;
        // Until its chunks point at it, the block's pack must not be rolled and compacted as if
        // the block were dead (the same lock a writer holds from append to index).
        let _sealing = self.inner.sealing.read().unwrap_or_else(|e| e.into_inner());
        let block = self.append_moved(CODEC_ZSTD_LONG, raw_len, &list, &olds, members_len, payload)?;
        Ok(SealedBlock { at: block, payload_hash: *blake3::hash(payload).as_bytes() })
    }

    /// Records `plan` (anchored) as the revision's and marks it repacked, if its record is still
    /// `old` (bytes as read): a revision released meanwhile keeps what it had.
    fn record_repacked(&self, old: &[u8], mut record: RevisionRecord, plan: &[PlanEntry]) -> Result<bool> {
        let (mut blocks, mut pinned) = (BlockBuilder::default(), Vec::new());
        if !plan.is_empty() {
            let mut chunks = WriterChunks { store: self, blocks: &mut blocks, pinned: &mut pinned };
            let root = store_plan(plan, true, &mut |bytes| chunks.put(bytes))?;
            self.seal_block(&mut blocks)?;
            self.inner.packs.sync()?;
            record.frames = root.map(|r| hex::encode(r.hash)).unwrap_or_default();
            record.frames_len = root.map_or(0, |r| r.len);
            record.frames_anchored = true;
        }
        record.repacked = true;
        let swapped = self.tree().compare_and_swap(&key_revision(record.id), Some(old), Some(&encode_json(&record)));
        // The collector marks the new plan from here on (a pass under way marks it again).
        self.manifest_recorded();
        self.unpin_all(&pinned);
        let swapped = swapped?;
        if swapped {
            self.flush()?;
        }
        Ok(swapped)
    }
}

/// Repacks one revision. The store is held only while it is read or written, never while a
/// stretch is compressed (seconds at level 19): a store dropped meanwhile closes, and the work is
/// found again at its next open.
pub(super) fn repack_revision(store: &Weak<super::Inner>, rev: RevisionId) -> Result<()> {
    let held = || store.upgrade().map(|inner| Store { inner });
    let Some(first) = held() else { return Ok(()) };
    let Some(old) = first.tree().get(key_revision(rev))? else { return Ok(()) };
    let record: RevisionRecord = decode_json(&old)?;
    if !record.repack_due() {
        return Ok(());
    }
    let mut plan = first.plan_entries(&record)?;
    let level = first.inner.options.repack_level;
    drop(first);
    let worth_it = record.recompresses();
    let mut compressor = compressor(level)?;
    let mut cursor = super::TarCursor::new(rev, record.tar_size);
    let mut identity = Vec::new();
    let mut repacked = Vec::new();
    let mut start = 0;
    while worth_it && start < record.tar_size {
        let end = (start + REPACK_BLOCK).min(record.tar_size);
        if let Some(entry) = repack_stretch(store, &record, &mut cursor, start, end, &mut compressor, &mut identity)? {
            repacked.push(entry);
        }
        start = end;
    }
    let Some(store) = held() else { return Ok(()) };
    let replaced_blocks = !repacked.is_empty();
    // The new plan: the repacked stretches, and the old entries outside them (an old block that
    // lay partly in one lost its chunks there), every entry anchored.
    plan.retain(|e| {
        let end = e.tar_start + e.block.at.raw_len as u64;
        !repacked.iter().any(|r: &PlanEntry| e.tar_start < r.tar_start + r.block.at.raw_len as u64 && r.tar_start < end)
    });
    plan.extend(repacked);
    plan.sort_by_key(|e| e.tar_start);
    let plan = plan.into_iter().map(|e| store.anchored(&record, e)).collect::<Result<Vec<_>>>()?;
    store.record_repacked(&old, record, &plan)?;
    // The old blocks are dead now: a pass (which marks every revision) sweeps the old plan and may
    // compact their pack. An old plan only replaced by an anchored one waits for the next pass.
    if replaced_blocks {
        store.request_sweep();
    }
    Ok(())
}

/// Rewrites `[start, end)` of the revision's tar as one block if that takes less than what its
/// chunks not in a repacked block take where they are now (their shares of their blocks, filler
/// included): the block then holds those chunks, and the bytes of the others (in an earlier
/// revision's repacked block, so a later version that mostly repeats it is left as it is), and
/// repeats inside the stretch cost next to nothing. Returns the stretch's new plan entry.
pub(super) fn repack_stretch(
    store: &Weak<super::Inner>,
    record: &RevisionRecord,
    cursor: &mut super::TarCursor,
    start: u64,
    end: u64,
    compressor: &mut zstd::bulk::Compressor<'static>,
    identity: &mut Vec<u8>,
) -> Result<Option<PlanEntry>> {
    let held = || store.upgrade().map(|inner| Store { inner });
    let Some(store) = held() else { return Ok(None) };
    // In the reserve the block would be refused after its compression: do neither.
    store.ensure_space(super::WriteKind::Content)?;
    read_identity(identity, end - start, |sink| store.read_tar_at(cursor, RangeSpec { start, end }, sink))?;
    // Chunks in another repacked block stay there: taking them over would leave that block partly
    // dead, and compaction would then copy what is left of it at the upload level.
    let (mut members, mut in_long) = (store.members_in(record, start, end, None)?, 0);
    members.retain(|(_, at)| {
        let long = at.block.codec == CODEC_ZSTD_LONG;
        in_long += if long { at.stored_share() } else { 0 };
        !long
    });
    drop(store);
    let now: u64 = members.iter().map(|(_, at)| at.stored_share()).sum();
    // The block would also hold the bytes the repacked blocks hold: where that is most of the
    // stretch, it would take more than it frees (a version repeating the one repacked before it).
    if now <= in_long || members.len() > u16::MAX as usize {
        return Ok(None);
    }
    let payload = compressor.compress(identity)?;
    if payload.len() as f64 > now as f64 * (1.0 - MIN_SAVING) {
        return Ok(None);
    }
    let Some(store) = held() else { return Ok(None) };
    let block = store.relocate_into(identity.len() as u32, &members, &payload)?;
    let anchor = members.first().map(|(m, _)| m.hash);
    Ok(Some(PlanEntry { tar_start: start, block, anchor }))
}

/// A compressor at `level` whose window covers a whole repacked block, its tables capped.
pub(super) fn compressor(level: i32) -> Result<zstd::bulk::Compressor<'static>> {
    use zstd::stream::raw::CParameter;
    let mut c = zstd::bulk::Compressor::new(level)?;
    let window_log = REPACK_BLOCK.trailing_zeros();
    c.set_parameter(CParameter::WindowLog(window_log))?;
    c.set_parameter(CParameter::ChainLog(window_log - 1))?;
    c.set_parameter(CParameter::HashLog(window_log - 2))?;
    Ok(c)
}

/// Every committed revision not repacked yet, oldest first (the thread that warms frames in the
/// replicated store does this in the embedded one, [`super::frames::spawn_warmer`]).
pub(super) fn repack_pending(store: &Weak<super::Inner>) {
    let pending = match store.upgrade().map(|inner| Store { inner }.repack_pending()) {
        Some(Ok(pending)) => pending,
        Some(Err(e)) => return tracing::warn!(error = %e, "listing the revisions to repack failed"),
        None => return,
    };
    for rev in pending {
        if let Err(e) = repack_revision(store, rev) {
            tracing::warn!(revision = rev, error = %e, "repacking a revision failed; it keeps its blocks");
        }
    }
}
