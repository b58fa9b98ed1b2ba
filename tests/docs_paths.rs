//! Every repository path the documentation names exists.
//!
//! The rule, kept simple so a writer can predict it:
//! - only inline code spans count (text between backticks; fenced code blocks are skipped), read a
//!   paragraph at a time so a span may wrap onto the next line;
//! - a span's first word is a path when it starts with one of [`ROOTS`] (`src/`, `crates/`,
//!   `tests/`, `deploy/`, …): so `scripts/bench.sh writes` checks `scripts/bench.sh`;
//! - a word holding a placeholder or a pattern (`*`, `<`, `{`, `…`, `$`) is not checked, nor is
//!   text after `:` or `#` (a line number, an anchor);
//! - the path must exist under the repository, as a file or a directory (a trailing `/` is fine).
//!
//! Checked: `ARCHITECTURE.md`, `README.md` and every `docs/*.md`. The failure lists every missing
//! path with the file that names it.

// Tests state their expectations with unwrap, indexing and panics.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

use std::path::Path;

/// The top-level directories of the repository a documented path may start with.
const ROOTS: &[&str] =
    &["src/", "crates/", "tests/", "deploy/", "docs/", "scripts/", "certs/", "examples/", "fuzz/", "bench/", ".ci/"];

/// Characters that mark a word as a placeholder or a pattern rather than a path.
const NOT_A_PATH: &[char] = &['*', '<', '>', '{', '}', '…', '$', '|'];

/// The paths `text` names by the rule above, in order of appearance.
fn named_paths(text: &str) -> Vec<String> {
    let mut paths = Vec::new();
    let mut paragraph = String::new();
    let mut fenced = false;
    for line in text.lines().chain(std::iter::once("")) {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        if !line.trim().is_empty() {
            paragraph.push_str(line);
            paragraph.push('\n');
            continue;
        }
        // Odd pieces of a paragraph split at backticks are the code spans.
        for span in paragraph.split('`').skip(1).step_by(2) {
            let Some(word) = span.split_whitespace().next() else { continue };
            let word = word.split([':', '#']).next().unwrap_or_default();
            if ROOTS.iter().any(|root| word.starts_with(root)) && !word.contains(NOT_A_PATH) {
                paths.push(word.to_string());
            }
        }
        paragraph.clear();
    }
    paths
}

#[test]
fn rule_reads_spans_and_skips_fences_and_placeholders() {
    let text = "See `src/lib.rs` and `scripts/bench.sh writes`, wrapped `scripts/bench.sh\nwrites`? No:\n\
                `bench/*.sh`, `src/<x>.rs`, `cargo test`, `tests/a.rs:12`.\n\n```\n`src/in_fence.rs`\n```\n";
    assert_eq!(named_paths(text), ["src/lib.rs", "scripts/bench.sh", "scripts/bench.sh", "tests/a.rs"]);
}

#[test]
fn every_path_the_docs_name_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut documents = vec![root.join("ARCHITECTURE.md"), root.join("README.md")];
    let mut docs: Vec<_> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    docs.sort();
    documents.extend(docs);

    let mut missing = Vec::new();
    let mut checked = 0;
    for document in &documents {
        let text = std::fs::read_to_string(document).unwrap();
        let name = document.strip_prefix(root).unwrap().display().to_string();
        for path in named_paths(&text) {
            checked += 1;
            if !root.join(&path).exists() {
                missing.push(format!("{name}: `{path}`"));
            }
        }
    }
    missing.sort();
    missing.dedup();
    assert!(checked > 0, "no path found in {documents:?}");
    assert!(missing.is_empty(), "{} named path(s) do not exist:\n{}", missing.len(), missing.join("\n"));
}
