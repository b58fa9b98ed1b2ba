//! SHA-256 of byte streams on a helper thread ([`FileDigests`]), so that a writer hashing the same
//! bytes with BLAKE3 (and cutting them into chunks) or reading them back does not also pay for
//! SHA-256 on its own core: each file's `sha256` while it is added, and the tar's digest (the tar
//! as one stream) while it is laid out ([`super::tar_blocks`]).

use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender};
use sha2::{Digest, Sha256};

use super::{Result, StorageError};

/// Bytes handed to the thread at once.
pub const BATCH: usize = 256 * 1024;
/// Batches waiting for the thread, at most.
pub const QUEUE: usize = 8;

fn gone() -> StorageError {
    StorageError::Io(std::io::Error::other("the hashing thread stopped"))
}

/// The SHA-256 of each file a writer adds, computed in file order on one thread beside the writer,
/// so that chunking and BLAKE3 (the writer's own work) do not wait for it. A file's digest comes
/// back after the writer has moved on; the writer keeps the file's entry until then.
///
/// Bounded: batches of [`BATCH`] bytes or [`MAX_ENDS`] file ends, at most [`QUEUE`] of them
/// waiting. The thread starts with the first batch and stops when this is dropped (it is joined
/// then, so it never outlives the work it hashes).
#[derive(Default)]
pub(super) struct FileDigests {
    batches: Option<Sender<DigestBatch>>,
    digests: Option<Receiver<[u8; 32]>>,
    batch: DigestBatch,
    thread: Option<JoinHandle<()>>,
    /// Files ended whose digest was not taken yet.
    outstanding: usize,
}

/// File ends per batch, at most (a batch of many tiny files still goes out soon).
pub const MAX_ENDS: usize = 256;

/// Bytes of consecutive files; `ends` are the offsets in `data` where a file ends, and whether its
/// digest is wanted (no: the file was abandoned part way, its bytes are dropped from the hash).
#[derive(Default)]
struct DigestBatch {
    data: Vec<u8>,
    ends: Vec<(usize, bool)>,
}

impl FileDigests {
    /// Hashes `bytes` as the next bytes of the current file.
    pub fn update(&mut self, bytes: &[u8]) -> Result<()> {
        self.batch.data.extend_from_slice(bytes);
        if self.batch.data.len() >= BATCH {
            self.send()?;
        }
        Ok(())
    }

    /// Ends the current file; its digest comes from [`FileDigests::ready`] or [`FileDigests::wait`]
    /// after those of the files ended before it.
    pub fn end_file(&mut self) -> Result<()> {
        self.outstanding += 1;
        self.mark_end(true)
    }

    /// Drops the current file's bytes (it failed part way): the next file's digest starts afresh.
    pub fn abandon_file(&mut self) -> Result<()> {
        self.mark_end(false)
    }

    fn mark_end(&mut self, wanted: bool) -> Result<()> {
        self.batch.ends.push((self.batch.data.len(), wanted));
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
        let batch =
            std::mem::replace(&mut self.batch, DigestBatch { data: Vec::with_capacity(BATCH), ends: Vec::new() });
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
                for &(end, wanted) in &batch.ends {
                    state.update(batch.data.get(start..end).unwrap_or_default());
                    let digest: [u8; 32] = state.finalize_reset().into();
                    if wanted && send_digest.send(digest).is_err() {
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
}
