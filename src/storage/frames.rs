//! zstd downloads made of the stored frames.
//!
//! Blocks are stored as zstd frames, and zstd frames concatenate into one valid stream. Finalize
//! packs a revision's new chunks in tar order, with the tar's headers, padding and trailer as
//! filler between them ([`super::tar_blocks`]), so such a block's raw bytes *are* a stretch of the
//! served tar. Finalize records which: the revision's *frame plan*, a list of (tar offset, block,
//! BLAKE3 of the block's stored payload), in chunks named by the revision record.
//!
//! A zstd download walks the plan. A block that lies wholly in the range asked for goes out as it
//! is stored — read from its pack, its payload's BLAKE3 compared with the plan's, no decompression;
//! a block stored raw (it did not compress) is wrapped in a zstd frame of raw blocks. Everything
//! else (chunks shared with other revisions, a block only partly asked for, a block compaction
//! moved or that no longer matches) is read as an identity download reads it, every chunk verified,
//! and compressed afresh at the blocks' level in frames of at most [`STEP_INPUT`] bytes.
//!
//! Freshly compressed frames are kept in a cache bounded by `StoreOptions::frame_cache_bytes`
//! ([`super::frame_cache`]), by revision and tar stretch, and recompressed smaller there in the
//! background: a revision is immutable, so the next download of it sends them as it sends stored
//! ones. This is what makes chunks repeated within a revision (five versions of one chart in one
//! bundle) cheap to serve without storing them twice. A download sends a cached frame wherever
//! one starts, before stored ones. The embedded store rewrites a committed revision's blocks as
//! long ones in the background ([`super::repack`]), so its stored frames are long already; in the
//! replicated store, ahead of the first download, a warmer thread at a lower priority caches a
//! committed revision's *long frames* instead ([`Store::warm_zstd_frames`]): its whole tar in
//! stretches of up to 8 MiB at the upgrade level, until half the cache is filled. A frame's window
//! is its stretch, so cross-file matches a 1 MiB block cuts are found (the kube-prometheus-stack
//! chart: 454 kB on the wire against 669 kB of stored frames), and the stored frames stay what
//! they were sealed as.
//!
//! Integrity: a stored frame is sent only if its payload's hash is the one recorded when the block
//! was written from bytes checked against their chunk hashes (a plan entry whose block compaction
//! copied whole is followed through its anchor chunk, and the copy checked the same way);
//! otherwise the bytes are rebuilt from verified chunks. A cached frame is checked against the
//! hash taken when it was cached.
//! Memory per download: one block's payload or one step's identity bytes, plus one page of the
//! plan; compression contexts are per blocking thread, not per download.

use std::sync::mpsc::Receiver;
use std::sync::Weak;

use super::chunks::{ChunkRef, Hash, SealedBlock, CHUNK_REF_LEN, CODEC_RAW};
use super::frame_cache::LONG_FRAME;
use super::packs::BlockAt;
use super::read::RangeSpec;
use super::{FileEntry, Result, RevisionId, RevisionRecord, StorageError, Store};

/// Identity bytes compressed afresh per step, at most: on the corpus, 4 MiB frames take 13 % fewer
/// bytes than 1 MiB ones (3.42 against 3.95 MB; nginx's one stream 3.16) and compress as fast.
const STEP_INPUT: u64 = 4 << 20;
/// Plan entries per stored page (65 bytes each, 97 anchored: a page stays under a chunk's 64 KiB).
const PAGE_ENTRIES: usize = 1000;
const ANCHORED_PAGE_ENTRIES: usize = 600;
const ENTRY_LEN: usize = 8 + 8 + 8 + 4 + 1 + 4 + 32;
const ANCHORED_ENTRY_LEN: usize = ENTRY_LEN + 32;
const ROOT_ENTRY_LEN: usize = 8 + CHUNK_REF_LEN;
/// Pages a plan names at most (its root stays one chunk): about 1.4 TiB of tar; past that the
/// tar is compressed afresh.
const MAX_PAGES: usize = 64 * 1024 / ROOT_ENTRY_LEN;

