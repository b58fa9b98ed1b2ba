//! Append-only pack files holding compressed blocks of chunks; sled keeps only their small index.
//!
//! Why not sled values: measured here, sled 0.34 kept every inserted chunk in memory until process
//! exit (1 GiB upload → 1.8 GiB RSS, `cache_capacity` ignored for writes) and took 1.7× the bytes
//! on disk. Pack files make memory independent of content size and space use predictable.
//!
//! A record is one *block*: several chunks compressed together (zstd needs context: bundle YAML cut
//! into independent 32 KiB frames compresses about half as well as the same bytes in 256 KiB
//! blocks). Layout: `magic, codec(1), raw_len(4), stored_len(4), count(2)`, then `count` directory
//! entries `hash(32), offset(4), len(4)` naming the chunks inside, then the payload. Writers append
//! to the *active* pack (a new one after every start and every [`PACK_ROLL_BYTES`]), so a torn tail
//! left by a crash is never appended to.
//!
//! [`Packs::sync`] runs before any commit is acknowledged and must cover exactly what was appended
//! before it started, whoever else is syncing: syncs run one at a time, and each fsyncs every pack
//! written past what the previous one covered (the active pack's length when that one began is
//! kept). A caller arriving while another sync runs waits for it, then syncs what that one did not
//! cover. A failed fsync poisons the store ([`super::durability`]): the pages it could not write
//! may be marked clean, so no later sync could be believed.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use super::durability::{self, Poison};
use super::{Result, StorageError};

const MAGIC: &[u8; 4] = b"SWB1";
const HEADER: usize = 4 + 1 + 4 + 4 + 2;
const DIRECTORY_ENTRY: usize = 32 + 4 + 4;
/// Packs roll over at this size.
pub const PACK_ROLL_BYTES: u64 = 128 << 20;
/// Largest raw block a record may claim (guards scans of damaged files): the repacker's
/// ([`super::repack::REPACK_BLOCK`]).
const MAX_BLOCK_RAW: u32 = super::repack::REPACK_BLOCK as u32;

/// A chunk inside a block: its hash and byte range in the block's raw (uncompressed) bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Member {
    pub hash: [u8; 32],
    pub offset: u32,
    pub len: u32,
}

/// Where a block's payload is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BlockAt {
    pub pack: u64,
    pub payload_offset: u64,
    pub stored_len: u32,
    pub codec: u8,
    pub raw_len: u32,
}

/// A block read back by a scan.
pub struct ScannedBlock {
    pub at: BlockAt,
    pub members: Vec<Member>,
    pub payload: Vec<u8>,
}

struct Active {
    id: u64,
    file: Arc<File>,
    /// Bytes appended (each append completes under the lock before it is counted).
    len: u64,
}

/// What the last successful sync covered of the active pack: its id and length when it began.
#[derive(Default)]
struct Synced {
    pack: u64,
    len: u64,
}

/// The pack files of a store.
pub struct Packs {
    dir: PathBuf,
    active: Mutex<Option<Active>>,
    open: RwLock<HashMap<u64, Arc<File>>>,
    /// Packs rolled over since the last sync began, with bytes it may not have covered.
    unsynced: Mutex<Vec<Arc<File>>>,
    /// Held for a whole sync, so syncs run one after another; see the module doc.
    syncing: Mutex<Synced>,
    next_id: Mutex<u64>,
    poison: Arc<Poison>,
}

fn pack_name(id: u64) -> String {
    format!("pack-{id:016x}.dat")
}

fn parse_pack_name(name: &str) -> Option<u64> {
    u64::from_str_radix(name.strip_prefix("pack-")?.strip_suffix(".dat")?, 16).ok()
}

/// The little-endian u32 at the start of `b` (0 if `b` is shorter: callers pass fixed-size parts).
fn le32(b: &[u8]) -> u32 {
    b.first_chunk::<4>().map_or(0, |b| u32::from_le_bytes(*b))
}

impl Packs {
    pub fn open(dir: &Path, poison: Arc<Poison>) -> Result<Packs> {
        std::fs::create_dir_all(dir)?;
        let highest = Self::list_in(dir)?.into_iter().max().unwrap_or(0);
        Ok(Packs {
            dir: dir.to_path_buf(),
            active: Mutex::new(None),
            open: RwLock::new(HashMap::new()),
            unsynced: Mutex::new(Vec::new()),
            syncing: Mutex::new(Synced::default()),
            next_id: Mutex::new(highest + 1),
            poison,
        })
    }

