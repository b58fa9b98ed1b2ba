//! A revision's served tar laid out: its SHA-256 (the revision's digest) and its new content
//! blocks in tar order.
//!
//! Every byte of the tar goes through [`TarLayout`] in order: headers, padding and the trailer as
//! filler, each new chunk as a member, each chunk stored before as a gap. So a block is a stretch
//! of the tar, and its stored zstd frame can be sent as it is by a zstd download
//! ([`super::frames`], which gets the stretch's offset from the plan built here).
//!
//! Two writers feed it ([`super::revision`]): finalize, walking the staged entries in path order
//! and reading their chunks from the spool; or, while every entry arrives in that order, the
//! writer itself as the bytes arrive (then nothing is spooled and finalize only writes the
//! manifest and the plan). When an entry out of order stops the second, the blocks sealed so far
//! keep their place in the plan wherever their stretch is still one stretch of the tar finalize
//! lays out ([`KeptBlocks`]): no later entry sorts inside it, so only its offset moved.
//!
//! A chunk stored already — before this revision, or earlier in it — interrupts the stretch (it is
//! stored once: keeping a repeat as filler would make zstd downloads cheaper but cost its bytes
//! again, tripling the corpus's store). The block is sealed there if it holds a quarter of a block
//! already; else it goes on collecting the new chunks without filler and without a place in the
//! plan (so a revision that mostly repeats stays compact; downloads compress the rest afresh, once,
//! [`super::frames::FrameCache`]). A file of a block or more starts a block, so that a download of
//! that file alone sends stored frames too.

use super::chunks::{BlockBuilder, Hash, SealedBlock, BLOCK_TARGET};
use super::frames::PlanEntry;
use super::hashing::FileDigests;
use super::seal::SealPipeline;
use super::tarfmt::{self, padded};
use super::{EntryKind, FileEntry, Result, Store};

/// A chunk stored before interrupts the block being built; it is sealed if it holds this much.
const SEAL_AT_GAP: usize = BLOCK_TARGET / 4;

/// The served tar, laid out from its first byte on: where it stands, its SHA-256 (on a thread of
/// its own: the tar is its one "file"), its new blocks, and the stored bytes of the chunks it
/// shares with earlier revisions.
#[derive(Default)]
pub(super) struct TarLayout {
    pos: u64,
    digest: FileDigests,
    blocks: TarBlocks,
    stored: u64,
}

/// A tar laid out to its end.
pub(super) struct LaidOut {
    pub digest: [u8; 32],
    pub size: u64,
    /// The stretches of tar the revision's new blocks hold.
    pub plan: Vec<PlanEntry>,
    /// Stored bytes of the revision's content: its new blocks and its shares of earlier ones.
    pub stored: u64,
}

impl TarLayout {
    /// Bytes of the tar in no chunk: an entry's header, padding.
    pub fn filler(&mut self, seals: &mut SealPipeline, bytes: &[u8]) -> Result<()> {
        self.digest.update(bytes)?;
        self.blocks.filler(seals, self.pos, bytes)?;
        self.pos += bytes.len() as u64;
        Ok(())
    }

    /// Where the tar stands: the offset of its next byte.
    pub fn position(&self) -> u64 {
        self.pos
    }

    /// Seals the block being built here, so that the next bytes start a block (where a kept block
    /// starts, lest a new one take its first bytes).
    pub fn cut(&mut self, seals: &mut SealPipeline) -> Result<()> {
        self.blocks.cut(seals)
    }

    /// The next entry: sets its tar offset and lays out its header. A file of a block or more
    /// starts a block.
    pub fn start_entry(&mut self, seals: &mut SealPipeline, entry: &mut FileEntry) -> Result<()> {
        entry.tar_offset = self.pos;
        self.filler(seals, &tarfmt::header_bytes(&entry.header_spec()))?;
        if entry.kind == EntryKind::File && entry.size >= BLOCK_TARGET as u64 {
            self.blocks.cut(seals)?;
        }
        Ok(())
    }

    /// A chunk the store did not hold when it arrived.
    pub fn new_chunk(&mut self, store: &Store, seals: &mut SealPipeline, hash: Hash, data: &[u8]) -> Result<()> {
        self.digest.update(data)?;
        self.blocks.chunk(store, seals, self.pos, hash, data)?;
        self.pos += data.len() as u64;
        Ok(())
    }

