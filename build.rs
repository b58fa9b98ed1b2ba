//! Build metadata for `stowage_build_info` (src/apiserver/metrics/process.rs): the compiler's
//! version and the git commit the crate was built from. Cheap: two short commands, rerun only when
//! the checked-out commit changes. `STOWAGE_GIT_COMMIT` overrides the commit (image builds whose
//! context has no `.git`); outside a git checkout of this crate (a source tarball, a registry
//! download) the commit is `unknown`.

use std::path::Path;
use std::process::Command;

fn output(program: &str, args: &[&str], dir: &Path) -> Option<String> {
    let out = Command::new(program).args(args).current_dir(dir).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    let text = text.trim();
    (out.status.success() && !text.is_empty()).then(|| text.to_owned())
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=STOWAGE_GIT_COMMIT");
    let manifest = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| ".".into());
    let dir = Path::new(&manifest);
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let rust_version = output(&rustc, &["--version"], dir).unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=STOWAGE_RUST_VERSION={rust_version}");
    let commit = match std::env::var("STOWAGE_GIT_COMMIT") {
        Ok(commit) if !commit.trim().is_empty() => commit.trim().to_owned(),
        _ => git_commit(dir).unwrap_or_else(|| "unknown".into()),
    };
    println!("cargo:rustc-env=STOWAGE_GIT_COMMIT={commit}");
}

/// HEAD's commit, if `dir` is the top of a git checkout (not a tarball unpacked inside another
/// repository); asks cargo to rerun when HEAD or the branch it names moves.
fn git_commit(dir: &Path) -> Option<String> {
    let top = output("git", &["rev-parse", "--show-toplevel"], dir)?;
    let same = match (Path::new(&top).canonicalize(), dir.canonicalize()) {
        (Ok(top), Ok(dir)) => top == dir,
        _ => false,
    };
    if !same {
        return None;
    }
    let git_dir = output("git", &["rev-parse", "--absolute-git-dir"], dir)?;
    let git_dir = Path::new(&git_dir);
    // Only paths that exist: a missing one would rerun this script on every build.
    let mut watched = vec![git_dir.join("HEAD"), git_dir.join("packed-refs")];
    if let Some(branch) = output("git", &["symbolic-ref", "-q", "HEAD"], dir) {
        watched.push(git_dir.join(branch));
    }
    for path in watched.iter().filter(|p| p.exists()) {
        println!("cargo:rerun-if-changed={}", path.display());
    }
    output("git", &["rev-parse", "--short=12", "HEAD"], dir)
}
