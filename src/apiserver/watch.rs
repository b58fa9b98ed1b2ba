//! `?watch=true` on lists: the change log replayed from a resourceVersion, then followed live.
//!
//! Each watcher is its own task that reads the change log (never holding a lock writers need) and
//! sends newline-delimited watch events through a small bounded channel; a slow reader only slows
//! its own task. Store notifications only say "something changed"; the log is the source of truth,
//! so a watcher that lagged behind the notifications reads the log and misses nothing.
//!
//! With selectors, an update that moves an object into the selection is sent as ADDED and one that
//! moves it out as DELETED (with its last selected state), as kube-apiserver's watch cache does.

use std::collections::HashMap;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use tokio::sync::{broadcast, mpsc};

use super::resources::ResourceDef;
use super::selectors::{FieldSelector, LabelSelector};
use super::status::{ApiError, ApiResult};
use super::table::{self, Representation};
use super::{blocking, AppState, ChannelStream, API_VERSION};
use crate::storage::ChangeEvent;

/// Log entries read per step.
const BATCH: usize = 256;
/// How often an idle watch gets a BOOKMARK (when the client allows them).
const BOOKMARK_EVERY: Duration = Duration::from_secs(60);
/// Longest watch when the client sets no `timeoutSeconds` (kube-apiserver picks 30–60 min).
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// What one watch sends.
struct Filter {
    def: &'static ResourceDef,
    namespace: Option<String>,
    labels: LabelSelector,
    fields: FieldSelector,
    representation: Representation,
}

impl Filter {
    fn selects(&self, object: &Value) -> bool {
        self.labels.matches(object) && self.fields.matches(object)
    }

    /// The event this watcher sees for a change, if any.
    fn event(&self, rv: u64, change: &ChangeEvent) -> Option<Bytes> {
        if change.resource != self.def.plural || self.namespace.as_deref().is_some_and(|ns| ns != change.namespace) {
            return None;
        }
        let now = self.selects(&change.object);
        if change.kind != "MODIFIED" {
            return now.then(|| self.render(&change.kind, &change.object));
        }
        let before = change.previous.as_ref().is_some_and(|p| self.selects(p));
        match (before, now) {
            (true, true) => Some(self.render("MODIFIED", &change.object)),
            (false, true) => Some(self.render("ADDED", &change.object)),
            (true, false) => {
                // Left the selection: its last selected state, at the change's resourceVersion.
                let mut last = change.previous.clone().unwrap_or(Value::Null);
                if let Some(meta) = last.get_mut("metadata").and_then(Value::as_object_mut) {
                    meta.insert("resourceVersion".into(), json!(rv.to_string()));
                }
                Some(self.render("DELETED", &last))
            }
            (false, false) => None,
        }
    }

    fn render(&self, kind: &str, object: &Value) -> Bytes {
        let object = table::render_one(self.def, object, self.representation);
        let mut line = json!({"type": kind, "object": object}).to_string();
        line.push('\n');
        Bytes::from(line)
    }

    fn bookmark(&self, rv: u64) -> Bytes {
        self.bookmark_with(rv, json!({}))
    }

    fn bookmark_with(&self, rv: u64, annotations: Value) -> Bytes {
        let mut metadata = json!({"resourceVersion": rv.to_string()});
        if annotations.as_object().is_some_and(|a| !a.is_empty()) {
            metadata["annotations"] = annotations;
        }
        let object = json!({"kind": self.def.kind, "apiVersion": API_VERSION, "metadata": metadata});
        // Metadata watchers get every event object, bookmarks included, as PartialObjectMetadata.
        let object = match self.representation {
            Representation::Metadata => table::partial_object_metadata(&object),
            _ => object,
        };
        let mut line = json!({"type": "BOOKMARK", "object": object}).to_string();
        line.push('\n');
        Bytes::from(line)
    }
}