/// A stretch of a revision's tar that a stored block holds exactly: `[tar_start, tar_start +
/// block.at.raw_len)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlanEntry {
    pub tar_start: u64,
    pub block: SealedBlock,
    /// A chunk of the block (plans the repacker wrote, [`super::repack`]): where the chunk index
    /// says it is now, the block is, if compaction copied it whole.
    pub anchor: Option<Hash>,
}

fn encode_entry(e: &PlanEntry, anchored: bool, out: &mut Vec<u8>) {
    let at = &e.block.at;
    out.extend_from_slice(&e.tar_start.to_le_bytes());
    out.extend_from_slice(&at.pack.to_le_bytes());
    out.extend_from_slice(&at.payload_offset.to_le_bytes());
    out.extend_from_slice(&at.stored_len.to_le_bytes());
    out.push(at.codec);
    out.extend_from_slice(&at.raw_len.to_le_bytes());
    out.extend_from_slice(&e.block.payload_hash);
    if anchored {
        out.extend_from_slice(&e.anchor.unwrap_or_default());
    }
}

fn decode_entries(bytes: &[u8], anchored: bool) -> Result<Vec<PlanEntry>> {
    let len = if anchored { ANCHORED_ENTRY_LEN } else { ENTRY_LEN };
    if !bytes.len().is_multiple_of(len) {
        return Err(StorageError::Corrupt("frame plan page has the wrong length".into()));
    }
    let entry = |b: &[u8]| -> Option<PlanEntry> {
        let u64_at = |i: usize| b.get(i..)?.first_chunk::<8>().map(|v| u64::from_le_bytes(*v));
        let u32_at = |i: usize| b.get(i..)?.first_chunk::<4>().map(|v| u32::from_le_bytes(*v));
        let at = BlockAt {
            pack: u64_at(8)?,
            payload_offset: u64_at(16)?,
            stored_len: u32_at(24)?,
            codec: *b.get(28)?,
            raw_len: u32_at(29)?,
        };
        let block = SealedBlock { at, payload_hash: *b.get(33..)?.first_chunk()? };
        let anchor = if anchored { Some(*b.get(ENTRY_LEN..)?.first_chunk()?) } else { None };
        Some(PlanEntry { tar_start: u64_at(0)?, block, anchor })
    };
    bytes.chunks_exact(len).map(|b| entry(b).ok_or_else(|| StorageError::Corrupt("frame plan entry".into()))).collect()
}

/// Stores a plan (entries in tar order) as pages and a root naming them; returns the root (`None`
/// for an empty plan). `anchored`: with each entry's anchor (the record then says so).
pub(super) fn store_plan(
    entries: &[PlanEntry],
    anchored: bool,
    put: &mut dyn FnMut(&[u8]) -> Result<ChunkRef>,
) -> Result<Option<ChunkRef>> {
    if entries.is_empty() {
        return Ok(None);
    }
    let per_page = if anchored { ANCHORED_PAGE_ENTRIES } else { PAGE_ENTRIES };
    let mut root = Vec::new();
    for page in entries.chunks(per_page).take(MAX_PAGES) {
        let mut bytes = Vec::with_capacity(page.len() * ANCHORED_ENTRY_LEN);
        page.iter().for_each(|e| encode_entry(e, anchored, &mut bytes));
        let chunk = put(&bytes)?;
        root.extend_from_slice(&page.first().map_or(0, |e| e.tar_start).to_le_bytes());
        chunk.encode_into(&mut root);
    }
    put(&root).map(Some)
}

