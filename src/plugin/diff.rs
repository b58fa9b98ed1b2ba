//! Revisions by name or digest prefix, and the file-level difference of two listings.

use std::collections::BTreeMap;

use crate::client::{ContentClient, FileInfo};

/// [`find_revision`] of `wanted` if one is asked for (`--revision`); `None` is the served content.
pub async fn find_optional_revision(
    content: &ContentClient,
    namespace: &str,
    name: &str,
    wanted: Option<&str>,
) -> anyhow::Result<Option<String>> {
    match wanted {
        Some(wanted) => Ok(Some(find_revision(content, namespace, name, wanted).await?)),
        None => Ok(None),
    }
}

/// The BundleContent of Bundle `name` called `wanted`, or whose digest starts with it
/// (`sha256:` optional).
pub async fn find_revision(
    content: &ContentClient,
    namespace: &str,
    name: &str,
    wanted: &str,
) -> anyhow::Result<String> {
    let revisions = content.revisions(namespace, name).await?;
    let prefix = wanted.trim_start_matches("sha256:");
    let matches: Vec<_> = revisions
        .iter()
        .filter(|r| {
            r.name == wanted || (!prefix.is_empty() && r.digest.trim_start_matches("sha256:").starts_with(prefix))
        })
        .collect();
    match matches.as_slice() {
        [one] => Ok(one.name.clone()),
        [] => {
            let known: Vec<&str> = revisions.iter().map(|r| r.name.as_str()).collect();
            anyhow::bail!("no revision {wanted:?} of bundle {namespace}/{name} (revisions: {})", known.join(", "))
        }
        _ => anyhow::bail!("{wanted:?} matches several revisions of {namespace}/{name}: give more digits"),
    }
}

/// `A path`, `D path`, `M path (what changed)`, sorted by path.
pub fn compare(before: &[FileInfo], after: &[FileInfo]) -> Vec<String> {
    let old: BTreeMap<&str, &FileInfo> = before.iter().map(|f| (f.path.as_str(), f)).collect();
    let new: BTreeMap<&str, &FileInfo> = after.iter().map(|f| (f.path.as_str(), f)).collect();
    let mut lines = Vec::new();
    let mut paths: Vec<&str> = old.keys().chain(new.keys()).copied().collect();
    paths.sort_unstable();
    paths.dedup();
    for path in paths {
        match (old.get(path), new.get(path)) {
            (None, Some(_)) => lines.push(format!("A {path}")),
            (Some(_), None) => lines.push(format!("D {path}")),
            (Some(a), Some(b)) => {
                let mut what = Vec::new();
                if a.sha256 != b.sha256 || a.target != b.target {
                    what.push(format!("content {} -> {} bytes", a.size, b.size));
                }
                if a.mode != b.mode {
                    what.push(format!("mode {:o} -> {:o}", a.mode, b.mode));
                }
                if !what.is_empty() {
                    lines.push(format!("M {path} ({})", what.join(", ")));
                }
            }
            (None, None) => {}
        }
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(path: &str, sha: &str, mode: u32) -> FileInfo {
        FileInfo { path: path.into(), kind: "file".into(), mode, size: 1, sha256: sha.into(), target: None }
    }

    #[test]
    fn added_deleted_and_modified_files() {
        let before = [f("a", "1", 0o644), f("b", "2", 0o644), f("c", "3", 0o644)];
        let after = [f("a", "1", 0o755), f("c", "9", 0o644), f("d", "4", 0o644)];
        assert_eq!(compare(&before, &after), vec!["M a (mode 644 -> 755)", "D b", "M c (content 1 -> 1 bytes)", "A d"]);
    }
}
