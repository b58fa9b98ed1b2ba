//! Writing a revision: stream files in, cut them into chunks, then finalize into the served form.
//!
//! A revision is `Staging` while written. Entries (files, symlinks, directories) arrive in any
//! order; a file is chunked with FastCDC (content-defined, so an edit moves few cut points); all
//! are staged outside sled ([`super::staging`]), and so are the bytes of the chunks the store does
//! not hold yet (the spool).
//! `finalize` walks the entries in path order, assigns each its offset in the deterministic tar,
//! hashes that tar — the digest — from the spooled bytes (each checked against its hash) and the
//! stored ones (verified as every read is), and packs the new chunks into blocks *in tar order*,
//! headers and padding included ([`super::tar_blocks`]), recording which block holds which
//! stretch of the tar (the frame plan, [`super::frames`]); then it writes the manifest
//! ([`super::manifest`]) as chunks, and the revision record names the manifest's and the plan's
//! roots. The revision becomes visible only when an API object attaches it
//! ([`PendingRevision::commit`]), after everything was flushed.
//!
//! Every chunk the writer references stays pinned ([`super::chunks::Pins`]) until the manifest is
//! recorded: until then no collection may take it, whether the writer stored it or found it stored.
//!
//! Blocks are sealed in parallel: finalize hands each full block to the writer's seal workers
//! ([`super::seal`]) while it reads and hashes the next; it waits for them before it records the
//! plan, and dropping the writer stops them before it unpins.
//!
//! Entries that arrive in path order (`git archive`, `kubectl stowage push`, a git source) need
//! no spool: while every entry so far came in that order, the writer lays the tar out as the bytes
//! arrive — the same [`TarLayout`] finalize would feed — and finalize only writes the manifest and
//! the plan. The first entry out of order, a hard link or a file that fails part way ends that:
//! the blocks handed to the seal workers are waited for, the one being built is kept unsealed,
//! and finalize lays the tar out afresh from the spool, that block and the store. The blocks
//! sealed before keep their place in the plan wherever no later entry sorts inside their stretch
//! ([`super::tar_blocks::KeptBlocks`]).

use std::collections::{HashSet, VecDeque};
use std::io::Read;

use sha2::{Digest, Sha256};

use super::chunker::Chunker;
use super::chunks::{BlockBuilder, ChunkRef, Hash};
use super::frames::store_plan;
use super::hashing::FileDigests;
use super::manifest::{chunk_list, ChunkList, ManifestBuilder};
use super::objects::key_revision;
use super::seal::SealPipeline;
use super::staging::{StagedRef, Staging};
use super::tar_blocks::{KeptBlocks, TarLayout};
use super::{
    encode_json, EntryKind, FileEntry, ObjectWrite, Result, RevisionId, RevisionRecord, RevisionState, StorageError,
    Store, WriteOutcome, PERMISSION_BITS,
};

/// Chunk refs buffered per file before they go to the staging file.
const REF_BUFFER: usize = 256;
/// Files added whose SHA-256 is still being computed, at most; the writer then waits for one.
const MAX_AWAITING_DIGEST: usize = 1024;
/// A file's bytes held back from hashing until its end, at most: a file this small whose chunks
/// are those of a file hashed lately is not hashed again ([`super::hashing::KnownDigests`]).
const HELD_FILE_BYTES: usize = 1 << 20;
/// Free space is checked each time this much more new content was spooled or laid out.
const SPACE_CHECK: u64 = 1 << 20;

/// Streams files into a new `Staging` revision. Dropping it without [`RevisionWriter::finalize`]
/// releases everything written.
pub struct RevisionWriter {
    store: Store,
    id: RevisionId,
    open: bool,
    /// New manifest and plan chunks not yet sealed into a block.
    blocks: BlockBuilder,
    staging: Staging,
    /// Bytes of new chunks so far (spooled or laid out), and when free space was last checked.
    new_bytes: u64,
    space_checked: u64,
    /// Every chunk this writer pinned, once per pin.
    pinned: Vec<Hash>,
    /// Replicated: the count of lost leases when the writer began (its pins hold while it stays).
    lease_epoch: u64,
    /// Seals full blocks of file content on worker threads.
    seals: SealPipeline,
    /// The chunker's buffer, reused from file to file.
    chunk_buffer: Vec<u8>,
    /// Each file's SHA-256, computed beside the writer.
    digests: FileDigests,
    /// Files added whose digest has not come back, in the order added (staged once it has), with
    /// their content keys.
    awaiting_digest: VecDeque<(FileEntry, ContentKey)>,
    /// Their paths (a later entry with one of them is a duplicate).
    awaiting_paths: HashSet<String>,
    /// While every entry so far came in path order: the tar laid out as they arrived.
    in_order: Option<TarLayout>,
    /// The last path added (a directory's with its `/`).
    last_path: String,
    /// The block being built when laying out stopped: new chunks no spool or store holds.
    held: BlockBuilder,
    /// The blocks sealed before laying out stopped, placed again by finalize where they fit.
    kept: KeptBlocks,
}

