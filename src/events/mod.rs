//! Kubernetes Events about stowage's own objects (`events.k8s.io/v1`, `reportingController:
//! stowage`), as kube's controllers write them: the unpacker and the upload handlers call
//! [`EventRecorder::normal`]/[`warning`](EventRecorder::warning), which never blocks nor fails the
//! caller — Events go through a bounded queue to one task (a full queue drops the Event and says
//! so in the log). The task aggregates as client-go's events library does: an Event isomorphic to
//! one written in the last [`SERIES_WINDOW`] (same object, type, reason and action) updates that
//! Event's `series` (count, last observed time, latest note) instead of writing another, so a
//! failing poll is one Event with a count.
//!
//! Where they go ([`EventSink`]): in a cluster, to the cluster's API server (created with POST,
//! series updates with a merge PATCH), so `kubectl describe bundle` and `kubectl get events` show
//! them; standalone, into the store as objects of resource `events`, which the API serves as
//! `events.k8s.io/v1` and as core `v1` (`api::event::core_view`), bounded by count and age (swept
//! every minute and as they are written) and surviving restarts like every object.

mod sink;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

pub use crate::api::event::{EventType, Regarding};
pub use sink::{EventLimits, EventSink};

/// How long an isomorphic Event extends the earlier one's series (client-go's events library: 6
/// minutes).
pub const SERIES_WINDOW: Duration = Duration::from_secs(6 * 60);
/// Events waiting to be written; past this they are dropped (the caller never waits).
const QUEUE: usize = 1024;
/// Series remembered at once (each at most [`SERIES_WINDOW`]).
const MAX_SERIES: usize = 4096;

/// One thing that happened, before aggregation.
#[derive(Debug)]
struct Emitted {
    regarding: Regarding,
    kind: EventType,
    reason: String,
    action: String,
    note: String,
}

/// Where callers hand Events to; cheap to clone. [`EventRecorder::disabled`] drops them.
#[derive(Clone, Debug)]
pub struct EventRecorder {
    queue: Option<mpsc::Sender<Emitted>>,
}

impl EventRecorder {
    /// A recorder that records nothing (tools and tests that build the parts alone).
    pub fn disabled() -> EventRecorder {
        EventRecorder { queue: None }
    }

    /// Starts the task that writes to `sink` as `instance` (`reportingInstance`); it ends with
    /// `shutdown`.
    pub fn spawn(sink: EventSink, instance: String, shutdown: CancellationToken) -> EventRecorder {
        let (tx, rx) = mpsc::channel(QUEUE);
        tokio::spawn(run(sink, instance, rx, shutdown));
        EventRecorder { queue: Some(tx) }
    }

    pub fn normal(&self, regarding: &Regarding, reason: &str, action: &str, note: &str) {
        self.record(regarding, EventType::Normal, reason, action, note);
    }

    pub fn warning(&self, regarding: &Regarding, reason: &str, action: &str, note: &str) {
        self.record(regarding, EventType::Warning, reason, action, note);
    }

    fn record(&self, regarding: &Regarding, kind: EventType, reason: &str, action: &str, note: &str) {
        let Some(queue) = &self.queue else { return };
        let emitted = Emitted {
            regarding: regarding.clone(),
            kind,
            reason: reason.to_owned(),
            action: action.to_owned(),
            note: note.to_owned(),
        };
        if queue.try_send(emitted).is_err() {
            tracing::warn!(reason, object = %regarding.name, "event queue full or closed; event dropped");
        }
    }
}

/// The Event a series is recorded in.
struct Series {
    name: String,
    first: String,
    /// The first occurrence's note: kube-apiserver keeps an Event's note immutable, so a series
    /// says how often and when, not what each occurrence said.
    note: String,
    count: u64,
    seen: Instant,
}

/// What makes two Events isomorphic (client-go's key, less the note, which carries times).
type SeriesKey = (String, String, String, EventType, String, String);

fn key_of(emitted: &Emitted) -> SeriesKey {
    let r = &emitted.regarding;
    (r.namespace.clone(), r.name.clone(), r.uid.clone(), emitted.kind, emitted.reason.clone(), emitted.action.clone())
}

async fn run(sink: EventSink, instance: String, mut rx: mpsc::Receiver<Emitted>, shutdown: CancellationToken) {
    let mut series: HashMap<SeriesKey, Series> = HashMap::new();
    let mut sweep = tokio::time::interval(sink.sweep_every());
    loop {
        let emitted = tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = sweep.tick() => {
                sink.sweep().await;
                series.retain(|_, s| s.seen.elapsed() < SERIES_WINDOW);
                continue;
            }
            emitted = rx.recv() => match emitted { Some(e) => e, None => return },
        };
        let now = micro_time();
        let key = key_of(&emitted);
        // The series this occurrence extends, else a new Event.
        let (name, first, note, count) = match series.get_mut(&key).filter(|s| s.seen.elapsed() < SERIES_WINDOW) {
            Some(known) => {
                known.count += 1;
                known.seen = Instant::now();
                (known.name.clone(), known.first.clone(), known.note.clone(), known.count)
            }
            None => {
                let nanos = chrono::Utc::now().timestamp_nanos_opt().unwrap_or(0);
                (format!("{}.{nanos:x}", emitted.regarding.name), now.clone(), emitted.note.clone(), 1)
            }
        };
        let event = crate::api::event::event_object(
            &name,
            &emitted.regarding,
            emitted.kind,
            &emitted.reason,
            &emitted.action,
            &note,
            &instance,
            &first,
            (count > 1).then_some((count, now.as_str())),
        );
        let namespace = &emitted.regarding.namespace;
        let written = match count {
            1 => sink.create(namespace, event).await,
            _ => sink.update(namespace, &name, event).await,
        };
        if count == 1 && written.is_ok() {
            if series.len() >= MAX_SERIES {
                series.retain(|_, s| s.seen.elapsed() < SERIES_WINDOW);
            }
            if series.len() < MAX_SERIES {
                series.insert(key, Series { name, first, note, count, seen: Instant::now() });
            }
        }
        if let Err(error) = written {
            tracing::warn!(%error, reason = %emitted.reason, object = %emitted.regarding.name, "writing an event failed");
        }
    }
}

/// `metav1.MicroTime` now.
fn micro_time() -> String {
    chrono::Utc::now().format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
}
