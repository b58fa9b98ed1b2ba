//! Content-addressed chunks: stored once under their BLAKE3 hash, packed into zstd-compressed
//! blocks by us, verified on every read.
//!
//! A writer collects the new chunks of an upload in a [`BlockBuilder`] and seals it into a pack
//! record of about [`BLOCK_TARGET`] raw bytes; the index (`c` keys) maps each chunk hash to its
//! block and its range inside. An index entry is only ever *added* if absent (or moved by
//! compaction, compare-and-swap): a second copy of a chunk never redirects readers of the first.
//!
//! Collection is mark and sweep ([`super::gc`]): a chunk stays while a finalized revision's
//! manifest reaches it or a writer has it *pinned*. A writer pins a hash before it checks whether
//! the chunk exists and keeps it pinned until its manifest is recorded; the sweep deletes a chunk
//! only if it is unmarked and not pinned, under the same lock. So a chunk a writer is about to
//! reuse can never be swept under it.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use super::packs::{BlockAt, Member};
use super::{key, Result, StorageError, Store};

/// Chunk sizes (FastCDC): content-defined cut points between these bounds.
pub const MIN_CHUNK: u32 = 16 * 1024;
pub const AVG_CHUNK: u32 = 32 * 1024;
pub const MAX_CHUNK: u32 = 64 * 1024;
/// Raw bytes collected before a block is sealed. zstd at level 3 needs the context: the five
/// kube-prometheus-stack versions of the corpus take 19 % less in 1 MiB blocks than in 256 KiB ones
/// (the footprint figures of the benchmarks journal, `git show 15314ef:docs/benchmarks.md`); a
/// random read decompresses one block (about a millisecond).
pub const BLOCK_TARGET: usize = 1024 * 1024;
/// Index entries swept per batch.
pub(super) const SWEEP_GROUP: usize = 1024;
/// Decompressed bytes of the blocks kept for sequential reads: sixteen upload blocks, or four of
/// the repacker's ([`super::repack::REPACK_BLOCK`]).
const BLOCK_CACHE_BYTES: usize = 32 << 20;
/// Chunk locations remembered by a replica (about 100 bytes each).
const LOCATION_CACHE_ENTRIES: usize = 65_536;

pub(super) const CODEC_RAW: u8 = 0;
pub(super) const CODEC_ZSTD: u8 = 1;
/// zstd too, written by the repacker ([`super::repack`]): its chunks stay where they are when a
/// later revision is repacked.
pub(super) const CODEC_ZSTD_LONG: u8 = 2;

pub type Hash = [u8; 32];

/// A reference to a chunk inside a file's chunk list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkRef {
    pub hash: Hash,
    pub len: u32,
}

pub const CHUNK_REF_LEN: usize = 36;

impl ChunkRef {
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.hash);
        out.extend_from_slice(&self.len.to_le_bytes());
    }

    pub fn decode_all(bytes: &[u8]) -> Result<Vec<ChunkRef>> {
        if !bytes.len().is_multiple_of(CHUNK_REF_LEN) {
            return Err(StorageError::Corrupt("segment length is not a multiple of a chunk ref".into()));
        }
        Ok(bytes
            .chunks_exact(CHUNK_REF_LEN)
            .filter_map(|c| {
                let (hash, len) = c.split_first_chunk::<32>()?;
                Some(ChunkRef { hash: *hash, len: u32::from_le_bytes(*len.first_chunk::<4>()?) })
            })
            .collect())
    }
}

/// Where a chunk is: its block, and its range in the block's raw bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Location {
    pub block: BlockAt,
    pub offset: u32,
    pub len: u32,
    /// The raw bytes of the block's chunks: less than the block's raw bytes when it also holds tar
    /// bytes in no chunk (filler, [`BlockBuilder::filler`]), which its chunks' shares then carry.
    pub members_len: u32,
}

