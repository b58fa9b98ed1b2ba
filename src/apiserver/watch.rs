//! `?watch=true` on lists: the change log replayed from a resourceVersion, then followed live.
//!
//! Each watcher is its own task that reads the change log (never holding a lock writers need) and
//! sends newline-delimited watch events through a small bounded channel; a slow reader only slows
//! its own task. Store notifications only say "something changed"; the log is the source of truth,
//! so a watcher that lagged behind the notifications reads the log and misses nothing.
//!
//! Not yet: ADDED/DELETED synthesis when an update moves an object into or out of a label
//! selector (such updates are delivered as MODIFIED only if the new state matches).

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
    fn matches(&self, event: &ChangeEvent) -> bool {
        event.resource == self.def.plural
            && self.namespace.as_deref().is_none_or(|ns| ns == event.namespace)
            && self.labels.matches(&event.object)
            && self.fields.matches(&event.object)
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
            let oldest = blocking(app, |store| store.oldest_change()).await?;
            let current = blocking(app, |store| store.current_resource_version()).await?;
            if oldest.is_some_and(|oldest| rv + 1 < oldest) || (oldest.is_none() && rv < current) {
                return Err(ApiError::gone(format!("too old resource version: {rv} ({})", oldest.unwrap_or(current))));
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
    let added = objects
        .iter()
        .map(|o| &o.value)
        .filter(|o| filter.labels.matches(o) && filter.fields.matches(o))
        .map(|o| filter.render("ADDED", o))
        .collect();
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
            for (rv, event) in changes {
                from = rv;
                if filter.matches(&event) && tx.send(Ok(filter.render(&event.kind, &event.object))).await.is_err() {
                    return;
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
