//! Cutting clients that stop reading. A stalled HTTP/1 or HTTP/2 peer stops polling the response
//! body, so ending the body frees nothing: the connection itself is closed, through the
//! [`ConnectionCut`] the listener puts in every request's extensions. Downloads detect a stall
//! themselves (`content/stream.rs`); a watch is watched by [`watch_for_stall`], and only while
//! events wait for it — a quiet watch is never cut.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Bytes;
use futures_util::Stream;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::ChannelStream;

/// Closes the connection a request came on.
#[derive(Clone, Debug, Default)]
pub struct ConnectionCut(pub CancellationToken);

type Frame = Result<Bytes, std::io::Error>;

/// A response body stream that counts the frames the client has taken.
pub struct Counted {
    inner: ChannelStream,
    taken: Arc<AtomicU64>,
}

impl Stream for Counted {
    type Item = Frame;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Frame>> {
        let polled = Pin::new(&mut self.inner).poll_next(cx);
        if let Poll::Ready(Some(_)) = &polled {
            self.taken.fetch_add(1, Ordering::Relaxed);
        }
        polled
    }
}

/// The body of a streamed response fed by `tx`'s channel: cut when the channel stays full (events
/// wait) and the client takes nothing for `stall`.
pub fn watch_for_stall(
    tx: &mpsc::Sender<Frame>,
    rx: mpsc::Receiver<Frame>,
    stall: Duration,
    cut: Option<ConnectionCut>,
) -> Counted {
    let taken = Arc::new(AtomicU64::new(0));
    if let Some(cut) = cut {
        let (weak, taken) = (tx.downgrade(), taken.clone());
        let every = (stall / 4).max(Duration::from_millis(50));
        tokio::spawn(async move {
            // Since when the channel has been full with nothing taken, and the count then.
            let mut stalled: Option<(tokio::time::Instant, u64)> = None;
            loop {
                tokio::time::sleep(every).await;
                let Some(tx) = weak.upgrade() else { return };
                let now_taken = taken.load(Ordering::Relaxed);
                stalled = match stalled {
                    _ if tx.capacity() > 0 => None,
                    Some((since, count)) if count == now_taken => {
                        if since.elapsed() >= stall {
                            tracing::info!(?stall, "cutting a watch whose client took no event for the stall timeout");
                            cut.0.cancel();
                            return;
                        }
                        Some((since, count))
                    }
                    _ => Some((tokio::time::Instant::now(), now_taken)),
                };
            }
        });
    }
    Counted { inner: ChannelStream(rx), taken }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::StreamExt as _;

    #[tokio::test]
    async fn a_full_channel_nobody_reads_is_cut_a_quiet_or_read_one_is_not() {
        let stall = Duration::from_millis(200);
        // Quiet: nothing to send.
        let (tx, rx) = mpsc::channel(2);
        let quiet = ConnectionCut::default();
        let _quiet_body = watch_for_stall(&tx, rx, stall, Some(quiet.clone()));
        // Read: events flow and are taken.
        let (read_tx, read_rx) = mpsc::channel(2);
        let read = ConnectionCut::default();
        let mut read_body = watch_for_stall(&read_tx, read_rx, stall, Some(read.clone()));
        // Stalled: the channel fills and nobody takes anything.
        let (stalled_tx, stalled_rx) = mpsc::channel(2);
        let stalled = ConnectionCut::default();
        let _stalled_body = watch_for_stall(&stalled_tx, stalled_rx, stall, Some(stalled.clone()));
        for _ in 0..2 {
            stalled_tx.send(Ok(Bytes::from_static(b"{}\n"))).await.unwrap();
        }
        let started = tokio::time::Instant::now();
        while started.elapsed() < stall * 4 {
            read_tx.send(Ok(Bytes::from_static(b"{}\n"))).await.unwrap();
            read_tx.send(Ok(Bytes::from_static(b"{}\n"))).await.unwrap();
            tokio::time::sleep(Duration::from_millis(20)).await;
            read_body.next().await.unwrap().unwrap();
            read_body.next().await.unwrap().unwrap();
        }
        assert!(stalled.0.is_cancelled(), "a watch whose client took nothing was not cut");
        assert!(!quiet.0.is_cancelled(), "a quiet watch was cut");
        assert!(!read.0.is_cancelled(), "a watch whose client reads was cut");
    }
}
