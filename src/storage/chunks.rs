//! Content-addressed chunks: stored once under their BLAKE3 hash, zstd-compressed by us, verified on
//! every read.
//!
//! Garbage collection uses reference counts (`r` keys) changed only under the [`Pins`] lock, in the
//! same atomic batch as the segment records that add or drop the references. A writer *pins* a hash
//! before it checks whether the chunk exists and keeps it pinned until its segment (with the count
//! increment) is written; the sweep deletes a chunk only if its count is zero and it is not pinned,
//! under the same lock. So a chunk a writer is about to reuse can never be swept under it.
//!
//! Candidates for the sweep are marked with `z` keys (new chunks, and chunks whose count fell to
//! zero), so collection costs O(garbage), not O(store), and chunks orphaned by a crash are found.

use std::collections::HashMap;

use super::packs::Location;
use super::{key, Result, StorageError, Store};

/// Chunk sizes (FastCDC): content-defined cut points between these bounds.
pub const MIN_CHUNK: u32 = 16 * 1024;
pub const AVG_CHUNK: u32 = 32 * 1024;
pub const MAX_CHUNK: u32 = 64 * 1024;

const CODEC_RAW: u8 = 0;
const CODEC_ZSTD: u8 = 1;

pub type Hash = [u8; 32];

/// A reference to a chunk inside a file's chunk list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkRef {
    pub hash: Hash,
    pub len: u32,
    /// Bytes the chunk takes in the store (for `storedSize`).
    pub stored: u32,
}

pub const CHUNK_REF_LEN: usize = 40;

impl ChunkRef {
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.hash);
        out.extend_from_slice(&self.len.to_le_bytes());
        out.extend_from_slice(&self.stored.to_le_bytes());
    }

    pub fn decode_all(bytes: &[u8]) -> Result<Vec<ChunkRef>> {
        if bytes.len() % CHUNK_REF_LEN != 0 {
            return Err(StorageError::Corrupt("segment length is not a multiple of a chunk ref".into()));
        }
        Ok(bytes
            .chunks_exact(CHUNK_REF_LEN)
            .map(|c| {
                let mut hash = [0u8; 32];
                hash.copy_from_slice(&c[..32]);
                let len = u32::from_le_bytes([c[32], c[33], c[34], c[35]]);
                let stored = u32::from_le_bytes([c[36], c[37], c[38], c[39]]);
                ChunkRef { hash, len, stored }
            })
            .collect())
    }
}

/// Hashes pinned by writers that have not yet recorded their references.
#[derive(Default)]
pub struct Pins {
    counts: HashMap<Hash, u32>,
}

impl Pins {
    fn pin(&mut self, hash: Hash) {
        *self.counts.entry(hash).or_insert(0) += 1;
    }

    fn unpin(&mut self, hash: &Hash) {
        if let Some(n) = self.counts.get_mut(hash) {
            *n -= 1;
            if *n == 0 {
                self.counts.remove(hash);
            }
        }
    }

    fn is_pinned(&self, hash: &Hash) -> bool {
        self.counts.contains_key(hash)
    }
}

fn chunk_key(hash: &Hash) -> Vec<u8> {
    key(b'c', &[hash])
}

fn ref_key(hash: &Hash) -> Vec<u8> {
    key(b'r', &[hash])
}

fn candidate_key(hash: &Hash) -> Vec<u8> {
    key(b'z', &[hash])
}

/// Compresses a chunk unless that does not pay: (codec, payload).
fn encode(data: &[u8], level: i32) -> (u8, Vec<u8>) {
    match zstd::bulk::compress(data, level) {
        Ok(compressed) if compressed.len() < data.len() => (CODEC_ZSTD, compressed),
        _ => (CODEC_RAW, data.to_vec()),
    }
}

fn decode(hash: &Hash, at: &Location, payload: Vec<u8>) -> Result<Vec<u8>> {
    let corrupt = |what: &str| StorageError::Corrupt(format!("chunk {}: {what}", hex::encode(hash)));
    let raw_len = at.raw_len as usize;
    if raw_len > MAX_CHUNK as usize {
        return Err(corrupt("length out of range"));
    }
    let data = match at.codec {
        CODEC_RAW => payload,
        CODEC_ZSTD => zstd::bulk::decompress(&payload, raw_len).map_err(|e| corrupt(&format!("zstd: {e}")))?,
        _ => return Err(corrupt("unknown codec")),
    };
    if data.len() != raw_len || blake3::hash(&data).as_bytes() != hash {
        return Err(corrupt("content does not match its hash"));
    }
    Ok(data)
}

impl Store {
    /// Stores `data` (if new) and pins it; the caller must record the reference with
    /// [`Store::record_refs`], which also unpins.
    pub(super) fn put_chunk(&self, data: &[u8]) -> Result<ChunkRef> {
        let hash: Hash = *blake3::hash(data).as_bytes();
        self.lock_pins().pin(hash);
        let stored = match self.store_new_chunk(&hash, data) {
            Ok(stored) => stored,
            Err(e) => {
                self.lock_pins().unpin(&hash);
                return Err(e);
            }
        };
        Ok(ChunkRef { hash, len: data.len() as u32, stored })
    }

    /// Writes the chunk's record unless the index already has it; returns its stored size.
    fn store_new_chunk(&self, hash: &Hash, data: &[u8]) -> Result<u32> {
        if let Some(existing) = self.tree().get(chunk_key(hash))? {
            return Ok(Location::decode(&existing)?.stored_len);
        }
        let (codec, payload) = encode(data, self.inner.options.zstd_level);
        let at = self.inner.packs.append(hash, codec, data.len() as u32, &payload)?;
        let mut batch = sled::Batch::default();
        batch.insert(chunk_key(hash), at.encode());
        batch.insert(candidate_key(hash), &[][..]);
        self.tree().apply_batch(batch)?;
        Ok(at.stored_len)
    }