    /// A chunk stored before, of which this revision's stored size counts `share` bytes (none when
    /// this revision stored it: its block counts).
    pub fn stored_chunk(&mut self, seals: &mut SealPipeline, data: &[u8], share: u64) -> Result<()> {
        self.digest.update(data)?;
        self.blocks.gap(seals)?;
        self.stored += share;
        self.pos += data.len() as u64;
        Ok(())
    }

    /// A file's data of `size` bytes ended: the padding to the next tar block.
    pub fn end_data(&mut self, seals: &mut SealPipeline, size: u64) -> Result<()> {
        let padding = [0u8; tarfmt::BLOCK as usize];
        self.filler(seals, padding.get(..(padded(size) - size) as usize).unwrap_or_default())
    }

    /// Lays out the trailer and waits for every block to be sealed (so indexed: the plan names
    /// them). `kept`: blocks of an earlier layout of this tar placed in this one.
    pub fn finish(mut self, seals: &mut SealPipeline, kept: KeptBlocks) -> Result<LaidOut> {
        self.filler(seals, &[0u8; tarfmt::TRAILER_LEN as usize])?;
        self.blocks.cut(seals)?;
        seals.finish()?;
        let sealed = seals.take_sealed();
        let stored = self.stored + sealed.iter().map(|(_, b)| b.at.stored_len as u64).sum::<u64>();
        let plan = merge_plans(self.blocks.plan(sealed), kept.placed());
        self.digest.end_file()?;
        let digest = self.digest.wait()?;
        Ok(LaidOut { digest, size: self.pos, plan, stored })
    }

    /// Stops laying out. The blocks handed over are waited for, so their chunks are in the store
    /// (read back from there as any stored chunk when the tar is laid out again); they come back
    /// as [`KeptBlocks`], with the stretch of tar each held. The block being built is handed back
    /// unsealed: its chunks are laid out again as new, from there (also when waiting failed).
    pub fn abandon(self, seals: &mut SealPipeline) -> (BlockBuilder, KeptBlocks, Result<()>) {
        let finished = seals.finish();
        let kept = match finished {
            Ok(()) => KeptBlocks::new(self.blocks.plan(seals.take_sealed())),
            Err(_) => KeptBlocks::default(),
        };
        (self.blocks.builder, kept, finished)
    }
}

/// The blocks a layout stopped by an entry out of order had sealed, each with the stretch of the
/// tar as it was then. Finalize lays the tar out again and tells where each entry of the first
/// layout went ([`KeptBlocks::moved`]); a block keeps its place if every entry it holds bytes of
/// moved by the same amount (then no entry came between them) and all of its bytes were found
/// again (a file that failed part way is no entry any more).
#[derive(Default)]
pub(super) struct KeptBlocks {
    /// In tar order of the first layout, without overlaps (as any plan).
    blocks: Vec<Kept>,
}

struct Kept {
    entry: PlanEntry,
    /// Where the entries it holds bytes of went, less where they were: the same for all, or
    /// `Err` once two differ.
    shift: Option<std::result::Result<i128, ()>>,
    /// Its bytes found in entries laid out again.
    found: u64,
}

impl Kept {
    fn end(&self) -> u64 {
        self.entry.tar_start + self.entry.block.at.raw_len as u64
    }
}

impl KeptBlocks {
    fn new(plan: Vec<PlanEntry>) -> KeptBlocks {
        KeptBlocks { blocks: plan.into_iter().map(|entry| Kept { entry, shift: None, found: 0 }).collect() }
    }

    /// Whether a kept block starts at `old`, a tar offset of the first layout.
    pub fn starts_at(&self, old: u64) -> bool {
        self.blocks.binary_search_by_key(&old, |k| k.entry.tar_start).is_ok()
    }

    /// The entry of `len` bytes (header, data, padding) at `old` in the first layout is at `new`.
    pub fn moved(&mut self, old: u64, len: u64, new: u64) {
        let end = old.saturating_add(len);
        let shift = i128::from(new) - i128::from(old);
        let first = self.blocks.partition_point(|k| k.end() <= old);
        for kept in self.blocks.iter_mut().skip(first).take_while(|k| k.entry.tar_start < end) {
            kept.found += end.min(kept.end()) - old.max(kept.entry.tar_start);
            kept.shift = match kept.shift {
                None => Some(Ok(shift)),
                Some(Ok(s)) if s == shift => Some(Ok(s)),
                _ => Some(Err(())),
            };
        }
    }

    /// The blocks whose stretch is whole in the new layout, at their new offsets.
    fn placed(self) -> Vec<PlanEntry> {
        self.blocks
            .into_iter()
            .filter(|k| k.found == k.entry.block.at.raw_len as u64)
            .filter_map(|k| {
                let Some(Ok(shift)) = k.shift else { return None };
                let tar_start = u64::try_from(i128::from(k.entry.tar_start) + shift).ok()?;
                Some(PlanEntry { tar_start, ..k.entry })
            })
            .collect()
    }
}

