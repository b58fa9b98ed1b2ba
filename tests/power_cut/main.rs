//! Power-cut suite (ALICE / LazyFS style): a concurrent workload runs on the store in a child
//! process under an `LD_PRELOAD` shim (shim.c, compiled here with `cc`) that records every write,
//! sync and directory change under the data directory, with the data, and the workload's
//! acknowledgments at their exact places. Then, for each of many seeded crash points, the
//! directory a power cut there would leave is rebuilt ([`trace`] documents the model), the store
//! opened on it, and checked: every acknowledged write there, every attached revision whole.
//!
//! `STOWAGE_POWER_CUT_SEED` picks the crash points (and the workload's content) again; the
//! thread interleaving, so the trace, differs from run to run. `STOWAGE_POWER_CUT_POINTS` sets how
//! many (default 200). A failure keeps the trace and its crash states and prints where;
//! `STOWAGE_POWER_CUT_RAW=1` also keeps each state as rebuilt, before recovery changed it, and
//! `STOWAGE_POWER_CUT_PROBE` ([`probe`]) replays a kept trace.
//!
//! Also here: a failing fsync (the shim fails one) poisons the store — writes refused, reads kept
//! ([`poison`]); the standalone certificates survive a power cut right after they were written
//! ([`pki`]).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

mod check;
mod pki;
mod poison;
mod rng;
mod trace;
mod workload;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use rng::Rng;
use stowage::storage::Store;
use trace::Trace;

const CHILD: &str = "STOWAGE_POWER_CUT_CHILD";
const DEFAULT_POINTS: usize = 200;

fn main() {
    if let Ok(mode) = std::env::var(CHILD) {
        let root = PathBuf::from(std::env::var("PCUT_ROOT").unwrap());
        let marks = PathBuf::from(std::env::var("PCUT_MARKS").unwrap());
        let seed: u64 = std::env::var("STOWAGE_POWER_CUT_SEED").unwrap().parse().unwrap();
        match mode.as_str() {
            "workload" => workload::run(&root, &marks, seed),
            "pki" => pki::run(&root),
            other => poison::run(&root, other.trim_start_matches("poison:")),
        }
        return;
    }
    if let Ok(probe) = std::env::var("STOWAGE_POWER_CUT_PROBE") {
        return self::probe(&probe);
    }
    if std::env::args().any(|a| a == "--list") {
        println!("power_cut: test\npoisoned_store: test\npki_power_cut: test");
        return;
    }
    let filter: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let wanted = |name: &str| filter.is_empty() || filter.iter().any(|f| name.contains(f.as_str()));
    let work = tempfile::Builder::new().prefix("power-cut-").tempdir().unwrap();
    let shim = build_shim(work.path());
    let mut failed = false;
    if wanted("power_cut") {
        failed |= !power_cut(work.path(), &shim);
    }
    if wanted("poisoned_store") {
        for failing in ["packs/pack-:3", "db/db:8"] {
            failed |= !poison::suite(work.path(), &shim, failing);
        }
    }
    if wanted("pki_power_cut") {
        failed |= !pki::suite(work.path(), &shim);
    }
    if failed {
        // Exits without removing the work directory: the failing crash states stay for a look.
        println!("work directory kept: {}", work.path().display());
        std::process::exit(1);
    }
}

/// Debugging a kept trace: `DIR:FROM:TO` opens the synced-only crash state of `DIR/trace.bin`
/// after each operation in `FROM..TO` and prints the resourceVersion the store recovers (with
/// `:raw` appended, only rebuilds them); `DATA_DIR:open` opens one. `RUST_LOG=sled=trace` shows
/// sled's recovery.
fn probe(probe: &str) {
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).init();
    }
    let parts: Vec<&str> = probe.split(':').collect();
    let dir = PathBuf::from(parts[0]);
    if parts[1] == "open" {
        println!("{:?}", Store::open(&dir, workload::options()).map(|s| s.current_resource_version()));
        return;
    }
    let trace = Trace::read(&dir.join("trace.bin"));
    for p in parts[1].parse::<usize>().unwrap()..parts[2].parse().unwrap() {
        let state = dir.join(format!("probe-{p}"));
        trace.materialize(p, None, &journaled, &state);
        if parts.get(3) != Some(&"raw") {
            let rv = Store::open(&state.join("data"), workload::options()).map(|s| s.current_resource_version());
            println!("after {p}: {rv:?}");
        }
    }
}

/// Directories of the journaled model ([`trace`]): sled's, which sled never syncs.
fn journaled(dir: &str) -> bool {
    dir == "data/db" || dir.starts_with("data/db/")
}

/// Compiles the shim; the suite fails (never skips) without a C compiler.
fn build_shim(work: &Path) -> PathBuf {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/power_cut/shim.c");
    let out = work.join("shim.so");
    let status = Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-Wall", "-o"])
        .arg(&out)
        .arg(&source)
        .args(["-ldl", "-lpthread"])
        .status()
        .unwrap_or_else(|e| panic!("power_cut needs a C compiler (`cc`) to build its LD_PRELOAD shim: {e}"));
    assert!(status.success(), "compiling {} failed", source.display());
    out
}

