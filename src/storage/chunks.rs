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

use super::{key, Result, Store, StorageError};

/// Chunk sizes (FastCDC): content-defined cut points between these bounds.
pub const MIN_CHUNK: u32 = 16 * 1024;
pub const AVG_CHUNK: u32 = 32 * 1024;
pub const MAX_CHUNK: u32 = 64 * 1024;

const CODEC_RAW: u8 = 0;
const CODEC_ZSTD: u8 = 1;
const HEADER: usize = 5; // codec byte + raw length (u32 LE)

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

/// Raw (uncompressed) length recorded in a stored chunk.
pub fn raw_len(stored: &[u8]) -> Option<u32> {
    let b = stored.get(1..HEADER)?;
    Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

fn encode(data: &[u8], level: i32) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + data.len() / 2);
    let compressed = zstd::bulk::compress(data, level).ok().filter(|c| c.len() < data.len());
    out.push(if compressed.is_some() { CODEC_ZSTD } else { CODEC_RAW });
    out.extend_from_slice(&(data.len() as u32).to_le_bytes());
    out.extend_from_slice(compressed.as_deref().unwrap_or(data));
    out
}

fn decode(hash: &Hash, stored: &[u8]) -> Result<Vec<u8>> {
    let corrupt = |what: &str| StorageError::Corrupt(format!("chunk {}: {what}", hex::encode(hash)));
    let raw_len = raw_len(stored).ok_or_else(|| corrupt("short record"))? as usize;
    if raw_len > super::chunks::MAX_CHUNK as usize {
        return Err(corrupt("length out of range"));
    }
    let payload = &stored[HEADER..];
    let data = match stored[0] {
        CODEC_RAW => payload.to_vec(),
        CODEC_ZSTD => zstd::bulk::decompress(payload, raw_len).map_err(|e| corrupt(&format!("zstd: {e}")))?,
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
        let stored = match self.tree().get(chunk_key(&hash)) {
            Ok(Some(existing)) => existing.len() as u32,
            Ok(None) => {
                let value = encode(data, self.inner.options.zstd_level);
                let len = value.len() as u32;
                let mut batch = sled::Batch::default();
                batch.insert(chunk_key(&hash), value);
                batch.insert(candidate_key(&hash), &[][..]);
                if let Err(e) = self.tree().apply_batch(batch) {
                    self.lock_pins().unpin(&hash);
                    return Err(e.into());
                }
                len
            }
            Err(e) => {
                self.lock_pins().unpin(&hash);
                return Err(e.into());
            }
        };
        Ok(ChunkRef { hash, len: data.len() as u32, stored })
    }

    /// Reads and verifies one chunk.
    pub(super) fn get_chunk(&self, chunk: &ChunkRef) -> Result<Vec<u8>> {
        let stored = self
            .tree()
            .get(chunk_key(&chunk.hash))?
            .ok_or_else(|| StorageError::Corrupt(format!("chunk {} is missing", hex::encode(chunk.hash))))?;
        let data = decode(&chunk.hash, &stored)?;
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

    #[test]
    fn codec_round_trips_and_detects_corruption() {
        let data: Vec<u8> = (0..50_000u32).map(|i| (i % 251) as u8).collect();
        let hash = *blake3::hash(&data).as_bytes();
        let mut stored = encode(&data, 3);
        assert!(stored.len() < data.len());
        assert_eq!(decode(&hash, &stored).unwrap(), data);
        let last = stored.len() - 1;
        stored[last] ^= 0xff;
        assert!(decode(&hash, &stored).is_err());
    }

    #[test]
    fn incompressible_chunks_are_stored_raw() {
        let data: Vec<u8> = (0..1000u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
        let hash = *blake3::hash(&data).as_bytes();
        let stored = encode(&data, 3);
        assert_eq!(decode(&hash, &stored).unwrap(), data);
    }
}
