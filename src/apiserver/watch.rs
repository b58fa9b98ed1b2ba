//! `?watch=true` on lists: the change log replayed from a resourceVersion, then followed live.
//!
//! Changes come from the store's shared [`watch_cache`](super::watch_cache): decoded once, with the
//! full-object event line rendered once, for every watcher. Each watcher is its own task that takes
//! the events after its position, filters them and sends newline-delimited watch events through a
//! small bounded channel, the lines it has at once gathered into one frame; a slow reader only slows
//! its own task. One whose position the cache no longer holds reads the change log itself, as
//! before the cache, and once the log no longer covers it either, ends with a 410 Expired `ERROR`
//! event (the client lists again).
//!
//! With selectors, an update that moves an object into the selection is sent as ADDED and one that
//! moves it out as DELETED (with its last selected state), as kube-apiserver's watch cache does.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::handlers::{next_step, StepFilter};
use super::selectors::{FieldSelector, LabelSelector};
use super::stall::{self, ConnectionCut};
use super::status::{ApiError, ApiResult};
use super::table::{self, Representation};
use super::watch_cache::{self, event_line, CachedEvent, WatchCache, Window};
use super::{blocking, AppState};
use crate::storage::{ChangeEvent, ListCursor, ListQuery, ListSink, Listed, StorageError};
use crate::strategy::ResourceDef;

/// Events taken (from the cache or the log) per step.
const BATCH: usize = 256;
/// Lines sent together in one body frame, at most (a longer line goes alone): every frame is a
/// write, a TLS record and an HTTP/2 DATA frame to each watcher, and at 1,000 watchers those writes
/// were half the server's time. A watcher that fell behind catches up in a few frames, so its
/// sends get cheaper exactly when the server is busiest. 16 KiB: one TLS record, one default DATA
/// frame; the channel holds at most `CHANNEL_FRAMES` of them.
const FRAME_BYTES: usize = 16 * 1024;
const CHANNEL_FRAMES: usize = 16;
/// How often an idle watch gets a BOOKMARK (when the client allows them).
const BOOKMARK_EVERY: Duration = Duration::from_secs(60);
/// Longest watch when the client sets no `timeoutSeconds` (kube-apiserver picks 30–60 min).
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// The longest `timeoutSeconds` taken as asked: about 30 years, tokio's own "never" for timers
/// (a longer one overflowed the deadline arithmetic and killed the watch).
const LONGEST_TIMEOUT: Duration = Duration::from_secs(30 * 365 * 86_400);

type Sender = mpsc::Sender<Result<Bytes, std::io::Error>>;

/// What one watch sends.
struct Filter {
    def: &'static ResourceDef,
    namespace: Option<String>,
    labels: LabelSelector,
    fields: FieldSelector,
    representation: Representation,
}

/// How a change shows in one watch.
enum Seen {
    /// As it is: its own type and object.
    AsIs,
    /// It moved into the selection: ADDED.
    Entered,
    /// It moved out of the selection: DELETED, with its last selected state.
    Left,
}

impl Filter {
    fn selects(&self, object: &Value) -> bool {
        self.labels.matches(object) && self.fields.matches(object)
    }

    /// Whether the selectors select every object.
    fn selects_all(&self) -> bool {
        self.labels.is_empty() && self.fields.is_empty()
    }

    fn seen(&self, change: &ChangeEvent) -> Option<Seen> {
        if change.resource != self.def.plural || self.namespace.as_deref().is_some_and(|ns| ns != change.namespace) {
            return None;
        }
        let now = self.selects(&change.object);
        if change.kind != "MODIFIED" {
            return now.then_some(Seen::AsIs);
        }
        let before = change.previous.as_ref().is_some_and(|p| self.selects(p));
        match (before, now) {
            (true, true) => Some(Seen::AsIs),
            (false, true) => Some(Seen::Entered),
            (true, false) => Some(Seen::Left),
            (false, false) => None,
        }
    }

