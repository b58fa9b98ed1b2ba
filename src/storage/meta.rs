//! The metadata map under the store: sorted byte keys to byte values, in sled (embedded) or in
//! etcd (replicated, [`super::remote`]). The rest of the store is written once against this
//! narrow, sled-shaped surface: point reads and writes, ordered scans, atomic batches, and
//! compare-and-swap.
//!
//! What differs, and is stated where it matters: in etcd a [`Batch`] is one transaction, and etcd
//! caps a transaction's operations (`--max-txn-ops`, 128 by default), so a batch larger than that
//! is applied in several transactions — callers that need one atomic step use the guarded
//! transactions of [`EtcdMeta`] (`apply_if_at`, `apply_when`), which refuse instead of
//! splitting. Scans read in pages; like sled's, they are not a snapshot (each page is current
//! when read).

use std::collections::BTreeMap;
use std::ops::{Bound, RangeBounds};

use sled::IVec;

use super::remote::{EtcdMeta, Mirror};
use super::Result;

/// An ordered set of writes; the last one on a key wins (as in sled).
#[derive(Default)]
pub struct Batch {
    ops: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
}

impl Batch {
    pub fn insert(&mut self, key: impl AsRef<[u8]>, value: impl AsRef<[u8]>) {
        self.ops.insert(key.as_ref().to_vec(), Some(value.as_ref().to_vec()));
    }

    pub fn remove(&mut self, key: impl AsRef<[u8]>) {
        self.ops.insert(key.as_ref().to_vec(), None);
    }

    pub fn len(&self) -> usize {
        self.ops.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// The keys it writes or removes.
    pub fn keys(&self) -> impl Iterator<Item = &[u8]> {
        self.ops.keys().map(Vec::as_slice)
    }

    /// Adds `other`'s operations; on a key both have, `other`'s.
    pub fn extend(&mut self, other: Batch) {
        self.ops.extend(other.ops);
    }

    pub(super) fn into_ops(self) -> impl Iterator<Item = (Vec<u8>, Option<Vec<u8>>)> {
        self.ops.into_iter()
    }
}

/// A scan's items, oldest key first.
pub type MetaIter<'a> = Box<dyn Iterator<Item = Result<(IVec, IVec)>> + Send + 'a>;

/// The map: sled's tree, or a prefix of etcd's keyspace.
pub enum Meta {
    Sled(sled::Tree),
    Etcd(std::sync::Arc<EtcdMeta>),
}

impl Meta {
    pub fn get(&self, key: impl AsRef<[u8]>) -> Result<Option<IVec>> {
        match self {
            Meta::Sled(tree) => Ok(tree.get(key)?),
            Meta::Etcd(etcd) => etcd.get(key.as_ref()),
        }
    }

    /// etcd: how many pages scans have read from etcd so far (a scan's items come a page at a
    /// time, so a reader can tell whether it saw newer state since it last looked). sled: `None`,
    /// every item of a scan is read anew.
    pub fn pages_read(&self) -> Option<u64> {
        match self {
            Meta::Sled(_) => None,
            Meta::Etcd(etcd) => Some(etcd.pages_read()),
        }
    }

    pub fn contains_key(&self, key: impl AsRef<[u8]>) -> Result<bool> {
        match self {
            Meta::Sled(tree) => Ok(tree.contains_key(key)?),
            Meta::Etcd(etcd) => Ok(etcd.get(key.as_ref())?.is_some()),
        }
    }

    pub fn insert(&self, key: impl AsRef<[u8]>, value: impl AsRef<[u8]>) -> Result<()> {
        let mut batch = Batch::default();
        batch.insert(key, value);
        self.apply_batch(batch)
    }

    pub fn remove(&self, key: impl AsRef<[u8]>) -> Result<()> {
        let mut batch = Batch::default();
        batch.remove(key);
        self.apply_batch(batch)
    }

    /// Keys starting with `prefix`, in order.
    pub fn scan_prefix(&self, prefix: impl AsRef<[u8]>) -> MetaIter<'_> {
        let prefix = prefix.as_ref().to_vec();
        match prefix_end(&prefix) {
            Some(end) => self.range(prefix..end),
            None => self.range(prefix..),
        }
    }

