//! SHA-256 of byte streams on a helper thread ([`FileDigests`]), so that a writer hashing the same
//! bytes with BLAKE3 (and cutting them into chunks) or reading them back does not also pay for
//! SHA-256 on its own core: each file's `sha256` while it is added, and the tar's digest (the tar
//! as one stream) while it is laid out ([`super::tar_blocks`]).
//!
//! A file whose chunks are those of a file hashed lately is not hashed again ([`KnownDigests`]):
//! the same chunk ids in the same order are the same bytes, so the same SHA-256. Revisions of a
//! bundle share most of their files, and so do the copies of a chart in one tree.

use std::collections::HashMap;
use std::sync::Mutex;
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender};
use sha2::{Digest, Sha256};

use super::{Result, StorageError};

/// Bytes handed to the thread at once (each hand-off wakes it: fewer, larger batches cost less).
pub const BATCH: usize = 1 << 20;
/// Batches waiting for the thread, at most.
pub const QUEUE: usize = 4;
/// Room for the largest update past a full batch (a chunk), so a batch is never reallocated.
const UPDATE_ROOM: usize = super::chunks::MAX_CHUNK as usize;

fn gone() -> StorageError {
    StorageError::Io(std::io::Error::other("the hashing thread stopped"))
}

/// The SHA-256 of each file a writer adds, computed in file order on one thread beside the writer,
/// so that chunking and BLAKE3 (the writer's own work) do not wait for it. A file's digest comes
/// back after the writer has moved on; the writer keeps the file's entry until then.
///
/// Bounded: batches of [`BATCH`] bytes (and a held file's bytes, up to the hold) or [`MAX_ENDS`]
/// file ends, at most [`QUEUE`] of them waiting. The thread starts with the first batch and stops
/// when this is dropped (it is joined then, so it never outlives the work it hashes).
#[derive(Default)]
pub(super) struct FileDigests {
    batches: Option<Sender<DigestBatch>>,
    digests: Option<Receiver<[u8; 32]>>,
    batch: DigestBatch,
    thread: Option<JoinHandle<()>>,
    /// Files ended whose digest was not taken yet.
    outstanding: usize,
    /// Where the current file's bytes not handed to the thread yet start in `batch`.
    file_start: usize,
    /// A file's bytes are held back from the thread up to this many (0: none), so that they can
    /// be dropped unhashed if its digest turns out to be known ([`FileDigests::end_known_file`]).
    hold: usize,
}

/// File ends per batch, at most (a batch of many tiny files still goes out soon).
pub const MAX_ENDS: usize = 256;

/// Bytes of consecutive files; `ends` are the offsets in `data` where a file ends, and how.
#[derive(Default)]
struct DigestBatch {
    data: Vec<u8>,
    ends: Vec<(usize, FileEnd)>,
}

#[derive(Clone, Copy)]
enum FileEnd {
    /// Its digest is wanted.
    Hashed,
    /// It failed part way: its bytes are dropped from the hash, no digest is sent.
    Abandoned,
    /// Its digest was known and its bytes were dropped unhashed: this digest is sent in its turn.
    Known([u8; 32]),
}

impl FileDigests {
    /// Holds each file's first `hold` bytes back until its end, so that a file found in
    /// [`KnownDigests`] by then costs no hashing.
    pub fn holding(hold: usize) -> FileDigests {
        let mut digests = FileDigests::default();
        digests.hold = hold;
        digests
    }

    /// Hashes `bytes` as the next bytes of the current file.
    pub fn update(&mut self, bytes: &[u8]) -> Result<()> {
        if self.batch.data.capacity() == 0 {
            self.batch.data.reserve(BATCH + self.hold + UPDATE_ROOM);
        }
        self.batch.data.extend_from_slice(bytes);
        let len = self.batch.data.len();
        let holding = len.saturating_sub(self.file_start) <= self.hold;
        if len >= BATCH && !holding {
            self.send()?;
        }
        Ok(())
    }

