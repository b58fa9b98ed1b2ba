//! Collection in the replicated store, where writers on other replicas cannot be seen through a
//! lock. It runs on the leader only ([`super::remote`]); the invariant it keeps, stated in
//! ARCHITECTURE.md, is that no chunk a committed or recorded manifest reaches, and no chunk a
//! live writer has pinned, is ever deleted:
//!
//! - A writer pins a hash in etcd (`p` hash `/` replica, under its lease) in the same transaction
//!   as it looks the chunk up, and keeps the pin until its manifest is recorded. The manifest is
//!   recorded only while that lease still holds, and the same transaction rewrites
//!   [`MANIFESTS_KEY`].
//! - The pass marks every recorded manifest, noting etcd's revision first (`marked_at`). Each of
//!   its delete transactions then compares, per chunk, that no pin of it exists, and that
//!   [`MANIFESTS_KEY`] was not written after `marked_at`. A pin taken after the comparison finds
//!   the chunk gone and the writer stores it anew; a manifest recorded after the mark fails the
//!   transaction, and the pass marks it and tries again.
//! - Revisions left `Staging` by a replica whose lease ended are released: their writer is gone.

use std::collections::HashSet;

use super::chunks::{chunk_key, pins_of, Hash, MANIFESTS_KEY};
use super::gc::LiveSet;
use super::meta::Batch;
use super::remote::EtcdMeta;
use super::{decode_json, encode_json, key, Result, RevisionRecord, RevisionState, StorageError, Store};

/// Times a group's deletion is retried after racing writers before the pass gives up (a later
/// pass goes on).
const RACE_RETRIES: usize = 16;

impl Store {
    /// Marks `Staging` revisions whose writer's replica is not in `alive` as `Deleting`.
    pub(super) fn release_staging_of_gone(&self, alive: &HashSet<String>) -> Result<u64> {
        let mut released = 0;
        for item in self.tree().scan_prefix(b"v") {
            let (k, v) = item?;
            let mut record: RevisionRecord = decode_json(&v)?;
            if record.state != RevisionState::Staging || alive.contains(&record.writer) {
                continue;
            }
            tracing::info!(revision = record.id, writer = %record.writer, "releasing a revision whose replica is gone");
            let before = v.to_vec();
            record.state = RevisionState::Deleting;
            if self.tree().compare_and_swap(&k, Some(&before), Some(&encode_json(&record)))? {
                released += 1;
            }
        }
        Ok(released)
    }

    /// Mark and sweep against writers on every replica; see the module doc. Returns the chunks
    /// removed.
    pub(super) fn mark_and_sweep_shared(&self, etcd: &EtcdMeta) -> Result<u64> {
        let mut live = LiveSet::new(super::gc::LIVE_SET_BITS);
        let mut marked = super::gc::Marked::new();
        let mut marked_at = etcd.revision()?;
        self.mark_new(&mut live, &mut marked)?;
        let mut removed = 0;
        let mut after: Vec<u8> = key(b'c', &[]);
        let per_txn = (etcd.max_ops().saturating_sub(1) / 2).max(1);
        loop {
            let group = super::gc::sweep_group(self.tree().range(after.clone()..key(b'c' + 1, &[])), &after)?;
            let Some(last) = group.last() else { return Ok(removed) };
            after = chunk_key(last);
            let candidates: Vec<Hash> = group.into_iter().filter(|h| !live.contains(h)).collect();
            for part in candidates.chunks(per_txn) {
                removed += self.delete_unreferenced(etcd, part, &mut live, &mut marked, &mut marked_at)?;
            }
        }
    }

    /// Deletes the index entries of `part` that no manifest marked since `marked_at` reaches and
    /// no replica pins, in one transaction when nothing raced it. Not deleting is always safe.
    fn delete_unreferenced(
        &self,
        etcd: &EtcdMeta,
        part: &[Hash],
        live: &mut LiveSet,
        marked: &mut super::gc::Marked,
        marked_at: &mut i64,
    ) -> Result<u64> {
        let transaction = |hashes: &[&Hash], marked_at: i64| {
            let mut batch = Batch::default();
            let mut compares = vec![etcd.key_unchanged_since(MANIFESTS_KEY, marked_at)];
            for hash in hashes {
                batch.remove(chunk_key(hash));
                compares.push(etcd.none_under(&pins_of(hash)));
            }
            etcd.apply_when(batch, compares)
        };
        for _ in 0..RACE_RETRIES {
            let part: Vec<&Hash> = part.iter().filter(|h| !live.contains(h)).collect();
            if part.is_empty() {
                return Ok(0);
            }
            if transaction(&part, *marked_at)? {
                return Ok(part.len() as u64);
            }
            if etcd.mod_revision(MANIFESTS_KEY)? > *marked_at {
                // A manifest was recorded since the mark: mark it, then try again.
                *marked_at = etcd.revision()?;
                self.mark_new(live, marked)?;
                continue;
            }
            // Some of them are pinned: one at a time, so the others still go.
            let mut deleted = 0;
            for hash in part {
                if transaction(&[hash], *marked_at)? {
                    deleted += 1;
                }
            }
            return Ok(deleted);
        }
        Err(StorageError::Remote("collection kept racing writers; the next pass goes on".into()))
    }
}
