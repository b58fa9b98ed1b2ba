//! The clients of the load suite (`load.rs`): workers that loop over a weighted mix of content
//! downloads, reads, lists and writes until a deadline, checking every answer's status and
//! recording each acknowledged write; and watchers that record every event they see, checking that
//! resourceVersions only increase.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use reqwest::{Client, RequestBuilder, StatusCode};
use serde_json::{json, Value};

use crate::harness::*;
use crate::tarutil::*;

/// Namespaces the workers write in (watchers watch one of them, or all).
pub const NAMESPACES: usize = 4;
const LIST_PAGE: usize = 50;
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

pub fn namespace(index: usize) -> String {
    format!("load-{}", index % NAMESPACES)
}

/// What a request did, for the per-kind counts and latencies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    ContentTar,
    ContentFile,
    ContentRange,
    ContentNotModified,
    GetBundle,
    ListPage,
    Create,
    Update,
    Upload,
}

/// The mix: each kind with its weight out of 100 (30% writes).
const MIX: [(Kind, u64); 9] = [
    (Kind::ContentTar, 10),
    (Kind::ContentFile, 15),
    (Kind::ContentRange, 10),
    (Kind::ContentNotModified, 10),
    (Kind::GetBundle, 15),
    (Kind::ListPage, 10),
    (Kind::Create, 8),
    (Kind::Update, 12),
    (Kind::Upload, 10),
];

/// The uploaded Bundle every worker downloads.
pub struct Fixture {
    pub namespace: String,
    pub name: String,
    pub tar_len: usize,
    pub etag: String,
    pub file_path: String,
    pub file_body: Vec<u8>,
}

/// A write the server acknowledged: a watcher of its namespace must see exactly this version.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Ack {
    pub namespace: String,
    pub name: String,
    pub resource_version: u64,
}

#[derive(Default)]
pub struct WorkerReport {
    pub latencies: BTreeMap<Kind, Vec<Duration>>,
    pub errors: Vec<String>,
    pub acks: Vec<Ack>,
}

pub struct Worker {
    pub id: usize,
    pub client: Client,
    pub base_url: String,
    pub fixture: std::sync::Arc<Fixture>,
}

impl Worker {
    /// Creates the worker's own Bundle, then runs the mix until `deadline`.
    pub async fn run(self, deadline: Instant) -> WorkerReport {
        let mut report = WorkerReport::default();
        let mut state = WorkerState { rng: splitmix64(self.id as u64 + 1), turn: 0 };
        let own = format!("w{}", self.id);
        self.record(&mut report, Kind::Create, self.create(&own).await, Instant::now());
        while Instant::now() < deadline {
            state.turn += 1;
            state.rng = splitmix64(state.rng);
            let kind = pick(state.rng);
            let started = Instant::now();
            let outcome = self.request(kind, &own, state.turn).await;
            self.record(&mut report, kind, outcome, started);
        }
        report
    }

    fn record(&self, report: &mut WorkerReport, kind: Kind, outcome: Result<Option<Ack>, String>, started: Instant) {
        match outcome {
            Ok(ack) => {
                report.latencies.entry(kind).or_default().push(started.elapsed());
                report.acks.extend(ack);
            }
            Err(error) => report.errors.push(format!("worker {} {kind:?}: {error}", self.id)),
        }
    }

    fn namespace(&self) -> String {
        namespace(self.id)
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base_url)
    }

    async fn request(&self, kind: Kind, own: &str, turn: u64) -> Result<Option<Ack>, String> {
        let f = &self.fixture;
        let content = self.url(&bundle_content(&f.namespace, &f.name));
        match kind {
            Kind::ContentTar => {
                let body = expect(self.client.get(&content), StatusCode::OK).await?;
                check(body.len() == f.tar_len, || format!("tar of {} bytes, expected {}", body.len(), f.tar_len))
            }
            Kind::ContentFile => {
                let body = expect(self.client.get(with_path(&content, &f.file_path)), StatusCode::OK).await?;
                check(body == f.file_body, || "a file's bytes differ".into())
            }
            Kind::ContentRange => {
                let ranged = self.client.get(&content).header("Range", "bytes=100-1099").header("If-Range", &f.etag);
                let body = expect(ranged, StatusCode::PARTIAL_CONTENT).await?;
                check(body.len() == 1000, || format!("range of {} bytes", body.len()))
            }
            Kind::ContentNotModified => {
                let conditional = self.client.get(&content).header("If-None-Match", &f.etag);
                expect(conditional, StatusCode::NOT_MODIFIED).await.map(|_| None)
            }
            Kind::GetBundle => {
                let path = bundle(&self.namespace(), own);
                expect(self.client.get(self.url(&path)), StatusCode::OK).await.map(|_| None)
            }
            Kind::ListPage => self.list_all_pages().await,
            Kind::Create => self.create(&format!("{own}-{turn}")).await,
            Kind::Update => {
                let patch = json!({"metadata": {"labels": {"turn": turn.to_string()}}});
                let request = self
                    .client
                    .patch(self.url(&bundle(&self.namespace(), own)))
                    .header("Content-Type", "application/merge-patch+json")
                    .body(patch.to_string());
                acknowledged(&expect(request, StatusCode::OK).await?)
            }
            Kind::Upload => {
                let tree = Tree::from([
                    ("Chart.yaml".to_string(), file(format!("name: {own}\nversion: 0.{turn}.0\n"))),
                    ("templates/cm.yaml".to_string(), file(random_bytes(turn, 2048))),
                ]);
                let request = self
                    .client
                    .put(self.url(&bundle_content(&self.namespace(), own)))
                    .header("Content-Type", "application/x-tar")
                    .body(build_tar(&tree));
                acknowledged(&expect(request, StatusCode::OK).await?)
            }
        }
    }

    async fn create(&self, name: &str) -> Result<Option<Ack>, String> {
        let namespace = self.namespace();
        let request = self
            .client
            .post(self.url(&bundles(&namespace)))
            .header("Content-Type", "application/json")
            .body(upload_bundle(&namespace, name).to_string());
        acknowledged(&expect(request, StatusCode::CREATED).await?)
    }

    /// A paged list of the worker's namespace, every page at the first page's version.
    async fn list_all_pages(&self) -> Result<Option<Ack>, String> {
        let mut next = String::new();
        loop {
            let path = format!("{}?limit={LIST_PAGE}&continue={next}", bundles(&self.namespace()));
            let page = expect(self.client.get(self.url(&path)), StatusCode::OK).await?;
            let page: Value = serde_json::from_slice(&page).map_err(|e| format!("list page: {e}"))?;
            match page.pointer("/metadata/continue").and_then(Value::as_str) {
                Some(token) if !token.is_empty() => next = token.to_string(),
                _ => return Ok(None),
            }
        }
    }
}

