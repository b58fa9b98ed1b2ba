//! The entry loop's per-entry logic: classifies each tar entry, validates it against the limits
//! and the tree built so far, and hands accepted entries to the sink.

use std::io::Read;

use super::paths::{check_symlink_target, display_path, normalize, Kind, NodeId, Tree};
use super::stream::EntryData;
use super::{EntrySink, Failure, IngestLimits, IngestStats, State, Violation};

const SYMLINK_ESCAPES: &str = "symlink target escapes the bundle root";
/// Paths and targets of symlinks kept for the check at the end (real trees have a handful).
const MAX_DEFERRED_SYMLINK_BYTES: usize = 16 << 20;

/// Validates entries one by one and remembers what it accepted.
pub(super) struct Walker<'l> {
    limits: &'l IngestLimits,
    tree: Tree,
    stats: IngestStats,
    entries: u64,
    /// (link path, target) of symlinks whose target has `..` after a normal component: checked
    /// against the complete tree at the end; their bytes, bounded by
    /// [`MAX_DEFERRED_SYMLINK_BYTES`].
    deferred_symlinks: Vec<(String, String)>,
    deferred_bytes: usize,
}

fn invalid<E>(state: &State, path: impl Into<String>, reason: impl Into<String>) -> Failure<E> {
    state.flag(Violation::Invalid { path: path.into(), reason: reason.into() });
    Failure::Flagged
}

impl<'l> Walker<'l> {
    pub(super) fn new(limits: &'l IngestLimits) -> Self {
        Walker {
            limits,
            tree: Tree::new(),
            stats: IngestStats::default(),
            entries: 0,
            deferred_symlinks: Vec::new(),
            deferred_bytes: 0,
        }
    }

    /// Validates one entry (the stream is positioned at its data) and hands it to `sink`.
    pub(super) fn entry<R: Read, S: EntrySink + ?Sized>(
        &mut self,
        entry: &mut tar::Entry<'_, R>,
        sink: &mut S,
        state: &State,
    ) -> Result<(), Failure<S::Error>> {
        self.entries += 1;
        if self.entries > self.limits.max_entries {
            state.flag(Violation::TooLarge(self.limits.max_entries));
            return Err(Failure::Flagged);
        }
        let header = entry.header();
        let entry_type = header.entry_type();
        let type_byte = header.as_old().linkflag.first().copied().unwrap_or(0);
        let mode = header.mode();
        if entry_type.is_pax_global_extensions() {
            return Ok(()); // global PAX defaults (e.g. git archive's comment): nothing for us
        }
        let raw_path = entry.path_bytes().into_owned();
        let shown = display_path(&raw_path);
        let number = state.entries.get();
        state.last.set(Some((number, shown.clone())));
        let norm = match normalize(&raw_path, self.limits.max_path_bytes) {
            Ok(norm) => norm,
            Err(reason) => return Err(invalid(state, shown, reason)),
        };
        if let Some(reason) = sparse_pax_marker(entry) {
            return Err(invalid(state, shown, reason));
        }
        let size = entry.size();
        let is_dir =
            entry_type.is_dir() || (entry_type.is_file() && type_byte != b'7' && norm.trailing_slash && size == 0);
        if is_dir {
            if norm.path.is_empty() {
                return Ok(()); // the root itself (`./`)
            }
            let mode = entry_mode(mode, state)?;
            let first = self.tree.name_dir(&norm.path).map_err(|reason| invalid(state, norm.path.clone(), reason))?;
            // A directory named again keeps the mode of its first entry.
            if first {
                sink.dir(&norm.path, mode).map_err(Failure::Sink)?;
                self.stats.dirs += 1;
            }
            return Ok(());
        }
        if norm.path.is_empty() {
            return Err(invalid(state, shown, "empty path"));
        }
        if norm.trailing_slash {
            return Err(invalid(state, shown, "non-directory entry with a trailing '/'"));
        }
        let path = norm.path;

        if entry_type.is_file() || entry_type.is_contiguous() {
            let mode = entry_mode(mode, state)?;
            self.add_bytes(size, state)?;
            self.tree.insert(&path, Kind::File { size }).map_err(|reason| invalid(state, path.clone(), reason))?;
            let mut data = EntryData::new(&mut *entry, size, number, &path, state);
            let result = sink.file(&path, mode, size, &mut data);
            if let Some(e) = data.take_failure() {
                // The sink saw a read error: that error, not the sink's reaction to it, counts.
                return Err(Failure::Io(e));
            }
            result.map_err(Failure::Sink)?;
            self.stats.files += 1;
            Ok(())
        } else if entry_type.is_symlink() {
            let Some(target) = entry.link_name_bytes() else {
                return Err(invalid(state, path, "symlink without a target"));
            };
            let depth = path.split('/').count().saturating_sub(1);
            let (target, deferred) = match check_symlink_target(&target, depth, self.limits.max_path_bytes) {
                Ok(ok) => ok,
                Err(reason) => return Err(invalid(state, path, reason)),
            };
            self.tree.insert(&path, Kind::Symlink).map_err(|reason| invalid(state, path.clone(), reason))?;
            sink.symlink(&path, &target).map_err(Failure::Sink)?;
            if deferred {
                self.deferred_bytes += path.len() + target.len();
                if self.deferred_bytes > MAX_DEFERRED_SYMLINK_BYTES {
                    return Err(invalid(
                        state,
                        path,
                        format!(
                            "too many symlinks whose target goes down and back up ('a/../b'): their paths \
                             pass {} MiB",
                            MAX_DEFERRED_SYMLINK_BYTES >> 20
                        ),
                    ));
                }
                self.deferred_symlinks.push((path, target));
            }
            self.stats.symlinks += 1;
            Ok(())
        } else if entry_type.is_hard_link() {
            let Some(target) = entry.link_name_bytes() else {
                return Err(invalid(state, path, "hard link without a target"));
            };
            let target = match normalize(&target, self.limits.max_path_bytes) {
                Ok(t) if !t.path.is_empty() && !t.trailing_slash => t.path,
                Ok(_) => return Err(invalid(state, path, "hard link target is not a file")),
                Err(reason) => return Err(invalid(state, path, format!("hard link target: {reason}"))),
            };
            // A link to a hard link links to its copy (a regular file by then): no path is kept.
            let size = match self.tree.lookup(&target) {
                Some(Kind::File { size } | Kind::Hardlink { size }) => size,
                _ => {
                    return Err(invalid(
                        state,
                        path,
                        format!("hard link target {target:?} is not an earlier regular file"),
                    ))
                }
            };
            self.add_bytes(size, state)?;
            self.tree.insert(&path, Kind::Hardlink { size }).map_err(|reason| invalid(state, path.clone(), reason))?;
            sink.hardlink(&path, &target).map_err(Failure::Sink)?;
            self.stats.files += 1;
            Ok(())
        } else {
            let reason = if entry_type.is_character_special() || entry_type.is_block_special() {
                "device files are not allowed".to_owned()
            } else if entry_type.is_fifo() {
                "FIFOs are not allowed".to_owned()
            } else if entry_type.is_gnu_sparse() {
                "GNU sparse files are unsupported".to_owned()
            } else {
                format!("unsupported entry type {:?}", char::from(type_byte))
            };
            Err(invalid(state, path, reason))
        }
    }