/// Two plans as one, in tar order; where two blocks' stretches overlap, the later is left out (a
/// plan's stretches never overlap).
fn merge_plans(new: Vec<PlanEntry>, kept: Vec<PlanEntry>) -> Vec<PlanEntry> {
    if kept.is_empty() {
        return new;
    }
    let mut all: Vec<PlanEntry> = new.into_iter().chain(kept).collect();
    all.sort_by_key(|e| e.tar_start);
    let mut plan: Vec<PlanEntry> = Vec::with_capacity(all.len());
    for entry in all {
        let free_from = plan.last().map_or(0, |e| e.tar_start + e.block.at.raw_len as u64);
        if entry.tar_start >= free_from {
            plan.push(entry);
        }
    }
    plan
}

#[derive(Default)]
struct TarBlocks {
    builder: BlockBuilder,
    /// Where the block being built starts in the tar; `None` while it is empty or broken by a gap.
    start: Option<u64>,
    /// The block being built is no stretch of tar any more.
    gapped: bool,
    /// Blocks handed to the seal workers as stretches of tar: (sequence number, tar offset).
    submitted: Vec<(u64, u64)>,
}

impl TarBlocks {
    /// Bytes of the tar at `pos` that belong to no new chunk.
    fn filler(&mut self, seals: &mut SealPipeline, pos: u64, bytes: &[u8]) -> Result<()> {
        if self.gapped || bytes.is_empty() {
            return Ok(());
        }
        self.start.get_or_insert(pos);
        self.builder.filler(bytes);
        self.seal_if_full(seals)
    }

    /// A spooled chunk at `pos` in the tar. One met before in this revision (in this block, in a
    /// block being sealed, or — embedded — already indexed) is a gap, as a chunk stored before.
    fn chunk(&mut self, store: &Store, seals: &mut SealPipeline, pos: u64, hash: Hash, data: &[u8]) -> Result<()> {
        let seen = self.builder.contains(&hash)
            || seals.holds(&hash)
            || (store.backend().finds_stored_chunks_at_put() && store.chunk_location(&hash)?.is_some());
        if seen {
            return self.gap(seals);
        }
        if !self.gapped {
            self.start.get_or_insert(pos);
        }
        self.builder.push(hash, data);
        self.seal_if_full(seals)
    }

    /// The tar goes on with a chunk stored before this revision.
    fn gap(&mut self, seals: &mut SealPipeline) -> Result<()> {
        if self.gapped {
            return Ok(());
        }
        if self.builder.is_empty() {
            // Filler alone is worth nothing: start over after the gap.
            self.builder = BlockBuilder::default();
            self.start = None;
        } else if self.builder.raw_len() >= SEAL_AT_GAP {
            self.cut(seals)?;
        } else {
            self.gapped = true;
            self.start = None;
        }
        Ok(())
    }

    /// Seals the block being built (a large file's data starts a block; the end of the tar).
    fn cut(&mut self, seals: &mut SealPipeline) -> Result<()> {
        let builder = std::mem::take(&mut self.builder);
        let start = self.start.take();
        self.gapped = false;
        // Filler alone (headers of empty files) is not worth a block.
        if builder.is_empty() {
            return Ok(());
        }
        let seq = seals.submit(builder)?;
        if let Some(start) = start {
            self.submitted.push((seq, start));
        }
        Ok(())
    }

    fn seal_if_full(&mut self, seals: &mut SealPipeline) -> Result<()> {
        if self.builder.is_full() {
            self.cut(seals)?;
        }
        Ok(())
    }

    /// The plan: the stretches of tar whose blocks were written, in tar order. `sealed` is every
    /// block the workers wrote.
    fn plan(&self, mut sealed: Vec<(u64, SealedBlock)>) -> Vec<PlanEntry> {
        sealed.sort_unstable_by_key(|(seq, _)| *seq);
        let mut plan = Vec::with_capacity(self.submitted.len());
        let mut sealed = sealed.into_iter().peekable();
        for &(seq, tar_start) in &self.submitted {
            while sealed.next_if(|(s, _)| *s < seq).is_some() {}
            if let Some((_, block)) = sealed.next_if(|(s, _)| *s == seq) {
                plan.push(PlanEntry { tar_start, block, anchor: None });
            }
        }
        plan
    }
}