const LOCATION_LEN: usize = 8 + 8 + 4 + 1 + 4 + 4 + 4;
/// With `members_len` (written only when it differs from the block's raw length, so an entry of a
/// block without filler keeps the older, shorter form).
const LOCATION_FILLED_LEN: usize = LOCATION_LEN + 4;

impl Location {
    pub fn new(block: BlockAt, member: &Member, members_len: u32) -> Location {
        Location { block, offset: member.offset, len: member.len, members_len }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(LOCATION_FILLED_LEN);
        out.extend_from_slice(&self.block.pack.to_be_bytes());
        out.extend_from_slice(&self.block.payload_offset.to_be_bytes());
        out.extend_from_slice(&self.block.stored_len.to_le_bytes());
        out.push(self.block.codec);
        out.extend_from_slice(&self.block.raw_len.to_le_bytes());
        out.extend_from_slice(&self.offset.to_le_bytes());
        out.extend_from_slice(&self.len.to_le_bytes());
        if self.members_len != self.block.raw_len {
            out.extend_from_slice(&self.members_len.to_le_bytes());
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<Location> {
        if bytes.len() != LOCATION_LEN && bytes.len() != LOCATION_FILLED_LEN {
            return Err(StorageError::Corrupt("chunk index entry has the wrong size".into()));
        }
        let b = bytes;
        // Offsets within the fixed-size entry; `get` keeps the decoder free of panics.
        let u64_at = |i: usize| b.get(i..).and_then(<[u8]>::first_chunk::<8>).map_or(0, |v| u64::from_be_bytes(*v));
        let u32_at = |i: usize| b.get(i..).and_then(<[u8]>::first_chunk::<4>).map_or(0, |v| u32::from_le_bytes(*v));
        Ok(Location {
            block: BlockAt {
                pack: u64_at(0),
                payload_offset: u64_at(8),
                stored_len: u32_at(16),
                codec: b.get(20).copied().unwrap_or_default(),
                raw_len: u32_at(21),
            },
            offset: u32_at(25),
            len: u32_at(29),
            members_len: if b.len() == LOCATION_FILLED_LEN { u32_at(33) } else { u32_at(21) },
        })
    }

    /// The chunk's share of its block's stored bytes (filler included: a block whose chunks all
    /// live is all live, for compaction).
    pub fn stored_share(&self) -> u64 {
        (self.len as u64 * self.block.stored_len as u64).div_ceil(self.members_len.max(1) as u64)
    }
}

/// New chunks of one writer, waiting to be sealed into a block. A revision's content blocks also
/// hold the tar bytes between and around its chunks (headers, padding, the trailer: *filler*,
/// in no member), so that such a block is a stretch of the served tar, which a zstd download sends
/// as it is stored ([`super::frames`]).
#[derive(Default)]
pub struct BlockBuilder {
    raw: Vec<u8>,
    members: Vec<Member>,
    hashes: HashSet<Hash>,
}

/// A block written: where, and the BLAKE3 of its stored payload (what a download that sends the
/// payload as it is verifies it against).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SealedBlock {
    pub at: BlockAt,
    pub payload_hash: Hash,
}

impl BlockBuilder {
    /// Appends bytes that belong to no chunk (a block of filler alone is not written: nothing
    /// would keep it).
    pub fn filler(&mut self, bytes: &[u8]) {
        self.reserve();
        self.raw.extend_from_slice(bytes);
    }

    /// A new block's buffer is allocated once, for a full block: grown by doubling, its bytes
    /// were copied again about once.
    fn reserve(&mut self) {
        if self.raw.capacity() == 0 {
            self.raw.reserve(BLOCK_TARGET + MAX_CHUNK as usize);
        }
    }

    pub fn raw_len(&self) -> usize {
        self.raw.len()
    }

    pub(super) fn members_len(&self) -> u32 {
        self.members.iter().map(|m| m.len).sum()
    }

    /// The chunks in the block, in the order added.
    pub(super) fn members(&self) -> &[Member] {
        &self.members
    }

