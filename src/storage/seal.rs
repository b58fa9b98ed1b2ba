//! Parallel sealing: a writer hands its full tar-ordered blocks to worker threads, which seal them
//! (compress, append to a pack or object storage, index: [`Store::seal_block`]) while it lays out
//! the next ones ([`super::tar_blocks`]) — as the entries arrive, or in finalize from the spool.
//!
//! Bounded: at most [`MAX_IN_FLIGHT`] blocks are handed over and not yet sealed; a writer that
//! gets that far ahead waits for a worker. With the block being built (and the one kept when
//! laying out as entries arrive stopped), a writer holds at most `MAX_IN_FLIGHT + 2` blocks of about [`super::chunks::BLOCK_TARGET`] raw bytes (plus each
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

use super::chunks::{BlockBuilder, Hash, SealedBlock};
use super::packs::BlockAt;
use super::{Result, StorageError, Store};

/// Seal workers per writer, at most (and at most half the machine's cores, at least one).
pub const MAX_WORKERS: usize = 4;
/// Blocks handed to the workers and not yet sealed, at most (per writer).
pub const MAX_IN_FLIGHT: usize = 4;

struct Job {
    seq: u64,
    builder: BlockBuilder,
}

/// A sealed block (its sequence number; `None`: nothing was left to write), or why it was not.
type Done = (u64, Result<Option<SealedBlock>>);

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
    /// The blocks written, by sequence number, until [`SealPipeline::take_sealed`].
    sealed: Vec<(u64, SealedBlock)>,
    /// Where they are (whether a chunk found stored is one of this writer's: [`SealPipeline::wrote`]).
    sealed_at: HashSet<BlockAt>,
    /// The first worker error not yet returned.
    error: Option<StorageError>,
    /// A worker failed: the writer cannot finish any more.
    failed: bool,
    /// Workers to start; none: every block is sealed by the writer itself.
    worker_count: usize,
}

