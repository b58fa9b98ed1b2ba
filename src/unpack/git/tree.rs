//! Streams a commit's tree (or one subdirectory of it) into a sink: blobs become files (mode
//! 100755 → 0755, else 0644: all git records), symlinks are kept when their target stays inside
//! the tree, submodules are skipped; directories are implied by their files (git has no empty
//! ones) and so are not entries. Files come in path order. Enforces the unpack limits and checks
//! cancellation between entries.
//!
//! Each blob is decoded whole by gix before it is written (gix reads objects only whole: packed
//! ones may be deltas), so memory is bounded by the largest single file, which is checked against
//! `max_file_bytes` and `max_git_file_bytes` (`--max-git-file-bytes`, also gix's own allocation
//! limit) from the object header *before* decoding.

use gix::objs::tree::EntryKind;

use crate::unpack::error::UnpackError;
use crate::unpack::source::{Sink, SourceContext};

pub(super) fn walk(
    repo: &gix::Repository,
    root: gix::ObjectId,
    directory: &str,
    commit: gix::ObjectId,
    ctx: &SourceContext,
    sink: &mut Sink<'_>,
) -> Result<(), UnpackError> {
    let start = subdirectory(repo, root, directory, commit)?;
    let mut added = Added::default();
    // Depth-first, a subtree's entries where the subtree sits: git sorts a tree's entries by name,
    // a subtree's as if it ended in `/`, so the files come in path order, the order the store
    // serves them in (it lays them out as they arrive). Paths are relative to `start`.
    let mut stack = vec![Pending::Tree(String::new(), start)];
    while let Some(pending) = stack.pop() {
        let (prefix, tree_id) = match pending {
            Pending::Tree(prefix, tree_id) => (prefix, tree_id),
            Pending::Entry(kind, path, oid) => {
                ctx.check_cancelled()?;
                add_entry(repo, (kind, &path, oid), ctx, sink, &mut added, commit)?;
                continue;
            }
        };
        ctx.check_cancelled()?;
        let tree = repo
            .find_tree(tree_id)
            .map_err(|e| corrupt(commit, format!("tree {tree_id} is missing or corrupt"), &e))?;
        let decoded = tree.decode().map_err(|e| corrupt(commit, format!("tree {tree_id} does not decode"), &e))?;
        let entries: Vec<(EntryKind, Result<String, ()>, gix::ObjectId)> = decoded
            .entries
            .iter()
            .map(|e| {
                let name = std::str::from_utf8(e.filename).map(str::to_owned).map_err(|_| ());
                (e.mode.kind(), name, e.oid.to_owned())
            })
            .collect();
        // A hostile server may send a tree naming one entry twice (e.g. as a file and as a
        // directory); names unique per tree make every path unique and never both kinds.
        let mut names = std::collections::HashSet::with_capacity(entries.len());
        let mut items = Vec::with_capacity(entries.len());
        for (kind, name, oid) in entries {
            let Ok(name) = name else {
                return Err(UnpackError::InvalidEntry {
                    path: format!("{prefix}?"),
                    reason: "file name is not UTF-8".into(),
                });
            };
            // Names a valid git tree never holds, but a hostile server may send.
            if name.is_empty() || name == "." || name == ".." || name.contains(['/', '\0']) {
                return Err(UnpackError::InvalidEntry {
                    path: format!("{prefix}{name}"),
                    reason: "invalid file name in git tree".into(),
                });
            }
            let path = format!("{prefix}{name}");
            if !names.insert(name) {
                return Err(UnpackError::InvalidEntry { path, reason: "duplicate name in git tree".into() });
            }
            items.push(match kind {
                EntryKind::Tree => Pending::Tree(format!("{path}/"), oid),
                _ => Pending::Entry(kind, path, oid),
            });
        }
        // Popped in the tree's order.
        stack.extend(items.into_iter().rev());
    }
    Ok(())
}

/// A bad object of `commit`: gix's wording is logged, not shown; the user learns which object of
/// the commit is bad.
fn corrupt(commit: gix::ObjectId, what: String, e: &dyn std::fmt::Display) -> UnpackError {
    tracing::debug!(%commit, error = %e, "{what}");
    UnpackError::CorruptArchive(format!("git commit {commit}: {what}"))
}

/// What the walk has still to do: a tree to list, or a tree's entry to add.
enum Pending {
    Tree(String, gix::ObjectId),
    Entry(EntryKind, String, gix::ObjectId),
}

/// Files and bytes added so far (the limits count them).
#[derive(Default)]
struct Added {
    files: u64,
    bytes: u64,
}

