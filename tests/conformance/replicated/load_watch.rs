//! Watchers of the load tests: each follows one namespace through the load balancer and, when its
//! connection dies or the stream ends, resumes from the last resourceVersion it saw — as informers
//! do. A 410 on resume, an event out of order or an error event is a problem; every event is kept
//! for the final comparison with a list.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use reqwest::{Client, StatusCode};
use serde_json::Value;
use tokio::sync::watch;

use super::retry::{dead_connection, Stats};
use crate::harness::*;

const BACKOFF: Duration = Duration::from_millis(250);

/// What one watcher saw.
#[derive(Debug, Default)]
pub struct WatchRecord {
    pub namespace: String,
    /// The version it started from (a list's).
    pub start: u64,
    /// (type, name, resourceVersion) of every ADDED/MODIFIED/DELETED event, in arrival order.
    pub events: Vec<(String, String, u64)>,
    /// Times it resumed after its stream ended or its connection died.
    pub resumes: u64,
}

pub struct Watcher {
    pub namespace: String,
    pub client: Client,
    pub base: String,
    pub stats: Arc<Stats>,
}

impl Watcher {
    /// Follows the namespace from `start` until `stop` flips; publishes the newest version seen.
    pub async fn run(self, start: u64, progress: watch::Sender<u64>, mut stop: watch::Receiver<bool>) -> WatchRecord {
        let mut record = WatchRecord { namespace: self.namespace.clone(), start, ..Default::default() };
        let mut last = start;
        let mut opened = false;
        while !*stop.borrow() {
            let url = format!(
                "{}{}?watch=true&resourceVersion={last}&allowWatchBookmarks=true",
                self.base,
                bundles(&self.namespace)
            );
            if opened {
                record.resumes += 1;
            }
            opened = true;
            self.stats.request("watch");
            let resp = tokio::select! {
                r = self.client.get(&url).send() => r,
                _ = stop.changed() => break,
            };
            let resp = match resp {
                Ok(r) if r.status() == StatusCode::OK => r,
                Ok(r) => {
                    let status = r.status();
                    let text = r.text().await.unwrap_or_default();
                    self.stats.problem(format!("watch {} from {last}: HTTP {status}: {text}", self.namespace));
                    if status == StatusCode::GONE {
                        return record; // its events can no longer be complete
                    }
                    tokio::time::sleep(BACKOFF).await;
                    continue;
                }
                Err(e) => {
                    self.interrupted(&e);
                    tokio::time::sleep(BACKOFF).await;
                    continue;
                }
            };
            let opened_at = last;
            let mut stream = resp.bytes_stream();
            let mut buffer = Vec::new();
            loop {
                let chunk = tokio::select! {
                    c = stream.next() => c,
                    _ = stop.changed() => return record,
                };
                match chunk {
                    Some(Ok(bytes)) => buffer.extend_from_slice(&bytes),
                    Some(Err(e)) => {
                        self.interrupted(&e);
                        break;
                    }
                    None => break, // ended by the server: resume
                }
                while let Some(end) = buffer.iter().position(|b| *b == b'\n') {
                    let line: Vec<u8> = buffer.drain(..=end).collect();
                    if let Err(problem) = self.event(&line, &mut last, &mut record) {
                        self.stats.problem(format!("watch {} (opened from {opened_at}): {problem}", self.namespace));
                    }
                    progress.send_replace(last);
                }
            }
        }
        record
    }

    fn interrupted(&self, e: &reqwest::Error) {
        match dead_connection(e) {
            Ok(cause) => self.stats.count_failure(format!("watch/{cause}")),
            Err(other) => self.stats.problem(format!("watch {}: {other}", self.namespace)),
        }
    }

    fn event(&self, line: &[u8], last: &mut u64, record: &mut WatchRecord) -> Result<(), String> {
        let event: Value = serde_json::from_slice(line).map_err(|e| format!("event is not JSON ({e})"))?;
        let kind = event["type"].as_str().unwrap_or_default().to_owned();
        if kind == "ERROR" {
            return Err(format!("error event {event}"));
        }
        let rv: u64 = event
            .pointer("/object/metadata/resourceVersion")
            .and_then(Value::as_str)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("event without a resourceVersion: {event}"))?;
        if kind == "BOOKMARK" {
            *last = (*last).max(rv);
            return Ok(());
        }
        let name = event.pointer("/object/metadata/name").and_then(Value::as_str).unwrap_or_default().to_owned();
        if rv <= *last {
            return Err(format!("{kind} {name} at {rv}, not after {last}"));
        }
        *last = rv;
        record.events.push((kind, name, rv));
        Ok(())
    }
}