/// BLAKE3 of a file's chunk ids in order: files with the same key hold the same bytes.
type ContentKey = [u8; 32];

/// The tar offset of an entry not laid out as it arrived (finalize sets it).
const NOT_LAID_OUT: u64 = u64::MAX;

/// The counter of revision ids in the replicated store's map.
const REVISION_ID: &[u8] = b"mrevid";

impl Store {
    /// A revision id never used before ([`super::backend::Backend::next_revision_id`]).
    fn next_revision_id(&self) -> Result<RevisionId> {
        self.backend().next_revision_id(self.tree(), REVISION_ID)
    }

    pub fn begin_revision(&self) -> Result<RevisionWriter> {
        self.ensure_space(super::WriteKind::Content)?;
        let id = self.next_revision_id()?;
        let record = RevisionRecord {
            id,
            state: RevisionState::Staging,
            digest: String::new(),
            tar_size: 0,
            files: 0,
            size: 0,
            stored_size: 0,
            writer: self.backend().writer_id(),
            manifest: String::new(),
            manifest_len: 0,
            frames: String::new(),
            frames_len: 0,
            frames_anchored: false,
            repacked: false,
        };
        self.tree().insert(key_revision(id), encode_json(&record))?;
        let staging = match Staging::create(self.staging_dir(id)) {
            Ok(staging) => staging,
            Err(e) => {
                self.release_revision(id)?;
                return Err(e);
            }
        };
        Ok(RevisionWriter {
            store: self.clone(),
            id,
            open: true,
            blocks: BlockBuilder::default(),
            staging,
            new_bytes: 0,
            space_checked: 0,
            pinned: Vec::new(),
            lease_epoch: self.backend().lease_epoch(),
            seals: SealPipeline::new(self.clone()),
            chunk_buffer: Vec::new(),
            digests: FileDigests::holding(HELD_FILE_BYTES),
            awaiting_digest: VecDeque::new(),
            awaiting_paths: HashSet::new(),
            in_order: Some(TarLayout::default()),
            last_path: String::new(),
            held: BlockBuilder::default(),
            kept: KeptBlocks::default(),
        })
    }

    /// Marks a revision for deletion; the collector frees its data.
    pub fn release_revision(&self, id: RevisionId) -> Result<()> {
        if let Ok(mut record) = self.revision_record(id) {
            record.state = RevisionState::Deleting;
            self.tree().insert(key_revision(id), encode_json(&record))?;
        }
        self.request_gc();
        Ok(())
    }
}

/// Stores a writer's chunks — file content, manifest pages, segment lists — pinning each and
/// adding to the block being built only what the store does not hold yet.
pub(super) struct WriterChunks<'a> {
    pub store: &'a Store,
    pub blocks: &'a mut BlockBuilder,
    pub pinned: &'a mut Vec<Hash>,
}

impl WriterChunks<'_> {
    /// Stores a chunk, sealing a full block here and now.
    pub fn put(&mut self, bytes: &[u8]) -> Result<ChunkRef> {
        let chunk = self.put_unsealed(bytes)?;
        if self.blocks.is_full() {
            self.store.seal_block(self.blocks)?;
        }
        Ok(chunk)
    }

    /// Pins the chunk and adds it to the block being built unless the store or that block holds
    /// it. The caller seals the block once it is full.
    fn put_unsealed(&mut self, bytes: &[u8]) -> Result<ChunkRef> {
        let hash = *blake3::hash(bytes).as_bytes();
        let chunk = ChunkRef { hash, len: bytes.len() as u32 };
        // Where the backend finds out only at the seal which chunks the store holds (replicated:
        // one transaction per block instead of one per chunk), every chunk is new here.
        let known = self.store.pin_chunk(hash)?.is_some();
        self.pinned.push(hash);
        if !known && !self.blocks.contains(&hash) {
            self.blocks.push(hash, bytes);
        }
        Ok(chunk)
    }
}

