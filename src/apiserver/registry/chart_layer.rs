//! Helm's chart layer, made from a stored chart as `helm package` lays it out (`<name>/Chart.yaml`,
//! `<name>/templates/…`, regular files only), gzipped, and produced in steps like every download.
//!
//! The bytes depend only on the tree: the tar is the store's deterministic format, and the gzip
//! uses stored (uncompressed) deflate blocks cut at fixed sizes, with no name and no time in its
//! header. A compressor's output may change with its version, which would change the layer's
//! digest on an upgrade; stored blocks cannot. Charts are small, so the bytes saved by
//! compressing are not worth a digest that moves.

use sha2::{Digest, Sha256};

use crate::apiserver::content::download::resolve_file;
use crate::apiserver::content::stream::{Producer, STEP};
use crate::storage::{tarfmt, EntryKind, FileEntry, RangeSpec, RevisionId, StorageError, Store};

/// Largest stored deflate block.
const STORED_BLOCK: usize = 65_535;
/// A gzip header: magic, deflate, no flags, no time, no extra flags, OS unknown.
const GZIP_HEADER: [u8; 10] = [0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff];

/// The chart of `revision` whose `Chart.yaml` is at `root` (`""` or `"dir/"`), as Helm's
/// `application/vnd.cncf.helm.chart.content.v1.tar+gzip` layer.
pub struct ChartLayer {
    revision: RevisionId,
    root: String,
    name: String,
    /// The last entry taken from the listing.
    after: Option<String>,
    current: Option<Current>,
    tar_done: bool,
    gzip: StoredGzip,
}

/// The file being written: its tar header, and how far into header + data + padding we are.
struct Current {
    file: FileEntry,
    header: Vec<u8>,
    pos: u64,
}

impl ChartLayer {
    pub fn new(revision: RevisionId, root: &str, name: &str) -> ChartLayer {
        ChartLayer {
            revision,
            root: root.to_string(),
            name: name.to_string(),
            after: None,
            current: None,
            tar_done: false,
            gzip: StoredGzip::default(),
        }
    }

    /// The next file of the chart (symlinks to files inside the tree are followed, as `helm
    /// package` does; directories and anything else are left out, as there).
    fn next_file(&mut self, store: &Store) -> Result<Option<Current>, StorageError> {
        loop {
            let Some(entry) = store.files_after(self.revision, &self.root, self.after.as_deref()).next().transpose()?
            else {
                return Ok(None);
            };
            self.after = Some(entry.path.clone());
            let file = match entry.kind {
                EntryKind::File => entry.clone(),
                EntryKind::Directory => continue,
                EntryKind::Symlink => match resolve_file(store, self.revision, &entry.path)? {
                    Some(file) => file,
                    None => continue,
                },
            };
            let relative = entry.path.strip_prefix(&self.root).unwrap_or(&entry.path);
            let path = format!("{}/{relative}", self.name);
            let spec =
                tarfmt::HeaderSpec { path: &path, kind: tarfmt::Kind::File { size: file.size }, mode: file.mode() };
            return Ok(Some(Current { header: tarfmt::header_bytes(&spec), file, pos: 0 }));
        }
    }

    /// Appends about `budget` bytes of the tar to `tar`.
    fn tar_step(&mut self, store: &Store, tar: &mut Vec<u8>, budget: usize) -> Result<(), StorageError> {
        while tar.len() < budget && !self.tar_done {
            let mut current = match self.current.take() {
                Some(current) => current,
                None => match self.next_file(store)? {
                    Some(current) => current,
                    None => {
                        tar.resize(tar.len() + tarfmt::TRAILER_LEN as usize, 0);
                        self.tar_done = true;
                        return Ok(());
                    }
                },
            };
            let header_len = current.header.len() as u64;
            let data_end = header_len + current.file.size;
            let entry_end = header_len + tarfmt::padded(current.file.size);
            if current.pos < header_len {
                tar.extend_from_slice(current.header.get(current.pos as usize..).unwrap_or_default());
                current.pos = header_len;
            }
            if current.pos < data_end {
                let room = budget.saturating_sub(tar.len()).max(1) as u64;
                let to = data_end.min(current.pos + room);
                let range = RangeSpec { start: current.pos - header_len, end: to - header_len };
                store.read_file(self.revision, &current.file, range, &mut |bytes| {
                    tar.extend_from_slice(bytes);
                    Ok(())
                })?;
                current.pos = to;
            }
            if current.pos >= data_end {
                tar.resize(tar.len() + (entry_end - current.pos) as usize, 0);
                continue;
            }
            self.current = Some(current);
        }
        Ok(())
    }
}

