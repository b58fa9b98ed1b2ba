//! Content-defined chunking of a file's bytes: FastCDC 2020's cut points (the fastcdc crate's
//! `cut`, with the same sizes and masks as its `StreamCDC`, so chunks and their ids do not change)
//! over one buffer the writer reuses from file to file.
//!
//! `StreamCDC` copies every chunk into a new `Vec` and moves the rest of its 64 KiB buffer to the
//! front after each one; here a chunk is a slice of the buffer, and the unread tail (less than one
//! largest chunk) moves once per refill of [`BUFFER_BYTES`].

use std::io::{self, Read};

use fastcdc::v2020::{cut, select_masks, Normalization};

use super::chunks::{AVG_CHUNK, MAX_CHUNK, MIN_CHUNK};

/// The buffer a writer keeps for chunking (four largest chunks).
pub const BUFFER_BYTES: usize = 4 * MAX_CHUNK as usize;

const MIN: usize = MIN_CHUNK as usize;
const AVG: usize = AVG_CHUNK as usize;
const MAX: usize = MAX_CHUNK as usize;

/// Cuts what `source` reads into chunks, lent one at a time.
pub struct Chunker<'b, R> {
    source: R,
    buffer: &'b mut Vec<u8>,
    /// The unread bytes are `buffer[start..end]`.
    start: usize,
    end: usize,
    eof: bool,
    masks: (u64, u64),
}

impl<'b, R: Read> Chunker<'b, R> {
    /// Chunks `source` in `buffer` (grown to [`BUFFER_BYTES`] if smaller).
    pub fn new(source: R, buffer: &'b mut Vec<u8>) -> Self {
        if buffer.len() < BUFFER_BYTES {
            buffer.resize(BUFFER_BYTES, 0);
        }
        let masks = select_masks(AVG, Normalization::Level1);
        Chunker { source, buffer, start: 0, end: 0, eof: false, masks }
    }

    /// The next chunk, or `None` at the end of the source.
    pub fn next_chunk(&mut self) -> io::Result<Option<&[u8]>> {
        // A cut needs a largest chunk's worth of bytes ahead, or the end of the source.
        if self.end - self.start < MAX && !self.eof {
            self.buffer.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
            while self.end < self.buffer.len() && !self.eof {
                let free = self.buffer.get_mut(self.end..).unwrap_or_default();
                match self.source.read(free) {
                    Ok(0) => self.eof = true,
                    Ok(n) => self.end += n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
        }
        let window = self.buffer.get(self.start..self.end.min(self.start + MAX)).unwrap_or_default();
        if window.is_empty() {
            return Ok(None);
        }
        let (mask_s, mask_l) = self.masks;
        let (_, len) = cut(window, MIN, AVG, MAX, mask_s, mask_l, mask_s << 1, mask_l << 1);
        let chunk = window.get(..len.clamp(1, window.len())).unwrap_or_default();
        self.start += chunk.len();
        Ok(Some(chunk))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hands out at most a varying handful of bytes per read, as a network or a tar entry does.
    struct Trickle<'a> {
        data: &'a [u8],
        step: usize,
    }

    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            self.step = (self.step * 7 + 3) % 9001 + 1;
            let n = self.step.min(buf.len()).min(self.data.len());
            buf[..n].copy_from_slice(&self.data[..n]);
            self.data = &self.data[n..];
            Ok(n)
        }
    }

    fn pseudo_random(len: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        (0..len)
            .map(|i| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // Runs of text-like bytes too, where cut points are rarer.
                if (i / 50_000) % 3 == 0 {
                    b"key: value\n"[i % 11]
                } else {
                    x as u8
                }
            })
            .collect()
    }

    #[test]
    fn cuts_where_the_crates_stream_chunker_cuts_whatever_the_read_sizes() {
        let mut buffer = Vec::new();
        for (len, seed) in [(0, 1), (1, 2), (MIN - 1, 3), (MIN + 1, 4), (MAX, 5), (MAX + 1, 6), (3_000_000, 7)] {
            let data = pseudo_random(len, seed);
            let expected: Vec<Vec<u8>> =
                fastcdc::v2020::StreamCDC::new(&data[..], MIN, AVG, MAX).map(|c| c.unwrap().data).collect();
            for trickle in [false, true] {
                let mut got = Vec::new();
                let mut chunker: Chunker<Box<dyn Read>> = if trickle {
                    Chunker::new(Box::new(Trickle { data: &data, step: 1 }), &mut buffer)
                } else {
                    Chunker::new(Box::new(&data[..]), &mut buffer)
                };
                while let Some(chunk) = chunker.next_chunk().unwrap() {
                    got.push(chunk.to_vec());
                }
                assert_eq!(got.len(), expected.len(), "{len} bytes, trickle {trickle}");
                assert!(got == expected, "{len} bytes, trickle {trickle}: the same chunks");
            }
        }
        assert_eq!(buffer.len(), BUFFER_BYTES, "the buffer stays its size, to be reused");
    }
}