impl RevisionWriter {
    pub fn id(&self) -> RevisionId {
        self.id
    }

    /// Pins a content chunk; lays it out if the entries are in order, else spools its bytes
    /// unless the store holds it (replicated: which it holds is found out when its block is
    /// sealed, so every chunk is new here).
    fn stage_chunk(&mut self, bytes: &[u8]) -> Result<StagedRef> {
        let hash = *blake3::hash(bytes).as_bytes();
        let stored_at = self.store.pin_chunk(hash)?;
        let known = stored_at.is_some();
        self.pinned.push(hash);
        let chunk = ChunkRef { hash, len: bytes.len() as u32 };
        if !known {
            // Checked as new content grows: an upload that crosses the reserve stops within a MiB.
            self.new_bytes += bytes.len() as u64;
            if self.new_bytes >= self.space_checked + SPACE_CHECK {
                self.store.ensure_space(super::WriteKind::Content)?;
                self.space_checked = self.new_bytes;
            }
        }
        let Some(layout) = &mut self.in_order else {
            let spooled = if known { None } else { Some(self.staging.spool(bytes)?) };
            return Ok(StagedRef { chunk, spooled });
        };
        match stored_at {
            // Found stored: before this revision (its share counts), or in a block of this one.
            Some(at) => {
                let ours = self.seals.holds(&hash) || self.seals.wrote(&at.block);
                layout.stored_chunk(&mut self.seals, bytes, if ours { 0 } else { at.stored_share() })?;
            }
            None => layout.new_chunk(&self.store, &mut self.seals, hash, bytes)?,
        }
        Ok(StagedRef { chunk, spooled: None })
    }

    /// If `entry` (not yet staged) comes after every entry so far, it goes on the tar laid out
    /// as they arrive: its header is laid out and its tar offset set. The first that does not
    /// ends that.
    fn lay_out(&mut self, entry: &mut FileEntry) -> Result<()> {
        if self.in_order.is_none() {
            return Ok(());
        }
        if entry.path <= self.last_path {
            return self.stop_laying_out();
        }
        self.last_path.clone_from(&entry.path);
        match &mut self.in_order {
            Some(layout) => layout.start_entry(&mut self.seals, entry),
            None => Ok(()),
        }
    }

    /// Stages an entry without data, laid out if in order.
    fn stage_entry(&mut self, mut entry: FileEntry) -> Result<()> {
        self.lay_out(&mut entry)?;
        let staged = self.staging.add(&entry);
        if staged.is_err() {
            self.stop_laying_out()?;
        }
        staged
    }

    /// Ends laying out the tar as entries arrive (finalize lays it out from the staged entries).
    fn stop_laying_out(&mut self) -> Result<()> {
        let Some(layout) = self.in_order.take() else { return Ok(()) };
        let (held, kept, finished) = layout.abandon(&mut self.seals);
        (self.held, self.kept) = (held, kept);
        finished
    }

    /// Adds a regular file of `size` bytes with permission bits `mode` (masked to 0o777),
    /// streaming `data` (which must yield exactly `size` bytes) through the chunker. Its SHA-256 is
    /// computed beside the writer: the entry is staged once the digest is back, by a later call or
    /// by `finalize`.
    pub fn add_file(&mut self, path: &str, mode: u32, size: u64, data: &mut dyn Read) -> Result<()> {
        self.ensure_new(path)?;
        let mut entry = FileEntry {
            path: path.to_string(),
            kind: EntryKind::File,
            target: None,
            mode: mode & PERMISSION_BITS,
            size,
            sha256: String::new(),
            tar_offset: NOT_LAID_OUT,
            chunks: ChunkList::None,
        };
        self.lay_out(&mut entry)?;
        let first_ref = self.staging.refs_written();
        let mut staged = self.stage_file_chunks(path, size, data);
        if let (Ok(_), Some(layout)) = (&staged, &mut self.in_order) {
            if let Err(e) = layout.end_data(&mut self.seals, size) {
                staged = Err(e);
            }
        }
        let (count, key) = match staged {
            Ok(staged) => staged,
            Err(e) => {
                // The writer may go on with other files: their digests must not include these
                // bytes, nor the tar laid out so far.
                self.digests.abandon_file()?;
                // A worker's failure already came back as `e`: any later one only repeats it.
                let _ = self.stop_laying_out();
                return Err(e);
            }
        };
        match self.store.inner.known_digests.get(&key) {
            Some(digest) => self.digests.end_known_file(digest)?,
            None => self.digests.end_file()?,
        }
        self.awaiting_paths.insert(path.to_string());
        entry.chunks = ChunkList::Staged { offset: first_ref, count };
        self.awaiting_digest.push_back((entry, key));
        self.stage_digested(self.awaiting_digest.len() > MAX_AWAITING_DIGEST)
    }

