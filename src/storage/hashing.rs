//! SHA-256 of a byte stream on a helper thread, so that a writer hashing the same bytes with
//! BLAKE3 (and cutting them into chunks) or reading them back does not also pay for SHA-256 on its
//! own core: a file's `sha256` while it is added, the tar's digest while `finalize` reads it back.
//!
//! Bounded: bytes travel in batches of [`BATCH`] bytes, at most [`QUEUE`] of them waiting; the
//! thread lives in a [`std::thread::scope`] of the caller, so it never outlives the work it hashes.

use std::thread::{Scope, ScopedJoinHandle};

use crossbeam_channel::Sender;
use sha2::{Digest, Sha256};

use super::{Result, StorageError};

/// Bytes handed to the thread at once.
pub const BATCH: usize = 256 * 1024;
/// Batches waiting for the thread, at most.
pub const QUEUE: usize = 8;

/// Feeds a SHA-256 computed by a thread of a scope.
pub(super) struct ShaFeed<'scope> {
    batches: Option<Sender<Vec<u8>>>,
    pending: Vec<u8>,
    thread: ScopedJoinHandle<'scope, Sha256>,
}

fn gone() -> StorageError {
    StorageError::Io(std::io::Error::other("the hashing thread stopped"))
}

impl<'scope> ShaFeed<'scope> {
    /// Continues `state` on a new thread of `scope`.
    pub fn spawn<'env>(scope: &'scope Scope<'scope, 'env>, state: Sha256) -> Result<ShaFeed<'scope>> {
        let (batches, receive) = crossbeam_channel::bounded::<Vec<u8>>(QUEUE);
        let thread = std::thread::Builder::new().name("stowage-sha256".into()).spawn_scoped(scope, move || {
            let mut state = state;
            for batch in receive {
                state.update(&batch);
            }
            state
        })?;
        Ok(ShaFeed { batches: Some(batches), pending: Vec::with_capacity(BATCH), thread })
    }

    /// Hashes a copy of `bytes` (batched).
    pub fn update(&mut self, bytes: &[u8]) -> Result<()> {
        self.pending.extend_from_slice(bytes);
        if self.pending.len() >= BATCH {
            self.send_pending()?;
        }
        Ok(())
    }

    /// Hands over the bytes batched so far, if any.
    fn send_pending(&mut self) -> Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let batch = std::mem::replace(&mut self.pending, Vec::with_capacity(BATCH));
        self.send(batch)
    }

    fn send(&mut self, batch: Vec<u8>) -> Result<()> {
        let batches = self.batches.as_ref().ok_or_else(gone)?;
        batches.send(batch).map_err(|_| gone())
    }

    /// The digest of everything fed.
    pub fn finish(mut self) -> Result<[u8; 32]> {
        self.send_pending()?;
        self.batches = None;
        let state = self.thread.join().map_err(|_| gone())?;
        Ok(state.finalize().into())
    }
}

/// A SHA-256 computed here until the stream passes `threshold` bytes, then on a thread of `scope`
/// (for small files a thread would cost more than it saves).
pub(super) enum Sha<'scope, 'env> {
    Here { state: Sha256, fed: usize, threshold: usize, scope: &'scope Scope<'scope, 'env> },
    Thread(ShaFeed<'scope>),
}

impl<'scope, 'env> Sha<'scope, 'env> {
    pub fn new(scope: &'scope Scope<'scope, 'env>, threshold: usize) -> Self {
        Sha::Here { state: Sha256::new(), fed: 0, threshold, scope }
    }

    pub fn update(&mut self, bytes: &[u8]) -> Result<()> {
        match self {
            Sha::Here { state, fed, threshold, scope } => {
                if *fed + bytes.len() <= *threshold {
                    state.update(bytes);
                    *fed += bytes.len();
                    return Ok(());
                }
                let mut feed = ShaFeed::spawn(scope, std::mem::take(state))?;
                feed.update(bytes)?;
                *self = Sha::Thread(feed);
                Ok(())
            }
            Sha::Thread(feed) => feed.update(bytes),
        }
    }

    pub fn finish(self) -> Result<[u8; 32]> {
        match self {
            Sha::Here { state, .. } => Ok(state.finalize().into()),
            Sha::Thread(feed) => feed.finish(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_match_hashing_in_place() {
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        let expected: [u8; 32] = Sha256::digest(&data).into();
        std::thread::scope(|scope| {
            let mut feed = ShaFeed::spawn(scope, Sha256::new()).unwrap();
            for piece in data.chunks(70_001) {
                feed.update(piece.get(..10).unwrap()).unwrap();
                feed.update(piece.get(10..).unwrap()).unwrap();
            }
            assert_eq!(feed.finish().unwrap(), expected);
            for threshold in [0, 100_000, 10_000_000] {
                let mut sha = Sha::new(scope, threshold);
                for piece in data.chunks(40_000) {
                    sha.update(piece).unwrap();
                }
                assert_eq!(sha.finish().unwrap(), expected, "threshold {threshold}");
            }
        });
    }
}