    fn list_in(dir: &Path) -> Result<Vec<u64>> {
        let mut ids = Vec::new();
        for entry in std::fs::read_dir(dir)? {
            if let Some(id) = entry?.file_name().to_str().and_then(parse_pack_name) {
                ids.push(id);
            }
        }
        Ok(ids)
    }

    /// Ids of all pack files.
    pub fn list(&self) -> Result<Vec<u64>> {
        Self::list_in(&self.dir)
    }

    pub fn active_id(&self) -> Option<u64> {
        lock(&self.active).as_ref().map(|a| a.id)
    }

    /// Seals the active pack (the next append starts a new one), so compaction may reclaim it.
    pub fn roll(&self) {
        if let Some(old) = lock(&self.active).take() {
            self.sealed(old);
        }
    }

    /// A pack is no longer active: the next sync fsyncs it (again, if the last one covered it:
    /// cheap, and it need not know how far that one got).
    fn sealed(&self, old: Active) {
        if old.len > 0 {
            lock(&self.unsynced).push(old.file);
        }
    }

    fn path(&self, id: u64) -> PathBuf {
        self.dir.join(pack_name(id))
    }

    /// Appends a block record; returns where its payload went.
    pub fn append(&self, codec: u8, raw_len: u32, members: &[Member], payload: &[u8]) -> Result<BlockAt> {
        let (record, payload_start) = encode_record(codec, raw_len, members, payload)?;
        let mut guard = lock(&self.active);
        if guard.as_ref().is_none_or(|a| a.len >= PACK_ROLL_BYTES) {
            if let Some(old) = guard.take() {
                self.sealed(old);
            }
            *guard = Some(self.create_pack()?);
        }
        let active = guard.as_mut().ok_or_else(|| StorageError::Corrupt("no active pack".into()))?;
        let offset = active.len;
        active.file.write_all_at(&record, offset)?;
        active.len += record.len() as u64;
        Ok(BlockAt {
            pack: active.id,
            payload_offset: offset + payload_start,
            stored_len: payload.len() as u32,
            codec,
            raw_len,
        })
    }

    fn create_pack(&self) -> Result<Active> {
        let mut next = lock(&self.next_id);
        let id = *next;
        *next += 1;
        let file = Arc::new(OpenOptions::new().create_new(true).read(true).write(true).open(self.path(id))?);
        // Make the new file's directory entry durable too.
        durability::sync_dir(&self.dir).map_err(|e| self.poison.poison("fsync of the packs directory", e))?;
        write_lock(&self.open).insert(id, file.clone());
        Ok(Active { id, file, len: 0 })
    }

    /// Makes every record appended before the call durable; see the module doc.
    pub fn sync(&self) -> Result<()> {
        let mut synced = lock(&self.syncing);
        // Also refuses once the sync this one waited for failed.
        self.poison.check()?;
        // The active pack as it is now, then the packs rolled over until now: whatever was
        // appended before this call is in one of them (a roll-over queues the old pack under the
        // same lock as it replaces the active one).
        let active = lock(&self.active).as_ref().map(|a| (a.id, a.file.clone(), a.len));
        let rolled: Vec<Arc<File>> = std::mem::take(&mut *lock(&self.unsynced));
        for file in rolled {
            file.sync_data().map_err(|e| self.poison.poison("fsync of a pack file", e))?;
        }
        if let Some((pack, file, len)) = active {
            if pack != synced.pack || len > synced.len {
                file.sync_data().map_err(|e| self.poison.poison("fsync of a pack file", e))?;
                *synced = Synced { pack, len };
            }
        }
        Ok(())
    }

    fn file(&self, id: u64) -> Result<Arc<File>> {
        if let Some(file) = read_lock(&self.open).get(&id) {
            return Ok(file.clone());
        }
        let file = Arc::new(
            File::open(self.path(id))
                .map_err(|e| StorageError::Corrupt(format!("pack {} cannot be opened: {e}", pack_name(id))))?,
        );
        write_lock(&self.open).insert(id, file.clone());
        Ok(file)
    }

    /// Reads a block's (still compressed) payload.
    pub fn read_payload(&self, at: &BlockAt) -> Result<Vec<u8>> {
        let file = self.file(at.pack)?;
        let mut payload = vec![0u8; at.stored_len as usize];
        file.read_exact_at(&mut payload, at.payload_offset)
            .map_err(|e| StorageError::Corrupt(format!("pack {}: short read: {e}", pack_name(at.pack))))?;
        Ok(payload)
    }