    /// Chunks, stages and hashes a file's bytes, `size` of them; returns its count of chunk refs
    /// and its content key.
    fn stage_file_chunks(&mut self, path: &str, expected: u64, data: &mut dyn Read) -> Result<(u64, ContentKey)> {
        let mut size = 0u64;
        let mut count = 0u64;
        let mut key = blake3::Hasher::new();
        let mut refs: Vec<StagedRef> = Vec::with_capacity(REF_BUFFER);
        let mut buffer = std::mem::take(&mut self.chunk_buffer);
        let mut chunker = Chunker::new(data, &mut buffer);
        while let Some(chunk) = chunker.next_chunk()? {
            size += chunk.len() as u64;
            if size > expected {
                break;
            }
            let staged = self.stage_chunk(chunk)?;
            key.update(&staged.chunk.hash);
            refs.push(staged);
            self.digests.update(chunk)?;
            if refs.len() == REF_BUFFER {
                self.staging.push_refs(&refs)?;
                count += refs.len() as u64;
                refs.clear();
            }
        }
        self.chunk_buffer = buffer;
        if size != expected {
            let reason = format!("its data does not match the size declared for it ({expected} bytes)");
            return Err(StorageError::InvalidEntry { path: path.into(), reason });
        }
        self.staging.push_refs(&refs)?;
        count += refs.len() as u64;
        Ok((count, *key.finalize().as_bytes()))
    }

    /// Stages the files whose digest is back; with `wait`, waits for (at least) the oldest.
    fn stage_digested(&mut self, mut wait: bool) -> Result<()> {
        while !self.awaiting_digest.is_empty() {
            let digest = match wait {
                true => self.digests.wait()?,
                false => match self.digests.ready() {
                    Some(digest) => digest,
                    None => break,
                },
            };
            wait = false;
            let Some((mut entry, key)) = self.awaiting_digest.pop_front() else { break };
            self.store.inner.known_digests.put(key, digest);
            entry.sha256 = hex::encode(digest);
            self.awaiting_paths.remove(&entry.path);
            self.staging.add(&entry)?;
        }
        Ok(())
    }

    /// Stages every file added, waiting for the digests still being computed.
    fn stage_all_files(&mut self) -> Result<()> {
        while !self.awaiting_digest.is_empty() {
            self.stage_digested(true)?;
        }
        Ok(())
    }

    /// Refuses a path already added (staged, or waiting for its digest).
    fn ensure_new(&mut self, path: &str) -> Result<()> {
        if self.awaiting_paths.contains(path) {
            return Err(StorageError::DuplicatePath { path: path.into() });
        }
        self.staging.ensure_new(path)
    }

    pub fn add_symlink(&mut self, path: &str, target: &str) -> Result<()> {
        self.ensure_new(path)?;
        let entry = FileEntry {
            path: path.to_string(),
            kind: EntryKind::Symlink,
            target: Some(target.to_string()),
            mode: 0o777,
            size: 0,
            sha256: hex::encode(Sha256::digest(target.as_bytes())),
            tar_offset: NOT_LAID_OUT,
            chunks: ChunkList::None,
        };
        self.stage_entry(entry)
    }

