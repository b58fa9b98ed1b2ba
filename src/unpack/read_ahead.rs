//! An async byte stream read ahead of the blocking thread that consumes it.
//!
//! Ingest runs on a blocking thread and reads through `std::io::Read`. Bridging each read to the
//! stream (`SyncIoBridge`) makes the network and the reader take turns: the connection reads one
//! frame only once the reader asks for it, and each frame costs both threads a wake-up. Here a task
//! on the runtime pulls frames as they arrive and hands them over in batches, so the network keeps
//! a few batches ahead while the reader works, and a wake-up moves up to [`BATCH_BYTES`].
//!
//! Bounded: at most [`BATCHES`] batches wait, plus the one the task is gathering (a batch closes at
//! [`BATCH_BYTES`], so it holds that much plus one frame). The task stops once the reader is gone.

use std::collections::VecDeque;
use std::io::{self, Read};

use bytes::{Buf, Bytes};
use futures_util::{FutureExt, Stream, StreamExt};
use tokio::sync::mpsc;

/// A batch closes once it holds this many bytes.
pub const BATCH_BYTES: usize = 256 * 1024;
/// Batches waiting for the reader, at most. 4 MiB: on two cores the ingest's threads (parsing,
/// hashing, sealing) get the CPU in bursts, and a shallow queue fills during one, which stops the
/// connection reading and the client sending (1 GiB `curl -T`: 340 MB/s with 4 batches, 365 with 16).
pub const BATCHES: usize = 16;

enum Batch {
    Data(Vec<Bytes>),
    Failed(io::Error),
    End,
}

/// The blocking side: reads the frames the task gathered.
pub struct ReadAhead {
    batches: mpsc::Receiver<Batch>,
    frames: VecDeque<Bytes>,
    ended: bool,
}

impl ReadAhead {
    /// Starts reading `stream` on `runtime`; read the bytes from a blocking thread.
    pub fn spawn<S>(runtime: &tokio::runtime::Handle, stream: S) -> ReadAhead
    where
        S: Stream<Item = io::Result<Bytes>> + Send + 'static,
    {
        let (send, batches) = mpsc::channel(BATCHES);
        runtime.spawn(pump(stream, send));
        ReadAhead { batches, frames: VecDeque::new(), ended: false }
    }
}

async fn pump<S>(stream: S, send: mpsc::Sender<Batch>)
where
    S: Stream<Item = io::Result<Bytes>> + Send,
{
    let mut stream = std::pin::pin!(stream);
    loop {
        // Waiting for the client: stop as soon as nobody reads any more.
        let first = tokio::select! {
            next = stream.next() => next,
            () = send.closed() => return,
        };
        let (mut frames, mut bytes, mut last) = (Vec::new(), 0, None);
        match first {
            Some(Ok(frame)) => {
                bytes += frame.len();
                frames.push(frame);
            }
            Some(Err(e)) => last = Some(Batch::Failed(e)),
            None => last = Some(Batch::End),
        }
        // Add the frames already here, without waiting for more.
        while last.is_none() && bytes < BATCH_BYTES {
            match stream.next().now_or_never() {
                Some(Some(Ok(frame))) => {
                    bytes += frame.len();
                    frames.push(frame);
                }
                Some(Some(Err(e))) => last = Some(Batch::Failed(e)),
                Some(None) => last = Some(Batch::End),
                None => break,
            }
        }
        if !frames.is_empty() && send.send(Batch::Data(frames)).await.is_err() {
            return;
        }
        if let Some(last) = last {
            let _ = send.send(last).await;
            return;
        }
    }
}

