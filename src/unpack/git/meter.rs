//! Watching a git fetch as gix downloads its pack: gix reports the bytes it reads from the pack
//! stream through its progress tree ("read pack", [`ProgressId::ReadPackBytes`]) and each pack
//! entry it has read ("indexing", [`IndexProgress::IndexObjects`]), so a progress that counts them
//! can stop the fetch (through gix's interrupt flag, checked on every read) the moment
//!
//! - the fetch passes `--max-git-fetch-bytes`;
//! - one entry passes `--max-git-file-bytes`: gix keeps an entry's compressed bytes in memory until
//!   it is complete (zlib does not shrink what it cannot compress, so such an entry would be
//!   refused anyway once decoded);
//! - the data directory, where the pack is written, has no room left above its free-space reserve
//!   for what was read and is not on disk yet (the entry held in memory).
//!
//! One meter spans every attempt of one fetch (by commit id, then everything): the cap is on what
//! the fetch downloads in all.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use gix::odb::pack::bundle::write::ProgressId;
use gix::odb::pack::index::write::ProgressId as IndexProgress;
use gix::progress::{Id, MessageLevel, Step, StepShared, Unit, UNKNOWN};

use super::transport::Listing;
use crate::storage::StorageError;
use crate::unpack::error::UnpackError;
use crate::unpack::source::{Scratch, UnpackLimits};

/// How often (in pack bytes) the free space of the data directory is checked: one `statvfs`.
const SPACE_CHECK_BYTES: u64 = 4 << 20;
/// Bytes read past an entry that may belong to the next ones (gix's read-ahead buffers).
const ENTRY_SLACK: u64 = 1 << 20;

/// Why the meter stopped a fetch.
enum Stop {
    FetchTooLarge,
    ObjectTooLarge,
    OutOfSpace(String),
}

struct State {
    read: AtomicU64,
    /// `read` when the last entry was complete.
    entry_start: AtomicU64,
    next_space_check: AtomicU64,
    cap: u64,
    max_object: u64,
    scratch: Scratch,
    interrupt: Arc<AtomicBool>,
    stop: Mutex<Option<Stop>>,
    listing: Arc<Listing>,
}

/// The progress handed to gix's fetch; its children share one count.
#[derive(Clone)]
pub(super) struct Meter {
    state: Arc<State>,
    id: Id,
}

impl Meter {
    /// A meter for one fetch within `limits`; it sets `interrupt` to stop gix.
    pub fn new(limits: &UnpackLimits, scratch: Scratch, interrupt: Arc<AtomicBool>) -> Meter {
        let state = State {
            read: AtomicU64::new(0),
            entry_start: AtomicU64::new(0),
            next_space_check: AtomicU64::new(SPACE_CHECK_BYTES),
            cap: limits.max_git_fetch_bytes,
            max_object: limits.max_git_file_bytes,
            scratch,
            interrupt,
            stop: Mutex::new(None),
            listing: Arc::default(),
        };
        Meter { state: Arc::new(state), id: UNKNOWN }
    }

    /// The error to report when the meter stopped the fetch (`what` names the source).
    pub fn stopped(&self, what: &str) -> Option<UnpackError> {
        let stop = self.state.stop.lock().ok()?;
        match stop.as_ref()? {
            Stop::FetchTooLarge => Some(UnpackError::TooLarge(format!(
                "{what}: the fetch is larger than the limit of {} bytes (--max-git-fetch-bytes)",
                self.state.cap
            ))),
            Stop::ObjectTooLarge => Some(object_too_large(what, self.state.max_object)),
            Stop::OutOfSpace(why) => Some(UnpackError::Storage(StorageError::InsufficientStorage(format!(
                "{what}: stopped fetching the git pack: {why}"
            )))),
        }
    }

    /// What the fetch's transport shares with the meter.
    pub fn listing(&self) -> Arc<Listing> {
        self.state.listing.clone()
    }

