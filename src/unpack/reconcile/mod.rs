//! The reconcile loop: keeps every Bundle's served content in line with its spec.
//!
//! It follows the store's change log like any watcher. For each Bundle it decides ([`plan`]) what
//! the Bundle needs — an unpack of its current generation, a timer to re-resolve floating
//! references (`spec.pollInterval`), a refresh asked for with the `content.stowage.dev/refresh`
//! annotation, a paused note, or nothing — and runs at most one job per Bundle. Jobs share a
//! bounded pool of unpack slots; a job is cancelled when its Bundle's spec or refresh annotation
//! changes or the Bundle goes, and all are cancelled on shutdown.
//!
//! An upload Bundle has nothing to fetch, but its status must still follow its spec: when the
//! status speaks for an older generation, [`recheck`] checks the served content against the new
//! spec (or, with nothing served, only moves the generation along).
//!
//! All state lives in the store: a Bundle whose `Unpacked` condition was not finally answered for
//! its generation (`Pending`, `Unpacking`, a transient failure) is picked up again at start, so a
//! crash or restart mid-unpack resumes: the half-written revision was released by the store's
//! recovery and the revision is written again from the start, but what the sources had downloaded
//! is in the Bundle's download spool ([`crate::unpack::download_spool`]): image layers and http
//! files already downloaded are read from disk, and the one cut off continues where it stopped.
//! The spool is removed once the content is committed, when the unpack fails for good, and when
//! the Bundle is gone; at start, spools of Bundles with no unfinished unpack are swept.

mod job;
mod plan;
mod recheck;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::Value;

use crate::api::Bundle;
use tokio::sync::{broadcast, Semaphore};
use tokio_util::sync::CancellationToken;

use super::download_spool::Downloads;
use super::secrets::CredentialSource;
use super::source::{NetworkPolicy, UnpackLimits};
use crate::storage::{ChangedObject, ObjectKey, StorageError, Store};

pub use plan::{plan, Plan};

/// How the loop runs.
#[derive(Clone)]
pub struct ReconcilerConfig {
    /// Unpacks running at once.
    pub concurrency: usize,
    pub limits: UnpackLimits,
    pub network: Arc<NetworkPolicy>,
    pub credentials: CredentialSource,
    /// Where git fetches put their packs (`DATA_DIR/tmp/git`).
    pub scratch_dir: std::path::PathBuf,
    /// Where downloads are spooled so an interrupted unpack resumes (`DATA_DIR/tmp/downloads`).
    pub downloads: Downloads,
    /// Jobs, durations, queue depth and fetched bytes, registered for `/metrics`.
    pub metrics: super::metrics::UnpackMetrics,
    /// Events about each Bundle's unpacks, versions, served content and pruned revisions.
    pub events: crate::events::EventRecorder,
}

/// `(namespace, name)` of a Bundle.
type Key = (String, String);

/// The one job a Bundle may have.
struct Running {
    id: u64,
    uid: String,
    generation: i64,
    /// The refresh annotation's value when the job started: a new one starts a new job.
    refresh: Option<String>,
    cancel: CancellationToken,
}

struct Shared {
    store: Store,
    config: ReconcilerConfig,
    slots: Semaphore,
    jobs: Mutex<HashMap<Key, Running>>,
    next_id: AtomicU64,
    shutdown: CancellationToken,
}

/// Starts the loop; it ends (cancelling every job) when `shutdown` is cancelled.
pub fn spawn(store: Store, config: ReconcilerConfig, shutdown: CancellationToken) -> tokio::task::JoinHandle<()> {
    let shared = Arc::new(Shared {
        store,
        slots: Semaphore::new(config.concurrency.max(1)),
        config,
        jobs: Mutex::new(HashMap::new()),
        next_id: AtomicU64::new(1),
        shutdown,
    });
    tokio::spawn(async move {
        let mut notifications = shared.store.subscribe();
        let mut from = relist(&shared, true).await;
        loop {
            tokio::select! {
                _ = shared.shutdown.cancelled() => break,
                received = notifications.recv() => {
                    if matches!(received, Err(broadcast::error::RecvError::Closed)) {
                        break;
                    }
                    from = match follow(&shared, from).await {
                        Ok(rv) => rv,
                        // The log moved past us (or the store hiccuped): look at everything again.
                        Err(_) => relist(&shared, false).await,
                    };
                }
            }
        }
        let jobs = std::mem::take(&mut *shared.jobs.lock().unwrap_or_else(|p| p.into_inner()));
        for job in jobs.values() {
            job.cancel.cancel();
        }
    })
}