    /// Drops the members `known` (one flag per member, in order) says the store holds already;
    /// their bytes stay, as filler: the block remains the stretch of tar it was built as.
    pub(super) fn drop_known(&mut self, known: Vec<bool>) {
        let mut known = known.into_iter();
        self.members.retain(|_| !known.next().unwrap_or(false));
        self.hashes = self.members.iter().map(|m| m.hash).collect();
    }

    pub fn contains(&self, hash: &Hash) -> bool {
        self.hashes.contains(hash)
    }

    pub fn push(&mut self, hash: Hash, data: &[u8]) {
        self.reserve();
        self.members.push(Member { hash, offset: self.raw.len() as u32, len: data.len() as u32 });
        self.raw.extend_from_slice(data);
        self.hashes.insert(hash);
    }

    pub fn is_full(&self) -> bool {
        self.raw.len() >= BLOCK_TARGET
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// A chunk's bytes, if the block holds it.
    pub fn member(&self, hash: &Hash) -> Option<&[u8]> {
        if !self.hashes.contains(hash) {
            return None;
        }
        let member = self.members.iter().find(|m| m.hash == *hash)?;
        self.raw.get(member.offset as usize..(member.offset + member.len) as usize)
    }

    /// The hashes of the chunks in the block.
    pub fn hashes(&self) -> &HashSet<Hash> {
        &self.hashes
    }
}

/// Recently decompressed blocks, so a sequential read decompresses each block once (raw blocks,
/// which need no decompression, are read a chunk at a time and never held here).
#[derive(Default)]
pub struct BlockCache {
    entries: std::sync::Mutex<VecDeque<(BlockAt, Arc<Vec<u8>>)>>,
}

fn cached_bytes(entries: &VecDeque<(BlockAt, Arc<Vec<u8>>)>) -> usize {
    entries.iter().map(|(_, block)| block.len()).sum()
}

impl BlockCache {
    fn get(&self, at: &BlockAt) -> Option<Arc<Vec<u8>>> {
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.iter().find(|(key, _)| key == at).map(|(_, block)| block.clone())
    }

    fn put(&self, at: BlockAt, block: Arc<Vec<u8>>) {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        while !entries.is_empty() && cached_bytes(&entries) + block.len() > BLOCK_CACHE_BYTES {
            entries.pop_front();
        }
        entries.push_back((at, block));
    }

    pub fn forget_pack(&self, pack: u64) {
        self.entries.lock().unwrap_or_else(|e| e.into_inner()).retain(|(at, _)| at.pack != pack);
    }

    /// Tests: forgets every block, so the next read goes below this cache.
    #[cfg(test)]
    pub fn clear(&self) {
        self.entries.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }
}

/// Chunk locations read lately (replicated store, where each lookup is an etcd round trip).
/// A location names an immutable block, so a stale one still reads the right bytes — or fails
/// once compaction deleted its block, and the reader then looks the chunk up afresh. Bounded:
/// emptied when full.
#[derive(Default)]
pub struct LocationCache {
    entries: std::sync::Mutex<HashMap<Hash, Location>>,
}

impl LocationCache {
    fn get(&self, hash: &Hash) -> Option<Location> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner()).get(hash).copied()
    }

    fn put(&self, hash: Hash, at: Location) {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if entries.len() >= LOCATION_CACHE_ENTRIES {
            entries.clear();
        }
        entries.insert(hash, at);
    }

    fn forget(&self, hash: &Hash) {
        self.entries.lock().unwrap_or_else(|e| e.into_inner()).remove(hash);
    }
}

/// Hashes pinned by writers whose manifests are not recorded yet.
#[derive(Default)]
pub struct Pins {
    counts: HashMap<Hash, u32>,
}

impl Pins {
    /// Whether this is the hash's first pin.
    pub(super) fn pin(&mut self, hash: Hash) -> bool {
        let count = self.counts.entry(hash).or_insert(0);
        *count += 1;
        *count == 1
    }

