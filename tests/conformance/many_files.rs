//! Memory is bounded by configuration, never by the number of files (issue 13): a small gzip tar of
//! many empty files that is refused at its last entry, and a revision of as many files uploaded and
//! then deleted, cost the server a bounded number of bytes per file at the peak, and its memory
//! comes back near where it was once the revision is released. (Before the fix, releasing a
//! revision removed all of its per-file keys in one sled batch: 1,000,000 files held 4.5 GiB until
//! restart.) The 1,000,000-file figures are in `docs/benchmarks.md` (`bench/many_files.sh`).

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use reqwest::StatusCode;

use crate::harness::*;
use crate::raw_client::rss_kib;
use crate::tarutil::*;

/// Empty files per archive: enough that per-file costs dwarf the constant ones, small enough to
/// run in well under a minute on two cores.
const FILES: u64 = 150_000;
/// Peak growth allowed per file over the idle server (the target is < 300 MiB at 1,000,000 files,
/// idle baseline included).
const MAX_PEAK_BYTES_PER_FILE: u64 = 200;
/// What the server may keep after the revision is gone, over its idle RSS before (allocator slack,
/// sled's page cache, which is bounded by `cache_capacity`).
const MAX_RETAINED_KIB: u64 = 48 << 10;
const PHASE_TIMEOUT: Duration = Duration::from_secs(180);

/// A gzip tar of `files` empty files `f/0000000`, … then, if `evil`, a `../escape` entry.
fn many_empty_files(files: u64, evil: bool) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    for i in 0..files {
        gz.write_all(&raw_entry(&format!("f/{i:07}"), b'0', b"", "")).unwrap();
    }
    if evil {
        gz.write_all(&raw_entry("../escape", b'0', b"", "")).unwrap();
    }
    gz.write_all(&[0u8; 1024]).unwrap();
    gz.finish().unwrap()
}

/// The highest RSS seen since the last `take`, sampled every 20 ms on a thread of its own.
struct Sampler {
    peak: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Sampler {
    fn start(pid: u32) -> Sampler {
        let (peak, stop) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicBool::new(false)));
        let (p, s) = (peak.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                p.fetch_max(rss_kib(pid), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        Sampler { peak, stop, thread: Some(thread) }
    }

    fn take(&self) -> u64 {
        self.peak.swap(0, Ordering::Relaxed)
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Waits until no revision is staging or being deleted, and `committed` are committed.
async fn revisions_settle(server: &Server, committed: f64) {
    eventually(PHASE_TIMEOUT, "revisions released", || async {
        let m = server.metrics().await;
        let get = |state: &str| m.get(&format!("stowage_revisions{{state=\"{state}\"}}")).copied().unwrap_or(-1.0);
        let seen = (get("committed"), get("staging"), get("deleting"));
        if seen == (committed, 0.0, 0.0) {
            Ok(())
        } else {
            Err(format!("committed/staging/deleting = {seen:?}"))
        }
    })
    .await;
}

/// RSS after the allocator and sled had a moment to settle.
async fn settled_rss(server: &Server) -> u64 {
    tokio::time::sleep(Duration::from_secs(2)).await;
    rss_kib(server.pid())
}

/// Reports a phase's memory; the problems found, if any.
fn check_phase(what: &str, baseline: u64, peak: u64, after: u64) -> Vec<String> {
    let per_file = (peak.saturating_sub(baseline) << 10) / FILES;
    report(&format!(
        "{what} ({FILES} files): RSS idle {} MiB, peak {} MiB ({per_file} B/file over idle), after {} MiB",
        baseline >> 10,
        peak >> 10,
        after >> 10
    ));
    let mut problems = Vec::new();
    if per_file > MAX_PEAK_BYTES_PER_FILE {
        problems.push(format!(
            "{what}: peak RSS {peak} KiB is {per_file} bytes per file over the idle {baseline} KiB \
             (at most {MAX_PEAK_BYTES_PER_FILE})"
        ));
    }
    if after > baseline + MAX_RETAINED_KIB {
        problems.push(format!(
            "{what}: RSS {after} KiB once the revision is released, idle was {baseline} KiB \
             (at most {MAX_RETAINED_KIB} KiB more)"
        ));
    }
    problems
}

#[tokio::test(flavor = "multi_thread")]
async fn many_files_refused_or_deleted_cost_bounded_memory_per_file_and_are_given_back() {
    let server = Server::start_temp(&[]);
    let (evil, good) =
        tokio::task::spawn_blocking(|| (many_empty_files(FILES, true), many_empty_files(FILES, false))).await.unwrap();
    server.create_bundle("many", "refused").await;
    server.create_bundle("many", "deleted").await;
    revisions_settle(&server, 0.0).await;
    let sampler = Sampler::start(server.pid());

    // 1. Refused at its last entry: everything it wrote is released.
    let baseline = settled_rss(&server).await;
    sampler.take();
    let resp = tokio::time::timeout(PHASE_TIMEOUT, server.upload("many", "refused", evil, Some("gzip")))
        .await
        .expect("refused upload timed out");
    let status = expect_status(resp, 422, "Invalid").await;
    assert!(status["message"].as_str().unwrap_or("").contains("../escape"), "{status:#}");
    revisions_settle(&server, 0.0).await;
    let peak = sampler.take();
    let mut problems = check_phase("refused upload", baseline, peak, settled_rss(&server).await);

    // 2. Accepted, then the Bundle deleted: its BundleContent and revision go with it.
    let baseline = settled_rss(&server).await;
    sampler.take();
    let b = tokio::time::timeout(PHASE_TIMEOUT, server.upload_ok("many", "deleted", good, Some("gzip")))
        .await
        .expect("upload timed out");
    assert_eq!(u64_at(&b, "/status/files"), FILES);
    revisions_settle(&server, 1.0).await;
    let resp = server.delete(&bundle("many", "deleted")).await;
    assert_eq!(resp.status(), StatusCode::OK);
    eventually(PHASE_TIMEOUT, "BundleContent collected", || async {
        let names = server.bundlecontent_names("many").await;
        if names.is_empty() {
            Ok(())
        } else {
            Err(format!("{names:?}"))
        }
    })
    .await;
    revisions_settle(&server, 0.0).await;
    let peak = sampler.take();
    problems.extend(check_phase("upload then delete", baseline, peak, settled_rss(&server).await));
    report(&format!("many files: server peak RSS (VmHWM) {} MiB", server.peak_rss_kib() >> 10));
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
