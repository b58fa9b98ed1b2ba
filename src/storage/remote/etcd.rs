//! [`super::super::meta::Meta`] in etcd: the store's keys under `<prefix>/s/`, read with linearizable
//! ranges in pages, written in transactions.

use std::ops::Bound;
use std::sync::Arc;

use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse};
use sled::IVec;

use super::metrics::{kind, op};
use super::{remote_error, Remote, DEFAULT_MAX_TXN_OPS};
use crate::storage::meta::{prefix_end, Batch};
use crate::storage::{Result, StorageError};

/// Keys read per range request of a scan (small in unit tests, so that their scans span pages).
const SCAN_PAGE: i64 = if cfg!(test) { 16 } else { 512 };

/// The store's map in etcd.
pub struct EtcdMeta {
    remote: Arc<Remote>,
    /// `<prefix>/s/`.
    base: Vec<u8>,
    max_ops: usize,
    /// Pages read by scans ([`EtcdMeta::pages_read`]).
    pages: std::sync::atomic::AtomicU64,
}

impl EtcdMeta {
    pub fn new(remote: Arc<Remote>) -> EtcdMeta {
        let base = remote.key(b"s/");
        let max_ops = match remote.options.etcd_max_txn_ops {
            0 => DEFAULT_MAX_TXN_OPS,
            n => n,
        };
        EtcdMeta { remote, base, max_ops, pages: std::sync::atomic::AtomicU64::new(0) }
    }

    /// Pages read by scans so far, counted once each page has arrived.
    pub fn pages_read(&self) -> u64 {
        self.pages.load(std::sync::atomic::Ordering::Acquire)
    }

    pub fn remote(&self) -> &Arc<Remote> {
        &self.remote
    }

    /// The etcd key of a store key.
    pub fn full_key(&self, key: &[u8]) -> Vec<u8> {
        [self.base.as_slice(), key].concat()
    }

    pub fn get(&self, key: &[u8]) -> Result<Option<IVec>> {
        let mut etcd = self.remote.etcd.clone();
        let full = self.full_key(key);
        let get = async move { etcd.get(full, None).await };
        let mut answer =
            self.remote.block_on(self.remote.metrics().etcd(op::GET, kind::STORE, get)).map_err(etcd_error)?;
        Ok(answer.take_kvs().into_iter().next().map(|kv| IVec::from(kv.value())))
    }

