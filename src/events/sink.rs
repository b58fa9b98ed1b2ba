//! Where Events are written: the cluster's API server, or the store (standalone), where they are
//! kept at most [`EventLimits::ttl`] after they were last observed and at most
//! [`EventLimits::max_events`] of them (the oldest go first).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use crate::api::event::EVENTS_API_VERSION;
use crate::storage::{ObjectKey, ObjectWrite, Precondition, Store};

/// How often stored Events past their age or count are deleted (more often for a short TTL).
const SWEEP_EVERY: Duration = Duration::from_secs(60);
/// The resource stored Events are kept under.
pub const EVENTS: &str = "events";

/// How many stored Events are kept, and how long.
#[derive(Clone, Copy, Debug)]
pub struct EventLimits {
    pub max_events: usize,
    pub ttl: Duration,
}

#[derive(Clone)]
pub enum EventSink {
    /// `events.k8s.io/v1` on the cluster's API server.
    Cluster(kube::Client),
    /// Objects in the store, served by stowage's own API.
    Store { store: Store, limits: EventLimits, stored: Arc<AtomicUsize> },
}

impl EventSink {
    pub fn store(store: Store, limits: EventLimits) -> EventSink {
        EventSink::Store { store, limits, stored: Arc::new(AtomicUsize::new(0)) }
    }

    /// How often [`Self::sweep`] runs: every minute, or every half TTL when that is shorter.
    pub(super) fn sweep_every(&self) -> Duration {
        match self {
            EventSink::Store { limits, .. } => (limits.ttl / 2).clamp(Duration::from_secs(1), SWEEP_EVERY),
            EventSink::Cluster(_) => SWEEP_EVERY,
        }
    }

    /// Writes a new Event.
    pub(super) async fn create(&self, namespace: &str, event: Value) -> Result<(), String> {
        match self {
            EventSink::Cluster(client) => {
                let path = format!("/apis/{EVENTS_API_VERSION}/namespaces/{namespace}/events");
                send(client, http::Method::POST, &path, "application/json", &event).await
            }
            EventSink::Store { store, limits, stored } => {
                let name = event.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("").to_owned();
                let mut event = event;
                if let Some(metadata) = event.get_mut("metadata").and_then(Value::as_object_mut) {
                    crate::strategy::stamp_new(metadata);
                    metadata.remove("generation");
                }
                let write = ObjectWrite::Put {
                    key: ObjectKey::new(EVENTS, namespace, &name),
                    object: event,
                    precondition: Precondition::MustNotExist,
                    revision: None,
                };
                blocking(store, move |store| store.write_objects(vec![write]).map(|_| ())).await?;
                // Past the bound: sweep now rather than at the next minute.
                if stored.fetch_add(1, Ordering::Relaxed) + 1 > limits.max_events {
                    self.sweep().await;
                }
                Ok(())
            }
        }
    }

    /// Writes the next state of an Event's series (created again if it is gone).
    pub(super) async fn update(&self, namespace: &str, name: &str, event: Value) -> Result<(), String> {
        match self {
            EventSink::Cluster(client) => {
                let path = format!("/apis/{EVENTS_API_VERSION}/namespaces/{namespace}/events/{name}");
                // Only the series: kube-apiserver refuses changes to the rest of an Event.
                let patch = json!({"series": event.get("series")});
                match send(client, http::Method::PATCH, &path, "application/merge-patch+json", &patch).await {
                    Err(e) if e.starts_with("404") => self.create(namespace, event).await,
                    other => other,
                }
            }
            EventSink::Store { store, .. } => {
                let key = ObjectKey::new(EVENTS, namespace, name);
                let lookup = key.clone();
                let current = blocking(store, move |store| store.get_object(&lookup)).await?;
                let Some(current) = current else { return self.create(namespace, event).await };
                let mut updated = event;
                if let (Some(map), Some(metadata)) = (updated.as_object_mut(), current.value.get("metadata")) {
                    map.insert("metadata".into(), metadata.clone());
                }
                let write = ObjectWrite::Put {
                    key,
                    object: updated,
                    precondition: Precondition::ResourceVersion(current.resource_version),
                    revision: None,
                };
                blocking(store, move |store| store.write_objects(vec![write]).map(|_| ())).await
            }
        }
    }

    /// Deletes stored Events past their age, then the oldest past the count.
    pub(super) async fn sweep(&self) {
        let EventSink::Store { store, limits, stored } = self else { return };
        let limits = *limits;
        let swept = blocking(store, move |store| {
            let (events, _) = store.list_objects(EVENTS, None)?;
            let cutoff = chrono::Utc::now() - chrono::Duration::from_std(limits.ttl).unwrap_or(chrono::Duration::MAX);
            let mut dated: Vec<(chrono::DateTime<chrono::Utc>, ObjectKey, u64)> = events
                .iter()
                .map(|e| {
                    let namespace = e.value.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or("");
                    let name = e.value.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("");
                    (last_observed(&e.value), ObjectKey::new(EVENTS, namespace, name), e.resource_version)
                })
                .collect();
            dated.sort_by_key(|(at, _, _)| std::cmp::Reverse(*at));
            let total = dated.len();
            let deletes: Vec<ObjectWrite> = dated
                .into_iter()
                .enumerate()
                .filter(|(i, (at, _, _))| *i >= limits.max_events || *at < cutoff)
                .map(|(_, (_, key, rv))| ObjectWrite::Delete { key, precondition: Precondition::ResourceVersion(rv) })
                .collect();
            let kept = total - deletes.len();
            for batch in deletes.chunks(store.writes_at_once()) {
                match store.write_objects(batch.to_vec()) {
                    // Another replica swept (or a series moved) meanwhile: the next sweep sees it.
                    Err(crate::storage::StorageError::Conflict(_)) => {}
                    other => {
                        other?;
                    }
                }
            }
            Ok(kept)
        })
        .await;
        match swept {
            Ok(kept) => stored.store(kept, Ordering::Relaxed),
            Err(error) => tracing::warn!(%error, "sweeping old events failed"),
        }
    }
}

/// When an Event was last observed: its series' last time, else its time.
fn last_observed(event: &Value) -> chrono::DateTime<chrono::Utc> {
    let text = event
        .pointer("/series/lastObservedTime")
        .or_else(|| event.get("eventTime"))
        .and_then(Value::as_str)
        .unwrap_or("");
    chrono::DateTime::parse_from_rfc3339(text).map(|t| t.with_timezone(&chrono::Utc)).unwrap_or_default()
}

async fn blocking<T: Send + 'static>(
    store: &Store,
    work: impl FnOnce(&Store) -> Result<T, crate::storage::StorageError> + Send + 'static,
) -> Result<T, String> {
    let store = store.clone();
    match tokio::task::spawn_blocking(move || work(&store)).await {
        Ok(result) => result.map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    }
}

/// One request to the cluster's API server; `Err` starts with the status code when it answered.
async fn send(
    client: &kube::Client,
    method: http::Method,
    path: &str,
    content_type: &str,
    body: &Value,
) -> Result<(), String> {
    let bytes = serde_json::to_vec(body).map_err(|e| e.to_string())?;
    let request = http::Request::builder()
        .method(method)
        .uri(path)
        .header(http::header::CONTENT_TYPE, content_type)
        .header(http::header::ACCEPT, "application/json")
        .body(bytes)
        .map_err(|e| e.to_string())?;
    match client.request_text(request).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) => Err(format!("{} {}", status.code, status.message)),
        Err(other) => Err(other.to_string()),
    }
}
