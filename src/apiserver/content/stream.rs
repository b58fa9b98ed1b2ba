//! Download bodies produced in short steps: each trip to the blocking pool produces a batch of
//! steps and returns, and the next starts only once the client has taken the previous one. A slow
//! client therefore parks an async task and one buffer, never a thread — a thousand slow readers
//! cost a thousand small buffers, not the blocking pool every other request needs.
//!
//! A batch starts at [`STEP`] bytes and doubles, up to [`MAX_BATCH`], while the client takes each
//! one at once: a fast reader costs few trips (each is two thread wake-ups), a slow one keeps small
//! buffers.
//!
//! A client that takes nothing for the stall timeout is cut: its connection is closed (a stalled
//! HTTP/1 or HTTP/2 peer stops polling the body, so ending the body alone would free nothing).

use std::time::Duration;

use crate::apiserver::stall::ConnectionCut;
use crate::apiserver::ChannelStream;
use crate::storage::{StorageError, Store};
use axum::body::{Body, Bytes};
use tokio::sync::mpsc;

/// Bytes one step produces at most (a little more when a step ends inside a small piece).
pub const STEP: usize = 256 * 1024;
/// Bytes one trip to the blocking pool produces at most: with a buffer waiting for the client and
/// the one hyper writes, what a download holds is bounded by about twice this.
pub const MAX_BATCH: usize = 1 << 20;
/// A client that took the previous batch within this is keeping up: the next batch may double.
const KEEPING_UP: Duration = Duration::from_millis(5);

/// One step of a download: appends the next bytes (about [`STEP`]) to `out`, which may already
/// hold earlier steps' bytes of the same batch; returns whether more follow.
pub trait Producer: Send + 'static {
    fn step(&mut self, store: &Store, out: &mut Vec<u8>) -> Result<bool, StorageError>;
}

impl<F> Producer for F
where
    F: FnMut(&Store, &mut Vec<u8>) -> Result<bool, StorageError> + Send + 'static,
{
    fn step(&mut self, store: &Store, out: &mut Vec<u8>) -> Result<bool, StorageError> {
        self(store, out)
    }
}

/// A response body fed by `producer`, one step ahead of the client at most.
pub fn body<P: Producer>(store: Store, producer: P, stall: Duration, cut: Option<ConnectionCut>) -> Body {
    // One buffer waits in the channel while hyper writes the one before it.
    let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(1);
    tokio::spawn(async move {
        let mut producer = producer;
        // What the next batch may be while the client keeps up: the first is one step.
        let mut next_batch = STEP;
        loop {
            let waited = tokio::time::Instant::now();
            let permit = match tokio::time::timeout(stall, tx.reserve()).await {
                Ok(Ok(permit)) => permit,
                // The client went away.
                Ok(Err(_)) => return,
                Err(_) => {
                    tracing::info!(?stall, "cutting a download whose client took nothing for the stall timeout");
                    if let Some(cut) = &cut {
                        cut.0.cancel();
                    }
                    return;
                }
            };
            let batch = if waited.elapsed() <= KEEPING_UP { next_batch } else { STEP };
            next_batch = (batch * 2).min(MAX_BATCH);
            let store = store.clone();
            let stepped = tokio::task::spawn_blocking(move || {
                let mut out = Vec::with_capacity(batch);
                let more = loop {
                    let before = out.len();
                    match producer.step(&store, &mut out) {
                        // A step that added nothing ends the batch, so no producer spins here.
                        Ok(true) if out.len() < batch && out.len() > before => {}
                        done => break done,
                    }
                };
                (producer, out, more)
            })
            .await;
            let (returned, out, more) = match stepped {
                Ok(stepped) => stepped,
                Err(e) => {
                    tracing::error!(error = %e, "content read task failed");
                    permit.send(Err(std::io::Error::other("content read failed")));
                    return;
                }
            };
            producer = returned;
            match more {
                Ok(more) => {
                    if !out.is_empty() {
                        permit.send(Ok(Bytes::from(out)));
                    }
                    if !more {
                        return;
                    }
                }
                Err(StorageError::Cancelled) => return,
                Err(e) => {
                    // Headers are gone already: abort the body so the client sees a truncated
                    // transfer (and a digest mismatch), never wrong bytes.
                    tracing::error!(error = %e, "content read failed mid-stream");
                    permit.send(Err(std::io::Error::other("content read failed")));
                    return;
                }
            }
        }
    });
    Body::from_stream(ChannelStream(rx))
}