    /// Adds a directory the archive names (an empty one included), with permission bits `mode`
    /// (masked to 0o777). Its path is stored with a trailing `/`, so it sorts right before its
    /// contents and never collides with a file's path.
    pub fn add_dir(&mut self, path: &str, mode: u32) -> Result<()> {
        let path = format!("{}/", path.trim_end_matches('/'));
        self.ensure_new(&path)?;
        let entry = FileEntry {
            path,
            kind: EntryKind::Directory,
            target: None,
            mode: mode & PERMISSION_BITS,
            size: 0,
            sha256: hex::encode(Sha256::digest(b"")),
            tar_offset: NOT_LAID_OUT,
            chunks: ChunkList::None,
        };
        self.stage_entry(entry)
    }

    /// Adds `path` as a copy of the earlier regular file `target` (sharing its chunks); returns
    /// the copy's size.
    pub fn add_hardlink(&mut self, path: &str, target: &str) -> Result<u64> {
        self.ensure_new(path)?;
        // Its bytes would be read back from blocks still being sealed: hard links are rare, the
        // tar is laid out by finalize instead.
        self.stop_laying_out()?;
        // The target must be staged to be found (hard links are rare: waiting here costs little).
        self.stage_all_files()?;
        let Some(source) = self.staging.regular_file(target)? else {
            let reason = "hard link target is not an earlier regular file of the archive";
            return Err(StorageError::InvalidEntry { path: path.into(), reason: reason.into() });
        };
        // The source's pins cover the shared chunks.
        let entry = FileEntry { path: path.to_string(), tar_offset: NOT_LAID_OUT, ..source };
        self.staging.add(&entry)?;
        Ok(entry.size)
    }

    /// Computes tar offsets and the digest, packs the new chunks in tar order (unless that was
    /// done as they arrived), writes the frame plan and the manifest, flushes, and hands back the
    /// revision ready to attach.
    pub fn finalize(mut self) -> Result<PendingRevision> {
        self.stage_all_files()?;
        let store = self.store.clone();
        let id = self.id;
        // Laid out as the entries arrived: their tar offsets are set already.
        let laid_out_already = self.in_order.is_some();
        let mut layout = self.in_order.take().unwrap_or_default();
        let (mut files, mut size) = (0u64, 0u64);
        let mut manifest = ManifestBuilder::default();
        let mut meta = WriterChunks { store: &store, blocks: &mut self.blocks, pinned: &mut self.pinned };
        let mut put = |bytes: &[u8]| meta.put(bytes);
        let (staging, seals, held) = (&mut self.staging, &mut self.seals, &self.held);
        let mut kept = std::mem::take(&mut self.kept);
        for item in staging.sorted()? {
            let mut entry = staging.read_entry(item?)?;
            // Where the entry was when the tar was laid out as entries arrived, if it was.
            let first_layout = Some(entry.tar_offset).filter(|&o| o != NOT_LAID_OUT && !laid_out_already);
            if !laid_out_already {
                if first_layout.is_some_and(|old| kept.starts_at(old)) {
                    layout.cut(seals)?;
                }
                layout.start_entry(seals, &mut entry)?;
            }
            if let Some((first, count)) = entry.chunks.staged() {
                let staged = staging.read_refs(first, count)?;
                if !laid_out_already {
                    let sources = ChunkSources { store: &store, staging, held };
                    lay_out_data(sources, seals, &mut layout, &entry, &staged)?;
                }
                entry.chunks = chunk_list(staged.iter().map(|r| r.chunk).collect(), &mut put)?;
            }
            if let Some(old) = first_layout {
                kept.moved(old, layout.position() - entry.tar_offset, entry.tar_offset);
            }
            // Files and symlinks: what `status.files` counts (directories hold no content).
            files += u64::from(!entry.is_dir());
            size += entry.size;
            manifest.push(&entry, &mut put)?;
        }
        let tar = layout.finish(seals, kept)?;
        let plan = store_plan(&tar.plan, false, &mut put)?;
        let root = manifest.finish(&mut put)?;
        store.seal_block(&mut self.blocks)?;
        let record = RevisionRecord {
            id,
            state: RevisionState::Staging,
            digest: format!("sha256:{}", hex::encode(tar.digest)),
            tar_size: tar.size,
            files,
            size,
            stored_size: tar.stored,
            writer: store.backend().writer_id(),
            manifest: hex::encode(root.hash),
            manifest_len: root.len,
            frames: plan.map(|p| hex::encode(p.hash)).unwrap_or_default(),
            frames_len: plan.map_or(0, |p| p.len),
            frames_anchored: false,
            repacked: false,
        };
        store.record_while_pinned(&key_revision(id), &encode_json(&record), self.lease_epoch)?;
        store.flush()?;
        // The collector now finds these chunks through the manifest; see `Store::manifest_recorded`.
        store.manifest_recorded();
        store.unpin_all(&std::mem::take(&mut self.pinned));
        self.staging.remove();
        self.open = false;
        Ok(PendingRevision { store, record, armed: true })
    }