/// Serves a watch for a list request.
pub async fn serve(
    app: &AppState,
    def: &'static ResourceDef,
    namespace: Option<String>,
    params: &HashMap<String, String>,
    headers: &HeaderMap,
    labels: LabelSelector,
    fields: FieldSelector,
) -> ApiResult<Response> {
    let representation = table::negotiate(headers, params.get("includeObject").map(String::as_str));
    let filter = Filter { def, namespace, labels, fields, representation };
    let timeout = params
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .map(Duration::from_secs)
        .unwrap_or(DEFAULT_TIMEOUT);
    let bookmarks = params.get("allowWatchBookmarks").is_some_and(|v| v == "true");
    // Subscribe before reading anything, so no change falls between the read and the follow.
    let notifications = app.store.subscribe();
    let requested = params.get("resourceVersion").map(String::as_str).unwrap_or("");
    // WatchList (streaming lists): the current state as ADDED events, ended by a bookmark.
    let send_initial = params.get("sendInitialEvents").is_some_and(|v| v == "true");
    if send_initial && params.get("resourceVersionMatch").map(String::as_str) != Some("NotOlderThan") {
        return Err(ApiError::new_unprocessable(
            "sendInitialEvents=true requires resourceVersionMatch=NotOlderThan (and allowWatchBookmarks=true)",
        ));
    }
    let (initial, from) = match requested {
        _ if send_initial => {
            let (mut lines, rv) = current_state(app, &filter).await?;
            lines.push(filter.bookmark_with(rv, json!({"k8s.io/initial-events-end": "true"})));
            (lines, rv)
        }
        "" | "0" => current_state(app, &filter).await?,
        text => {
            let rv: u64 =
                text.parse().map_err(|_| ApiError::bad_request(format!("invalid resourceVersion {text:?}")))?;
            if !blocking(app, move |store| store.log_covers(rv)).await? {
                let current = blocking(app, |store| store.current_resource_version()).await?;
                return Err(ApiError::gone(format!("too old resource version: {rv} ({current})")));
            }
            (Vec::new(), rv)
        }
    };
    let (tx, rx) = mpsc::channel(16);
    let app = app.clone();
    tokio::spawn(async move {
        for line in initial {
            if tx.send(Ok(line)).await.is_err() {
                return;
            }
        }
        follow(app, filter, from, notifications, tx, timeout, bookmarks).await;
    });
    let mut response = Body::from_stream(ChannelStream(rx)).into_response();
    *response.status_mut() = StatusCode::OK;
    response.headers_mut().insert(header::CONTENT_TYPE, header::HeaderValue::from_static("application/json"));
    Ok(response)
}

/// The objects the watch selects now, as ADDED events, and the resourceVersion they are at.
async fn current_state(app: &AppState, filter: &Filter) -> ApiResult<(Vec<Bytes>, u64)> {
    let plural = filter.def.plural;
    let ns = filter.namespace.clone();
    let (objects, rv) = blocking(app, move |store| store.list_objects(plural, ns.as_deref())).await?;
    let added =
        objects.iter().map(|o| &o.value).filter(|o| filter.selects(o)).map(|o| filter.render("ADDED", o)).collect();
    Ok((added, rv))
}

/// Sends every matching change after `from` until the timeout or the client goes away.
async fn follow(
    app: AppState,
    filter: Filter,
    mut from: u64,
    mut notifications: broadcast::Receiver<u64>,
    tx: mpsc::Sender<Result<Bytes, std::io::Error>>,
    timeout: Duration,
    bookmarks: bool,
) {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut bookmark_timer = tokio::time::interval_at(tokio::time::Instant::now() + BOOKMARK_EVERY, BOOKMARK_EVERY);
    loop {
        // Drain the log from `from`.
        loop {
            let after = from;
            let changes = match blocking(&app, move |store| store.changes_after(after, BATCH)).await {
                Ok(changes) => changes,
                Err(e) => {
                    let _ = tx.send(Err(std::io::Error::other(e.to_string()))).await;
                    return;
                }
            };
            let done = changes.len() < BATCH;
            for (rv, change) in changes {
                from = rv;
                if let Some(line) = filter.event(rv, &change) {
                    if tx.send(Ok(line)).await.is_err() {
                        return;
                    }
                }
            }
            if done {
                break;
            }
        }
        tokio::select! {
            _ = tokio::time::sleep_until(deadline) => return,
            _ = tx.closed() => return,
            _ = app.shutdown.cancelled() => return,
            _ = bookmark_timer.tick(), if bookmarks => {
                if tx.send(Ok(filter.bookmark(from))).await.is_err() {
                    return;
                }
            }
            received = notifications.recv() => match received {
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => return,
            },
        }
    }
}
