//! Parallel ingest: a writer hands its full blocks to worker threads, which seal them (compress,
//! append to a pack or object storage, index: [`Store::seal_block`]) while the writer reads, cuts
//! and hashes the next ones.
//!
//! Bounded: at most [`MAX_IN_FLIGHT`] blocks are handed over and not yet sealed; a writer that
//! gets that far ahead waits for a worker. With the block being built, a writer holds at most
//! `MAX_IN_FLIGHT + 1` blocks of about [`super::chunks::BLOCK_TARGET`] raw bytes (plus each
//! worker's compressed copy), whatever the size of the upload. The workers start with the first full
//! block, so a small upload never starts a thread.
//!
//! What sealing guaranteed before still holds, because the workers run the same
//! [`Store::seal_block`] and the writer waits for all of them before it records a manifest
//! ([`SealPipeline::finish`]):
//! - Every chunk was pinned by the writer before its existence was checked, and stays pinned until
//!   the manifest is recorded or the writer is dropped — the writer stops and joins the workers
//!   ([`SealPipeline::shutdown`]) before it unpins, so no worker indexes a chunk its writer no
//!   longer pins.
//! - An index entry is only added if absent (under the pins lock, in `seal_block`).
//! - A chunk in a block a worker has not finished is not yet indexed: the writer asks
//!   [`SealPipeline::holds`] too, so it stores each new chunk once.
//! - A worker's error (out of space: the same [`StorageError`]) comes back from the writer's next
//!   call; then the workers skip what is queued. A panicking seal is an error, not a lost block.

use std::collections::HashSet;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender};

use super::chunks::{BlockBuilder, Hash};
use super::{Result, StorageError, Store};

/// Seal workers per writer, at most (and at most the machine's cores).
pub const MAX_WORKERS: usize = 4;
/// Blocks handed to the workers and not yet sealed, at most (per writer).
pub const MAX_IN_FLIGHT: usize = 4;

struct Job {
    seq: u64,
    builder: BlockBuilder,
}

/// A sealed block (its sequence number), or why it was not.
type Done = (u64, Result<()>);

/// The seal workers of one writer; see the module doc.
pub(super) struct SealPipeline {
    store: Store,
    workers: Vec<JoinHandle<()>>,
    /// Closed (dropped) to stop the workers.
    jobs: Option<Sender<Job>>,
    done: Option<Receiver<Done>>,
    /// Set by the first failure or by shutdown: queued blocks are skipped.
    stop: Arc<AtomicBool>,
    /// The hashes of the blocks handed over and not yet reported sealed, by sequence number.
    in_flight: Vec<(u64, HashSet<Hash>)>,
    next_seq: u64,
    /// The first worker error not yet returned.
    error: Option<StorageError>,
    /// A worker failed: the writer cannot finish any more.
    failed: bool,
    /// Workers to start (tests: a fixed number).
    worker_count: usize,
}

fn default_workers() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from).clamp(1, MAX_WORKERS)
}

impl SealPipeline {
    pub fn new(store: Store) -> SealPipeline {
        SealPipeline::with_workers(store, default_workers())
    }

    pub fn with_workers(store: Store, workers: usize) -> SealPipeline {
        SealPipeline {
            store,
            workers: Vec::new(),
            jobs: None,
            done: None,
            stop: Arc::new(AtomicBool::new(false)),
            in_flight: Vec::new(),
            next_seq: 0,
            error: None,
            failed: false,
            worker_count: workers.max(1),
        }
    }

    /// Whether `hash` is in a block handed over and not yet known sealed (so not yet indexed).
    pub fn holds(&self, hash: &Hash) -> bool {
        self.in_flight.iter().any(|(_, hashes)| hashes.contains(hash))
    }

    /// Hands a full block to the workers (waiting while [`MAX_IN_FLIGHT`] are); returns a worker's
    /// earlier error, if any.
    pub fn submit(&mut self, builder: BlockBuilder) -> Result<()> {
        self.collect(false)?;
        if builder.is_empty() {
            return Ok(());
        }
        while self.in_flight.len() >= MAX_IN_FLIGHT {
            self.collect(true)?;
        }
        if self.jobs.is_none() {
            self.start()?;
        }
        let Some(jobs) = &self.jobs else {
            // No worker thread could be started: seal here, as before.
            let mut builder = builder;
            return self.store.seal_block(&mut builder);
        };
        let seq = self.next_seq;
        self.next_seq += 1;
        self.in_flight.push((seq, builder.hashes().clone()));
        if jobs.send(Job { seq, builder }).is_err() {
            self.failed = true;
            return Err(worker_lost());
        }
        Ok(())
    }