    /// Seals with `workers` threads (none: inline, as a serial writer); before anything is written.
    #[cfg(test)]
    pub(super) fn set_seal_workers(&mut self, workers: usize) {
        self.seals = SealPipeline::with_workers(self.store.clone(), workers);
    }

    /// Bytes spooled so far (tests).
    #[cfg(test)]
    pub(super) fn spooled_bytes(&self) -> u64 {
        self.staging.spooled_bytes()
    }

    /// Alive while any of the writer's seal workers is (tests).
    #[cfg(test)]
    pub(super) fn seal_liveness(&self) -> std::sync::Weak<std::sync::atomic::AtomicBool> {
        self.seals.liveness()
    }

    /// Leaves the revision `Staging` as a crash would (tests of recovery).
    #[cfg(test)]
    pub fn simulate_crash(mut self) {
        self.seals.shutdown();
        self.open = false;
        self.store.unpin_all(&std::mem::take(&mut self.pinned));
    }
}

/// Where finalize finds the bytes of staged chunks.
struct ChunkSources<'a> {
    store: &'a Store,
    staging: &'a mut Staging,
    held: &'a BlockBuilder,
}

/// Lays out a file's data from its staged chunks: spooled (each checked against its hash), held
/// from the tar laid out as entries arrived, or stored (verified as every read is).
fn lay_out_data(
    sources: ChunkSources,
    seals: &mut SealPipeline,
    layout: &mut TarLayout,
    entry: &FileEntry,
    staged: &[StagedRef],
) -> Result<()> {
    let ChunkSources { store, staging, held } = sources;
    let mut size = 0u64;
    for r in staged {
        // Each source returns exactly `r.chunk.len` bytes (checked there; held: as hashed).
        let hash = r.chunk.hash;
        match (r.spooled, held.member(&hash)) {
            (Some(at), _) => layout.new_chunk(store, seals, hash, &staging.read_spooled(&r.chunk, at)?)?,
            (None, Some(data)) => layout.new_chunk(store, seals, hash, data)?,
            (None, None) => {
                let (data, share) = store.get_chunk(&r.chunk)?;
                layout.stored_chunk(seals, &data, share)?;
            }
        }
        size += r.chunk.len as u64;
    }
    if size != entry.size {
        return Err(StorageError::Corrupt(format!("{}: staged chunks do not add up", entry.path)));
    }
    layout.end_data(seals, entry.size)
}

impl Drop for RevisionWriter {
    fn drop(&mut self) {
        // No worker may index a chunk of this writer once it is unpinned: stop them first.
        self.seals.shutdown();
        // Unpinned before the release is recorded: the pass the release triggers must find these
        // chunks unpinned, or they would stay until some later pass.
        self.store.unpin_all(&std::mem::take(&mut self.pinned));
        if self.open {
            self.staging.remove();
            if let Err(e) = self.store.release_revision(self.id) {
                tracing::warn!(revision = self.id, error = %e, "could not release an abandoned revision");
            }
        }
    }
}

/// A finalized revision not yet attached to any object. Dropping it releases the revision.
pub struct PendingRevision {
    store: Store,
    record: RevisionRecord,
    armed: bool,
}

impl PendingRevision {
    pub fn record(&self) -> &RevisionRecord {
        &self.record
    }

    /// Applies `writes`, which must attach this revision to an object (`ObjectWrite::Put` with
    /// `revision: Some(id)`), atomically making it visible. On failure the revision is released.
    pub fn commit(&mut self, writes: Vec<ObjectWrite>) -> Result<WriteOutcome> {
        let outcome = self.store.write_objects(writes)?;
        self.armed = false;
        Ok(outcome)
    }
}

impl Drop for PendingRevision {
    fn drop(&mut self) {
        if self.armed {
            if let Err(e) = self.store.release_revision(self.record.id) {
                tracing::warn!(revision = self.record.id, error = %e, "could not release an unused revision");
            }
        }
    }
}
