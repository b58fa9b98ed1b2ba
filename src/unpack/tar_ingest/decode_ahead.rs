//! Decompressing on a thread of its own, ahead of the tar reader: inflating gzip or zstd took a
//! third of the ingest thread's time, the one thread every other step of an unpack waits for.
//!
//! The body is still read on the ingest thread, through [`super::stream::SourceReader`], so a
//! body's failure is attributed as before; only its compressed bytes go to the decoder thread, and
//! decoded ones come back, each way through a bounded queue ([`QUEUE`] batches of up to
//! [`BATCH`] bytes): memory does not grow with the input, and a decoder that expands a bomb
//! waits for the reader, which counts every decoded byte against the limit.

use std::cell::Cell;
use std::io::{self, Read};
use std::rc::Rc;
use std::thread::JoinHandle;

use crossbeam_channel::{bounded, Receiver, Select, Sender, TryRecvError};

use super::State;

/// Bytes per batch, either way.
const BATCH: usize = 256 * 1024;
/// Batches queued each way, at most.
const QUEUE: usize = 4;

/// What the decoder thread sends back.
enum Decoded {
    Data(Vec<u8>),
    End,
    /// The decoder refused its input; `input_ended`: it had read all of it.
    Failed {
        error: io::Error,
        input_ended: bool,
    },
}

/// A decoder running on its own thread over what `raw` reads.
pub(super) struct DecodeAhead<'s, R> {
    raw: R,
    state: &'s State,
    /// Compressed bytes to the thread; dropped at the body's end.
    input: Option<Sender<Vec<u8>>>,
    /// Body bytes read and not yet taken by the thread.
    pending: Option<Vec<u8>>,
    output: Receiver<Decoded>,
    current: Vec<u8>,
    pos: usize,
    ended: bool,
    thread: Option<JoinHandle<()>>,
}

impl<'s, R: Read> DecodeAhead<'s, R> {
    /// Starts the thread: `decoder` builds the decoder over the compressed bytes it is handed.
    pub fn start<D: Read + 'static>(
        raw: R,
        state: &'s State,
        decoder: impl FnOnce(Handed) -> io::Result<D> + Send + 'static,
    ) -> io::Result<Self> {
        let (input, handed) = bounded::<Vec<u8>>(QUEUE);
        let (give, output) = bounded::<Decoded>(QUEUE);
        let thread = std::thread::Builder::new().name("stowage-decode".into()).spawn(move || {
            let ended = Rc::new(Cell::new(false));
            let source = Handed { queue: handed, current: Vec::new(), pos: 0, ended: ended.clone() };
            let mut decoder = match decoder(source) {
                Ok(decoder) => decoder,
                Err(error) => {
                    let _ = give.send(Decoded::Failed { error, input_ended: false });
                    return;
                }
            };
            decode(&mut decoder, &give, &ended);
        })?;
        Ok(DecodeAhead {
            raw,
            state,
            input: Some(input),
            pending: None,
            output,
            current: Vec::new(),
            pos: 0,
            ended: false,
            thread: Some(thread),
        })
    }

    /// The body's next bytes, read (`None` at its end, the queue to the thread then closed).
    fn read_body(&mut self) -> io::Result<Option<Vec<u8>>> {
        let mut chunk = vec![0u8; BATCH];
        let n = self.raw.read(&mut chunk)?;
        if n == 0 {
            self.input = None;
            return Ok(None);
        }
        chunk.truncate(n);
        Ok(Some(chunk))
    }

    /// The thread's next word: waiting for it, handing it the body's bytes meanwhile (a decoder
    /// may take any amount of input before it gives anything back).
    fn next_decoded(&mut self) -> io::Result<Decoded> {
        let stopped = || io::Error::other("the decoder thread stopped");
        loop {
            match self.output.try_recv() {
                Ok(next) => return Ok(next),
                Err(TryRecvError::Disconnected) => return Err(stopped()),
                Err(TryRecvError::Empty) => {}
            }
            if self.input.is_some() && self.pending.is_none() {
                self.pending = self.read_body()?;
                continue;
            }
            let (Some(input), Some(_)) = (&self.input, &self.pending) else {
                return self.output.recv().map_err(|_| stopped());
            };
            let mut select = Select::new();
            let give = select.send(input);
            let take = select.recv(&self.output);
            let ready = select.select();
            if ready.index() == give {
                let chunk = self.pending.take().unwrap_or_default();
                // A thread gone has sent its last word: it is taken next.
                let _ = ready.send(input, chunk);
            } else if ready.index() == take {
                return ready.recv(&self.output).map_err(|_| stopped());
            }
        }
    }
}

/// The thread's loop: decoded batches until the end or a failure, or until the reader is gone.
fn decode(decoder: &mut dyn Read, give: &Sender<Decoded>, ended: &Cell<bool>) {
    loop {
        let mut batch = vec![0u8; BATCH];
        let mut filled = 0;
        let last = loop {
            match decoder.read(batch.get_mut(filled..).unwrap_or_default()) {
                Ok(0) => break Some(Decoded::End),
                Ok(n) => {
                    filled += n.min(BATCH - filled);
                    if filled == BATCH {
                        break None;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => {
                    let input_ended = ended.get();
                    break Some(Decoded::Failed { error, input_ended });
                }
            }
        };
        if filled > 0 {
            batch.truncate(filled);
            if give.send(Decoded::Data(batch)).is_err() {
                return;
            }
        }
        if let Some(last) = last {
            let _ = give.send(last);
            return;
        }
    }
}

impl<R: Read> Read for DecodeAhead<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.pos == self.current.len() {
            if self.ended || buf.is_empty() {
                return Ok(0);
            }
            match self.next_decoded()? {
                Decoded::Data(data) => (self.current, self.pos) = (data, 0),
                Decoded::End => self.ended = true,
                Decoded::Failed { error, input_ended } => {
                    // Read ahead, the body may have ended long before the decoder failed: what
                    // the message says (truncated or corrupt) is the decoder's view.
                    self.state.source_eof.set(input_ended);
                    return Err(error);
                }
            }
        }
        Ok(lend(&self.current, &mut self.pos, buf))
    }
}

impl<R> Drop for DecodeAhead<'_, R> {
    fn drop(&mut self) {
        // Both queues closed: the thread's next send or receive fails and it returns.
        self.input = None;
        let (_, closed) = bounded(0);
        self.output = closed;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The compressed bytes as the decoder thread reads them.
pub(super) struct Handed {
    queue: Receiver<Vec<u8>>,
    current: Vec<u8>,
    pos: usize,
    /// Shared with the thread's loop (the decoder owns this).
    ended: Rc<Cell<bool>>,
}

impl Read for Handed {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.pos == self.current.len() {
            match self.queue.recv() {
                Ok(chunk) => (self.current, self.pos) = (chunk, 0),
                Err(_) => {
                    self.ended.set(true);
                    return Ok(0);
                }
            }
        }
        Ok(lend(&self.current, &mut self.pos, buf))
    }
}

/// Copies what `buf` holds of `from[*pos..]` and moves `pos` past it.
fn lend(from: &[u8], pos: &mut usize, buf: &mut [u8]) -> usize {
    let rest = from.get(*pos..).unwrap_or_default();
    let n = rest.len().min(buf.len());
    if let (Some(to), Some(from)) = (buf.get_mut(..n), rest.get(..n)) {
        to.copy_from_slice(from);
    }
    *pos += n;
    n
}
