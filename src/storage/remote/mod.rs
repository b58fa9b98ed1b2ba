//! The replicated store's connections: etcd for everything small and mutable (API objects, the
//! change log, revision records, the chunk index, writers' pins, upload sessions, the leader key)
//! and S3-compatible object storage for everything large and immutable (blocks of chunks, upload
//! pieces). Several replicas open the same prefix and bucket; each is a peer.
//!
//! Both clients are async; the store's methods block (they run on `spawn_blocking` threads), so
//! the clients live on a small runtime of their own and [`Remote::block_on`] waits for them.
//!
//! Each replica holds an etcd *lease* for as long as it lives: its presence key and its pins are
//! attached to it, so that what a killed replica was in the middle of stops protecting chunks once
//! the lease expires ([`LEASE_TTL_SECS`]), and nothing of it needs cleaning by hand.

mod block_cache;
mod etcd;
mod leader;
pub mod metrics;
mod mirror;
mod s3;

use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, ConnectOptions, PutOptions};

pub use block_cache::DiskBlocks;
pub use etcd::EtcdMeta;
pub use metrics::RemoteMetrics;
pub use mirror::{Mirror, CATCH_UP_WAIT};
pub use s3::S3Blocks;

use super::{Result, StorageError};

/// Seconds a replica's lease outlives its last keep-alive: how long a killed replica's pins and
/// leadership last.
pub const LEASE_TTL_SECS: i64 = 10;
/// etcd's default `--max-txn-ops`.
pub const DEFAULT_MAX_TXN_OPS: usize = 128;

/// Where the shared store is and how to reach it (`stowage serve --etcd-servers … --s3-…`).
#[derive(Clone, Debug, Default)]
pub struct RemoteOptions {
    pub etcd_servers: Vec<String>,
    /// Every key stowage writes starts with this (`/stowage` by default).
    pub etcd_prefix: String,
    pub etcd_ca_file: Option<PathBuf>,
    pub etcd_cert_file: Option<PathBuf>,
    pub etcd_key_file: Option<PathBuf>,
    /// Operations per etcd transaction (etcd's `--max-txn-ops`).
    pub etcd_max_txn_ops: usize,
    pub s3_endpoint: Option<String>,
    pub s3_bucket: String,
    pub s3_region: String,
    pub s3_path_style: bool,
    pub s3_access_key_id: Option<String>,
    pub s3_secret_access_key: Option<String>,
    /// Names this replica in pins, presence and leadership.
    pub replica_id: String,
    /// A block younger than this is never deleted: a writer indexes its chunks well within it.
    pub block_grace: Duration,
    /// How often the leader runs a full collection pass unasked.
    pub collect_every: Duration,
    /// Bytes of API objects and change log this replica keeps in memory ([`Mirror`]); 0: none,
    /// every read goes to etcd.
    pub object_cache_bytes: u64,
    /// Bytes of blocks this replica keeps on its disk ([`DiskBlocks`]); 0: none.
    pub block_cache_bytes: u64,
    /// Where etcd and object storage requests are recorded (`/metrics`).
    pub metrics: RemoteMetrics,
}

/// The two connections, the runtime driving them, and this replica's lease.
pub struct Remote {
    runtime: Option<tokio::runtime::Runtime>,
    handle: tokio::runtime::Handle,
    pub(super) etcd: Client,
    /// `<etcd-prefix>/`: every key of this deployment starts so.
    prefix: Vec<u8>,
    pub(super) options: RemoteOptions,
    lease: AtomicI64,
    lease_lost: Arc<AtomicBool>,
    lease_epoch: std::sync::atomic::AtomicU64,
    /// Set while this replica holds the leader key ([`leader`]).
    leader: AtomicBool,
    /// Set by [`Remote::resign`]: the lease is not renewed or replaced any more.
    resigned: AtomicBool,
    pub(super) s3: Arc<dyn object_store::ObjectStore>,
}

impl std::fmt::Debug for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Remote").field("options", &self.options).finish_non_exhaustive()
    }
}