    /// Waits until every block handed over is sealed; the first error of any.
    pub fn finish(&mut self) -> Result<()> {
        while !self.in_flight.is_empty() {
            self.collect(true)?;
        }
        self.collect(false)
    }

    /// Stops the workers (what is queued is dropped unsealed) and waits for them: after this no
    /// worker touches the store for this writer.
    pub fn shutdown(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.jobs = None;
        // A worker reporting finds nobody listening and ends.
        self.done = None;
        for worker in self.workers.drain(..) {
            if worker.join().is_err() {
                tracing::warn!("a block sealing worker panicked");
            }
        }
        self.in_flight.clear();
    }

    fn start(&mut self) -> Result<()> {
        let (jobs, queue) = crossbeam_channel::bounded::<Job>(MAX_IN_FLIGHT);
        let (report, done) = crossbeam_channel::bounded::<Done>(MAX_IN_FLIGHT);
        for i in 0..self.worker_count {
            let (store, queue, report, stop) = (self.store.clone(), queue.clone(), report.clone(), self.stop.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("stowage-seal-{i}"))
                .spawn(move || work(&store, &queue, &report, &stop));
            match spawned {
                Ok(handle) => self.workers.push(handle),
                Err(e) => {
                    tracing::warn!(error = %e, "could not start a block sealing worker");
                    break;
                }
            }
        }
        if !self.workers.is_empty() {
            self.jobs = Some(jobs);
            self.done = Some(done);
        }
        Ok(())
    }

    /// Takes the workers' reports: all there are (`wait`: at least one). Returns the first error.
    fn collect(&mut self, wait: bool) -> Result<()> {
        if self.failed {
            return Err(self.error.take().unwrap_or_else(earlier_failure));
        }
        let mut wait = wait;
        loop {
            let Some(done) = &self.done else { return Ok(()) };
            let report = if wait {
                match done.recv() {
                    Ok(report) => report,
                    Err(_) => {
                        self.failed = true;
                        return Err(worker_lost());
                    }
                }
            } else {
                match done.try_recv() {
                    Ok(report) => report,
                    Err(_) => break,
                }
            };
            wait = false;
            let (seq, result) = report;
            self.in_flight.retain(|(s, _)| *s != seq);
            match result {
                Ok(()) => {}
                // A block skipped because another failed: that failure is the one to report.
                Err(StorageError::Cancelled) => {
                    self.failed = true;
                    wait = self.error.is_none() && !self.in_flight.is_empty();
                }
                Err(e) => {
                    self.stop.store(true, Ordering::SeqCst);
                    self.failed = true;
                    if self.error.is_none() {
                        self.error = Some(e);
                    }
                }
            }
        }
        if self.failed {
            return Err(self.error.take().unwrap_or_else(earlier_failure));
        }
        Ok(())
    }
}

impl Drop for SealPipeline {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn worker_lost() -> StorageError {
    StorageError::Io(std::io::Error::other("the block sealing workers stopped"))
}

fn earlier_failure() -> StorageError {
    StorageError::Io(std::io::Error::other("an earlier block of this upload could not be stored"))
}

/// A worker: seals the blocks it receives until the writer closes the queue or goes away.
fn work(store: &Store, queue: &Receiver<Job>, report: &Sender<Done>, stop: &AtomicBool) {
    while let Ok(mut job) = queue.recv() {
        let result = if stop.load(Ordering::SeqCst) {
            Err(StorageError::Cancelled)
        } else {
            std::panic::catch_unwind(AssertUnwindSafe(|| store.seal_block(&mut job.builder)))
                .unwrap_or_else(|_| Err(StorageError::Io(std::io::Error::other("sealing a block panicked"))))
        };
        if result.is_err() {
            stop.store(true, Ordering::SeqCst);
        }
        if report.send((job.seq, result)).is_err() {
            return;
        }
    }
}