    /// The keys in `[start, end)`, fetched a page at a time as the iterator is consumed.
    pub fn range(
        &self,
        start: Bound<Vec<u8>>,
        end: Bound<Vec<u8>>,
    ) -> impl Iterator<Item = Result<(IVec, IVec)>> + Send + '_ {
        let from = match start {
            Bound::Included(k) => self.full_key(&k),
            Bound::Excluded(k) => [self.full_key(&k), vec![0]].concat(),
            Bound::Unbounded => self.base.clone(),
        };
        let to = match end {
            Bound::Included(k) => [self.full_key(&k), vec![0]].concat(),
            Bound::Excluded(k) => self.full_key(&k),
            Bound::Unbounded => prefix_end(&self.base).unwrap_or_default(),
        };
        Scan { meta: self, next: Some(from), end: to, page: Vec::new().into_iter() }
    }

    /// Applies a batch in transactions of at most `--etcd-max-txn-ops` operations.
    pub fn apply(&self, batch: Batch) -> Result<()> {
        let ops: Vec<TxnOp> = self.ops(batch);
        for group in ops.chunks(self.max_ops) {
            self.txn(Txn::new().and_then(group.to_vec()))?;
        }
        Ok(())
    }

    /// Applies a batch in one transaction if `guard` holds `expected`.
    pub fn apply_if(&self, batch: Batch, guard: &[u8], expected: Option<&[u8]>) -> Result<bool> {
        Ok(self.apply_if_at(batch, guard, expected)?.is_some())
    }

    /// [`EtcdMeta::apply_if`], telling the etcd revision the transaction made (`None`: `guard`
    /// held something else, nothing was written).
    pub fn apply_if_at(&self, batch: Batch, guard: &[u8], expected: Option<&[u8]>) -> Result<Option<i64>> {
        self.apply_when_at(batch, vec![self.holds(guard, expected)])
    }

    /// Applies a batch in one transaction if every comparison holds.
    pub fn apply_when(&self, batch: Batch, compares: Vec<Compare>) -> Result<bool> {
        Ok(self.apply_when_at(batch, compares)?.is_some())
    }

    /// [`EtcdMeta::apply_when`], telling the etcd revision the transaction made (`None`: a
    /// comparison failed).
    fn apply_when_at(&self, batch: Batch, compares: Vec<Compare>) -> Result<Option<i64>> {
        let ops = self.ops(batch);
        if ops.len() + compares.len() > self.max_ops {
            return Err(StorageError::Remote(format!(
                "one write needs {} etcd operations, more than --etcd-max-txn-ops ({})",
                ops.len() + compares.len(),
                self.max_ops
            )));
        }
        self.txn_at(Txn::new().when(compares).and_then(ops))
    }

    /// A comparison that `key` holds `expected` (`None`: is absent).
    pub fn holds(&self, key: &[u8], expected: Option<&[u8]>) -> Compare {
        let full = self.full_key(key);
        match expected {
            Some(value) => Compare::value(full, CompareOp::Equal, value.to_vec()),
            None => Compare::create_revision(full, CompareOp::Equal, 0),
        }
    }

    /// A comparison that no key starts with `prefix`.
    pub fn none_under(&self, prefix: &[u8]) -> Compare {
        Compare::create_revision(self.full_key(prefix), CompareOp::Equal, 0).with_prefix()
    }

    /// The etcd revision of `key`'s last write (0: absent).
    pub fn mod_revision(&self, key: &[u8]) -> Result<i64> {
        self.remote.block_on(self.mod_revision_async(key))
    }

    /// [`EtcdMeta::mod_revision`], awaited (on the clients' runtime: see [`Remote::spawn`]).
    pub async fn mod_revision_async(&self, key: &[u8]) -> Result<i64> {
        let mut etcd = self.remote.etcd.clone();
        let full = self.full_key(key);
        let get = async move { etcd.get(full, None).await };
        let answer = self.remote.metrics().etcd(op::GET, kind::STORE, get).await.map_err(etcd_error)?;
        Ok(answer.kvs().first().map_or(0, |kv| kv.mod_revision()))
    }

    /// A comparison that `key` was not written after etcd revision `revision`.
    pub fn key_unchanged_since(&self, key: &[u8], revision: i64) -> Compare {
        Compare::mod_revision(self.full_key(key), CompareOp::Less, revision + 1)
    }

    /// Operations one transaction may hold.
    pub fn max_ops(&self) -> usize {
        self.max_ops
    }

    /// A comparison that no key under `prefix` was written after etcd revision `revision`.
    pub fn unchanged_since(&self, prefix: &[u8], revision: i64) -> Compare {
        let full = self.full_key(prefix);
        let end = prefix_end(&full).unwrap_or_default();
        Compare::mod_revision(full, CompareOp::Less, revision + 1).with_range(end)
    }

    /// Puts all `keys` (pins) under `lease` and tells which of `probes` (parallel to `keys`)
    /// exist, in as few transactions as etcd allows, each pin before its probe.
    pub fn put_leased_and_probe_many(&self, keys: &[Vec<u8>], lease: i64, probes: &[Vec<u8>]) -> Result<Vec<bool>> {
        let mut found = Vec::with_capacity(probes.len());
        let per_txn = (self.max_ops / 2).max(1);
        for (keys, probes) in keys.chunks(per_txn).zip(probes.chunks(per_txn)) {
            let mut ops: Vec<TxnOp> = keys
                .iter()
                .map(|key| TxnOp::put(self.full_key(key), Vec::new(), Some(PutOptions::new().with_lease(lease))))
                .collect();
            ops.extend(probes.iter().map(|p| TxnOp::get(self.full_key(p), Some(GetOptions::new().with_count_only()))));
            let mut etcd = self.remote.etcd.clone();
            let txn = async move { etcd.txn(Txn::new().and_then(ops)).await };
            let answer =
                self.remote.block_on(self.remote.metrics().etcd(op::TXN, kind::STORE, txn)).map_err(etcd_error)?;
            let counts = answer.op_responses().into_iter().filter_map(|op| match op {
                TxnOpResponse::Get(get) => Some(get.count() > 0),
                _ => None,
            });
            found.extend(counts);
        }
        if found.len() != probes.len() {
            return Err(StorageError::Remote("etcd answered a transaction with missing results".into()));
        }
        Ok(found)
    }

    /// A comparison that this replica's lease is the one it started with (its pins are intact).
    pub fn lease_held(&self, lease: i64) -> Compare {
        Compare::lease(self.remote.presence_key(), CompareOp::Equal, lease)
    }

    /// etcd's current revision.
    pub fn revision(&self) -> Result<i64> {
        let mut etcd = self.remote.etcd.clone();
        let probe = self.base.clone();
        let get = async move { etcd.get(probe, Some(GetOptions::new().with_count_only())).await };
        let answer = self.remote.block_on(self.remote.metrics().etcd(op::GET, kind::STORE, get)).map_err(etcd_error)?;
        Ok(answer.header().map_or(0, |h| h.revision()))
    }

    fn ops(&self, batch: Batch) -> Vec<TxnOp> {
        batch
            .into_ops()
            .map(|(key, value)| match value {
                Some(value) => TxnOp::put(self.full_key(&key), value, None),
                None => TxnOp::delete(self.full_key(&key), None),
            })
            .collect()
    }

    fn txn(&self, txn: Txn) -> Result<bool> {
        Ok(self.txn_at(txn)?.is_some())
    }

    /// The transaction's etcd revision if it succeeded.
    fn txn_at(&self, txn: Txn) -> Result<Option<i64>> {
        let mut etcd = self.remote.etcd.clone();
        let txn = async move { etcd.txn(txn).await };
        let answer = self.remote.block_on(self.remote.metrics().etcd(op::TXN, kind::STORE, txn)).map_err(etcd_error)?;
        Ok(answer.succeeded().then(|| answer.header().map_or(0, |h| h.revision())))
    }

    fn page(&self, from: Vec<u8>, end: Vec<u8>) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut etcd = self.remote.etcd.clone();
        let options = GetOptions::new().with_range(end).with_limit(SCAN_PAGE);
        let list = async move { etcd.get(from, Some(options)).await };
        let mut answer =
            self.remote.block_on(self.remote.metrics().etcd(op::LIST, kind::STORE, list)).map_err(etcd_error)?;
        self.pages.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        Ok(answer.take_kvs().into_iter().map(|kv| (kv.key().to_vec(), kv.value().to_vec())).collect())
    }
}

fn etcd_error(err: etcd_client::Error) -> StorageError {
    remote_error("etcd", err)
}

struct Scan<'a> {
    meta: &'a EtcdMeta,
    /// Where the next page starts (`None`: the range is done).
    next: Option<Vec<u8>>,
    end: Vec<u8>,
    page: std::vec::IntoIter<(Vec<u8>, Vec<u8>)>,
}

impl Iterator for Scan<'_> {
    type Item = Result<(IVec, IVec)>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some((key, value)) = self.page.next() {
                let key = key.get(self.meta.base.len()..).unwrap_or_default();
                return Some(Ok((IVec::from(key), IVec::from(value))));
            }
            let from = self.next.take()?;
            if !self.end.is_empty() && from >= self.end {
                return None;
            }
            match self.meta.page(from, self.end.clone()) {
                Ok(page) => {
                    if page.len() as i64 == SCAN_PAGE {
                        self.next = page.last().map(|(key, _)| [key.as_slice(), &[0]].concat());
                    }
                    if page.is_empty() {
                        return None;
                    }
                    self.page = page.into_iter();
                }
                Err(e) => return Some(Err(e)),
            }
        }
    }
}