    /// Keys in `range`, in order.
    pub fn range<R: RangeBounds<Vec<u8>>>(&self, range: R) -> MetaIter<'_> {
        let start = range.start_bound().cloned();
        let end = range.end_bound().cloned();
        match self {
            Meta::Sled(tree) => {
                Box::new(tree.range::<Vec<u8>, (Bound<Vec<u8>>, Bound<Vec<u8>>)>((start, end)).map(|item| Ok(item?)))
            }
            Meta::Etcd(etcd) => Box::new(etcd.range(start, end)),
        }
    }

    /// Applies the batch: atomically in sled; in etcd in transactions of at most the configured
    /// operation count (see the module doc).
    pub fn apply_batch(&self, batch: Batch) -> Result<()> {
        match self {
            Meta::Sled(tree) => Ok(tree.apply_batch(sled_batch(batch))?),
            Meta::Etcd(etcd) => etcd.apply(batch),
        }
    }

    /// Replaces `old` with `new` at `key` (`None`: absent); `Ok(false)` if the key held something
    /// else.
    pub fn compare_and_swap(&self, key: &[u8], old: Option<&[u8]>, new: Option<&[u8]>) -> Result<bool> {
        match self {
            Meta::Sled(tree) => Ok(tree.compare_and_swap(key, old, new)?.is_ok()),
            Meta::Etcd(etcd) => {
                let mut batch = Batch::default();
                match new {
                    Some(new) => batch.insert(key, new),
                    None => batch.remove(key),
                }
                etcd.apply_if(batch, key, old)
            }
        }
    }
}

/// Where the read paths (GET, LIST, watches, the change log's followers) read the map: the map
/// itself, or, replicated with an object cache, the replica's [`Mirror`] of it, which answers
/// what it holds while it serves and hands everything else to etcd.
#[derive(Clone, Copy)]
pub enum Reads<'a> {
    Map(&'a Meta),
    Mirror(&'a Mirror, &'a EtcdMeta),
    /// The mirror alone, for writers whose compare-and-swap vouches for one consistent source:
    /// a read it cannot answer is an error (the writer then reads the map), never a read of etcd
    /// mixed with the mirror's older state.
    MirrorOnly(&'a Mirror),
}

impl<'a> Reads<'a> {
    pub fn get(self, key: impl AsRef<[u8]>) -> Result<Option<IVec>> {
        match self {
            Reads::Map(meta) => meta.get(key),
            Reads::Mirror(mirror, etcd) => match mirror.get(key.as_ref()) {
                Some(found) => Ok(found),
                None => etcd.get(key.as_ref()),
            },
            Reads::MirrorOnly(mirror) => mirror.get(key.as_ref()).ok_or_else(stopped),
        }
    }

    /// Keys in `range`, in order (from the mirror while it serves; see [`Mirror::range`]).
    pub fn range<R: RangeBounds<Vec<u8>>>(self, range: R) -> MetaIter<'a> {
        match self {
            Reads::Map(meta) => meta.range(range),
            Reads::Mirror(mirror, etcd) => {
                let (start, end) = (range.start_bound().cloned(), range.end_bound().cloned());
                match mirror.range(etcd, start.clone(), end.clone()) {
                    Some(scan) => Box::new(scan),
                    None => Box::new(etcd.range(start, end)),
                }
            }
            // Writers only read single keys.
            Reads::MirrorOnly(_) => Box::new(std::iter::once(Err(stopped()))),
        }
    }

    /// [`Meta::pages_read`]; with a mirror, its pages and etcd's together (either moving means a
    /// scan may have seen newer state).
    pub fn pages_read(self) -> Option<u64> {
        match self {
            Reads::Map(meta) => meta.pages_read(),
            Reads::Mirror(mirror, etcd) => Some(etcd.pages_read().wrapping_add(mirror.pages_read())),
            Reads::MirrorOnly(mirror) => Some(mirror.pages_read()),
        }
    }
}

fn stopped() -> super::StorageError {
    super::StorageError::Remote("the object cache stopped serving during a write; read etcd".into())
}

fn sled_batch(batch: Batch) -> sled::Batch {
    let mut out = sled::Batch::default();
    for (key, value) in batch.into_ops() {
        match value {
            Some(value) => out.insert(key, value),
            None => out.remove(key),
        }
    }
    out
}

/// The first key after every key that starts with `prefix` (`None`: no such key).
pub fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_ends_carry_past_0xff() {
        assert_eq!(prefix_end(b"ab"), Some(b"ac".to_vec()));
        assert_eq!(prefix_end(&[1, 0xff]), Some(vec![2]));
        assert_eq!(prefix_end(&[0xff, 0xff]), None);
    }

    #[test]
    fn the_last_write_to_a_key_in_a_batch_wins() {
        let db = sled::Config::new().temporary(true).open().unwrap();
        let meta = Meta::Sled((*db).clone());
        meta.insert(b"k1", b"old").unwrap();
        let mut batch = Batch::default();
        batch.remove(b"k1");
        batch.insert(b"k1", b"new");
        batch.insert(b"k2", b"x");
        batch.remove(b"k2");
        meta.apply_batch(batch).unwrap();
        assert_eq!(meta.get(b"k1").unwrap().unwrap(), b"new");
        assert!(!meta.contains_key(b"k2").unwrap());
        let keys: Vec<IVec> = meta.scan_prefix(b"k").map(|item| item.unwrap().0).collect();
        assert_eq!(keys, vec![IVec::from(b"k1")]);
        assert!(meta.compare_and_swap(b"k1", Some(b"new"), Some(b"newer")).unwrap());
        assert!(!meta.compare_and_swap(b"k1", Some(b"new"), None).unwrap());
    }
}
