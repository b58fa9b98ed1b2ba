//! Lingering close: a connection's transport that, when the server shuts it down, first sends
//! its end (TLS `close_notify`, TCP FIN), then reads and discards what the client still sends,
//! for a bounded time and amount, before the socket is closed.
//!
//! Why: a server that answers early (404 for a missing Bundle, 413, 401…) before reading a large
//! request body, then closes, leaves unread bytes in the kernel's receive buffer; closing such a
//! socket sends a TCP reset, which discards the response the client has not read yet. A client
//! still sending its body (Python requests sends all of it before reading; curl without
//! `Expect: 100-continue`) then sees a broken pipe or `SSLEOFError` instead of the Status. Reading
//! the rest lets the answer arrive — what Apache's and nginx's lingering close do. The bounds keep
//! a client from holding the connection open this way: after [`LINGER_TIME`] in all,
//! [`LINGER_IDLE`] without a byte, or [`LINGER_MAX_BYTES`] read, the socket is closed anyway.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// Longest a closing connection is read from.
pub const LINGER_TIME: Duration = Duration::from_secs(5);
/// A closing connection whose client sends nothing for this long is closed.
pub const LINGER_IDLE: Duration = Duration::from_secs(2);
/// Most bytes read from a closing connection (a 64 MiB body sent before the answer is read fits).
pub const LINGER_MAX_BYTES: u64 = 128 << 20;
const BUFFER_BYTES: usize = 16 << 10;

/// A transport (the TLS stream) whose shutdown lingers.
pub struct Lingering<T> {
    inner: T,
    state: State,
}

enum State {
    Open,
    /// Our end is shut down; reading what the client still sends.
    Draining {
        deadline: Instant,
        idle: Pin<Box<Sleep>>,
        left: u64,
        buffer: Box<[u8]>,
    },
    Closed,
}

impl<T> Lingering<T> {
    pub fn new(inner: T) -> Self {
        Lingering { inner, state: State::Open }
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> Lingering<T> {
    /// Reads and discards until the client is done or a bound is reached.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let State::Draining { deadline, idle, left, buffer } = &mut self.state else { return Poll::Ready(()) };
        loop {
            if *left == 0 || Instant::now() >= *deadline {
                return Poll::Ready(());
            }
            let mut read = ReadBuf::new(buffer);
            match Pin::new(&mut self.inner).poll_read(cx, &mut read) {
                // End of stream, or an error (a reset, a TLS alert): nothing left to protect.
                Poll::Ready(Ok(())) if read.filled().is_empty() => return Poll::Ready(()),
                Poll::Ready(Err(_)) => return Poll::Ready(()),
                Poll::Ready(Ok(())) => {
                    *left = left.saturating_sub(read.filled().len() as u64);
                    let next = (Instant::now() + LINGER_IDLE).min(*deadline);
                    idle.as_mut().reset(next);
                }
                Poll::Pending => {
                    ready!(idle.as_mut().poll(cx));
                    return Poll::Ready(());
                }
            }
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Lingering<T> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Lingering<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if let State::Open = this.state {
            ready!(Pin::new(&mut this.inner).poll_shutdown(cx))?;
            let now = Instant::now();
            this.state = State::Draining {
                deadline: now + LINGER_TIME,
                idle: Box::pin(tokio::time::sleep_until(now + LINGER_IDLE)),
                left: LINGER_MAX_BYTES,
                buffer: vec![0; BUFFER_BYTES].into_boxed_slice(),
            };
        }
        ready!(this.poll_drain(cx));
        this.state = State::Closed;
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn shutdown_reads_what_the_peer_still_sends_then_returns() {
        let (server, mut client) = tokio::io::duplex(64 << 10);
        let mut server = Lingering::new(server);
        let sender = tokio::spawn(async move {
            // More than the pipe holds: only a draining server lets this finish.
            client.write_all(&vec![7u8; 1 << 20]).await.unwrap();
            let mut answer = Vec::new();
            client.read_to_end(&mut answer).await.unwrap();
            answer
        });
        server.write_all(b"answer").await.unwrap();
        tokio::time::timeout(Duration::from_secs(5), server.shutdown()).await.expect("drains").unwrap();
        assert_eq!(sender.await.unwrap(), b"answer");
    }

    #[tokio::test]
    async fn a_silent_peer_is_given_up_after_the_idle_time() {
        let (server, _client) = tokio::io::duplex(1024);
        let mut server = Lingering::new(server);
        let started = Instant::now();
        server.shutdown().await.unwrap();
        let waited = started.elapsed();
        assert!(waited >= LINGER_IDLE && waited < LINGER_TIME, "{waited:?}");
    }
}