    /// Where a chunk is, if stored.
    pub(super) fn chunk_location(&self, hash: &Hash) -> Result<Option<Location>> {
        self.tree().get(chunk_key(hash))?.map(|v| Location::decode(&v)).transpose()
    }

    /// Moves a chunk's index entry from `old` to `new` unless it changed meanwhile (compaction);
    /// a chunk swept in between stays swept.
    pub(super) fn relocate_chunk(&self, hash: &Hash, old: &Location, new: &Location) -> Result<()> {
        let _pins = self.lock_pins();
        // An Err(CompareAndSwapError) only means the entry changed; the copy is then dead bytes.
        let _ = self.tree().compare_and_swap(chunk_key(hash), Some(old.encode()), Some(new.encode()))?;
        Ok(())
    }

    /// Reads and verifies one chunk.
    pub(super) fn get_chunk(&self, chunk: &ChunkRef) -> Result<Vec<u8>> {
        let at = self
            .chunk_location(&chunk.hash)?
            .ok_or_else(|| StorageError::Corrupt(format!("chunk {} is missing", hex::encode(chunk.hash))))?;
        let payload = match self.inner.packs.read(&chunk.hash, &at) {
            Ok(payload) => payload,
            // Compaction may have moved the record between the lookup and the read: look again.
            Err(first) => match self.chunk_location(&chunk.hash)? {
                Some(moved) if moved != at => self.inner.packs.read(&chunk.hash, &moved)?,
                _ => return Err(first),
            },
        };
        let data = decode(&chunk.hash, &at, payload)?;
        if data.len() != chunk.len as usize {
            return Err(StorageError::Corrupt(format!("chunk {} has the wrong length", hex::encode(chunk.hash))));
        }
        Ok(data)
    }

    /// Applies `batch` together with reference-count changes (`delta` per occurrence in `refs`),
    /// atomically; then unpins `unpin` (the hashes this writer pinned for these references).
    pub(super) fn record_refs(
        &self,
        mut batch: sled::Batch,
        refs: &[ChunkRef],
        delta: i64,
        unpin: &[ChunkRef],
    ) -> Result<()> {
        let mut pins = self.lock_pins();
        let mut changes: HashMap<Hash, i64> = HashMap::new();
        for r in refs {
            *changes.entry(r.hash).or_insert(0) += delta;
        }
        for (hash, change) in &changes {
            let current = match self.tree().get(ref_key(hash))? {
                Some(v) => super::read_be(&v)?,
                None => 0,
            };
            let next = (current as i64 + change).max(0) as u64;
            if next == 0 {
                batch.remove(ref_key(hash));
                batch.insert(candidate_key(hash), &[][..]);
            } else {
                batch.insert(ref_key(hash), &super::be(next)[..]);
            }
        }
        let result = self.tree().apply_batch(batch);
        for r in unpin {
            pins.unpin(&r.hash);
        }
        result.map_err(Into::into)
    }

    /// Releases pins without recording references (a writer that gave up).
    pub(super) fn unpin(&self, refs: &[ChunkRef]) {
        let mut pins = self.lock_pins();
        for r in refs {
            pins.unpin(&r.hash);
        }
    }

    /// Deletes every candidate chunk that has no references and no pin. Returns chunks removed.
    pub(super) fn sweep_chunks(&self) -> Result<u64> {
        let mut removed = 0;
        let candidates: Vec<Hash> = self
            .tree()
            .scan_prefix(b"z")
            .keys()
            .filter_map(|k| k.ok())
            .filter_map(|k| k.get(1..33).and_then(|h| h.try_into().ok()))
            .collect();
        for hash in candidates {
            let pins = self.lock_pins();
            let mut batch = sled::Batch::default();
            batch.remove(candidate_key(&hash));
            if !pins.is_pinned(&hash) && self.tree().get(ref_key(&hash))?.is_none() {
                batch.remove(chunk_key(&hash));
                removed += 1;
            }
            self.tree().apply_batch(batch)?;
        }
        Ok(removed)
    }

    fn lock_pins(&self) -> std::sync::MutexGuard<'_, Pins> {
        // A poisoned lock only means another thread panicked while holding it; the map is still
        // consistent (every mutation is a single insert/remove).
        self.inner.pins.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(codec: u8, raw_len: usize) -> Location {
        Location { pack: 1, offset: 0, codec, raw_len: raw_len as u32, stored_len: 0 }
    }

    #[test]
    fn codec_round_trips_and_detects_corruption() {
        let data: Vec<u8> = (0..50_000u32).map(|i| (i % 251) as u8).collect();
        let hash = *blake3::hash(&data).as_bytes();
        let (codec, mut payload) = encode(&data, 3);
        assert_eq!(codec, CODEC_ZSTD);
        assert!(payload.len() < data.len());
        assert_eq!(decode(&hash, &at(codec, data.len()), payload.clone()).unwrap(), data);
        let last = payload.len() - 1;
        payload[last] ^= 0xff;
        assert!(decode(&hash, &at(codec, data.len()), payload).is_err());
    }

    #[test]
    fn incompressible_chunks_are_stored_raw() {
        let mut x = 0x2545F4914F6CDD1Du64;
        let data: Vec<u8> = (0..1000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 24) as u8
            })
            .collect();
        let hash = *blake3::hash(&data).as_bytes();
        let (codec, payload) = encode(&data, 3);
        assert_eq!(codec, CODEC_RAW);
        assert_eq!(decode(&hash, &at(codec, data.len()), payload).unwrap(), data);
    }
}
