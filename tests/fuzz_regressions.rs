//! Replays the fuzzing corpus and every input that once crashed a fuzz target (`fuzz/`) through
//! the same `stowage::fuzzing` entry points, on stable and in CI: a fixed crash that comes back
//! fails here, without a fuzzer.
//!
//! Every target must have a non-empty `fuzz/corpus/<target>/`. `fuzz/regressions/<target>/` must
//! exist and be non-empty exactly for the targets marked as having regressions below, so a lost
//! directory fails the test instead of silently replaying nothing. `FUZZ_SHOW_OUTCOMES=1` prints
//! what each input answered.

// A test fails by panicking: unwrap, expect, panic and indexing are how these tests assert.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use stowage::fuzzing;

struct Target {
    name: &'static str,
    run: fn(&[u8]) -> fuzzing::Outcome,
    /// Whether this target ever found a defect (and so has a regressions directory).
    has_regressions: bool,
}

const TARGETS: &[Target] = &[
    Target { name: "tar_ingest", run: fuzzing::tar_ingest, has_regressions: false },
    Target { name: "oci_layers", run: fuzzing::oci_layers, has_regressions: false },
    Target { name: "object_decode", run: fuzzing::object_decode, has_regressions: false },
    Target { name: "patch", run: fuzzing::patch, has_regressions: true },
    Target { name: "selectors", run: fuzzing::selectors, has_regressions: false },
    Target { name: "docker_config", run: fuzzing::docker_config, has_regressions: false },
    Target { name: "kubeconfig", run: fuzzing::kubeconfig, has_regressions: false },
    Target { name: "range_headers", run: fuzzing::range_headers, has_regressions: true },
    Target { name: "list_query", run: fuzzing::list_query, has_regressions: false },
];

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz")
}

/// The files of `dir`, sorted; panics when it is missing or empty.
fn inputs(dir: &Path) -> Vec<PathBuf> {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let mut files: Vec<PathBuf> =
        entries.map(|e| e.expect("a directory entry").path()).filter(|p| p.is_file()).collect();
    files.sort();
    assert!(!files.is_empty(), "{} holds no inputs", dir.display());
    files
}

/// Runs every input; returns the ones that panicked, with the panic message.
fn replay(target: &Target, files: &[PathBuf]) -> Vec<String> {
    let mut failures = Vec::new();
    for file in files {
        let data = std::fs::read(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let outcome = catch_unwind(AssertUnwindSafe(|| (target.run)(&data)));
        if std::env::var_os("FUZZ_SHOW_OUTCOMES").is_some() {
            // To check that seeds reach deep (are accepted) rather than fail early.
            eprintln!("{}: {:?}", file.display(), outcome.as_ref().map_err(|_| "panic"));
        }
        if let Err(panic) = outcome {
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            failures.push(format!("{}: {message}", file.display()));
        }
    }
    failures
}

#[test]
fn every_target_has_a_corpus_that_replays_without_panicking() {
    let mut failures = Vec::new();
    for target in TARGETS {
        failures.extend(replay(target, &inputs(&fuzz_dir().join("corpus").join(target.name))));
    }
    assert!(failures.is_empty(), "corpus inputs panicked:\n{}", failures.join("\n"));
}

#[test]
fn every_past_crash_stays_fixed() {
    let mut failures = Vec::new();
    for target in TARGETS {
        let dir = fuzz_dir().join("regressions").join(target.name);
        if !target.has_regressions {
            assert!(!dir.exists(), "{} exists: mark {} as having regressions", dir.display(), target.name);
            continue;
        }
        failures.extend(replay(target, &inputs(&dir)));
    }
    assert!(failures.is_empty(), "past crashes are back:\n{}", failures.join("\n"));
}

#[test]
fn every_target_directory_is_listed() {
    for kind in ["corpus", "regressions"] {
        let Ok(entries) = std::fs::read_dir(fuzz_dir().join(kind)) else { continue };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            assert!(TARGETS.iter().any(|t| t.name == name), "fuzz/{kind}/{name} belongs to no known target");
        }
    }
}