    /// The event this watcher sees for a change, if any.
    fn event(&self, rv: u64, change: &ChangeEvent) -> Option<Bytes> {
        Some(match self.seen(change)? {
            Seen::AsIs => self.render(&change.kind, &change.object),
            Seen::Entered => self.render("ADDED", &change.object),
            Seen::Left => {
                // Left the selection: its last selected state, at the change's resourceVersion.
                let mut last = change.previous.clone().unwrap_or(Value::Null);
                if let Some(meta) = last.get_mut("metadata").and_then(Value::as_object_mut) {
                    meta.insert("resourceVersion".into(), json!(rv.to_string()));
                }
                self.render("DELETED", &last)
            }
        })
    }

    /// [`Filter::event`] for a cached change: full objects as they are share the cache's line.
    fn cached_event(&self, event: &CachedEvent) -> Option<Bytes> {
        match self.seen(&event.change)? {
            Seen::AsIs if self.representation == Representation::Object && self.def.view.is_none() => {
                Some(event.line.clone())
            }
            _ => self.event(event.rv, &event.change),
        }
    }

    fn render(&self, kind: &str, object: &Value) -> Bytes {
        match (self.representation, self.def.view) {
            (Representation::Object, Some(view)) => event_line(kind, &view(object)),
            (Representation::Object, None) => event_line(kind, object),
            (representation, _) => event_line(kind, &table::render_one(self.def, object, representation)),
        }
    }

    /// A BOOKMARK at `rv`; `initial_end` marks the end of a WatchList's initial events.
    fn bookmark(&self, rv: u64, initial_end: bool) -> Bytes {
        let metadata = match initial_end {
            true => json!({"resourceVersion": rv.to_string(), "annotations": {"k8s.io/initial-events-end": "true"}}),
            false => json!({"resourceVersion": rv.to_string()}),
        };
        let object = json!({"kind": self.def.kind, "apiVersion": self.def.api_version, "metadata": metadata});
        // Metadata watchers get every event object, bookmarks included, as PartialObjectMetadata.
        let object = match self.representation {
            Representation::Metadata => table::partial_object_metadata(&object),
            _ => object,
        };
        event_line("BOOKMARK", &object)
    }
}

/// Serves a watch for a list request.
#[allow(clippy::too_many_arguments)] // the parts of the request, as the list handler parsed them
pub async fn serve(
    app: &AppState,
    def: &'static ResourceDef,
    namespace: Option<String>,
    params: &HashMap<String, String>,
    headers: &HeaderMap,
    labels: LabelSelector,
    fields: FieldSelector,
    cut: Option<ConnectionCut>,
) -> ApiResult<Response> {
    let representation = table::negotiate(headers, params.get("includeObject").map(String::as_str));
    let filter = Arc::new(Filter { def, namespace, labels, fields, representation });
    let timeout = timeout(params.get("timeoutSeconds").map(String::as_str))?;
    let bookmarks = params.get("allowWatchBookmarks").is_some_and(|v| v == "true");
    let cache = watch_cache::shared(&app.store)
        .map_err(|e| ApiError::internal(format!("cannot start the watch cache: {e}")))?;
    let requested = params.get("resourceVersion").map(String::as_str).unwrap_or("");
    // WatchList (streaming lists): the current state as ADDED events, ended by a bookmark.
    let send_initial = params.get("sendInitialEvents").is_some_and(|v| v == "true");
    if send_initial && params.get("resourceVersionMatch").map(String::as_str) != Some("NotOlderThan") {
        return Err(ApiError::new_unprocessable(
            "sendInitialEvents=true requires resourceVersionMatch=NotOlderThan (and allowWatchBookmarks=true)",
        ));
    }
    // The initial state is a snapshot at `from`, and the follow starts right after it: nothing is
    // missed or sent twice.
    // The initial state's first step comes now (its errors are the response's); the rest is read
    // and sent step by step as the client takes it.
    let mut rest: Option<ListCursor> = None;
    let (initial, from) = match requested {
        _ if send_initial || requested.is_empty() || requested == "0" => {
            let (lines, cursor) = current_state(app, &filter).await?;
            let rv = cursor.resource_version();
            rest = Some(cursor);
            (lines, rv)
        }
        text => {
            let rv: u64 =
                text.parse().map_err(|_| ApiError::bad_request(format!("invalid resourceVersion {text:?}")))?;
            // A resourceVersion the store has not reached yet waits for the changes after it, as
            // kube-apiserver's watch cache does; only a past one can have left the log.
            let (current, covered) = blocking(app, move |store| {
                let current = store.current_resource_version()?;
                Ok((current, rv >= current || store.log_covers(rv)?))
            })
            .await?;
            if !covered {
                return Err(ApiError::gone(format!("too old resource version: {rv} ({current})")));
            }
            (Vec::new(), rv)
        }
    };
    let (tx, rx) = mpsc::channel(CHANNEL_FRAMES);
    let body = stall::watch_for_stall(&tx, rx, app.limits.stream_stall_timeout, cut);
    let app = app.clone();
    tokio::spawn(async move {
        if !send_lines(initial, &tx).await {
            return;
        }
        if let Some(cursor) = rest {
            if !send_rest(&app, &filter, cursor, &tx).await {
                return;
            }
        }
        if send_initial && tx.send(Ok(filter.bookmark(from, true))).await.is_err() {
            return;
        }
        let deadline = tokio::time::Instant::now() + timeout;
        follow(app, cache, &filter, from, tx, deadline, bookmarks).await;
    });
    let mut response = Body::from_stream(body).into_response();
    *response.status_mut() = StatusCode::OK;
    response.headers_mut().insert(header::CONTENT_TYPE, header::HeaderValue::from_static("application/json"));
    Ok(response)
}