/// A producer of the byte range `[start, end)` of something read by ranges (the tar, a file).
pub fn ranged<R>(start: u64, end: u64, mut read: R) -> impl Producer
where
    R: FnMut(&Store, u64, u64, &mut Vec<u8>) -> Result<(), StorageError> + Send + 'static,
{
    let mut pos = start;
    move |store: &Store, out: &mut Vec<u8>| {
        let to = end.min(pos.saturating_add(STEP as u64));
        if pos < to {
            read(store, pos, to, out)?;
            pos = to;
        }
        Ok(pos < end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt as _;

    fn store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), Default::default()).unwrap();
        (dir, store)
    }

    #[tokio::test]
    async fn steps_deliver_the_whole_range_in_order() {
        let (_dir, store) = store();
        let total = 3 * STEP as u64 + 17;
        let producer = ranged(5, total, |_: &Store, from: u64, to: u64, out: &mut Vec<u8>| {
            out.extend((from..to).map(|i| (i % 251) as u8));
            Ok(())
        });
        let bytes = body(store, producer, Duration::from_secs(5), None).collect().await.unwrap().to_bytes();
        let expected: Vec<u8> = (5..total).map(|i| (i % 251) as u8).collect();
        assert_eq!(bytes.as_ref(), expected.as_slice());
    }

    #[tokio::test]
    async fn batches_of_uneven_steps_deliver_everything_and_an_empty_step_does_not_spin() {
        let (_dir, store) = store();
        // Steps of 100 KiB, one that adds nothing, then a short last one: batches of up to
        // MAX_BATCH hold several steps each.
        let mut calls = 0u32;
        let producer = move |_: &Store, out: &mut Vec<u8>| -> Result<bool, StorageError> {
            calls += 1;
            match calls {
                3 => Ok(true),
                40 => {
                    out.extend_from_slice(b"end");
                    Ok(false)
                }
                n => {
                    out.extend(std::iter::repeat_n((n % 251) as u8, 100 * 1024));
                    Ok(true)
                }
            }
        };
        let bytes = body(store, producer, Duration::from_secs(5), None).collect().await.unwrap().to_bytes();
        let mut expected: Vec<u8> = Vec::new();
        for n in (1..40).filter(|n| *n != 3) {
            expected.extend(std::iter::repeat_n((n % 251) as u8, 100 * 1024));
        }
        expected.extend_from_slice(b"end");
        assert_eq!(bytes.len(), expected.len());
        assert!(bytes.as_ref() == expected.as_slice(), "the bytes come in order");
    }

    #[tokio::test]
    async fn a_client_that_takes_nothing_is_cut() {
        let (_dir, store) = store();
        let producer = ranged(0, u64::MAX, |_: &Store, from: u64, to: u64, out: &mut Vec<u8>| {
            out.resize(usize::try_from(to - from).unwrap_or(0), 0);
            Ok(())
        });
        let cut = ConnectionCut::default();
        let _body = body(store, producer, Duration::from_millis(100), Some(cut.clone()));
        tokio::time::timeout(Duration::from_secs(5), cut.0.cancelled()).await.expect("the stalled download was cut");
    }

    #[tokio::test]
    async fn a_failed_read_aborts_the_body() {
        let (_dir, store) = store();
        let producer = |_: &Store, _: &mut Vec<u8>| -> Result<bool, StorageError> {
            Err(StorageError::Corrupt("chunk hash mismatch".into()))
        };
        assert!(body(store, producer, Duration::from_secs(5), None).collect().await.is_err());
    }
}