/// A plan's pages: (tar offset of the first entry, the page's chunk).
fn decode_root(bytes: &[u8]) -> Result<Vec<(u64, ChunkRef)>> {
    if !bytes.len().is_multiple_of(ROOT_ENTRY_LEN) {
        return Err(StorageError::Corrupt("frame plan root has the wrong length".into()));
    }
    let mut pages = Vec::with_capacity(bytes.len() / ROOT_ENTRY_LEN);
    for b in bytes.chunks_exact(ROOT_ENTRY_LEN) {
        let (start, chunk) = b.split_at(8);
        let start = start.first_chunk::<8>().map_or(0, |v| u64::from_le_bytes(*v));
        let chunk =
            ChunkRef::decode_all(chunk)?.pop().ok_or_else(|| StorageError::Corrupt("frame plan root".into()))?;
        pages.push((start, chunk));
    }
    Ok(pages)
}

impl Store {
    /// The chunks of a revision's frame plan (root first), for the collector's mark.
    pub(super) fn plan_chunks(&self, record: &RevisionRecord) -> Result<Vec<Hash>> {
        let Some(root) = record.frames_root()? else { return Ok(Vec::new()) };
        let pages = decode_root(&self.get_chunk(&root)?.0)?;
        Ok(std::iter::once(root.hash).chain(pages.iter().map(|(_, c)| c.hash)).collect())
    }

    /// A revision's whole frame plan (empty if it has none).
    pub(super) fn plan_entries(&self, record: &RevisionRecord) -> Result<Vec<PlanEntry>> {
        let Some(root) = record.frames_root()? else { return Ok(Vec::new()) };
        let mut entries = Vec::new();
        for (_, page) in decode_root(&self.get_chunk(&root)?.0)? {
            entries.extend(decode_entries(&self.get_chunk(&page)?.0, record.frames_anchored)?);
        }
        Ok(entries)
    }
}

/// What a zstd download serves.
enum Source {
    /// The tar, read on from where the previous step stopped.
    Tar(Box<super::TarCursor>),
    /// One regular file, whose bytes start at `data_start` in the tar.
    File { entry: Box<FileEntry>, data_start: u64 },
}

/// Bytes sent as stored frames, as fresh ones compressed for this download, and as fresh ones an
/// earlier download compressed (identity bytes they stand for).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FrameStats {
    pub stored: u64,
    pub fresh: u64,
    pub cached: u64,
}

/// A zstd download in progress: call [`Store::zstd_step`] until it returns `false`.
pub struct ZstdDownload {
    rev: RevisionId,
    source: Source,
    /// Tar offsets: the next byte to send, and the end.
    pos: u64,
    end: u64,
    plan: Option<PlanCursor>,
    stats: FrameStats,
}

/// Where a download is in the plan: the pages, and the page loaded.
struct PlanCursor {
    pages: Vec<(u64, ChunkRef)>,
    anchored: bool,
    /// The next page to load.
    next_page: usize,
    entries: std::vec::IntoIter<PlanEntry>,
    /// The first entry starting at or after the download's position, if any is loaded.
    ahead: Option<PlanEntry>,
}

impl PlanCursor {
    /// The first entry that starts at or after `pos`.
    fn next_from(&mut self, store: &Store, pos: u64) -> Result<Option<PlanEntry>> {
        loop {
            if let Some(e) = self.ahead.filter(|e| e.tar_start >= pos) {
                return Ok(Some(e));
            }
            self.ahead = self.entries.next();
            if self.ahead.is_some() {
                continue;
            }
            // Skip pages that end before `pos` without reading them.
            while self.pages.get(self.next_page + 1).is_some_and(|(start, _)| *start <= pos) {
                self.next_page += 1;
            }
            let Some((_, page)) = self.pages.get(self.next_page) else { return Ok(None) };
            self.next_page += 1;
            match store.get_chunk(page).and_then(|(bytes, _)| decode_entries(&bytes, self.anchored)) {
                Ok(entries) => self.entries = entries.into_iter(),
                Err(e) => {
                    tracing::warn!(error = %e, "a page of a frame plan is unreadable; its stretch is compressed afresh");
                    self.entries = Vec::new().into_iter();
                }
            }
        }
    }
}

