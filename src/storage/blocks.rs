//! Where blocks live: pack files in the data directory (embedded) or objects in S3-compatible
//! storage (replicated, [`super::remote::S3Blocks`]). One surface for both, so chunk indexing,
//! reading, collection and compaction are written once.

use super::packs::{BlockAt, Member, Packs, ScannedBlock};
use super::remote::S3Blocks;
use super::Result;

pub enum BlockStore {
    Files(Packs),
    Remote(S3Blocks),
}

impl BlockStore {
    pub fn append(&self, codec: u8, raw_len: u32, members: &[Member], payload: &[u8]) -> Result<BlockAt> {
        match self {
            BlockStore::Files(packs) => packs.append(codec, raw_len, members, payload),
            BlockStore::Remote(s3) => s3.append(codec, raw_len, members, payload),
        }
    }

    /// Makes every block appended so far durable (object storage: already is).
    pub fn sync(&self) -> Result<()> {
        match self {
            BlockStore::Files(packs) => packs.sync(),
            BlockStore::Remote(_) => Ok(()),
        }
    }

    pub fn read_payload(&self, at: &BlockAt) -> Result<Vec<u8>> {
        match self {
            BlockStore::Files(packs) => packs.read_payload(at),
            BlockStore::Remote(s3) => s3.read_payload(at),
        }
    }

    /// Part of a block's payload, where the store can read one without the whole (pack files).
    pub fn read_range(&self, at: &BlockAt, offset: u32, len: u32) -> Result<Option<Vec<u8>>> {
        match self {
            BlockStore::Files(packs) => packs.read_range(at, offset, len).map(Some),
            BlockStore::Remote(_) => Ok(None),
        }
    }

    /// The packs collection may look at (object storage: blocks past their grace period).
    pub fn list(&self) -> Result<Vec<u64>> {
        match self {
            BlockStore::Files(packs) => packs.list(),
            BlockStore::Remote(s3) => s3.list(),
        }
    }

    /// The pack being appended to (object storage: none, every block is sealed when written).
    pub fn active_id(&self) -> Option<u64> {
        match self {
            BlockStore::Files(packs) => packs.active_id(),
            BlockStore::Remote(_) => None,
        }
    }

    pub fn roll(&self) {
        if let BlockStore::Files(packs) = self {
            packs.roll();
        }
    }

    pub fn size(&self, id: u64) -> Result<u64> {
        match self {
            BlockStore::Files(packs) => packs.size(id),
            BlockStore::Remote(s3) => s3.size(id),
        }
    }

    pub fn scan(&self, id: u64, visit: impl FnMut(ScannedBlock) -> Result<()>) -> Result<()> {
        match self {
            BlockStore::Files(packs) => packs.scan(id, visit),
            BlockStore::Remote(s3) => s3.scan(id, visit),
        }
    }

    pub fn remove(&self, id: u64) -> Result<()> {
        match self {
            BlockStore::Files(packs) => packs.remove(id),
            BlockStore::Remote(s3) => s3.remove(id),
        }
    }

    /// Bytes of the pack files (object storage: not counted here; the bucket's owner sees them).
    pub fn disk_bytes(&self) -> Result<u64> {
        match self {
            BlockStore::Files(packs) => packs.disk_bytes(),
            BlockStore::Remote(_) => Ok(0),
        }
    }
}