    /// Whether that was the hash's last pin.
    fn unpin(&mut self, hash: &Hash) -> bool {
        if let Some(n) = self.counts.get_mut(hash) {
            *n -= 1;
            if *n == 0 {
                self.counts.remove(hash);
                return true;
            }
        }
        false
    }

    pub(super) fn is_pinned(&self, hash: &Hash) -> bool {
        self.counts.contains_key(hash)
    }

    #[cfg(test)]
    pub(super) fn is_empty(&self) -> bool {
        self.counts.is_empty()
    }
}

pub(super) fn chunk_key(hash: &Hash) -> Vec<u8> {
    key(b'c', &[hash])
}

/// Replicated mode: `p` hash `/` replica, a pin in the shared map, attached to the replica's
/// lease. Hash first, so that "no replica pins this chunk" is one prefix comparison in the
/// collector's delete transaction ([`super::gc`]).
pub(super) fn pin_key(replica: &str, hash: &Hash) -> Vec<u8> {
    key(b'p', &[hash, b"/", replica.as_bytes()])
}

/// Where the pins of `hash` start.
pub(super) fn pins_of(hash: &Hash) -> Vec<u8> {
    key(b'p', &[hash, b"/"])
}

/// Replicated mode: rewritten with every manifest recorded, so that a collection pass can tell
/// whether one was recorded after it marked (its delete transactions compare this key).
pub(super) const MANIFESTS_KEY: &[u8] = b"mmanifests";

/// Compresses `data` at `level` with the calling thread's zstd context: making a context per call
/// cost more than compressing a small input (a change-log entry), and keeping one per caller (a
/// download) would hold one per slow client.
pub(super) fn zstd_with_thread_context(data: &[u8], level: i32) -> std::io::Result<Vec<u8>> {
    thread_local! {
        static COMPRESSOR: std::cell::RefCell<Option<zstd::bulk::Compressor<'static>>> =
            const { std::cell::RefCell::new(None) };
    }
    COMPRESSOR.with(|c| {
        let mut c = c.borrow_mut();
        let compressor = match c.as_mut() {
            Some(compressor) => compressor,
            None => c.insert(zstd::bulk::Compressor::new(level)?),
        };
        compressor.set_compression_level(level)?;
        compressor.compress(data)
    })
}

/// Compresses a block unless that does not pay: (codec, payload).
fn encode(data: &[u8], level: i32) -> (u8, Vec<u8>) {
    match zstd::bulk::compress(data, level) {
        Ok(compressed) if compressed.len() < data.len() => (CODEC_ZSTD, compressed),
        _ => (CODEC_RAW, data.to_vec()),
    }
}

pub(super) fn decode_block(at: &BlockAt, payload: Vec<u8>) -> Result<Vec<u8>> {
    let corrupt = |what: &str| StorageError::Corrupt(format!("block at {}:{}: {what}", at.pack, at.payload_offset));
    let raw_len = at.raw_len as usize;
    let data = match at.codec {
        CODEC_RAW => payload,
        CODEC_ZSTD | CODEC_ZSTD_LONG => {
            zstd::bulk::decompress(&payload, raw_len).map_err(|e| corrupt(&format!("zstd: {e}")))?
        }
        _ => return Err(corrupt("unknown codec")),
    };
    if data.len() != raw_len {
        return Err(corrupt("wrong decompressed length"));
    }
    Ok(data)
}

/// A chunk's bytes where they lie in its decompressed block (shared with the block cache): a
/// reader borrows them instead of copying each chunk out.
pub(super) struct ChunkBytes {
    block: Arc<Vec<u8>>,
    range: std::ops::Range<usize>,
}

impl std::ops::Deref for ChunkBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.block.get(self.range.clone()).unwrap_or_default()
    }
}

impl ChunkBytes {
    /// The chunk at `at` of its decompressed `block`.
    fn within(block: Arc<Vec<u8>>, at: &Location) -> ChunkBytes {
        ChunkBytes { block, range: at.offset as usize..(at.offset as usize + at.len as usize) }
    }
}