struct WorkerState {
    rng: u64,
    turn: u64,
}

fn pick(random: u64) -> Kind {
    let total: u64 = MIX.iter().map(|(_, w)| w).sum();
    let mut roll = random % total;
    for (kind, weight) in MIX {
        if roll < weight {
            return kind;
        }
        roll -= weight;
    }
    Kind::GetBundle
}

fn check(ok: bool, problem: impl FnOnce() -> String) -> Result<Option<Ack>, String> {
    if ok {
        Ok(None)
    } else {
        Err(problem())
    }
}

/// Sends `request`; its body if the status is `status`, else what came instead.
async fn expect(request: RequestBuilder, status: StatusCode) -> Result<bytes::Bytes, String> {
    let response = request.timeout(REQUEST_TIMEOUT).send().await.map_err(|e| format!("transport: {e:?}"))?;
    let got = response.status();
    let body = response.bytes().await.map_err(|e| format!("{got}, reading the body: {e:?}"))?;
    if got != status {
        return Err(format!("expected {status}, got {got}: {}", String::from_utf8_lossy(&body[..body.len().min(300)])));
    }
    Ok(body)
}

/// The write a response to a create, update or upload acknowledges.
fn acknowledged(body: &[u8]) -> Result<Option<Ack>, String> {
    let object: Value = serde_json::from_slice(body).map_err(|e| format!("write response: {e}"))?;
    let field = |pointer: &str| object.pointer(pointer).and_then(Value::as_str).map(str::to_owned);
    let (Some(namespace), Some(name), Some(rv)) =
        (field("/metadata/namespace"), field("/metadata/name"), field("/metadata/resourceVersion"))
    else {
        return Err(format!("write response without namespace/name/resourceVersion: {object}"));
    };
    let resource_version = rv.parse().map_err(|e| format!("resourceVersion {rv:?}: {e}"))?;
    Ok(Some(Ack { namespace, name, resource_version }))
}

/// What one watcher saw.
#[derive(Default)]
pub struct WatchLog {
    pub seen: HashSet<Ack>,
    pub events: usize,
    pub errors: Vec<String>,
}

/// Follows `url` (a watch from a known resourceVersion) until `stop` flips, recording each event
/// and publishing the newest resourceVersion seen on `progress`.
pub async fn watch(
    client: Client,
    url: String,
    progress: tokio::sync::watch::Sender<u64>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> WatchLog {
    let mut log = WatchLog::default();
    let response = match client.get(&url).send().await {
        Ok(r) if r.status() == StatusCode::OK => r,
        Ok(r) => {
            log.errors.push(format!("watch {url}: {}", r.status()));
            return log;
        }
        Err(e) => {
            log.errors.push(format!("watch {url}: {e:?}"));
            return log;
        }
    };
    let mut stream = response.bytes_stream();
    let mut buffer = Vec::new();
    let mut last = 0u64;
    loop {
        let chunk = tokio::select! {
            chunk = stream.next() => chunk,
            _ = stop.changed() => return log,
        };
        let bytes = match chunk {
            Some(Ok(bytes)) => bytes,
            Some(Err(e)) => {
                log.errors.push(format!("watch {url} failed: {e:?}"));
                return log;
            }
            None => {
                log.errors.push(format!("watch {url} ended early"));
                return log;
            }
        };
        buffer.extend_from_slice(&bytes);
        while let Some(end) = buffer.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buffer.drain(..=end).collect();
            match event_ack(&line) {
                Ok(None) => {}
                Ok(Some(ack)) => {
                    if ack.resource_version <= last {
                        log.errors.push(format!("event at {} after {last}: out of order", ack.resource_version));
                    }
                    last = ack.resource_version;
                    log.events += 1;
                    log.seen.insert(ack);
                    progress.send_replace(last);
                }
                Err(e) => log.errors.push(format!("watch {url}: {e}")),
            }
        }
    }
}

/// An ADDED/MODIFIED/DELETED event as the version it shows; `None` for a bookmark.
fn event_ack(line: &[u8]) -> Result<Option<Ack>, String> {
    let event: Value = serde_json::from_slice(line).map_err(|e| format!("event is not JSON: {e}"))?;
    match event["type"].as_str() {
        Some("BOOKMARK") => Ok(None),
        Some("ADDED" | "MODIFIED" | "DELETED") => acknowledged(event["object"].to_string().as_bytes()),
        _ => Err(format!("unexpected event {event}")),
    }
}