/// Runs this binary as a traced child in `mode`; returns the trace directory.
pub fn traced_child(work: &Path, shim: &Path, mode: &str, seed: u64, failing: Option<&str>) -> (PathBuf, bool) {
    let dir = work.join(mode.replace(['/', ':'], "_"));
    let root = dir.join("root");
    std::fs::create_dir_all(&root).unwrap();
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .env(CHILD, mode)
        .env("STOWAGE_POWER_CUT_SEED", seed.to_string())
        .env("LD_PRELOAD", shim)
        .env("PCUT_ROOT", &root)
        .env("PCUT_TRACE", dir.join("trace.bin"))
        .env("PCUT_MARKS", dir.join("marks.log"))
        // Syncs take longer the more they flush (a 100 KB pack block ~8 ms, a sled commit of a few
        // KB under 1 ms), as on a disk: another thread's sync is still running while a writer
        // goes on, which is where a sync that does not cover what it should shows.
        .env("PCUT_FSYNC_US", "150")
        .env("PCUT_FSYNC_US_PER_KB", "80");
    if let Some(failing) = failing {
        command.env("PCUT_FAIL_FSYNC", failing);
    }
    let status = command.status().unwrap();
    (dir, status.success())
}

fn power_cut(work: &Path, shim: &Path) -> bool {
    let seed: u64 = match std::env::var("STOWAGE_POWER_CUT_SEED") {
        Ok(s) => s.parse().expect("STOWAGE_POWER_CUT_SEED is a number"),
        Err(_) => std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64,
    };
    let points: usize = std::env::var("STOWAGE_POWER_CUT_POINTS").map_or(DEFAULT_POINTS, |n| n.parse().unwrap());
    println!("power_cut: seed {seed} (STOWAGE_POWER_CUT_SEED={seed} picks the same crash points), {points} points");
    let started = Instant::now();
    let (dir, ok) = traced_child(work, shim, "workload", seed, None);
    assert!(ok, "power_cut: the traced workload failed (seed {seed})");
    let trace = Trace::read(&dir.join("trace.bin"));
    let expectations = check::Expectations::new(&trace.marks());
    println!(
        "power_cut: workload traced in {:.1?}: {} operations, {} syncs, {:.1} MB written, {} writes acknowledged",
        started.elapsed(),
        trace.ops.len(),
        trace.syncs.len(),
        trace.data_bytes() as f64 / 1e6,
        expectations.acknowledged(),
    );
    let mut rng = Rng::new(seed);
    let (after_revision_acks, after_other_acks) = expectations.ack_points();
    let sync_ends: Vec<usize> = trace.syncs.iter().filter_map(|s| s.end).collect();
    let mut failures = Vec::new();
    for i in 0..points {
        // First, just after each acknowledgment of a revision, with synced data only: the
        // harshest moment for what it promised (other threads' syncs are in flight then). Then
        // after other acknowledgments, just before a sync returns, or anywhere.
        let (p, extra) = match after_revision_acks.get(i) {
            Some(&p) => (p, false),
            None => {
                let p = match rng.below(10) {
                    0..=2 => rng.pick(&after_revision_acks).copied(),
                    3..=5 => rng.pick(&after_other_acks).copied(),
                    6..=7 => rng.pick(&sync_ends).copied(),
                    _ => None,
                };
                (p.unwrap_or_else(|| rng.below(trace.ops.len() as u64 + 1) as usize), rng.below(2) == 0)
            }
        };
        let state = dir.join(format!("crash-{i}"));
        let extra_seed = rng.next();
        trace.materialize(p, extra.then_some(&mut Rng::new(extra_seed)), &journaled, &state);
        if std::env::var_os("STOWAGE_POWER_CUT_RAW").is_some() {
            // The crash state as rebuilt, kept apart: recovery changes the one it opens.
            trace.materialize(p, extra.then_some(&mut Rng::new(extra_seed)), &journaled, &dir.join(format!("raw-{i}")));
        }
        let problems = match std::panic::catch_unwind(|| match Store::open(&state.join("data"), workload::options()) {
            Ok(store) => {
                // The store serves while the collection recovery owes runs: checked then, and again
                // once that pass is over (it must not have taken anything acknowledged).
                let mut problems = expectations.check(&store, p);
                if !store.wait_recovered(std::time::Duration::from_secs(60)) {
                    problems.push("recovery did not finish within 60 s".to_string());
                } else if problems.is_empty() {
                    problems = expectations.check(&store, p);
                }
                problems
            }
            Err(e) => vec![format!("the store does not open: {e}")],
        }) {
            Ok(problems) => problems,
            Err(_) => vec!["the check panicked".to_string()],
        };
        if problems.is_empty() {
            std::fs::remove_dir_all(&state).unwrap();
        } else {
            let mode = if extra { "with extra writes" } else { "synced data only" };
            failures.push(format!(
                "crash point {i}: after operation {p} of {} ({mode}), state kept in {}:\n    {}",
                trace.ops.len(),
                state.display(),
                problems.join("\n    ")
            ));
        }
    }
    println!("power_cut: {points} crash points checked in {:.1?}", started.elapsed());
    if failures.is_empty() {
        return true;
    }
    println!("power_cut: FAILED with seed {seed}: {} of {points} crash points:", failures.len());
    for failure in failures.iter().take(10) {
        println!("  {failure}");
    }
    false
}