/// The chunk's bytes, verified against its hash.
fn verified(hash: &Hash, chunk: ChunkBytes) -> Result<ChunkBytes> {
    let data = chunk
        .block
        .get(chunk.range.clone())
        .ok_or_else(|| StorageError::Corrupt(format!("chunk {} lies outside its block", hex::encode(hash))))?;
    if blake3::hash(data).as_bytes() != hash {
        return Err(StorageError::Corrupt(format!("chunk {}: content does not match its hash", hex::encode(hash))));
    }
    Ok(chunk)
}

impl Store {
    /// Pins `hash` and tells where the store already has the chunk, if it has it. The caller
    /// unpins it with [`Store::unpin_all`] once its manifest is recorded (or it gave up).
    pub(super) fn pin_and_check(&self, hash: Hash) -> Result<Option<Location>> {
        self.lock_pins().pin(hash);
        match self.chunk_location(&hash) {
            Ok(at) => Ok(at),
            Err(e) => {
                self.lock_pins().unpin(&hash);
                Err(e)
            }
        }
    }

    /// Pins a writer's chunk `hash`; where the store holds it already, if the backend tells at
    /// once (else its block's seal finds out: [`super::backend::Backend::pin_at_seal`]).
    pub(super) fn pin_chunk(&self, hash: Hash) -> Result<Option<Location>> {
        self.backend().pin_chunk(self, hash)
    }

    /// Compresses and appends the builder's chunks (and filler) as one block and indexes the chunks
    /// not indexed yet; `None` if no chunk was left to store (nothing is written then).
    pub(super) fn seal_block(&self, builder: &mut BlockBuilder) -> Result<Option<SealedBlock>> {
        if builder.is_empty() {
            *builder = BlockBuilder::default();
            return Ok(None);
        }
        {
            let _pins = self.lock_pins();
            self.backend().pin_at_seal(builder)?;
        }
        if builder.is_empty() {
            *builder = BlockBuilder::default();
            return Ok(None);
        }
        // Checked per block: an upload that crosses the reserve stops here, one block past it.
        self.ensure_space(super::WriteKind::Content)?;
        let (codec, payload) = encode(&builder.raw, self.inner.options.zstd_level);
        let payload_hash = *blake3::hash(&payload).as_bytes();
        let _sealing = self.inner.sealing.read().unwrap_or_else(|e| e.into_inner());
        let appending = std::time::Instant::now();
        let block = self.inner.packs.append(codec, builder.raw.len() as u32, &builder.members, &payload)?;
        let _pins = self.lock_pins();
        let batch = self.backend().index_sealed(self.tree(), block, builder, appending)?;
        self.tree().apply_batch(batch)?;
        // The writer knows where its chunks went: the first read of what it wrote here (an
        // upload's first download) then costs no etcd lookup per chunk.
        if let Some(cache) = self.backend().location_cache() {
            let members_len = builder.members_len();
            for m in builder.members() {
                cache.put(m.hash, Location::new(block, m, members_len));
            }
        }
        *builder = BlockBuilder::default();
        Ok(Some(SealedBlock { at: block, payload_hash }))
    }

    /// Compaction: appends the builder's chunks as a new block, makes it durable, then moves each
    /// chunk's index entry from its old location (in `olds`, parallel to the members) to it.
    pub(super) fn seal_relocated(&self, builder: &mut BlockBuilder, olds: &mut Vec<Location>) -> Result<()> {
        if builder.is_empty() {
            return Ok(());
        }
        let (codec, payload) = encode(&builder.raw, self.inner.options.zstd_level);
        let raw_len = builder.raw.len() as u32;
        self.append_moved(codec, raw_len, &builder.members, olds, raw_len, &payload)?;
        *builder = BlockBuilder::default();
        olds.clear();
        Ok(())
    }