impl Drop for Remote {
    fn drop(&mut self) {
        // Dropping a runtime waits for its threads, which may not happen on an async thread.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// An etcd or S3 error, in words.
pub(super) fn remote_error(what: &str, err: impl std::fmt::Display) -> StorageError {
    StorageError::Remote(format!("{what}: {err}"))
}

impl Remote {
    /// Connects to etcd and the bucket, takes a lease and announces this replica.
    pub fn connect(options: RemoteOptions) -> Result<Arc<Remote>> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("stowage-remote")
            .enable_all()
            .build()?;
        let handle = runtime.handle().clone();
        let connect = handle.block_on(connect_etcd(&options))?;
        let s3 = s3::connect(&options)?;
        let mut prefix = options.etcd_prefix.trim_end_matches('/').as_bytes().to_vec();
        prefix.push(b'/');
        let remote = Arc::new(Remote {
            runtime: Some(runtime),
            handle,
            etcd: connect,
            prefix,
            options,
            lease: AtomicI64::new(0),
            lease_lost: Arc::new(AtomicBool::new(false)),
            lease_epoch: std::sync::atomic::AtomicU64::new(0),
            leader: AtomicBool::new(false),
            resigned: AtomicBool::new(false),
            s3,
        });
        remote.take_lease()?;
        remote.check_bucket()?;
        remote.campaign();
        Ok(remote)
    }

    /// Runs an async call of the clients to completion from blocking code.
    pub fn block_on<F: Future>(&self, fut: F) -> F::Output {
        match tokio::runtime::Handle::try_current() {
            // On a runtime's worker: tell it this thread blocks for a while.
            Ok(current) if current.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
                tokio::task::block_in_place(|| self.handle.block_on(fut))
            }
            _ => self.handle.block_on(fut),
        }
    }

    /// The request families etcd and object storage calls are recorded in.
    pub fn metrics(&self) -> &RemoteMetrics {
        &self.options.metrics
    }

