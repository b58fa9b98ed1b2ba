//! A revision's new content blocks, built by finalize in tar order.
//!
//! Finalize walks the served tar and appends to the block being built every byte it holds in
//! order: headers, padding and the trailer as filler, each new chunk as a member. So a block is a
//! stretch of the tar, and its stored zstd frame can be sent as it is by a zstd download
//! ([`super::frames`], which gets the stretch's offset from the plan built here).
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
use super::seal::SealPipeline;
use super::{Result, Store};

/// A chunk stored before interrupts the block being built; it is sealed if it holds this much.
const SEAL_AT_GAP: usize = BLOCK_TARGET / 4;

#[derive(Default)]
pub(super) struct TarBlocks {
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
    pub fn filler(&mut self, seals: &mut SealPipeline, pos: u64, bytes: &[u8]) -> Result<()> {
        if self.gapped || bytes.is_empty() {
            return Ok(());
        }
        self.start.get_or_insert(pos);
        self.builder.filler(bytes);
        self.seal_if_full(seals)
    }

    /// A spooled chunk at `pos` in the tar. One met before in this revision (in this block, in a
    /// block being sealed, or — embedded — already indexed) is a gap, as a chunk stored before.
    pub fn chunk(&mut self, store: &Store, seals: &mut SealPipeline, pos: u64, hash: Hash, data: &[u8]) -> Result<()> {
        let seen = self.builder.contains(&hash)
            || seals.holds(&hash)
            || (store.remote().is_none() && store.chunk_location(&hash)?.is_some());
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
    pub fn gap(&mut self, seals: &mut SealPipeline) -> Result<()> {
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
    pub fn cut(&mut self, seals: &mut SealPipeline) -> Result<()> {
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
    pub fn plan(&self, mut sealed: Vec<(u64, SealedBlock)>) -> Vec<PlanEntry> {
        sealed.sort_unstable_by_key(|(seq, _)| *seq);
        let mut plan = Vec::with_capacity(self.submitted.len());
        let mut sealed = sealed.into_iter().peekable();
        for &(seq, tar_start) in &self.submitted {
            while sealed.next_if(|(s, _)| *s < seq).is_some() {}
            if let Some((_, block)) = sealed.next_if(|(s, _)| *s == seq) {
                plan.push(PlanEntry { tar_start, block });
            }
        }
        plan
    }
}