    /// Appends a block holding `members` (its chunks' bytes `members_len` of its `raw_len`), makes
    /// it durable, then moves each member's index entry from where it was (`olds`, parallel) to it
    /// — compaction and the repacker.
    pub(super) fn append_moved(
        &self,
        codec: u8,
        raw_len: u32,
        members: &[Member],
        olds: &[Location],
        members_len: u32,
        payload: &[u8],
    ) -> Result<BlockAt> {
        let block = self.inner.packs.append(codec, raw_len, members, payload)?;
        self.inner.packs.sync()?;
        for (m, old) in members.iter().zip(olds) {
            self.relocate_chunk(&m.hash, old, &Location::new(block, m, members_len))?;
        }
        Ok(block)
    }

    /// Where a chunk is, if stored.
    pub(super) fn chunk_location(&self, hash: &Hash) -> Result<Option<Location>> {
        self.tree().get(chunk_key(hash))?.map(|v| Location::decode(&v)).transpose()
    }

    /// Moves a chunk's index entry from `old` to `new` unless it changed meanwhile (compaction);
    /// a chunk swept in between stays swept.
    pub(super) fn relocate_chunk(&self, hash: &Hash, old: &Location, new: &Location) -> Result<()> {
        let _pins = self.lock_pins();
        // `false` only means the entry changed; the copy is then dead bytes.
        let _ = self.tree().compare_and_swap(&chunk_key(hash), Some(&old.encode()), Some(&new.encode()))?;
        Ok(())
    }

    /// The raw bytes of a block, from the cache or the pack.
    pub(super) fn block(&self, at: &BlockAt) -> Result<Arc<Vec<u8>>> {
        if let Some(block) = self.inner.blocks.get(at) {
            return Ok(block);
        }
        let block = Arc::new(decode_block(at, self.inner.packs.read_payload(at)?)?);
        self.inner.blocks.put(*at, block.clone());
        Ok(block)
    }

    /// A chunk's bytes, unverified. Of a raw block (incompressible content) just the chunk is
    /// read: caching whole raw blocks would save no decompression, only hold memory.
    fn chunk_bytes(&self, at: &Location) -> Result<ChunkBytes> {
        if at.block.codec == CODEC_RAW {
            if let Some(bytes) = self.inner.packs.read_range(&at.block, at.offset, at.len)? {
                return Ok(ChunkBytes { range: 0..bytes.len(), block: Arc::new(bytes) });
            }
        }
        Ok(ChunkBytes::within(self.block(&at.block)?, at))
    }

    /// Reads and verifies one chunk; also returns its share of stored bytes.
    pub(super) fn get_chunk(&self, chunk: &ChunkRef) -> Result<(ChunkBytes, u64)> {
        let missing = || StorageError::Corrupt(format!("chunk {} is missing", hex::encode(chunk.hash)));
        let cache = self.backend().location_cache();
        let cached = cache.and_then(|c| c.get(&chunk.hash));
        let at = match cached {
            Some(at) => at,
            None => self.chunk_location(&chunk.hash)?.ok_or_else(missing)?,
        };
        let block = match self.chunk_bytes(&at) {
            Ok(block) => block,
            // Compaction may have moved the chunk between the lookup and the read: look again.
            Err(first) => {
                if let Some(cache) = cache {
                    cache.forget(&chunk.hash);
                }
                match self.chunk_location(&chunk.hash)? {
                    Some(moved) if moved != at || cached.is_some() => return self.get_chunk(chunk),
                    _ => return Err(first),
                }
            }
        };
        if let Some(cache) = cache.filter(|_| cached.is_none()) {
            cache.put(chunk.hash, at);
        }
        let data = verified(&chunk.hash, block)?;
        if data.len() != chunk.len as usize {
            return Err(StorageError::Corrupt(format!("chunk {} has the wrong length", hex::encode(chunk.hash))));
        }
        Ok((data, at.stored_share()))
    }