/// Adds one entry of a tree (a file, a symlink; a submodule is skipped) within the limits.
fn add_entry(
    repo: &gix::Repository,
    (kind, path, oid): (EntryKind, &str, gix::ObjectId),
    ctx: &SourceContext,
    sink: &mut Sink<'_>,
    added: &mut Added,
    commit: gix::ObjectId,
) -> Result<(), UnpackError> {
    let limits = &ctx.limits;
    if kind == EntryKind::Commit {
        return Ok(()); // a submodule: its content lives in another repository
    }
    if path.len() > limits.max_path_bytes {
        return Err(UnpackError::TooLarge(format!(
            "path {path:?} is longer than the limit of {} bytes",
            limits.max_path_bytes
        )));
    }
    added.files += 1;
    if added.files > limits.max_files {
        return Err(UnpackError::TooLarge(format!(
            "git commit {commit} has more than the limit of {} files",
            limits.max_files
        )));
    }
    let size =
        repo.find_header(oid).map_err(|e| corrupt(commit, format!("object {oid} is missing or corrupt"), &e))?.size();
    if size > limits.max_file_bytes {
        return Err(UnpackError::TooLarge(format!(
            "{path}: {size} bytes is more than the limit of {} per file",
            limits.max_file_bytes
        )));
    }
    if size > limits.max_git_file_bytes {
        return Err(UnpackError::TooLarge(format!(
            "{path}: {size} bytes is more than the limit of {} per git file (--max-git-file-bytes)",
            limits.max_git_file_bytes
        )));
    }
    added.bytes = added.bytes.saturating_add(size);
    if added.bytes > limits.max_total_bytes {
        return Err(UnpackError::TooLarge(format!(
            "git commit {commit} unpacks to more than the limit of {} bytes",
            limits.max_total_bytes
        )));
    }
    let blob = repo.find_blob(oid).map_err(|e| corrupt(commit, format!("blob {oid} is missing or corrupt"), &e))?;
    match kind {
        EntryKind::Link => {
            let target = std::str::from_utf8(&blob.data).map_err(|_| UnpackError::InvalidEntry {
                path: path.into(),
                reason: "symlink target is not UTF-8".into(),
            })?;
            check_symlink(path, target)?;
            sink.symlink(path, target)?;
        }
        _ => {
            // git records only whether a blob is executable.
            let mode = if kind == EntryKind::BlobExecutable { 0o755 } else { 0o644 };
            sink.file(path, mode, blob.data.len() as u64, &mut &blob.data[..])?;
        }
    }
    Ok(())
}

/// The tree `directory` names inside `root` (the root itself when empty).
fn subdirectory(
    repo: &gix::Repository,
    root: gix::ObjectId,
    directory: &str,
    commit: gix::ObjectId,
) -> Result<gix::ObjectId, UnpackError> {
    let dir = directory.trim_matches('/');
    if dir.is_empty() {
        return Ok(root);
    }
    let missing = |problem: String| UnpackError::InvalidFormat {
        path: directory.to_owned(),
        problem: format!("git directory {directory:?} {problem}"),
    };
    if dir.split('/').any(|c| c.is_empty() || c == "." || c == "..") {
        return Err(missing("must be a relative path without '.' or '..' components".into()));
    }
    let unreadable = |e: &dyn std::fmt::Display| {
        tracing::debug!(%commit, error = %e, "reading the commit's tree failed");
        UnpackError::CorruptArchive(format!("git commit {commit}: its tree {root} is missing or corrupt"))
    };
    let tree = repo.find_tree(root).map_err(|e| unreadable(&e))?;
    let entry = tree.lookup_entry_by_path(dir).map_err(|e| unreadable(&e))?;
    match entry {
        Some(e) if e.mode().is_tree() => Ok(e.object_id()),
        Some(_) => Err(missing(format!("is not a directory in commit {commit}"))),
        None => Err(missing(format!("does not exist in commit {commit}"))),
    }
}

/// A symlink at `path` may point only at something inside the tree: relative, and never climbing
/// above the root.
fn check_symlink(path: &str, target: &str) -> Result<(), UnpackError> {
    let invalid = |reason: &str| UnpackError::InvalidEntry { path: path.to_owned(), reason: reason.to_owned() };
    if target.is_empty() || target.contains('\0') {
        return Err(invalid("empty or invalid symlink target"));
    }
    if target.starts_with('/') {
        return Err(invalid("symlink target is absolute"));
    }
    // Depth of the link's directory below the root, then walk the target from there.
    let mut depth = path.matches('/').count() as i64;
    for component in target.split('/') {
        match component {
            "" | "." => {}
            ".." => {
                depth -= 1;
                if depth < 0 {
                    return Err(invalid("symlink target points outside the tree"));
                }
            }
            _ => depth += 1,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::check_symlink;

    #[test]
    fn symlinks_stay_inside() {
        assert!(check_symlink("a", "b").is_ok());
        assert!(check_symlink("a/b", "../c").is_ok());
        assert!(check_symlink("a/b", "../../c").is_err());
        assert!(check_symlink("a", "/etc/passwd").is_err());
        assert!(check_symlink("a/b/c", "d/../../x").is_ok());
        assert!(check_symlink("a", "x/../../y").is_err());
    }
}