impl ZstdDownload {
    /// The revision's whole tar.
    pub fn tar(record: &RevisionRecord) -> ZstdDownload {
        let cursor = super::TarCursor::new(record.id, record.tar_size);
        ZstdDownload::new(record, Source::Tar(Box::new(cursor)), 0, record.tar_size)
    }

    /// One regular file's bytes.
    pub fn file(record: &RevisionRecord, entry: FileEntry) -> ZstdDownload {
        let data_start = entry.tar_offset + super::tarfmt::header_bytes(&entry.header_spec()).len() as u64;
        let end = data_start + entry.size;
        ZstdDownload::new(record, Source::File { entry: Box::new(entry), data_start }, data_start, end)
    }

    fn new(record: &RevisionRecord, source: Source, pos: u64, end: u64) -> ZstdDownload {
        ZstdDownload { rev: record.id, source, pos, end, plan: None, stats: FrameStats::default() }
    }

    pub fn stats(&self) -> FrameStats {
        self.stats
    }
}

impl Store {
    /// One step of a zstd download: appends the next frames to `out`; returns whether more follow.
    pub fn zstd_step(&self, download: &mut ZstdDownload, out: &mut Vec<u8>) -> Result<bool> {
        if download.pos >= download.end {
            return Ok(false);
        }
        let pos = download.pos;
        // A cached frame from here (a long one the warmer made, or one an earlier download
        // compressed) goes first: it is never larger than what it stands for. A download the cache
        // covers never reads the plan.
        if let Some((end, frame)) = self.inner.fresh_frames.get_from(download.rev, pos, download.end) {
            out.extend_from_slice(&frame);
            download.stats.cached += end - pos;
            download.pos = end;
            return Ok(download.pos < download.end);
        }
        if download.plan.is_none() {
            let record = self.revision_record(download.rev)?;
            // A plan that cannot be read costs speed, not the download: all of it is then rebuilt
            // from verified chunks.
            let pages = match record.frames_root().and_then(|root| root.map(|r| self.get_chunk(&r)).transpose()) {
                Ok(Some((root, _))) => decode_root(&root).unwrap_or_else(|e| plan_unreadable(download.rev, &e)),
                Ok(None) => Vec::new(),
                Err(e) => plan_unreadable(download.rev, &e),
            };
            download.plan = Some(PlanCursor {
                pages,
                anchored: record.frames_anchored,
                next_page: 0,
                entries: Vec::new().into_iter(),
                ahead: None,
            });
        }
        let next = match download.plan.as_mut() {
            Some(plan) => plan.next_from(self, pos)?,
            None => None,
        };
        if let Some(entry) = next.filter(|e| e.tar_start == pos && pos + e.block.at.raw_len as u64 <= download.end) {
            let raw_len = entry.block.at.raw_len as u64;
            if self.send_stored(&entry.block, out)? || self.send_moved(&entry, out)? {
                download.pos += raw_len;
                download.stats.stored += raw_len;
                return Ok(download.pos < download.end);
            }
            // Moved or not what was recorded: rebuilt from verified chunks.
            self.send_fresh(download, pos + raw_len, out)?;
            return Ok(download.pos < download.end);
        }
        // Up to the next stored block (one starting here that was not usable is passed by).
        let until = match next {
            Some(e) if e.tar_start > pos => e.tar_start.min(download.end),
            _ => download.end,
        };
        self.send_fresh(download, until.min(pos + STEP_INPUT), out)?;
        Ok(download.pos < download.end)
    }

    /// Appends a block's stored payload as a frame if it is still the one the plan recorded.
    fn send_stored(&self, block: &SealedBlock, out: &mut Vec<u8>) -> Result<bool> {
        let Ok(payload) = self.inner.packs.read_payload(&block.at) else { return Ok(false) };
        if blake3::hash(&payload).as_bytes() != &block.payload_hash {
            tracing::debug!(
                pack = block.at.pack,
                offset = block.at.payload_offset,
                "stored frame changed; compressing afresh"
            );
            return Ok(false);
        }
        if block.at.codec == CODEC_RAW {
            raw_frame(&payload, out);
        } else {
            out.extend_from_slice(&payload);
        }
        Ok(true)
    }