/// `timeoutSeconds` as kube-apiserver reads it: an int64 (anything else is a 400), 0 or absent
/// for the default, a negative one ends the watch at once. Any larger one is taken, up to
/// [`LONGEST_TIMEOUT`] (kube multiplies it into a Go duration, which wraps past 292 years).
fn timeout(text: Option<&str>) -> ApiResult<Duration> {
    let Some(text) = text.filter(|t| !t.is_empty()) else { return Ok(DEFAULT_TIMEOUT) };
    let seconds: i64 = text.parse().map_err(|_| {
        ApiError::bad_request(format!("invalid timeoutSeconds {text:?}: must be a whole number of seconds"))
    })?;
    Ok(match seconds {
        0 => DEFAULT_TIMEOUT,
        s => Duration::from_secs(s.max(0).unsigned_abs()).min(LONGEST_TIMEOUT),
    })
}

/// ADDED events rendered as a list reads the objects, a step at a time: (lines, their bytes).
struct Added(Arc<Filter>, Vec<Bytes>, usize);

/// Bytes and events per step of the initial state (what a watch holds of it at a time).
const INITIAL_STEP_BYTES: usize = 1 << 20;
const INITIAL_STEP_EVENTS: usize = 500;

impl ListSink for Added {
    fn push(&mut self, mut object: Listed<'_>) -> Result<(), StorageError> {
        let line = match self.0.representation {
            // The object's JSON as stored: what `event_line` would write for it.
            Representation::Object if self.0.def.view.is_none() => {
                let mut line = br#"{"type":"ADDED","object":"#.to_vec();
                object.write_json(&mut line);
                line.extend_from_slice(b"}\n");
                Bytes::from(line)
            }
            _ => self.0.render("ADDED", object.value()?),
        };
        self.2 += line.len();
        self.1.push(line);
        Ok(())
    }
    fn restart(&mut self) {
        self.1.clear();
        self.2 = 0;
    }
    fn is_full(&self) -> bool {
        self.2 >= INITIAL_STEP_BYTES || self.1.len() >= INITIAL_STEP_EVENTS
    }
}