impl Producer for ChartLayer {
    fn step(&mut self, store: &Store, out: &mut Vec<u8>) -> Result<bool, StorageError> {
        let mut tar = Vec::with_capacity(STEP + tarfmt::TRAILER_LEN as usize);
        self.tar_step(store, &mut tar, STEP)?;
        self.gzip.push(&tar, out);
        if self.tar_done {
            self.gzip.finish(out);
            return Ok(false);
        }
        Ok(true)
    }
}

/// The digest and size of everything `producer` makes, read through once in bounded memory.
pub fn measure(store: &Store, mut producer: impl Producer) -> Result<(String, u64), StorageError> {
    let mut hasher = Sha256::new();
    let mut size = 0u64;
    loop {
        let mut out = Vec::with_capacity(STEP);
        let more = producer.step(store, &mut out)?;
        hasher.update(&out);
        size += out.len() as u64;
        if !more {
            return Ok((format!("sha256:{}", hex::encode(hasher.finalize())), size));
        }
    }
}

/// Bytes `[start, end)` of what `inner` makes (a `Range` of a built blob): the bytes before are
/// made and dropped, which costs little for the small blobs built here.
pub fn window<P: Producer>(inner: P, start: u64, end: u64) -> impl Producer {
    let mut inner = inner;
    let mut pos = 0u64;
    move |store: &Store, out: &mut Vec<u8>| -> Result<bool, StorageError> {
        // `out` may hold the batch's earlier steps: this step ends once it added something.
        let begin = out.len();
        while pos < end {
            let mut made = Vec::with_capacity(STEP);
            let more = inner.step(store, &mut made)?;
            let made_end = pos + made.len() as u64;
            if made_end > start {
                let from = start.saturating_sub(pos) as usize;
                let to = (end.min(made_end) - pos) as usize;
                out.extend_from_slice(made.get(from..to).unwrap_or_default());
            }
            pos = made_end;
            if !more {
                return Ok(false);
            }
            if out.len() > begin {
                return Ok(pos < end);
            }
        }
        Ok(false)
    }
}

/// A gzip stream of stored deflate blocks: full blocks as bytes arrive, the rest in the final one.
#[derive(Default)]
struct StoredGzip {
    started: bool,
    pending: Vec<u8>,
    crc: crc32fast::Hasher,
    len: u64,
}

impl StoredGzip {
    fn push(&mut self, data: &[u8], out: &mut Vec<u8>) {
        if !self.started {
            out.extend_from_slice(&GZIP_HEADER);
            self.started = true;
        }
        self.crc.update(data);
        self.len += data.len() as u64;
        self.pending.extend_from_slice(data);
        let full = self.pending.len() / STORED_BLOCK * STORED_BLOCK;
        for block in self.pending.get(..full).unwrap_or_default().chunks(STORED_BLOCK) {
            stored_block(block, false, out);
        }
        self.pending.drain(..full);
    }

    fn finish(&mut self, out: &mut Vec<u8>) {
        self.push(&[], out);
        stored_block(&self.pending, true, out);
        self.pending.clear();
        out.extend_from_slice(&self.crc.clone().finalize().to_le_bytes());
        // ISIZE is the length modulo 2^32.
        out.extend_from_slice(&(self.len as u32).to_le_bytes());
    }
}

/// One stored deflate block (`BTYPE` 00; byte-aligned, since every block before was stored too).
fn stored_block(data: &[u8], last: bool, out: &mut Vec<u8>) {
    let len = data.len() as u16;
    out.push(u8::from(last));
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&(!len).to_le_bytes());
    out.extend_from_slice(data);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn gzip_of(pieces: &[&[u8]]) -> Vec<u8> {
        let mut gzip = StoredGzip::default();
        let mut out = Vec::new();
        for piece in pieces {
            gzip.push(piece, &mut out);
        }
        gzip.finish(&mut out);
        out
    }

    fn gunzip(bytes: &[u8]) -> Vec<u8> {
        let mut decoded = Vec::new();
        flate2::read::GzDecoder::new(bytes).read_to_end(&mut decoded).unwrap();
        decoded
    }

    #[test]
    fn stored_gzip_decodes_and_depends_only_on_the_bytes() {
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let whole = gzip_of(&[&data]);
        assert_eq!(gunzip(&whole), data);
        let (a, b) = data.split_at(70_001);
        let (b, c) = b.split_at(3);
        assert_eq!(gzip_of(&[a, b, c]), whole, "how the bytes arrive must not change the stream");
        assert_eq!(gunzip(&gzip_of(&[])), Vec::<u8>::new());
        let exact = vec![7u8; STORED_BLOCK * 2];
        assert_eq!(gunzip(&gzip_of(&[&exact])), exact);
    }
}