    /// `len` bytes at `offset` into a block's payload (of a raw block: the bytes themselves).
    pub fn read_range(&self, at: &BlockAt, offset: u32, len: u32) -> Result<Vec<u8>> {
        if u64::from(offset) + u64::from(len) > u64::from(at.stored_len) {
            return Err(StorageError::Corrupt(format!("pack {}: a range past its block", pack_name(at.pack))));
        }
        let file = self.file(at.pack)?;
        let mut bytes = vec![0u8; len as usize];
        file.read_exact_at(&mut bytes, at.payload_offset + u64::from(offset))
            .map_err(|e| StorageError::Corrupt(format!("pack {}: short read: {e}", pack_name(at.pack))))?;
        Ok(bytes)
    }

    /// Bytes in a pack file.
    pub fn size(&self, id: u64) -> Result<u64> {
        Ok(std::fs::metadata(self.path(id))?.len())
    }

    /// Walks a pack's blocks in order. Stops at a torn or damaged tail.
    pub fn scan(&self, id: u64, visit: impl FnMut(ScannedBlock) -> Result<()>) -> Result<()> {
        scan_records(id, &mut std::io::BufReader::new(File::open(self.path(id))?), visit)
    }

    /// Deletes a pack file (open handles keep working until dropped).
    pub fn remove(&self, id: u64) -> Result<()> {
        write_lock(&self.open).remove(&id);
        std::fs::remove_file(self.path(id))?;
        Ok(())
    }

    /// Total bytes of all pack files.
    pub fn disk_bytes(&self) -> Result<u64> {
        let mut total = 0;
        for id in self.list()? {
            total += self.size(id).unwrap_or(0);
        }
        Ok(total)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn read_lock<T>(m: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    m.read().unwrap_or_else(|e| e.into_inner())
}

fn write_lock<T>(m: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    m.write().unwrap_or_else(|e| e.into_inner())
}

/// A block's record (see the module doc) and where its payload starts in it.
pub fn encode_record(codec: u8, raw_len: u32, members: &[Member], payload: &[u8]) -> Result<(Vec<u8>, u64)> {
    let count =
        u16::try_from(members.len()).map_err(|_| StorageError::Corrupt("too many chunks in one block".into()))?;
    let mut record = Vec::with_capacity(HEADER + members.len() * DIRECTORY_ENTRY + payload.len());
    record.extend_from_slice(MAGIC);
    record.push(codec);
    record.extend_from_slice(&raw_len.to_le_bytes());
    record.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    record.extend_from_slice(&count.to_le_bytes());
    for m in members {
        record.extend_from_slice(&m.hash);
        record.extend_from_slice(&m.offset.to_le_bytes());
        record.extend_from_slice(&m.len.to_le_bytes());
    }
    let payload_start = record.len() as u64;
    record.extend_from_slice(payload);
    Ok((record, payload_start))
}

/// Walks the block records in `reader` (pack `id`) in order. Stops at a torn or damaged tail.
pub fn scan_records(id: u64, reader: &mut impl Read, mut visit: impl FnMut(ScannedBlock) -> Result<()>) -> Result<()> {
    let mut offset = 0u64;
    loop {
        let mut header = [0u8; HEADER];
        if reader.read_exact(&mut header).is_err() || &header[..4] != MAGIC {
            return Ok(());
        }
        let (codec, raw_len, stored_len) = (header[4], le32(&header[5..9]), le32(&header[9..13]));
        let count = u16::from_le_bytes([header[13], header[14]]) as usize;
        if raw_len > MAX_BLOCK_RAW || stored_len > MAX_BLOCK_RAW {
            return Ok(());
        }
        let mut directory = vec![0u8; count * DIRECTORY_ENTRY];
        let mut payload = vec![0u8; stored_len as usize];
        if reader.read_exact(&mut directory).is_err() || reader.read_exact(&mut payload).is_err() {
            return Ok(());
        }
        let members = directory
            .chunks_exact(DIRECTORY_ENTRY)
            .filter_map(|e| {
                let (hash, rest) = e.split_first_chunk::<32>()?;
                let (offset, len) = rest.split_at_checked(4)?;
                Some(Member { hash: *hash, offset: le32(offset), len: le32(len) })
            })
            .collect();
        let payload_offset = offset + (HEADER + directory.len()) as u64;
        offset = payload_offset + stored_len as u64;
        visit(ScannedBlock { at: BlockAt { pack: id, payload_offset, stored_len, codec, raw_len }, members, payload })?;
    }
}
