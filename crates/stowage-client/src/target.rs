//! Where a fetch may write. A fetch replaces its target directory as a whole, so it must never
//! replace one holding anything it did not write: it takes a missing or empty directory, or one
//! that an earlier fetch of the same Bundle wrote and that nobody changed since. What an earlier
//! fetch wrote is recorded beside the directory (`.NAME.stowage-pull`, outside the tree so that a
//! `diff -r` of the pulled tree stays clean): every entry's path, kind, size and modification
//! time as extraction left them. Any entry added, removed or touched since makes the directory the
//! user's again. [`super::FetchOptions::replace`] overrides the check.

use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use serde::{Deserialize, Serialize};

use super::ClientError;

/// What an earlier fetch left in its directory.
#[derive(Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Record {
    /// `namespace/name` of the Bundle it came from.
    bundle: String,
    digest: String,
    entries: Vec<Entry>,
}

/// One entry of a tree: relative path, `f`ile / `d`irectory / `l`ink / `o`ther, size, mtime in
/// nanoseconds since the epoch.
#[derive(Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Entry(String, char, u64, i128);

fn record_path(dir: &Path) -> PathBuf {
    super::pieces::sibling(dir, "pull")
}

/// Refuses a target that holds anything but the unchanged output of an earlier fetch of `bundle`.
pub(super) fn check(dir: &Path, bundle: &str, replace: bool) -> Result<(), ClientError> {
    if replace {
        return Ok(());
    }
    let refuse = |reason: String| Err(ClientError::TargetInUse { path: dir.to_owned(), reason });
    match std::fs::symlink_metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(source) => return Err(ClientError::Io { path: dir.to_owned(), source }),
        Ok(meta) if !meta.is_dir() => return refuse("is not a directory".into()),
        Ok(_) => {}
    }
    let found = walk(dir)?;
    let Some(first) = found.first() else {
        return Ok(());
    };
    let record: Option<Record> =
        std::fs::read(record_path(dir)).ok().and_then(|bytes| serde_json::from_slice(&bytes).ok());
    let Some(record) = record else {
        return refuse(format!("holds files that no pull wrote ({})", first.0));
    };
    if record.bundle != bundle {
        return refuse(format!("holds the content of {}, not of {bundle}", record.bundle));
    }
    let mut recorded = record.entries.iter().peekable();
    let mut present = found.iter().peekable();
    // Both sorted by path: the first difference names what changed.
    loop {
        match (recorded.peek(), present.peek()) {
            (None, None) => return Ok(()),
            (Some(r), Some(p)) if r.0 == p.0 => {
                if r != p {
                    return refuse(format!("was changed since the last pull ({} differs)", p.0));
                }
                recorded.next();
                present.next();
            }
            (Some(r), Some(p)) if p.0 < r.0 => return refuse(format!("holds {}, which no pull wrote", p.0)),
            (None, Some(p)) => return refuse(format!("holds {}, which no pull wrote", p.0)),
            (Some(r), _) => return refuse(format!("was changed since the last pull ({} is gone)", r.0)),
        }
    }
}

/// Records what a fetch just put in `dir`.
pub(super) fn record(dir: &Path, bundle: &str, digest: &str) -> Result<(), ClientError> {
    let record = Record { bundle: bundle.to_owned(), digest: digest.to_owned(), entries: walk(dir)? };
    let path = record_path(dir);
    let partial = super::pieces::sibling(dir, "pull.partial");
    let io = |source| ClientError::Io { path: path.clone(), source };
    let bytes = serde_json::to_vec(&record).map_err(|e| ClientError::Protocol(e.to_string()))?;
    std::fs::write(&partial, bytes).map_err(io)?;
    std::fs::rename(&partial, &path).map_err(io)
}

/// Every entry under `dir`, sorted by path, without following symlinks.
fn walk(dir: &Path) -> Result<Vec<Entry>, ClientError> {
    let mut entries = Vec::new();
    for item in walkdir::WalkDir::new(dir).min_depth(1).sort_by_file_name() {
        let item = item.map_err(|e| {
            let path = e.path().unwrap_or(dir).to_owned();
            ClientError::Io { path, source: e.into() }
        })?;
        let meta = item.metadata().map_err(|e| ClientError::Io { path: item.path().to_owned(), source: e.into() })?;
        let kind = match meta.file_type() {
            t if t.is_dir() => 'd',
            t if t.is_file() => 'f',
            t if t.is_symlink() => 'l',
            _ => 'o',
        };
        // A directory's time moves with its entries, which are compared themselves.
        let mtime = match kind {
            'd' => 0,
            _ => {
                meta.modified().ok().and_then(|t| t.duration_since(UNIX_EPOCH).ok()).map_or(0, |d| d.as_nanos() as i128)
            }
        };
        let path = item.path().strip_prefix(dir).unwrap_or(item.path()).to_string_lossy().into_owned();
        let size = if kind == 'f' { meta.len() } else { 0 };
        entries.push(Entry(path, kind, size, mtime));
    }
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(dir: &Path, bundle: &str) -> String {
        match check(dir, bundle, false) {
            Err(ClientError::TargetInUse { reason, .. }) => reason,
            other => panic!("not refused: {other:?}"),
        }
    }

    #[test]
    fn missing_and_empty_directories_are_taken() {
        let tmp = tempfile::tempdir().unwrap();
        check(&tmp.path().join("new"), "ns/b", false).unwrap();
        check(tmp.path(), "ns/b", false).unwrap();
    }

    #[test]
    fn a_directory_no_pull_wrote_is_refused_unless_replacing() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("notes.txt"), "mine").unwrap();
        assert!(refused(tmp.path(), "ns/b").contains("notes.txt"));
        check(tmp.path(), "ns/b", true).unwrap();
        let file = tmp.path().join("notes.txt");
        assert!(refused(&file, "ns/b").contains("not a directory"));
    }

    #[test]
    fn only_an_unchanged_pull_of_the_same_bundle_is_replaced() {
        let parent = tempfile::tempdir().unwrap();
        let dir = parent.path().join("out");
        std::fs::create_dir_all(dir.join("templates")).unwrap();
        std::fs::write(dir.join("Chart.yaml"), "name: a\n").unwrap();
        std::fs::write(dir.join("templates/cm.yaml"), "kind: ConfigMap\n").unwrap();
        record(&dir, "ns/b", "sha256:00").unwrap();
        assert!(!dir.join(".out.stowage-pull").exists(), "the record is outside the tree");
        check(&dir, "ns/b", false).unwrap();
        assert!(refused(&dir, "ns/other").contains("ns/b"));

        std::fs::write(dir.join("templates/extra.yaml"), "mine").unwrap();
        assert!(refused(&dir, "ns/b").contains("templates/extra.yaml"));
        std::fs::remove_file(dir.join("templates/extra.yaml")).unwrap();
        check(&dir, "ns/b", false).unwrap();
        std::fs::remove_file(dir.join("Chart.yaml")).unwrap();
        assert!(refused(&dir, "ns/b").contains("Chart.yaml is gone"));
        std::fs::write(dir.join("Chart.yaml"), "name: b\n").unwrap();
        assert!(refused(&dir, "ns/b").contains("Chart.yaml differs"));
    }
}