    /// After the last entry: the deferred symlink checks, then the totals.
    pub(super) fn finish<E>(self, state: &State) -> Result<IngestStats, Failure<E>> {
        self.check_deferred_symlinks(state)?;
        Ok(self.stats)
    }

    fn add_bytes<E>(&mut self, size: u64, state: &State) -> Result<(), Failure<E>> {
        match self.stats.bytes.checked_add(size) {
            Some(total) if total <= self.limits.max_unpacked_bytes => {
                self.stats.bytes = total;
                Ok(())
            }
            _ => {
                state.flag(Violation::TooLarge(self.limits.max_unpacked_bytes));
                Err(Failure::Flagged)
            }
        }
    }

    /// Symlink targets like `a/../b` are only safe if `a` is a real directory (if it were a
    /// symlink, `..` would leave from wherever it points); checked once the whole tree is known.
    fn check_deferred_symlinks<E>(&self, state: &State) -> Result<(), Failure<E>> {
        for (link, target) in &self.deferred_symlinks {
            // (node if it exists, pushed by the target rather than by the link's own directory)
            let mut stack: Vec<(Option<NodeId>, bool)> = Vec::new();
            let mut current = Some(Tree::root());
            let parent_dirs = link.rsplit_once('/').map_or("", |(dir, _)| dir);
            for comp in parent_dirs.split('/').filter(|c| !c.is_empty()) {
                stack.push((current, false));
                current = current.and_then(|n| self.tree.child(n, comp));
            }
            for comp in target.split('/') {
                match comp {
                    "" | "." => {}
                    ".." => {
                        let leaving = current;
                        let Some((parent, from_target)) = stack.pop() else {
                            return Err(invalid(state, link.clone(), SYMLINK_ESCAPES));
                        };
                        // Leaving one of the link's own directories is always fine; leaving a
                        // component named by the target is only fine if it is a real directory.
                        if from_target && !leaving.is_some_and(|n| self.tree.is_dir(n)) {
                            return Err(invalid(state, link.clone(), SYMLINK_ESCAPES));
                        }
                        current = parent;
                    }
                    name => {
                        stack.push((current, true));
                        current = current.and_then(|n| self.tree.child(n, name));
                    }
                }
            }
        }
        Ok(())
    }
}

/// The permission bits of an entry's mode: setuid, setgid and sticky bits are dropped (content is
/// data for provisioners, never a way to hand out privileges), as are file-type bits some tools
/// put in the field.
fn entry_mode<E>(mode: std::io::Result<u32>, state: &State) -> Result<u32, Failure<E>> {
    match mode {
        Ok(mode) => Ok(mode & 0o777),
        Err(_) => {
            // The crate's message quotes the field's bytes.
            let entry = state.entry(state.entries.get());
            state.flag(Violation::Corrupt(format!("corrupt archive: {entry}: the mode field is not an octal number")));
            Err(Failure::Flagged)
        }
    }
}

/// PAX sparse formats (GNU.sparse.*) would hand the sink the sparse map as data: refuse them.
fn sparse_pax_marker<R: Read>(entry: &mut tar::Entry<'_, R>) -> Option<&'static str> {
    let extensions = entry.pax_extensions().ok()??;
    for ext in extensions.flatten() {
        if ext.key_bytes().starts_with(b"GNU.sparse.") {
            return Some("GNU sparse files are unsupported");
        }
    }
    None
}