/// The first step of the objects the watch selects now, as ADDED events, and the cursor for the
/// rest (its resourceVersion is where the watch follows on from).
async fn current_state(app: &AppState, filter: &Arc<Filter>) -> ApiResult<(Vec<Bytes>, ListCursor)> {
    let filter = filter.clone();
    blocking(app, move |store| {
        let query = ListQuery {
            resource: filter.def.plural,
            namespace: filter.namespace.as_deref(),
            at: None,
            after: None,
            limit: None,
        };
        let mut added = Added(filter.clone(), Vec::new(), 0);
        let selects: &dyn Fn(&Value) -> bool = &|o| filter.selects(o);
        let cursor = store.list_start(&query, (!filter.selects_all()).then_some(selects), &mut added)?;
        Ok((added.1, cursor))
    })
    .await
}

/// Sends the rest of the initial state; false when the watch is over (the client went away, or
/// the change log moved past the state's version: then a 410 `ERROR` event, and the client lists
/// again).
async fn send_rest(app: &AppState, filter: &Arc<Filter>, mut cursor: ListCursor, tx: &Sender) -> bool {
    let selects = filter.clone();
    let step_filter: StepFilter =
        (!filter.selects_all()).then(|| Arc::new(move |o: &Value| selects.selects(o)) as Arc<_>);
    let mut added = Added(filter.clone(), Vec::new(), 0);
    while !cursor.is_done() {
        (cursor, added) = match next_step(app, cursor, &step_filter, added).await {
            Ok(next) => next,
            Err(e) => {
                let _ = tx.send(Ok(event_line("ERROR", &e.status_body()))).await;
                return false;
            }
        };
        if !send_lines(std::mem::take(&mut added.1), tx).await {
            return false;
        }
        added.2 = 0;
    }
    true
}

/// Sends every matching change after `from` until the deadline or the client goes away.
async fn follow(
    app: AppState,
    cache: Arc<WatchCache>,
    filter: &Filter,
    mut from: u64,
    tx: Sender,
    deadline: tokio::time::Instant,
    bookmarks: bool,
) {
    let mut ticks = cache.subscribe();
    let mut bookmark_timer = tokio::time::interval_at(tokio::time::Instant::now() + BOOKMARK_EVERY, BOOKMARK_EVERY);
    loop {
        // Everything the cache gets from now on wakes the wait below.
        ticks.borrow_and_update();
        loop {
            let sent = match cache.events_after(from, BATCH) {
                Window::Events(events) if events.is_empty() => break,
                Window::Events(events) => send_cached(&events, filter, &mut from, &tx).await,
                Window::Behind => match send_from_log(&app, filter, &mut from, &tx).await {
                    Some(true) => continue,
                    Some(false) => break, // up to the end of the log
                    None => return,
                },
            };
            if !sent {
                return;
            }
        }
        tokio::select! {
            _ = tokio::time::sleep_until(deadline) => return,
            _ = tx.closed() => return,
            _ = app.shutdown.cancelled() => return,
            _ = bookmark_timer.tick(), if bookmarks => {
                if tx.send(Ok(filter.bookmark(from, false))).await.is_err() {
                    return;
                }
            }
            changed = ticks.changed() => if changed.is_err() {
                return;
            },
        }
    }
}

/// Sends the events of `events` this watcher selects; false once the client went away.
async fn send_cached(events: &[Arc<CachedEvent>], filter: &Filter, from: &mut u64, tx: &Sender) -> bool {
    if let Some(last) = events.last() {
        *from = last.rv;
    }
    send_lines(events.iter().filter_map(|event| filter.cached_event(event)).collect(), tx).await
}

/// Sends watch lines, gathered into frames of up to [`FRAME_BYTES`]; false once the client went
/// away.
async fn send_lines(lines: Vec<Bytes>, tx: &Sender) -> bool {
    let mut frames = Frames::default();
    for line in lines {
        if let Some(frame) = frames.push(line) {
            if tx.send(Ok(frame)).await.is_err() {
                return false;
            }
        }
    }
    match frames.finish() {
        Some(frame) => tx.send(Ok(frame)).await.is_ok(),
        None => true,
    }
}

/// Lines being gathered into one frame.
#[derive(Default)]
struct Frames {
    /// The first line of the frame, kept as it is (a frame of one line is never copied).
    first: Option<Bytes>,
    /// The frame, once it has a second line.
    joined: Vec<u8>,
}