    /// Appends the frame of a plan entry whose block is no longer where the plan says, found
    /// through its anchor: a block compaction copied whole is still the same payload.
    fn send_moved(&self, entry: &PlanEntry, out: &mut Vec<u8>) -> Result<bool> {
        let Some(anchor) = entry.anchor else { return Ok(false) };
        let Ok(Some(now)) = self.chunk_location(&anchor) else { return Ok(false) };
        let was = entry.block.at;
        if now.block == was || now.block.raw_len != was.raw_len || now.block.codec != was.codec {
            return Ok(false);
        }
        self.send_stored(&SealedBlock { at: now.block, payload_hash: entry.block.payload_hash }, out)
    }

    /// Appends the identity bytes `[download.pos, until)`, read (verified) and compressed now.
    fn send_fresh(&self, download: &mut ZstdDownload, until: u64, out: &mut Vec<u8>) -> Result<()> {
        let until = until.min(download.end);
        let key = (download.rev, download.pos, until);
        let mut identity = Vec::new();
        read_identity(&mut identity, until - download.pos, |sink| match &mut download.source {
            Source::Tar(cursor) => self.read_tar_at(cursor, RangeSpec { start: download.pos, end: until }, sink),
            Source::File { entry, data_start } => {
                let range = RangeSpec { start: download.pos - *data_start, end: until - *data_start };
                self.read_file(download.rev, entry, range, sink)
            }
        })?;
        let frame = super::chunks::zstd_with_thread_context(&identity, self.inner.options.zstd_level)?;
        out.extend_from_slice(&frame);
        self.inner.fresh_frames.put(key, frame);
        download.stats.fresh += until - download.pos;
        download.pos = until;
        Ok(())
    }
}

impl Store {
    /// Has the fresh frames of `rev`'s zstd download made and cached in the background (a warmer
    /// thread, one revision at a time, a few queued; more are skipped), so that its first download
    /// sends them as cached frames rather than compressing them while its client waits.
    /// A store that repacks ([`super::repack`]) goes over every revision it has not yet instead:
    /// the long blocks it writes are what the warmer would cache.
    pub fn warm_zstd_frames(&self, rev: RevisionId) {
        if self.repacks() || self.inner.fresh_frames.limit() > 0 {
            let _ = self.inner.warm_requests.try_send(rev);
        }
    }
}

/// Makes and caches the long frames of `rev`'s tar ([`LONG_FRAME`] stretches at the upgrade
/// level, each checked to be worth it), so that its zstd downloads, the first one included, send
/// a third fewer bytes than its stored frames, and compress nothing while their clients wait. Only
/// until they fill half the cache, and not for content that hardly compresses (its stored blocks
/// then take more than half its tar): compressing it again gains nothing and costs a context of
/// some MiB. The store is held a stretch at a time, so that warming never keeps a closed store open
/// for long.
pub(super) fn warm_fresh_frames(store: &Weak<super::Inner>, rev: RevisionId) -> Result<()> {
    let held = || store.upgrade().map(|inner| Store { inner });
    let Some(first) = held() else { return Ok(()) };
    let record = first.revision_record(rev)?;
    let budget = first.inner.fresh_frames.limit() / 2;
    drop(first);
    if !record.recompresses() {
        return Ok(());
    }
    let mut compressor = zstd::bulk::Compressor::new(super::frame_cache::UPGRADE_LEVEL)?;
    let mut cursor = super::TarCursor::new(rev, record.tar_size);
    let (mut pos, mut made, mut identity) = (0u64, 0u64, Vec::new());
    while pos < record.tar_size && made < budget {
        let Some(store) = held() else { return Ok(()) };
        let end = (pos + LONG_FRAME).min(record.tar_size);
        read_identity(&mut identity, end - pos, |sink| {
            store.read_tar_at(&mut cursor, RangeSpec { start: pos, end }, sink)
        })?;
        let frame = compressor.compress(&identity)?;
        // Worth a place only if it compresses: otherwise the stored (raw) frames go out.
        if frame.len() < identity.len() - identity.len() / 8 {
            made += frame.len() as u64;
            store.inner.fresh_frames.put_upgraded((rev, pos, end), frame);
        }
        pos = end;
    }
    Ok(())
}