impl Read for ReadAhead {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            if let Some(frame) = self.frames.front_mut() {
                let n = frame.len().min(buf.len());
                frame.copy_to_slice(buf.get_mut(..n).unwrap_or_default());
                if frame.is_empty() {
                    self.frames.pop_front();
                }
                if n > 0 || buf.is_empty() {
                    return Ok(n);
                }
                continue;
            }
            if self.ended || buf.is_empty() {
                return Ok(0);
            }
            match self.batches.blocking_recv() {
                Some(Batch::Data(frames)) => self.frames.extend(frames),
                Some(Batch::End) => self.ended = true,
                Some(Batch::Failed(e)) => return Err(e),
                // The task ended without saying why: the runtime is shutting down.
                None => return Err(io::Error::other("the server is shutting down")),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap()
    }

    #[test]
    fn reads_every_byte_in_order_then_the_end() {
        let rt = runtime();
        let frames: Vec<io::Result<Bytes>> =
            (0..2000u32).map(|i| Ok(Bytes::from(vec![(i % 251) as u8; (i as usize * 37) % 5000]))).collect();
        let expected: Vec<u8> = frames.iter().flat_map(|f| f.as_ref().unwrap().to_vec()).collect();
        let mut reader = ReadAhead::spawn(rt.handle(), futures_util::stream::iter(frames));
        let mut got = Vec::new();
        let mut buf = [0u8; 3001];
        loop {
            let n = reader.read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
        assert_eq!(got, expected);
        assert_eq!(reader.read(&mut buf).unwrap(), 0, "the end stays the end");
    }

    #[test]
    fn an_error_of_the_stream_reaches_the_reader_after_the_bytes_before_it() {
        let rt = runtime();
        let frames = vec![Ok(Bytes::from_static(b"abc")), Err(io::Error::other("body too large"))];
        let mut reader = ReadAhead::spawn(rt.handle(), futures_util::stream::iter(frames));
        let mut got = Vec::new();
        let e = reader.read_to_end(&mut got).unwrap_err();
        assert_eq!(got, b"abc");
        assert_eq!(e.to_string(), "body too large");
    }

    #[test]
    fn the_task_stops_reading_once_the_reader_is_gone() {
        let rt = runtime();
        let (send, receive) = mpsc::channel::<io::Result<Bytes>>(1);
        let stream = tokio_stream_of(receive);
        let reader = ReadAhead::spawn(rt.handle(), stream);
        drop(reader);
        // The task drops the stream (so its receiver) without any frame sent.
        rt.block_on(async {
            tokio::time::timeout(std::time::Duration::from_secs(5), send.closed()).await.expect("the task stopped");
        });
    }

    #[test]
    fn reads_ahead_no_further_than_its_bound() {
        let rt = runtime();
        // A client with far more to send than the bound, and a reader that takes nothing yet.
        let pulled = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = pulled.clone();
        let frame = Bytes::from(vec![7u8; 64 * 1024]);
        let stream = futures_util::stream::repeat_with(move || {
            counter.fetch_add(frame.len(), std::sync::atomic::Ordering::SeqCst);
            Ok(frame.clone())
        })
        .take(1000);
        let mut reader = ReadAhead::spawn(rt.handle(), stream);
        let held = || pulled.load(std::sync::atomic::Ordering::SeqCst);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while held() < BATCHES * BATCH_BYTES && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(held() >= BATCHES * BATCH_BYTES, "it reads ahead ({} bytes pulled)", held());
        // Time to go further, if it would.
        std::thread::sleep(std::time::Duration::from_millis(300));
        let bound = (BATCHES + 1) * BATCH_BYTES + 64 * 1024;
        assert!(held() <= bound, "{} bytes pulled while nobody read; at most {bound}", held());
        // Reading resumes the pulling, and every byte arrives.
        let mut got = 0;
        let mut buf = vec![0u8; 1 << 20];
        loop {
            match reader.read(&mut buf).unwrap() {
                0 => break,
                n => got += n,
            }
        }
        assert_eq!(got, 1000 * 64 * 1024);
    }

    fn tokio_stream_of(mut receive: mpsc::Receiver<io::Result<Bytes>>) -> impl Stream<Item = io::Result<Bytes>> {
        futures_util::stream::poll_fn(move |cx| receive.poll_recv(cx))
    }
}