    /// Spawns a task on the clients' runtime.
    pub fn spawn<F: Future<Output = ()> + Send + 'static>(&self, fut: F) {
        self.handle.spawn(fut);
    }

    /// `<prefix>/<name>`.
    pub fn key(&self, name: &[u8]) -> Vec<u8> {
        [self.prefix.as_slice(), name].concat()
    }

    /// A handle on the etcd client, for state that lives beside the store's map (upload sessions).
    pub(in crate::storage) fn etcd_client(&self) -> Client {
        self.etcd.clone()
    }

    /// The bucket, for objects that live beside the blocks (upload pieces).
    pub(in crate::storage) fn object_store(&self) -> Arc<dyn object_store::ObjectStore> {
        self.s3.clone()
    }

    pub fn replica_id(&self) -> &str {
        &self.options.replica_id
    }

    /// The lease this replica's pins and presence are attached to.
    pub fn lease(&self) -> i64 {
        self.lease.load(Ordering::Acquire)
    }

    /// Gives up this replica's lease at a graceful stop, so that its leadership, presence and pins
    /// go at once instead of after the TTL: the next leader starts within a second, and nothing
    /// waits for a writer that is gone. Writes of this replica fail from here on.
    pub fn resign(&self) {
        self.resigned.store(true, Ordering::Release);
        self.leader.store(false, Ordering::Release);
        self.lease_lost.store(true, Ordering::Release);
        let mut etcd = self.etcd.clone();
        let lease = self.lease();
        let revoke = self.metrics().etcd(metrics::op::REVOKE, metrics::kind::LEASE, etcd.lease_revoke(lease));
        let revoked = self
            .block_on(async move { tokio::time::timeout(Duration::from_secs(2), revoke).await.map(|r| r.map(drop)) });
        match revoked {
            Ok(Ok(())) => tracing::info!("gave up this replica's etcd lease"),
            Ok(Err(e)) => tracing::warn!(error = %e, "giving up the etcd lease; it expires by itself"),
            Err(_) => tracing::warn!("giving up the etcd lease: no answer; it expires by itself"),
        }
    }

    /// Whether the lease lapsed at some point (etcd unreachable longer than its TTL): what was
    /// pinned under it may have been collected.
    pub fn lease_lost(&self) -> bool {
        self.lease_lost.load(Ordering::Acquire)
    }

    /// `Err` once the lease lapsed: pins taken under it may be gone, so no write may rely on them.
    pub fn writable(&self) -> Result<()> {
        if self.lease_lost() {
            return Err(StorageError::Remote("this replica lost its etcd lease and is taking a new one".into()));
        }
        Ok(())
    }

    /// Calls `notify` with the value of `key` (its full etcd key) now and after every change,
    /// until `notify` returns false; reconnects after errors.
    pub fn follow_key(&self, key: Vec<u8>, notify: impl Fn(&[u8]) -> bool + Send + Sync + 'static) {
        let mut etcd = self.etcd.clone();
        self.spawn(async move {
            loop {
                let followed = async {
                    let mut stream = etcd.watch(key.clone(), None).await?;
                    // Whatever changed before the watch began.
                    let now = etcd.get(key.clone(), None).await?;
                    if let Some(kv) = now.kvs().first() {
                        if !notify(kv.value()) {
                            return Ok(false);
                        }
                    }
                    while let Some(answer) = stream.message().await? {
                        for event in answer.events() {
                            if let Some(kv) = event.kv() {
                                if !notify(kv.value()) {
                                    return Ok(false);
                                }
                            }
                        }
                    }
                    Ok::<bool, etcd_client::Error>(true)
                };
                match followed.await {
                    Ok(false) => return,
                    Ok(true) => {}
                    Err(e) => tracing::warn!(error = %e, "etcd watch interrupted; resuming"),
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        });
    }

    /// The key that exists while this replica's lease does.
    pub fn presence_key(&self) -> Vec<u8> {
        self.key(format!("replicas/{}", self.options.replica_id).as_bytes())
    }

    /// Whether both backends answer and the lease is held (readiness): [`Remote::etcd_reachable`],
    /// [`Remote::lease_held`], [`Remote::bucket_reachable`].
    pub fn reachable(&self) -> Result<()> {
        self.etcd_reachable()?;
        self.lease_held()?;
        self.bucket_reachable()
    }

    /// Whether etcd answers a read within 2 s (the `etcd` health check).
    pub fn etcd_reachable(&self) -> Result<()> {
        let mut etcd = self.etcd.clone();
        let presence = self.presence_key();
        let get = async move {
            tokio::time::timeout(Duration::from_secs(2), etcd.get(presence, None))
                .await
                .map_err(|_| remote_error("etcd", "no answer within 2 s"))?
                .map_err(|e| remote_error("etcd", e))
        };
        self.block_on(self.metrics().etcd(metrics::op::GET, metrics::kind::REPLICAS, get))?;
        Ok(())
    }

    /// Whether this replica holds its etcd lease (the `lease` health check).
    pub fn lease_held(&self) -> Result<()> {
        if self.lease_lost() {
            return Err(StorageError::Remote("this replica lost its etcd lease".into()));
        }
        Ok(())
    }

    /// Whether the bucket answers a listing within 5 s (the `object-storage` health check).
    pub fn bucket_reachable(&self) -> Result<()> {
        self.check_bucket()
    }

    fn check_bucket(&self) -> Result<()> {
        let s3 = self.s3.clone();
        let recorded = self.metrics().clone();
        self.block_on(async move {
            use futures_util::StreamExt;
            let path = object_store::path::Path::from("blocks");
            let mut listing = s3.list(Some(&path));
            let first = async {
                match tokio::time::timeout(Duration::from_secs(5), listing.next()).await {
                    Err(_) => Err(remote_error("object storage", "no answer within 5 s")),
                    Ok(Some(Err(e))) => Err(remote_error("object storage", e)),
                    Ok(_) => Ok(()),
                }
            };
            recorded.object_storage(metrics::op::LIST, first).await
        })
    }

    /// Grants the lease, writes the presence key under it and keeps it alive in the background.
    fn take_lease(self: &Arc<Self>) -> Result<()> {
        let id = self.block_on(grant(self.etcd.clone(), self.presence_key(), self.metrics()))?;
        self.lease.store(id, Ordering::Release);
        self.spawn(keep_lease(Arc::downgrade(self), id));
        Ok(())
    }

    /// Counts the leases this replica lost: a writer that began under another count than the
    /// current one may have lost its pins ([`super::chunks`]).
    pub fn lease_epoch(&self) -> u64 {
        self.lease_epoch.load(Ordering::Acquire)
    }
}

/// A new lease with this replica's presence key under it.
async fn grant(mut etcd: Client, presence: Vec<u8>, recorded: &RemoteMetrics) -> Result<i64> {
    let lease = recorded
        .etcd(metrics::op::GRANT, metrics::kind::LEASE, etcd.lease_grant(LEASE_TTL_SECS, None))
        .await
        .map_err(|e| remote_error("etcd lease", e))?;
    let put = etcd.put(presence, b"".to_vec(), Some(PutOptions::new().with_lease(lease.id())));
    recorded.etcd(metrics::op::PUT, metrics::kind::REPLICAS, put).await.map_err(|e| remote_error("etcd", e))?;
    Ok(lease.id())
}

/// Renews the lease every third of its TTL for as long as the replica lives. A lease that lapsed
/// (etcd said so, or no renewal got through for a whole TTL) is replaced by a new one: meanwhile
/// writes are refused, and writers that began under the old one fail when they record.
async fn keep_lease(remote: std::sync::Weak<Remote>, mut id: i64) {
    let ttl = Duration::from_secs(LEASE_TTL_SECS as u64);
    let mut renewed = std::time::Instant::now();
    loop {
        tokio::time::sleep(ttl / 3).await;
        let Some(this) = remote.upgrade() else { return };
        if this.resigned.load(Ordering::Acquire) {
            return;
        }
        let mut etcd = this.etcd.clone();
        let renewal = async {
            let (mut keeper, mut answers) = etcd.lease_keep_alive(id).await?;
            keeper.keep_alive().await?;
            Ok::<bool, etcd_client::Error>(answers.message().await?.is_some_and(|a| a.ttl() > 0))
        };
        // A renewal with no answer in time counts as a failed request (`None`).
        let timed =
            async { tokio::time::timeout(ttl / 3, renewal).await.map_err(|_| None).and_then(|r| r.map_err(Some)) };
        let answer = this.metrics().etcd(metrics::op::KEEPALIVE, metrics::kind::LEASE, timed).await;
        this.metrics().lease_renewal(matches!(answer, Ok(true)));
        match answer {
            Ok(true) => {
                renewed = std::time::Instant::now();
                continue;
            }
            Err(_) if renewed.elapsed() < ttl => continue,
            _ => {}
        }
        this.lease_lost.store(true, Ordering::Release);
        this.lease_epoch.fetch_add(1, Ordering::AcqRel);
        this.leader.store(false, Ordering::Release);
        tracing::error!("this replica's etcd lease lapsed: writes are refused until it has a new one");
        match grant(this.etcd.clone(), this.presence_key(), this.metrics()).await {
            Ok(new) => {
                id = new;
                this.lease.store(new, Ordering::Release);
                this.lease_lost.store(false, Ordering::Release);
                renewed = std::time::Instant::now();
                tracing::info!("this replica has a new etcd lease");
            }
            Err(e) => tracing::warn!(error = %e, "no new etcd lease yet"),
        }
    }
}

async fn connect_etcd(options: &RemoteOptions) -> Result<Client> {
    let mut connect = ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(5))
        .with_timeout(Duration::from_secs(10))
        .with_keep_alive(Duration::from_secs(5), Duration::from_secs(5));
    if options.etcd_ca_file.is_some() || options.etcd_cert_file.is_some() {
        let read =
            |path: &PathBuf| std::fs::read(path).map_err(|e| remote_error(&format!("reading {}", path.display()), e));
        let mut tls = etcd_client::TlsOptions::new();
        if let Some(ca) = &options.etcd_ca_file {
            tls = tls.ca_certificate(etcd_client::Certificate::from_pem(read(ca)?));
        }
        if let (Some(cert), Some(key)) = (&options.etcd_cert_file, &options.etcd_key_file) {
            tls = tls.identity(etcd_client::Identity::from_pem(read(cert)?, read(key)?));
        }
        connect = connect.with_tls(tls);
    }
    Client::connect(&options.etcd_servers, Some(connect)).await.map_err(|e| remote_error("connecting to etcd", e))
}