/// Considers every Bundle; returns the resourceVersion the list was taken at. At start
/// (`first`), before any job runs, sweeps the download spools no unfinished unpack will resume.
async fn relist(shared: &Arc<Shared>, first: bool) -> u64 {
    let (store, downloads) = (shared.store.clone(), shared.config.downloads.clone());
    let listed = tokio::task::spawn_blocking(move || {
        let listed = store.list_objects("bundles", None)?;
        if first {
            let resumed = listed.0.iter().filter_map(|b| crate::strategy::decode::<Bundle>(&b.value).ok());
            downloads.sweep(
                &resumed
                    .filter(|b| matches!(plan(b), Plan::Unpack(_) | Plan::Refresh(_)))
                    .map(|b| b.uid().to_string())
                    .collect(),
            );
        }
        Ok::<_, StorageError>(listed)
    });
    match listed.await {
        Ok(Ok((bundles, rv))) => {
            for bundle in bundles {
                consider(shared, &bundle.value);
            }
            rv
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "listing Bundles failed; retrying with the next change");
            0
        }
        Err(e) => {
            tracing::error!(error = %e, "listing Bundles failed");
            0
        }
    }
}

/// Considers the Bundles changed after `from`; returns how far it got. Acts on each Bundle's
/// current state, not on the logged one (which may be stale by now).
async fn follow(shared: &Arc<Shared>, from: u64) -> Result<u64, StorageError> {
    let store = shared.store.clone();
    let (current, reached) = tokio::task::spawn_blocking(move || -> Result<_, StorageError> {
        if from > 0 && !store.log_covers(from)? {
            return Err(StorageError::Expired(from));
        }
        let mut changed: Vec<Key> = Vec::new();
        let mut seen: HashSet<Key> = HashSet::new();
        let mut after = from;
        loop {
            let batch = store.changes_after_as::<ChangedObject>(after, 512)?;
            let done = batch.len() < 512;
            after = batch.last().map_or(after, |(rv, _)| *rv);
            for (_, change) in batch.into_iter().filter(|(_, c)| c.resource == "bundles") {
                let key = (change.namespace, change.name);
                if seen.insert(key.clone()) {
                    changed.push(key);
                }
            }
            if done {
                break;
            }
        }
        let mut current = Vec::with_capacity(changed.len());
        for key in changed {
            let object = store.get_object(&ObjectKey::new("bundles", &key.0, &key.1))?.map(|o| o.value);
            current.push((key, object));
        }
        Ok((current, after))
    })
    .await
    .map_err(|error| {
        // A panic (a bug) or the runtime stopping: not a corrupt store.
        tracing::error!(%error, "the change log task stopped unexpectedly");
        StorageError::Io(std::io::Error::other("the change log task stopped unexpectedly"))
    })??;
    for (key, object) in current {
        match object {
            Some(bundle) => consider(shared, &bundle),
            None => forget(shared, &key),
        }
    }
    Ok(reached)
}

/// Cancels the Bundle's job, if any.
fn forget(shared: &Shared, key: &Key) {
    let mut jobs = shared.jobs.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(job) = jobs.remove(key) {
        job.cancel.cancel();
    }
}

/// Starts whatever `bundle` needs, unless its job for this generation already runs.
fn consider(shared: &Arc<Shared>, object: &Value) {
    let Ok(bundle) = crate::strategy::decode::<Bundle>(object) else {
        tracing::warn!("a stored Bundle does not decode; skipped");
        return;
    };
    let key = (bundle.namespace().to_string(), bundle.name().to_string());
    let uid = bundle.uid().to_string();
    let generation = bundle.generation();
    let refresh = bundle.refresh_annotation().map(str::to_owned);
    let mut jobs = shared.jobs.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(job) = jobs.get(&key) {
        if job.uid == uid && job.generation == generation && job.refresh == refresh && !job.cancel.is_cancelled() {
            return;
        }
        job.cancel.cancel();
        jobs.remove(&key);
    }
    let plan = plan(&bundle);
    if plan == Plan::Nothing {
        return;
    }
    let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
    let cancel = shared.shutdown.child_token();
    jobs.insert(key.clone(), Running { id, uid: uid.clone(), generation, refresh, cancel: cancel.clone() });
    drop(jobs);
    let expect = super::revisions::Expect {
        namespace: key.0.clone(),
        name: key.1.clone(),
        uid,
        generation: Some(generation),
        checked_generation: generation,
    };
    let shared = shared.clone();
    tokio::spawn(async move {
        job::run(&shared, expect.clone(), plan, cancel).await;
        forget_downloads_if_gone(&shared, expect).await;
        let mut jobs = shared.jobs.lock().unwrap_or_else(|p| p.into_inner());
        if jobs.get(&key).is_some_and(|j| j.id == id) {
            jobs.remove(&key);
        }
    });
}

/// Removes a Bundle's download spool once the Bundle (that uid) is gone; the job has ended, so
/// nothing writes to it any more.
async fn forget_downloads_if_gone(shared: &Arc<Shared>, expect: super::revisions::Expect) {
    let (store, downloads) = (shared.store.clone(), shared.config.downloads.clone());
    let _ = tokio::task::spawn_blocking(move || {
        let any_generation = super::revisions::Expect { generation: None, ..expect };
        if matches!(super::revisions::current(&store, &any_generation), Err(super::revisions::CommitError::Gone)) {
            downloads.for_bundle(&any_generation.uid).remove();
        }
    })
    .await;
}