    /// Releases a writer's pins.
    pub(super) fn unpin_all(&self, hashes: &[Hash]) {
        let mut pins = self.lock_pins();
        let mut shared = super::meta::Batch::default();
        for hash in hashes {
            if pins.unpin(hash) {
                if let Some(key) = self.backend().shared_pin(hash) {
                    shared.remove(key);
                }
            }
        }
        if !shared.is_empty() {
            // Left behind, a pin only keeps a chunk longer: until this replica's lease ends.
            if let Err(e) = self.tree().apply_batch(shared) {
                tracing::warn!(error = %e, "could not remove pins from etcd; they go with this replica's lease");
            }
        }
    }

    /// Writes a record that makes pinned chunks reachable (a writer's manifest). Replicated: only
    /// while this replica's lease is the one its pins were taken under — once it lapsed, the
    /// collector may have taken them, so the write is refused and the writer fails.
    pub(super) fn record_while_pinned(&self, key: &[u8], value: &[u8], lease_epoch: u64) -> Result<()> {
        let mut batch = super::meta::Batch::default();
        batch.insert(key, value);
        self.backend().record_while_pinned(self.tree(), batch, key, lease_epoch)
    }

    pub(super) fn lock_pins(&self) -> std::sync::MutexGuard<'_, Pins> {
        // A poisoned lock only means another thread panicked while holding it; the map is still
        // consistent (every mutation is a single insert/remove).
        self.inner.pins.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block_at(codec: u8, raw_len: usize) -> BlockAt {
        BlockAt { pack: 1, payload_offset: 0, stored_len: 0, codec, raw_len: raw_len as u32 }
    }

    #[test]
    fn blocks_round_trip_and_chunks_are_verified() {
        let data: Vec<u8> = (0..50_000u32).map(|i| (i % 251) as u8).collect();
        let (codec, payload) = encode(&data, 3);
        assert_eq!(codec, CODEC_ZSTD);
        assert!(payload.len() < data.len());
        let block = decode_block(&block_at(codec, data.len()), payload).unwrap();
        assert_eq!(block, data);
        let block = Arc::new(block);
        let hash = *blake3::hash(&data[100..200]).as_bytes();
        let at = Location { block: block_at(codec, data.len()), offset: 100, len: 100, members_len: data.len() as u32 };
        assert_eq!(&*verified(&hash, ChunkBytes::within(block.clone(), &at)).unwrap(), &data[100..200]);
        let shifted = Location { offset: 101, ..at };
        assert!(verified(&hash, ChunkBytes::within(block.clone(), &shifted)).is_err());
        let outside = Location { offset: 49_950, ..at };
        assert!(verified(&hash, ChunkBytes::within(block, &outside)).is_err());
    }

    #[test]
    fn incompressible_blocks_are_stored_raw() {
        let mut x = 0x2545F4914F6CDD1Du64;
        let data: Vec<u8> = (0..1000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 24) as u8
            })
            .collect();
        let (codec, payload) = encode(&data, 3);
        assert_eq!(codec, CODEC_RAW);
        assert_eq!(decode_block(&block_at(codec, data.len()), payload).unwrap(), data);
    }

    #[test]
    fn locations_encode_and_decode() {
        let at = Location {
            block: BlockAt { pack: 7, payload_offset: 123_456, stored_len: 999, codec: CODEC_ZSTD, raw_len: 262_144 },
            offset: 65_536,
            len: 4_000,
            members_len: 262_144,
        };
        assert_eq!(at.encode().len(), LOCATION_LEN, "a block without filler keeps the older form");
        assert_eq!(Location::decode(&at.encode()).unwrap(), at);
        assert!(Location::decode(&at.encode()[1..]).is_err());
        let filled = Location { members_len: 131_072, ..at };
        assert_eq!(Location::decode(&filled.encode()).unwrap(), filled);
        assert_eq!(filled.stored_share(), 2 * at.stored_share() - 1, "filler is carried by the chunks' shares");
    }
}