/// Half the cores: the writer's own thread and its two hashing threads need the others. On two
/// cores a second worker only added switches (1 GiB `curl -T`: 360 MB/s with two, 385 with one).
fn default_workers() -> usize {
    (std::thread::available_parallelism().map_or(1, usize::from) / 2).clamp(1, MAX_WORKERS)
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
            sealed: Vec::new(),
            sealed_at: HashSet::new(),
            error: None,
            failed: false,
            worker_count: workers,
        }
    }

    /// Whether `hash` is in a block handed over and not yet known sealed (so not yet indexed).
    pub fn holds(&self, hash: &Hash) -> bool {
        self.in_flight.iter().any(|(_, hashes)| hashes.contains(hash))
    }

    /// Whether the block at `at` is one these workers sealed (since the last
    /// [`SealPipeline::take_sealed`]).
    pub fn wrote(&self, at: &BlockAt) -> bool {
        self.sealed_at.contains(at)
    }

    fn record(&mut self, seq: u64, sealed: SealedBlock) {
        self.sealed_at.insert(sealed.at);
        self.sealed.push((seq, sealed));
    }

    /// Hands a full block to the workers (waiting while [`MAX_IN_FLIGHT`] are); returns its sequence
    /// number (what [`SealPipeline::take_sealed`] names it by), or a worker's earlier error.
    pub fn submit(&mut self, builder: BlockBuilder) -> Result<u64> {
        self.collect(false)?;
        let seq = self.next_seq;
        self.next_seq += 1;
        if builder.is_empty() {
            return Ok(seq);
        }
        while self.in_flight.len() >= MAX_IN_FLIGHT {
            self.collect(true)?;
        }
        if self.jobs.is_none() && self.workers.is_empty() && self.worker_count > 0 {
            self.start();
        }
        let Some(jobs) = &self.jobs else {
            // No worker thread could be started: seal here, as before.
            let mut builder = builder;
            if let Some(sealed) = self.store.seal_block(&mut builder)? {
                self.record(seq, sealed);
            }
            return Ok(seq);
        };
        self.in_flight.push((seq, builder.hashes().clone()));
        if jobs.send(Job { seq, builder }).is_err() {
            self.failed = true;
            return Err(worker_lost());
        }
        Ok(seq)
    }

    /// The blocks written since the last call, by sequence number (any order).
    pub fn take_sealed(&mut self) -> Vec<(u64, SealedBlock)> {
        self.sealed_at.clear();
        std::mem::take(&mut self.sealed)
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

    fn start(&mut self) {
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
        if self.workers.is_empty() {
            // Sealed inline from now on.
            self.worker_count = 0;
        } else {
            self.jobs = Some(jobs);
            self.done = Some(done);
        }
    }

    /// Alive while any worker is (tests).
    #[cfg(test)]
    pub fn liveness(&self) -> std::sync::Weak<AtomicBool> {
        Arc::downgrade(&self.stop)
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
                Ok(Some(sealed)) => self.record(seq, sealed),
                Ok(None) => {}
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

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::time::{Duration, Instant};

    use serde_json::json;

    use super::*;
    use crate::storage::tests::{noise, open};
    use crate::storage::{ObjectKey, ObjectWrite, Precondition, RangeSpec, StoreStats};

    /// Bundle-like YAML, compressible, varied by `seed`.
    fn yaml(seed: u64, len: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(len + 128);
        let mut i = 0u64;
        while out.len() < len {
            let item = format!(
                "- name: item-{seed}-{i}\n  image: registry.example/app:{}.{}\n  replicas: {}\n",
                i % 7,
                i % 13,
                (i * seed) % 5
            );
            out.extend_from_slice(item.as_bytes());
            i += 1;
        }
        out.truncate(len);
        out
    }

    fn tree() -> Vec<(String, Vec<u8>)> {
        let mut files: Vec<(String, Vec<u8>)> =
            (0..6).map(|i| (format!("charts/{i}/values.yaml"), yaml(i, 900_000 + i as usize * 37_111))).collect();
        files.push(("bin/blob".into(), noise(7, 3_000_000)));
        // The same content right after: its chunks are in blocks the workers may still be sealing.
        files.push(("bin/blob-copy".into(), noise(7, 3_000_000)));
        files.push(("charts/0/copy.yaml".into(), yaml(0, 900_000)));
        files.push(("small.txt".into(), b"hello\n".to_vec()));
        files
    }

    /// Writes `tree()` into a fresh store with `workers` seal workers: the served tar, its digest
    /// and the store's figures.
    fn ingest(workers: usize) -> (Vec<u8>, String, StoreStats) {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let mut writer = store.begin_revision().unwrap();
        writer.set_seal_workers(workers);
        for (path, data) in tree() {
            writer.add_file(&path, 0o644, data.len() as u64, &mut &data[..]).unwrap();
        }
        let mut pending = writer.finalize().unwrap();
        let record = pending.record().clone();
        let key = ObjectKey::new("bundlecontents", "ns", "tree");
        let put = ObjectWrite::Put {
            key,
            object: json!({"metadata": {"name": "tree"}}),
            precondition: Precondition::MustNotExist,
            revision: Some(record.id),
        };
        pending.commit(vec![put]).unwrap();
        let mut tar = Vec::new();
        store
            .read_tar(record.id, record.tar_size, RangeSpec { start: 0, end: record.tar_size }, &mut |b| {
                tar.extend_from_slice(b);
                Ok(())
            })
            .unwrap();
        (tar, record.digest, store.stats().unwrap())
    }

    #[test]
    fn parallel_ingest_serves_what_serial_ingest_does() {
        let (serial_tar, serial_digest, serial) = ingest(0);
        for workers in [1, 2, 4] {
            let (tar, digest, stats) = ingest(workers);
            assert_eq!(digest, serial_digest, "{workers} workers");
            assert!(tar == serial_tar, "{workers} workers: the served tar differs");
            // Chunks of blocks still in flight are stored once, as a serial writer would.
            assert_eq!(stats.chunks, serial.chunks, "{workers} workers");
            assert_eq!(stats.chunk_raw_bytes, serial.chunk_raw_bytes, "{workers} workers");
        }
        let mut archive = tar::Archive::new(&serial_tar[..]);
        let served: Vec<(String, Vec<u8>)> = archive
            .entries()
            .unwrap()
            .map(|e| {
                let mut e = e.unwrap();
                let mut data = Vec::new();
                e.read_to_end(&mut data).unwrap();
                (e.path().unwrap().to_string_lossy().into_owned(), data)
            })
            .collect();
        let mut expected = tree();
        expected.sort();
        let dirs: Vec<_> = served.iter().filter(|(p, _)| p.ends_with('/')).map(|(p, _)| p.clone()).collect();
        let files: Vec<_> = served.into_iter().filter(|(p, _)| !p.ends_with('/')).collect();
        assert!(files == expected, "served files differ from the tree written (directories: {dirs:?})");
    }

    #[test]
    fn a_worker_error_comes_back_to_the_writer() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let mut writer = store.begin_revision().unwrap();
        writer.set_seal_workers(2);
        // No pack can be created any more: every seal fails.
        std::fs::remove_dir_all(dir.path().join("packs")).unwrap();
        let started = Instant::now();
        let big = yaml(1, 12_000_000);
        let added = writer.add_file("big.yaml", 0o644, big.len() as u64, &mut &big[..]);
        let err = match added {
            Err(e) => e,
            Ok(()) => writer.finalize().err().expect("finalize must fail"),
        };
        assert!(matches!(err, StorageError::Io(_)), "{err}");
        assert!(!err.to_string().contains("earlier block"), "the worker's own error, not a follow-up: {err}");
        assert!(started.elapsed() < Duration::from_secs(60));
    }

    #[test]
    fn a_pipeline_reports_the_first_real_error_then_refuses() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        std::fs::remove_dir_all(dir.path().join("packs")).unwrap();
        let mut seals = SealPipeline::with_workers(store, 2);
        let mut results = Vec::new();
        for seed in 0..6u64 {
            let mut block = BlockBuilder::default();
            let data = noise(seed, 200_000);
            block.push(*blake3::hash(&data).as_bytes(), &data);
            results.push(seals.submit(block).map(|_| ()));
        }
        results.push(seals.finish());
        let first = results.iter().position(Result::is_err).expect("a seal must fail");
        let Some(Err(err)) = results.get(first) else { unreachable!() };
        assert!(matches!(err, StorageError::Io(e) if !e.to_string().contains("earlier block")), "{err}");
        assert!(results.iter().skip(first + 1).all(Result::is_err));
        let liveness = seals.liveness();
        drop(seals);
        assert_eq!(liveness.strong_count(), 0, "workers still running after the pipeline was dropped");
    }

    /// A reader that yields YAML, then fails: an upload cut off mid-file.
    struct CutOff {
        data: Vec<u8>,
        at: usize,
    }

    impl Read for CutOff {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let rest = self.data.get(self.at..).unwrap_or_default();
            if rest.is_empty() {
                return Err(std::io::Error::other("client went away"));
            }
            let n = rest.len().min(buf.len());
            buf[..n].copy_from_slice(&rest[..n]);
            self.at += n;
            Ok(n)
        }
    }

    #[test]
    fn dropping_a_writer_mid_file_stops_its_workers_and_unpins() {
        // A file in path order is laid out as it arrives: workers run, and stop with the writer.
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let mut writer = store.begin_revision().unwrap();
        writer.set_seal_workers(2);
        let data = yaml(3, 9_000_000);
        let declared = data.len() as u64 + 1;
        let err = writer.add_file("cut.yaml", 0o644, declared, &mut CutOff { data, at: 0 }).unwrap_err();
        assert!(err.to_string().contains("client went away"), "{err}");
        let liveness = writer.seal_liveness();
        let started = Instant::now();
        drop(writer);
        assert!(started.elapsed() < Duration::from_secs(30));
        assert_eq!(liveness.strong_count(), 0, "workers still running after the writer was dropped");
        assert!(store.lock_pins().is_empty(), "pins left behind");
        // What the workers stored goes with the next collection.
        store.collect().unwrap();
        assert_eq!(store.stats().unwrap().chunks, 0);
    }

    /// Spooled bytes are checked against their hash when finalize reads them back: those a block
    /// takes (sealed on a worker or inline) and those of a chunk met twice in the revision.
    #[test]
    fn a_damaged_spool_fails_finalize_and_stores_nothing() {
        let data = noise(11, 3_000_000);
        // "c" first: the entries are out of order, so "a" and "b" are spooled. "a" sorts first: its
        // copy goes into a block; "b" holds the same chunks, met again.
        for (workers, damaged_at) in [(0, 1_000), (2, 1_000), (2, 3_001_000)] {
            let dir = tempfile::tempdir().unwrap();
            let store = open(dir.path());
            let mut writer = store.begin_revision().unwrap();
            writer.set_seal_workers(workers);
            writer.add_file("c", 0o644, 1, &mut &b"c"[..]).unwrap();
            writer.add_file("a", 0o644, data.len() as u64, &mut &data[..]).unwrap();
            writer.add_file("b", 0o644, data.len() as u64, &mut &data[..]).unwrap();
            let spool = store.staging_dir(writer.id()).join("spool");
            let file = std::fs::OpenOptions::new().write(true).open(&spool).unwrap();
            std::os::unix::fs::FileExt::write_all_at(&file, b"\xff\x00", damaged_at).unwrap();
            let err = writer.finalize().err().expect("finalize refuses damaged spooled bytes");
            let case = format!("{workers} workers, byte {damaged_at}");
            assert!(
                matches!(&err, StorageError::Corrupt(m) if m.contains("does not match its hash")),
                "{case}: {err:?}"
            );
            store.collect().unwrap();
            assert_eq!(store.stats().unwrap().chunks, 0, "{case}: nothing stays stored");
        }
    }

    /// A writer may go on after a file failed part way: the files after it get their own digests
    /// (each file's SHA-256 is computed on a thread beside the writer, from one stream of bytes).
    #[test]
    fn a_file_cut_off_part_way_leaves_the_next_files_digests_alone() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let mut writer = store.begin_revision().unwrap();
        let (small, large) = (b"kept\n".to_vec(), yaml(5, 2_000_000));
        writer.add_file("before.txt", 0o644, small.len() as u64, &mut &small[..]).unwrap();
        for cut_at in [1_000_000, 10] {
            let cut = CutOff { data: yaml(4, cut_at), at: 0 };
            let declared = cut.data.len() as u64 * 2;
            assert!(writer.add_file(&format!("cut-{cut_at}.yaml"), 0o644, declared, &mut { cut }).is_err());
        }
        writer.add_file("large.yaml", 0o644, large.len() as u64, &mut &large[..]).unwrap();
        writer.add_file("small.txt", 0o644, small.len() as u64, &mut &small[..]).unwrap();
        let rev = crate::storage::tests::attach("digests", writer.finalize().unwrap());
        for (path, data) in [("before.txt", &small), ("large.yaml", &large), ("small.txt", &small)] {
            let entry = store.file(rev, path).unwrap().unwrap();
            assert_eq!(entry.sha256, hex::encode(<sha2::Sha256 as sha2::Digest>::digest(data)), "{path}");
        }
        assert!(store.file(rev, "cut-10.yaml").unwrap().is_none(), "a failed file is not stored");
    }
}