    /// Ends the current file; its digest comes from [`FileDigests::ready`] or [`FileDigests::wait`]
    /// after those of the files ended before it.
    pub fn end_file(&mut self) -> Result<()> {
        self.outstanding += 1;
        self.mark_end(FileEnd::Hashed)
    }

    /// Ends the current file whose digest is `digest` (found in [`KnownDigests`]): its bytes not
    /// handed to the thread yet (all of a file up to the hold) are dropped unhashed, and `digest`
    /// comes back in its turn.
    pub fn end_known_file(&mut self, digest: [u8; 32]) -> Result<()> {
        self.batch.data.truncate(self.file_start);
        self.outstanding += 1;
        self.mark_end(FileEnd::Known(digest))
    }

    /// Drops the current file's bytes (it failed part way): the next file's digest starts afresh.
    pub fn abandon_file(&mut self) -> Result<()> {
        self.mark_end(FileEnd::Abandoned)
    }

    fn mark_end(&mut self, end: FileEnd) -> Result<()> {
        self.batch.ends.push((self.batch.data.len(), end));
        self.file_start = self.batch.data.len();
        if self.batch.ends.len() >= MAX_ENDS {
            self.send()?;
        }
        Ok(())
    }

    /// The next file's digest if the thread has it already.
    pub fn ready(&mut self) -> Option<[u8; 32]> {
        let digest = self.digests.as_ref()?.try_recv().ok()?;
        self.outstanding -= 1;
        Some(digest)
    }

    /// The next file's digest, waiting for it (the bytes batched so far go out first).
    pub fn wait(&mut self) -> Result<[u8; 32]> {
        if self.outstanding == 0 {
            return Err(StorageError::Io(std::io::Error::other("no file digest is outstanding")));
        }
        if !self.batch.ends.is_empty() {
            self.send()?;
        }
        let digests = self.digests.as_ref().ok_or_else(gone)?;
        let digest = digests.recv().map_err(|_| gone())?;
        self.outstanding -= 1;
        Ok(digest)
    }

    fn send(&mut self) -> Result<()> {
        if self.batches.is_none() {
            self.start()?;
        }
        let next = DigestBatch { data: Vec::with_capacity(BATCH + self.hold + UPDATE_ROOM), ends: Vec::new() };
        let batch = std::mem::replace(&mut self.batch, next);
        self.file_start = 0;
        let batches = self.batches.as_ref().ok_or_else(gone)?;
        batches.send(batch).map_err(|_| gone())
    }

    fn start(&mut self) -> Result<()> {
        let (batches, receive) = crossbeam_channel::bounded::<DigestBatch>(QUEUE);
        // Unbounded, but never longer than the files ended and not taken (the writer bounds those).
        let (send_digest, digests) = crossbeam_channel::unbounded();
        let thread = std::thread::Builder::new().name("stowage-sha256".into()).spawn(move || {
            let mut state = Sha256::new();
            for batch in receive {
                let mut start = 0;
                for &(end, how) in &batch.ends {
                    state.update(batch.data.get(start..end).unwrap_or_default());
                    let hashed: [u8; 32] = state.finalize_reset().into();
                    let digest = match how {
                        FileEnd::Hashed => hashed,
                        FileEnd::Known(known) => known,
                        FileEnd::Abandoned => {
                            start = end;
                            continue;
                        }
                    };
                    if send_digest.send(digest).is_err() {
                        return;
                    }
                    start = end;
                }
                state.update(batch.data.get(start..).unwrap_or_default());
            }
        })?;
        (self.batches, self.digests, self.thread) = (Some(batches), Some(digests), Some(thread));
        Ok(())
    }
}

/// Files hashed lately: the SHA-256 of a file by its content key (BLAKE3 of its chunk ids in
/// order). Shared by the store's writers; bounded: emptied when full.
#[derive(Default)]
pub struct KnownDigests {
    entries: Mutex<HashMap<[u8; 32], [u8; 32]>>,
}

