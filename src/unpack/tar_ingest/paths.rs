//! Paths: normalisation and validation of entry paths and symlink targets, the tree of accepted
//! paths (duplicate and file/directory conflict detection), and quoting paths in error messages.

use std::collections::HashMap;

/// Longest path quoted in an error message.
const MAX_DISPLAY_CHARS: usize = 512;

/// Where a path points in the tree being built.
pub(super) enum Kind {
    Dir(HashMap<Box<str>, usize>),
    File {
        size: u64,
    },
    /// A hard link, resolved to the regular file it copies.
    Hardlink {
        size: u64,
        origin: Box<str>,
    },
    Symlink,
}

/// All paths seen so far, as a tree of components (memory ~ total distinct path components).
pub(super) struct Tree {
    nodes: Vec<Kind>,
}

impl Tree {
    pub(super) fn new() -> Tree {
        Tree { nodes: vec![Kind::Dir(HashMap::new())] }
    }

    pub(super) fn child(&self, node: usize, name: &str) -> Option<usize> {
        match self.nodes.get(node) {
            Some(Kind::Dir(children)) => children.get(name).copied(),
            _ => None,
        }
    }

    pub(super) fn lookup(&self, path: &str) -> Option<&Kind> {
        let mut node = 0;
        for comp in path.split('/') {
            node = self.child(node, comp)?;
        }
        self.nodes.get(node)
    }

    pub(super) fn is_dir(&self, node: usize) -> bool {
        matches!(self.nodes.get(node), Some(Kind::Dir(_)))
    }

    fn add_child(&mut self, parent: usize, name: &str, kind: Kind) -> usize {
        let id = self.nodes.len();
        self.nodes.push(kind);
        if let Some(Kind::Dir(children)) = self.nodes.get_mut(parent) {
            children.insert(name.into(), id);
        }
        id
    }

    /// Records `path` (normalised, non-empty) as `kind`; the error is the rejection reason.
    pub(super) fn insert(&mut self, path: &str, kind: Kind) -> Result<(), &'static str> {
        let new_is_dir = matches!(kind, Kind::Dir(_));
        let mut comps = path.split('/').peekable();
        let mut node = 0;
        while let Some(comp) = comps.next() {
            let last = comps.peek().is_none();
            match self.child(node, comp) {
                Some(existing) if !last => {
                    if !self.is_dir(existing) {
                        return Err("a parent path is a file or link in another entry");
                    }
                    node = existing;
                }
                Some(existing) => {
                    return match (self.is_dir(existing), new_is_dir) {
                        (true, true) => Ok(()), // repeated directory entries are harmless
                        (true, false) => Err("conflicts with a directory of the same path"),
                        (false, true) => Err("conflicts with a file or link of the same path"),
                        (false, false) => Err("duplicate path"),
                    };
                }
                None if !last => node = self.add_child(node, comp, Kind::Dir(HashMap::new())),
                None => {
                    self.add_child(node, comp, kind);
                    return Ok(());
                }
            }
        }
        Ok(())
    }
}

#[derive(Debug, PartialEq, Eq)]
pub(super) struct Normalized {
    /// `a/b/c`; empty for the root (`.`, `./`).
    pub(super) path: String,
    pub(super) trailing_slash: bool,
}

/// Normalises an archive path: strips leading `./`, collapses `//` and `/./`, removes a trailing
/// `/`; rejects NUL, non-UTF-8, over-long, absolute and `..` paths.
pub(super) fn normalize(raw: &[u8], max_bytes: usize) -> Result<Normalized, String> {
    if raw.contains(&0) {
        return Err("path contains a NUL byte".to_owned());
    }
    if raw.len() > max_bytes {
        return Err(format!("path longer than {max_bytes} bytes"));
    }
    let Ok(text) = std::str::from_utf8(raw) else {
        return Err("path is not valid UTF-8".to_owned());
    };
    if text.is_empty() {
        return Err("empty path".to_owned());
    }
    if text.starts_with('/') {
        return Err("absolute path".to_owned());
    }
    let mut path = String::with_capacity(text.len());
    for comp in text.split('/') {
        match comp {
            "" | "." => {}
            ".." => return Err("path contains a '..' component".to_owned()),
            name => {
                if !path.is_empty() {
                    path.push('/');
                }
                path.push_str(name);
            }
        }
    }
    Ok(Normalized { path, trailing_slash: text.ends_with('/') })
}

/// Validates a symlink target for a link `depth` directories below the root. Returns the target
/// (unchanged) and whether it needs the deferred whole-tree check (a `..` after a normal
/// component).
pub(super) fn check_symlink_target(raw: &[u8], depth: usize, max_bytes: usize) -> Result<(String, bool), String> {
    if raw.is_empty() {
        return Err("empty symlink target".to_owned());
    }
    if raw.contains(&0) {
        return Err("symlink target contains a NUL byte".to_owned());
    }
    if raw.len() > max_bytes {
        return Err(format!("symlink target longer than {max_bytes} bytes"));
    }
    let Ok(target) = std::str::from_utf8(raw) else {
        return Err("symlink target is not valid UTF-8".to_owned());
    };
    if target.starts_with('/') {
        return Err("symlink target escapes the bundle root (absolute target)".to_owned());
    }
    let mut level = depth;
    let mut seen_name = false;
    let mut deferred = false;
    for comp in target.split('/') {
        match comp {
            "" | "." => {}
            ".." => {
                level = level.checked_sub(1).ok_or_else(|| "symlink target escapes the bundle root".to_owned())?;
                deferred |= seen_name;
            }
            _ => {
                level += 1;
                seen_name = true;
            }
        }
    }
    Ok((target.to_owned(), deferred))
}

/// A path for error messages: lossy UTF-8, control characters replaced, length capped.
pub(super) fn display_path(raw: &[u8]) -> String {
    let text = String::from_utf8_lossy(raw);
    let mut out = String::new();
    for (i, c) in text.chars().enumerate() {
        if i >= MAX_DISPLAY_CHARS {
            out.push('…');
            break;
        }
        out.push(if c.is_control() { '\u{fffd}' } else { c });
    }
    out
}