    fn count(&self, bytes: u64) {
        let state = &self.state;
        state.listing.pack_started.store(true, Ordering::Relaxed);
        let read = state.read.fetch_add(bytes, Ordering::Relaxed).saturating_add(bytes);
        let in_memory = read.saturating_sub(state.entry_start.load(Ordering::Relaxed));
        let stop = if read > state.cap {
            Some(Stop::FetchTooLarge)
        } else if in_memory > state.max_object.saturating_add(ENTRY_SLACK) {
            Some(Stop::ObjectTooLarge)
        } else if read >= state.next_space_check.load(Ordering::Relaxed) {
            state.next_space_check.store(read.saturating_add(SPACE_CHECK_BYTES), Ordering::Relaxed);
            state.scratch.check_room_for(in_memory).err().map(|e| match e {
                UnpackError::Storage(StorageError::InsufficientStorage(why)) => Stop::OutOfSpace(why),
                other => Stop::OutOfSpace(other.to_string()),
            })
        } else {
            None
        };
        if let Some(stop) = stop {
            if let Ok(mut slot) = state.stop.lock() {
                slot.get_or_insert(stop);
            }
            state.interrupt.store(true, Ordering::Relaxed);
        }
    }
}

impl gix::Count for Meter {
    fn set(&self, _step: Step) {}

    fn step(&self) -> Step {
        0
    }

    fn inc_by(&self, step: Step) {
        if self.id == Id::from(ProgressId::ReadPackBytes) {
            self.count(step as u64);
        } else if self.id == Id::from(IndexProgress::IndexObjects) {
            let state = &self.state;
            state.entry_start.store(state.read.load(Ordering::Relaxed), Ordering::Relaxed);
        }
    }

    fn counter(&self) -> StepShared {
        // Counts other than the pack's bytes (objects, entries) are not looked at.
        Arc::new(AtomicUsize::new(0))
    }
}

/// An object over `--max-git-file-bytes`, found by the meter or by gix's allocation limit.
pub(super) fn object_too_large(what: &str, limit: u64) -> UnpackError {
    UnpackError::TooLarge(format!(
        "{what}: an object (a file) is larger than the limit of {limit} bytes (--max-git-file-bytes)"
    ))
}

impl gix::Progress for Meter {
    fn init(&mut self, _max: Option<Step>, _unit: Option<Unit>) {}

    fn set_name(&mut self, _name: String) {}

    fn name(&self) -> Option<String> {
        None
    }

    fn id(&self) -> Id {
        self.id
    }

    fn message(&self, _level: MessageLevel, _message: String) {}
}

impl gix::NestedProgress for Meter {
    type SubProgress = Meter;

    fn add_child(&mut self, _name: impl Into<String>) -> Meter {
        Meter { state: self.state.clone(), id: UNKNOWN }
    }

    fn add_child_with_id(&mut self, _name: impl Into<String>, id: Id) -> Meter {
        Meter { state: self.state.clone(), id }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gix::{Count, NestedProgress};

    #[test]
    fn only_pack_bytes_count_and_the_cap_interrupts() {
        let limits = UnpackLimits { max_git_fetch_bytes: 3 << 20, ..UnpackLimits::default() };
        let interrupt = Arc::new(AtomicBool::new(false));
        let mut meter = Meter::new(&limits, Scratch::default(), interrupt.clone());
        let other = meter.add_child("decompressing");
        let pack = meter.add_child_with_id("read pack", ProgressId::ReadPackBytes.into());
        other.inc_by(5 << 20);
        pack.inc_by(2 << 20);
        assert!(!interrupt.load(Ordering::Relaxed) && meter.stopped("x").is_none());
        pack.inc_by(2 << 20);
        assert!(interrupt.load(Ordering::Relaxed));
        assert_eq!(meter.state.read.load(Ordering::Relaxed), 4 << 20);
        let err = meter.stopped("git source x").unwrap().to_string();
        assert!(err.contains("--max-git-fetch-bytes") && err.contains(&(3 << 20).to_string()), "{err}");
    }

    #[test]
    fn one_entry_over_the_file_limit_interrupts() {
        let limits = UnpackLimits { max_git_file_bytes: 4 << 20, ..UnpackLimits::default() };
        let interrupt = Arc::new(AtomicBool::new(false));
        let mut meter = Meter::new(&limits, Scratch::default(), interrupt.clone());
        let pack = meter.add_child_with_id("read pack", ProgressId::ReadPackBytes.into());
        let entries = meter.add_child_with_id("indexing", IndexProgress::IndexObjects.into());
        for _ in 0..4 {
            pack.inc_by(3 << 20);
            entries.inc();
        }
        assert!(!interrupt.load(Ordering::Relaxed), "many entries under the limit are fine");
        pack.inc_by(6 << 20);
        let err = meter.stopped("git source x").unwrap().to_string();
        assert!(interrupt.load(Ordering::Relaxed) && err.contains("--max-git-file-bytes"), "{err}");
    }
}
