//! Which replica does the singleton work (collection, the reconcile loop, the API's garbage
//! collector): the one whose id is in `<prefix>/leader`, a key attached to its lease. Every replica
//! campaigns: it creates the key if absent, then reads who holds it. A killed leader's key goes
//! with its lease ([`super::LEASE_TTL_SECS`]); the next campaign round elects another.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp};

use super::metrics::{kind, op};
use super::{remote_error, Remote};
use crate::storage::Result;

/// How often a replica checks the leader key.
const CAMPAIGN_EVERY: Duration = Duration::from_secs(1);

impl Remote {
    /// Whether this replica leads now.
    pub fn is_leader(&self) -> bool {
        self.leader.load(Ordering::Acquire) && !self.lease_lost()
    }

    /// The ids of the replicas whose lease is alive.
    pub fn live_replicas(&self) -> Result<HashSet<String>> {
        let mut etcd = self.etcd.clone();
        let prefix = self.key(b"replicas/");
        let list = async move { etcd.get(prefix, Some(GetOptions::new().with_prefix().with_keys_only())).await };
        let answer =
            self.block_on(self.metrics().etcd(op::LIST, kind::REPLICAS, list)).map_err(|e| remote_error("etcd", e))?;
        let skip = self.key(b"replicas/").len();
        Ok(answer
            .kvs()
            .iter()
            .filter_map(|kv| kv.key().get(skip..))
            .map(|id| String::from_utf8_lossy(id).into_owned())
            .collect())
    }

    /// Campaigns for leadership in the background for as long as the process runs.
    pub(super) fn campaign(self: &Arc<Self>) {
        let remote = Arc::downgrade(self);
        let mut etcd = self.etcd.clone();
        let key = self.key(b"leader");
        let me = self.options.replica_id.clone().into_bytes();
        let metrics = self.metrics().clone();
        self.spawn(async move {
            loop {
                let Some(lease) = remote.upgrade().filter(|r| !r.resigned.load(Ordering::Acquire)).map(|r| r.lease())
                else {
                    return;
                };
                let round = Txn::new()
                    .when(vec![Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
                    .and_then(vec![TxnOp::put(key.clone(), me.clone(), Some(PutOptions::new().with_lease(lease)))])
                    .or_else(vec![TxnOp::get(key.clone(), None)]);
                let leads = match metrics.etcd(op::TXN, kind::LEADER, etcd.txn(round)).await {
                    Ok(answer) if answer.succeeded() => Some(true),
                    Ok(_) => match metrics.etcd(op::GET, kind::LEADER, etcd.get(key.clone(), None)).await {
                        Ok(now) => Some(now.kvs().first().is_some_and(|kv| kv.value() == me.as_slice())),
                        Err(_) => None,
                    },
                    Err(_) => None,
                };
                let Some(remote) = remote.upgrade() else { return };
                // Unknown (etcd unreachable): not leading, to be safe.
                let leads = leads.unwrap_or(false);
                if remote.leader.swap(leads, Ordering::AcqRel) != leads {
                    tracing::info!(replica = %remote.options.replica_id, leads, "leadership changed");
                }
                drop(remote);
                tokio::time::sleep(CAMPAIGN_EVERY).await;
            }
        });
    }
}