impl Frames {
    /// Adds `line`; returns the frame gathered so far if `line` does not fit in it.
    fn push(&mut self, line: Bytes) -> Option<Bytes> {
        let Some(first) = &self.first else {
            self.first = Some(line);
            return None;
        };
        let len = if self.joined.is_empty() { first.len() } else { self.joined.len() };
        if len + line.len() > FRAME_BYTES {
            let full = self.finish();
            self.first = Some(line);
            return full;
        }
        if self.joined.is_empty() {
            self.joined.reserve(FRAME_BYTES.min(len + line.len() * 8));
            self.joined.extend_from_slice(first);
        }
        self.joined.extend_from_slice(&line);
        None
    }

    /// The frame gathered, if any line was added since the last one.
    fn finish(&mut self) -> Option<Bytes> {
        let first = self.first.take()?;
        if self.joined.is_empty() {
            return Some(first);
        }
        Some(Bytes::from(std::mem::take(&mut self.joined)))
    }
}

/// One batch of changes after `from`, read from the store's log: `Some(more)` (whether more may
/// follow), `None` when the watch is over (the client went away, the log failed or moved past it).
async fn send_from_log(app: &AppState, filter: &Filter, from: &mut u64, tx: &Sender) -> Option<bool> {
    let after = *from;
    let read = blocking(app, move |store| {
        let changes = store.changes_after(after, BATCH)?;
        // Checked after the read: a trim that raced it shows here.
        Ok((changes, store.log_covers(after)?))
    })
    .await;
    let changes = match read {
        Ok((changes, true)) => changes,
        Ok((_, false)) => {
            let expired = ApiError::gone(format!("too old resource version: {after}"));
            let _ = tx.send(Ok(event_line("ERROR", &expired.status_body()))).await;
            return None;
        }
        Err(e) => {
            let _ = tx.send(Err(std::io::Error::other(e.message))).await;
            return None;
        }
    };
    let more = changes.len() >= BATCH;
    if let Some((rv, _)) = changes.last() {
        *from = *rv;
    }
    let lines = changes.iter().filter_map(|(rv, change)| filter.event(*rv, change)).collect();
    send_lines(lines, tx).await.then_some(more)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames_of(lines: &[Bytes]) -> Vec<Bytes> {
        let mut frames = Frames::default();
        let mut out: Vec<Bytes> = lines.iter().filter_map(|l| frames.push(l.clone())).collect();
        out.extend(frames.finish());
        out
    }

    #[test]
    fn lines_are_gathered_into_frames_in_order_and_a_lone_line_is_not_copied() {
        let line = |i: usize, len: usize| Bytes::from(format!("{i:0>len$}\n", len = len - 1));
        let lone = line(0, 700);
        let frames = frames_of(std::slice::from_ref(&lone));
        assert_eq!(frames.len(), 1);
        assert_eq!(frames[0].as_ptr(), lone.as_ptr(), "one line goes out as it is");

        // 100 lines of 700 bytes: five frames of at most FRAME_BYTES, the lines in order.
        let lines: Vec<Bytes> = (0..100).map(|i| line(i, 700)).collect();
        let frames = frames_of(&lines);
        assert!(
            frames.iter().all(|f| f.len() <= FRAME_BYTES),
            "{:?}",
            frames.iter().map(Bytes::len).collect::<Vec<_>>()
        );
        assert_eq!(frames.len(), (100 * 700usize).div_ceil(FRAME_BYTES / 700 * 700));
        assert_eq!(frames.concat(), lines.concat());

        // A line longer than a frame goes alone, between the frames around it.
        let long = line(7, FRAME_BYTES + 1);
        let mixed = [line(1, 100), line(2, 100), long.clone(), line(3, 100)];
        let frames = frames_of(&mixed);
        assert_eq!(frames.iter().map(Bytes::len).collect::<Vec<_>>(), [200, FRAME_BYTES + 1, 100]);
        assert_eq!(frames[1].as_ptr(), long.as_ptr());
        assert_eq!(frames.concat(), mixed.concat());
        assert!(frames_of(&[]).is_empty());
    }
}