/// Fills `identity` (emptied first) with the `len` bytes of a stretch that `read` hands its sink,
/// verified as read; an error if it hands fewer.
pub(super) fn read_identity(
    identity: &mut Vec<u8>,
    len: u64,
    read: impl FnOnce(&mut super::Sink<'_>) -> Result<()>,
) -> Result<()> {
    identity.clear();
    identity.reserve(len as usize);
    read(&mut |bytes: &[u8]| {
        identity.extend_from_slice(bytes);
        Ok(())
    })?;
    if identity.len() as u64 != len {
        return Err(StorageError::Corrupt("zstd frames: the content is shorter than recorded".into()));
    }
    Ok(())
}

/// Revisions waiting for the warmer, at most (more are not warmed).
pub(super) const WARM_QUEUE: usize = 4;

/// Starts the thread that warms revisions queued on `requests` ([`Store::warm_zstd_frames`]). It
/// holds the store only while it warms, and ends with it.
pub(super) fn spawn_warmer(store: Weak<super::Inner>, requests: Receiver<RevisionId>) {
    let spawned = std::thread::Builder::new().name("stowage-frame-warm".into()).spawn(move || {
        lower_thread_priority();
        for rev in requests {
            if rev == super::repack::AFTER_OPEN {
                std::thread::sleep(super::repack::OPEN_DELAY);
            }
            if store.upgrade().is_some_and(|inner| Store { inner }.repacks()) {
                super::repack::repack_pending(&store);
            } else if let Err(e) = warm_fresh_frames(&store, rev) {
                tracing::debug!(revision = rev, error = %e, "warming zstd frames failed");
            }
        }
    });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "could not start the zstd frame warmer");
    }
}

/// Background work yields the cores to requests: the calling thread's nice value goes to 10.
fn lower_thread_priority() {
    // SAFETY: plain system calls on the calling thread (gettid names it for setpriority).
    unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 10);
    }
}

fn plan_unreadable(rev: RevisionId, e: &StorageError) -> Vec<(u64, ChunkRef)> {
    tracing::warn!(revision = rev, error = %e, "the frame plan is unreadable; the download is compressed afresh");
    Vec::new()
}

/// Largest block of a zstd frame (RFC 8878: min(window, 128 KiB)).
const MAX_ZSTD_BLOCK: usize = 128 * 1024;

/// Appends `data` as one zstd frame of raw (stored, uncompressed) blocks: a block that did not
/// compress costs a copy, not a compression attempt per download.
fn raw_frame(data: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(&0xFD2F_B528u32.to_le_bytes());
    // Frame header descriptor: single segment (the content size is the window), 8-byte size.
    out.push(0b1110_0000);
    out.extend_from_slice(&(data.len() as u64).to_le_bytes());
    let mut blocks = data.chunks(MAX_ZSTD_BLOCK).peekable();
    if blocks.peek().is_none() {
        // An empty frame still has one (last, empty) block.
        out.extend_from_slice(&1u32.to_le_bytes()[..3]);
    }
    while let Some(block) = blocks.next() {
        let last = u32::from(blocks.peek().is_none());
        // Block header: last flag, type 0 (raw), size.
        let header = last | ((block.len() as u32) << 3);
        out.extend_from_slice(&header.to_le_bytes()[..3]);
        out.extend_from_slice(block);
    }
}

#[cfg(test)]
pub(super) fn raw_frame_for_tests(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    raw_frame(data, &mut out);
    out
}
