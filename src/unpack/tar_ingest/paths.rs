//! Paths: normalisation and validation of entry paths and symlink targets, the tree of accepted
//! paths (duplicate and file/directory conflict detection, in bytes per entry that do not depend
//! on the names), and quoting paths in error messages.

use std::collections::BTreeMap;

/// Longest path quoted in an error message.
const MAX_DISPLAY_CHARS: usize = 512;

/// Where a path points in the tree being built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    Dir,
    File {
        size: u64,
    },
    /// A hard link, stored as a copy: a regular file of that size from then on.
    Hardlink {
        size: u64,
    },
    Symlink,
}

/// A node of the tree: a 128-bit hash of its parent's id and its name (the root is 0), so a node
/// costs the same few bytes however long its path. A collision of two names would need 2^64 work.
pub(super) type NodeId = [u64; 2];

const ROOT: NodeId = [0, 0];

/// All paths seen so far, as a tree of components: duplicate and file/directory conflict detection.
/// Memory is ~35 bytes per distinct path component (a B-tree of ids and kinds: no hash table that
/// doubles, and holds both tables while it does), whatever the length of the names: the entry
/// limit bounds it.
pub(super) struct Tree {
    nodes: BTreeMap<NodeId, Packed>,
}

/// A [`Kind`] in one word: the size shifted left by two, the kind in the low bits (for a directory,
/// the "size" says whether an entry named it).
#[derive(Clone, Copy)]
struct Packed(u64);

impl Packed {
    fn new(kind: Kind) -> Packed {
        let (tag, size) = match kind {
            Kind::Dir => (0, 0),
            Kind::File { size } => (1, size),
            Kind::Hardlink { size } => (2, size),
            Kind::Symlink => (3, 0),
        };
        // Sizes are bounded far below 2^62 by the unpacked-bytes limit; saturate all the same.
        Packed(size.min(u64::MAX >> 2) << 2 | tag)
    }

    fn kind(self) -> Kind {
        let size = self.0 >> 2;
        match self.0 & 3 {
            0 => Kind::Dir,
            1 => Kind::File { size },
            2 => Kind::Hardlink { size },
            _ => Kind::Symlink,
        }
    }
}

/// A directory an entry of its own named (an implied one is `Packed::new(Kind::Dir)`, 0).
const NAMED_DIR: Packed = Packed(1 << 2);

fn child_id(parent: NodeId, name: &str) -> NodeId {
    let mut hasher = blake3::Hasher::new();
    hasher.update(&parent[0].to_le_bytes());
    hasher.update(&parent[1].to_le_bytes());
    hasher.update(name.as_bytes());
    let hash = hasher.finalize();
    let bytes = hash.as_bytes();
    let word = |i: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(bytes.get(i..i + 8).unwrap_or(&[0; 8]));
        u64::from_le_bytes(w)
    };
    [word(0), word(8)]
}

impl Tree {
    pub(super) fn new() -> Tree {
        Tree { nodes: BTreeMap::from([(ROOT, Packed::new(Kind::Dir))]) }
    }

    pub(super) fn root() -> NodeId {
        ROOT
    }

    pub(super) fn child(&self, node: NodeId, name: &str) -> Option<NodeId> {
        if !self.is_dir(node) {
            return None;
        }
        let id = child_id(node, name);
        self.nodes.contains_key(&id).then_some(id)
    }

    pub(super) fn lookup(&self, path: &str) -> Option<Kind> {
        let mut node = ROOT;
        for comp in path.split('/') {
            node = self.child(node, comp)?;
        }
        self.nodes.get(&node).map(|p| p.kind())
    }

    /// Records `path` (normalised, non-empty) as a directory the archive names: `Ok(true)` the
    /// first time it is named (its contents may have implied it before), `Ok(false)` after that.
    pub(super) fn name_dir(&mut self, path: &str) -> Result<bool, &'static str> {
        self.insert(path, Kind::Dir)?;
        let mut node = ROOT;
        for comp in path.split('/') {
            node = child_id(node, comp);
        }
        match self.nodes.get_mut(&node) {
            Some(packed) if packed.0 != NAMED_DIR.0 => {
                *packed = NAMED_DIR;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    pub(super) fn is_dir(&self, node: NodeId) -> bool {
        self.nodes.get(&node).is_some_and(|p| p.kind() == Kind::Dir)
    }

    /// Records `path` (normalised, non-empty) as `kind`; the error is the rejection reason.
    pub(super) fn insert(&mut self, path: &str, kind: Kind) -> Result<(), &'static str> {
        let new_is_dir = kind == Kind::Dir;
        let mut comps = path.split('/').peekable();
        let mut node = ROOT;
        while let Some(comp) = comps.next() {
            let last = comps.peek().is_none();
            let id = child_id(node, comp);
            match self.nodes.get(&id).map(|p| p.kind()) {
                Some(existing) if !last => {
                    if existing != Kind::Dir {
                        return Err("a parent path is a file or link in another entry");
                    }
                    node = id;
                }
                Some(existing) => {
                    return match (existing == Kind::Dir, new_is_dir) {
                        (true, true) => Ok(()), // repeated directory entries are harmless
                        (true, false) => Err("conflicts with a directory of the same path"),
                        (false, true) => Err("conflicts with a file or link of the same path"),
                        (false, false) => Err("duplicate path"),
                    };
                }
                None if !last => {
                    self.nodes.insert(id, Packed::new(Kind::Dir));
                    node = id;
                }
                None => {
                    self.nodes.insert(id, Packed::new(kind));
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