/// Files remembered by [`KnownDigests`], at most (about 1 MiB).
const KNOWN_DIGESTS: usize = 16_384;

impl KnownDigests {
    pub fn get(&self, key: &[u8; 32]) -> Option<[u8; 32]> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner()).get(key).copied()
    }

    pub fn put(&self, key: [u8; 32], digest: [u8; 32]) {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if entries.len() >= KNOWN_DIGESTS {
            entries.clear();
        }
        entries.insert(key, digest);
    }
}

impl Drop for FileDigests {
    fn drop(&mut self) {
        self.batches = None;
        self.digests = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
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
        let mut stream = FileDigests::default();
        for piece in data.chunks(70_001) {
            stream.update(piece.get(..10).unwrap()).unwrap();
            stream.update(piece.get(10..).unwrap()).unwrap();
        }
        stream.end_file().unwrap();
        assert_eq!(stream.wait().unwrap(), expected);
    }

    /// Files of many sizes (empty ones, ones across batches, runs of tiny ones), their bytes fed in
    /// uneven pieces, some after an abandoned file, digests taken both as they become ready and by
    /// waiting.
    #[test]
    fn each_file_gets_its_own_digest_in_order() {
        let mut files: Vec<Vec<u8>> = Vec::new();
        for i in 0..1200usize {
            let len = match i % 7 {
                0 => 0,
                1 => 700_001,
                _ => (i * 131) % 5_000,
            };
            files.push((0..len).map(|j| ((i + j) % 253) as u8).collect());
        }
        let expected: Vec<[u8; 32]> = files.iter().map(|f| Sha256::digest(f).into()).collect();
        let mut digests = FileDigests::default();
        let mut got = Vec::new();
        for (i, file) in files.iter().enumerate() {
            if i % 5 == 0 {
                // A file abandoned part way before this one: none of its bytes count.
                digests.update(&file[..file.len() / 2]).unwrap();
                digests.update(b"abandoned").unwrap();
                digests.abandon_file().unwrap();
            }
            for piece in file.chunks(65_537) {
                digests.update(piece).unwrap();
            }
            digests.end_file().unwrap();
            while let Some(d) = digests.ready() {
                got.push(d);
            }
        }
        for _ in got.len()..files.len() {
            got.push(digests.wait().unwrap());
        }
        assert_eq!(got.len(), files.len());
        assert!(got == expected, "digests out of order or wrong");
        assert!(digests.wait().is_err(), "nothing outstanding to wait for");
    }

    /// Files ended as known send the digest given, in their turn, whatever part of their bytes
    /// was hashed already (here made-up digests, so a file hashed instead would show); the files
    /// around them (held, abandoned, or too large to hold) keep their own digests.
    #[test]
    fn a_known_file_is_dropped_unhashed_and_keeps_its_turn() {
        const HOLD: usize = 4096;
        let mut digests = FileDigests::holding(HOLD);
        let mut expected = Vec::new();
        let mut got = Vec::new();
        for i in 0..900usize {
            let len = match i % 6 {
                0 => 0,
                1 => 300_001,
                2 => HOLD + 1,
                _ => (i * 37) % HOLD,
            };
            let file: Vec<u8> = (0..len).map(|j| ((i * 7 + j) % 251) as u8).collect();
            if i % 11 == 0 {
                digests.update(&file[..len / 2]).unwrap();
                digests.abandon_file().unwrap();
            }
            for piece in file.chunks(1_500) {
                digests.update(piece).unwrap();
            }
            if i % 5 == 0 {
                let given = [i as u8; 32];
                digests.end_known_file(given).unwrap();
                expected.push(given);
            } else {
                digests.end_file().unwrap();
                expected.push(Sha256::digest(&file).into());
            }
            while let Some(d) = digests.ready() {
                got.push(d);
            }
        }
        for _ in got.len()..expected.len() {
            got.push(digests.wait().unwrap());
        }
        assert!(got == expected, "digests out of order or wrong");
    }
}
