//! Cutting clients that stop reading. A stalled HTTP/1 or HTTP/2 peer stops polling the response
//! body, so ending the body frees nothing: the connection itself is closed, through the
//! [`ConnectionCut`] the listener puts in every request's extensions. Downloads detect a stall
//! themselves (`content/stream.rs`); a watch is watched by [`watch_for_stall`], and only while
//! events wait for it — a quiet watch is never cut. A connection whose client abandons many
//! requests before their answers are ready (HTTP/2 streams reset as soon as they are opened, the
//! "rapid reset" attack, also when each is answered before its reset) is cut too ([`Abandons`]).

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use futures_util::Stream;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::ChannelStream;

/// Closes the connection a request came on.
#[derive(Clone, Debug, Default)]
pub struct ConnectionCut(pub CancellationToken);

type Frame = Result<Bytes, std::io::Error>;

/// Requests one connection may abandon within [`ABANDON_WINDOW`]. h2 itself ends a connection
/// whose streams are reset before the server accepted them; a stream reset just after it was
/// accepted still starts a handler, and no client but an attacker abandons dozens in ten seconds.
const MAX_ABANDONED: u32 = 32;
const ABANDON_WINDOW: Duration = Duration::from_secs(10);

/// The requests a connection's client abandoned before their answers were ready.
pub struct Abandons {
    cut: ConnectionCut,
    /// The current window's start and count.
    window: Mutex<(Instant, u32)>,
}

/// Counts a request as abandoned if it is dropped before [`Answering::answered`].
pub struct Answering(Option<Arc<Abandons>>);

impl Abandons {
    pub fn new(cut: ConnectionCut) -> Arc<Abandons> {
        Arc::new(Abandons { cut, window: Mutex::new((Instant::now(), 0)) })
    }

    /// A request starts: dropping the result before `answered` counts it abandoned.
    pub fn begin(self: &Arc<Self>) -> Answering {
        Answering(Some(self.clone()))
    }

    fn abandoned(&self) {
        let mut window = self.window.lock().unwrap_or_else(PoisonError::into_inner);
        if window.0.elapsed() > ABANDON_WINDOW {
            *window = (Instant::now(), 0);
        }
        window.1 = window.1.saturating_add(1);
        if window.1 > MAX_ABANDONED && !self.cut.0.is_cancelled() {
            tracing::info!(
                abandoned = window.1,
                "cutting a connection whose client abandons requests as fast as it opens them"
            );
            self.cut.0.cancel();
        }
    }
}

/// A response body dropped unfinished this soon after its answer counts as abandoned too: a watch
/// answered at once and reset at once costs a handler as a stream reset before its answer does.
const QUICK_ABANDON: Duration = Duration::from_secs(1);

impl Answering {
    /// The answer is ready. Its body, returned, still counts as abandoned if the client drops it
    /// unfinished within [`QUICK_ABANDON`]. `owed`: the bytes the response declares (its
    /// `Content-Length`; 0 for a HEAD, 204 or 304 answer), if it declares them — HTTP/1 stops
    /// polling a body once that many are out, without waiting for its end.
    pub fn answered(mut self, body: Body, owed: Option<u64>) -> Answered {
        Answered { body, abandons: self.0.take(), at: Instant::now(), owed }
    }
}

/// A response body that may still be abandoned ([`Answering::answered`]).
pub struct Answered {
    body: Body,
    abandons: Option<Arc<Abandons>>,
    at: Instant,
    /// Declared bytes not sent yet.
    owed: Option<u64>,
}

impl hyper::body::Body for Answered {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, axum::Error>>> {
        loop {
            let polled = Pin::new(&mut self.body).poll_frame(cx);
            match &polled {
                Poll::Ready(None) => self.abandons = None,
                // hyper sends an empty chunk as an empty DATA frame, and HTTP/2 clients count
                // those as abuse: h2 (reqwest, kube-rs) ends a connection after 100 of them, with
                // every stream on it. The end of the body is marked by hyper itself.
                Poll::Ready(Some(Ok(frame))) if frame.data_ref().is_some_and(Bytes::is_empty) => continue,
                Poll::Ready(Some(Ok(frame))) => {
                    let sent = frame.data_ref().map_or(0, |d| d.len() as u64);
                    let owed = self.owed.map(|owed| owed.saturating_sub(sent));
                    self.owed = owed;
                }
                _ => {}
            }
            return polled;
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

impl Drop for Answered {
    fn drop(&mut self) {
        let unfinished = !hyper::body::Body::is_end_stream(&self.body) && self.owed != Some(0);
        if let Some(abandons) = self.abandons.take().filter(|_| unfinished && self.at.elapsed() < QUICK_ABANDON) {
            abandons.abandoned();
        }
    }
}

impl Drop for Answering {
    fn drop(&mut self) {
        if let Some(abandons) = self.0.take() {
            abandons.abandoned();
        }
    }
}

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

    #[test]
    fn a_connection_abandoning_requests_fast_is_cut() {
        let cut = ConnectionCut::default();
        let abandons = Abandons::new(cut.clone());
        for _ in 0..1000 {
            // Answered and read to the end (an empty body ends at once).
            drop(abandons.begin().answered(Body::empty(), None));
        }
        assert!(!cut.0.is_cancelled(), "answered requests count for nothing");
        for _ in 0..MAX_ABANDONED {
            drop(abandons.begin());
        }
        assert!(!cut.0.is_cancelled());
        drop(abandons.begin());
        assert!(cut.0.is_cancelled(), "{} abandoned requests did not cut the connection", MAX_ABANDONED + 1);
    }

    #[test]
    fn answers_dropped_unfinished_at_once_count_as_abandoned() {
        let cut = ConnectionCut::default();
        let abandons = Abandons::new(cut.clone());
        let streaming = || Body::from_stream(futures_util::stream::pending::<Result<Bytes, std::io::Error>>());
        for _ in 0..=MAX_ABANDONED {
            drop(abandons.begin().answered(streaming(), None));
        }
        assert!(cut.0.is_cancelled(), "watches answered and reset at once did not cut the connection");
    }

    #[tokio::test]
    async fn answers_sent_to_their_declared_length_are_finished_even_if_never_polled_to_the_end() {
        use http_body_util::BodyExt as _;
        let cut = ConnectionCut::default();
        let abandons = Abandons::new(cut.clone());
        // A download as HTTP/1 sends it: its Content-Length taken, then the body dropped without
        // being polled for its end (a stream's end is known only when polled).
        let download = || {
            let parts = vec![Ok::<_, std::io::Error>(Bytes::from_static(b"0123")), Ok(Bytes::from_static(b"4567"))];
            Body::from_stream(futures_util::stream::iter(parts).chain(futures_util::stream::pending()))
        };
        for _ in 0..=MAX_ABANDONED {
            let mut body = abandons.begin().answered(download(), Some(8));
            for _ in 0..2 {
                body.frame().await.unwrap().unwrap();
            }
        }
        // HEAD, 204 and 304 answers: nothing is owed, whatever the body.
        for _ in 0..=MAX_ABANDONED {
            drop(abandons.begin().answered(download(), Some(0)));
        }
        assert!(!cut.0.is_cancelled(), "answers sent whole counted as abandoned");
        // Half of the declared bytes, then dropped: abandoned.
        for _ in 0..=MAX_ABANDONED {
            let mut body = abandons.begin().answered(download(), Some(8));
            body.frame().await.unwrap().unwrap();
        }
        assert!(cut.0.is_cancelled(), "answers dropped half sent did not cut the connection");
    }

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
