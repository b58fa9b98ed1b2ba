//! The operations the fault suite runs concurrently before a kill -9 (single-PUT and chunked
//! uploads, Bundles with `http` sources, Bundle deletes), each reporting only what the server
//! acknowledged: a 2xx with its complete body. Everything else may or may not have happened.

use std::time::Duration;

use reqwest::Client;
use serde_json::{json, Value};

use crate::harness::*;

pub const NS: &str = "faults";
/// Above the uploads any Bundle gets in the suite: acknowledged revisions are never pruned.
pub const HISTORY_LIMIT: u64 = 10;
/// A request cut by the kill errors at once; this only bounds a hung one.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// One operation of a cycle.
#[derive(Clone, Debug)]
pub enum Op {
    /// Creates the Bundle first when `create`.
    Put {
        bundle: String,
        create: bool,
        tar: Vec<u8>,
    },
    Chunked {
        bundle: String,
        create: bool,
        tar: Vec<u8>,
        pieces: usize,
    },
    /// A Bundle pulling the nginx file `file` (pinned by its sha256).
    Http {
        bundle: String,
        url: String,
        sha256: String,
    },
    Delete {
        bundle: String,
    },
}

/// What the server acknowledged.
#[derive(Debug)]
pub enum Ack {
    /// A Bundle was created (201).
    Created(String),
    /// An upload landed: the Bundle as returned.
    Uploaded(Value),
    Deleted(String),
}

/// A client and the server's URL, detached from the `Server` so tasks outlive its restarts.
#[derive(Clone)]
pub struct Conn {
    pub client: Client,
    pub url: String,
}

impl Conn {
    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.url)
    }

    /// Sends a request; `Some(body)` only for a 2xx whose whole body arrived.
    async fn send(&self, request: reqwest::RequestBuilder) -> Option<(u16, Vec<u8>)> {
        let resp = request.timeout(REQUEST_TIMEOUT).send().await.ok()?;
        let code = resp.status().as_u16();
        let body = resp.bytes().await.ok()?;
        (200..300).contains(&code).then(|| (code, body.to_vec()))
    }

    async fn create(&self, object: Value) -> Option<String> {
        let name = str_at(&object, "/metadata/name").to_owned();
        let request = self.client.post(self.url(&bundles(NS))).header("Content-Type", "application/json");
        self.send(request.body(object.to_string())).await.map(|_| name)
    }
}

pub fn upload_bundle_object(name: &str) -> Value {
    json!({"apiVersion": API_VERSION, "kind": "Bundle", "metadata": {"name": name, "namespace": NS},
        "spec": {"sources": [{"upload": {}}], "revisionHistoryLimit": HISTORY_LIMIT}})
}

pub fn http_bundle_object(name: &str, url: &str, sha256: &str) -> Value {
    json!({"apiVersion": API_VERSION, "kind": "Bundle", "metadata": {"name": name, "namespace": NS},
        "spec": {"sources": [{"http": {"url": url, "sha256": sha256}}], "revisionHistoryLimit": HISTORY_LIMIT}})
}

/// Runs one operation; returns every acknowledgement it got, in order.
pub async fn run(conn: Conn, op: Op) -> Vec<Ack> {
    let mut acks = Vec::new();
    match op {
        Op::Put { bundle, create, tar } => {
            if create {
                match conn.create(upload_bundle_object(&bundle)).await {
                    Some(name) => acks.push(Ack::Created(name)),
                    None => return acks,
                }
            }
            let request =
                conn.client.put(conn.url(&bundle_content(NS, &bundle))).header("Content-Type", "application/x-tar");
            if let Some((_, body)) = conn.send(request.body(tar)).await {
                acks.push(Ack::Uploaded(parse_json(&body, "upload response")));
            }
        }
        Op::Chunked { bundle, create, tar, pieces } => {
            if create {
                match conn.create(upload_bundle_object(&bundle)).await {
                    Some(name) => acks.push(Ack::Created(name)),
                    None => return acks,
                }
            }
            if let Some(bundle) = chunked_upload(&conn, &bundle, &tar, pieces).await {
                acks.push(Ack::Uploaded(bundle));
            }
        }
        Op::Http { bundle, url, sha256 } => {
            if let Some(name) = conn.create(http_bundle_object(&bundle, &url, &sha256)).await {
                acks.push(Ack::Created(name));
            }
        }
        Op::Delete { bundle } => {
            if conn.send(conn.client.delete(conn.url(&crate::harness::bundle(NS, &bundle)))).await.is_some() {
                acks.push(Ack::Deleted(bundle));
            }
        }
    }
    acks
}

/// Start a session, PATCH `pieces` pieces, commit with the digest: the Bundle on success.
async fn chunked_upload(conn: &Conn, bundle: &str, tar: &[u8], pieces: usize) -> Option<Value> {
    let content = bundle_content(NS, bundle);
    let (_, body) = conn.send(conn.client.post(conn.url(&format!("{content}?uploads")))).await?;
    let id = str_at(&parse_json(&body, "upload session"), "/uploadID").to_owned();
    let session = conn.url(&format!("{content}?upload={id}"));
    let step = tar.len().div_ceil(pieces.max(1));
    for start in (0..tar.len()).step_by(step) {
        let end = (start + step).min(tar.len());
        let range = format!("bytes {start}-{}/*", end - 1);
        let piece = conn.client.patch(&session).header("Content-Range", range).body(tar[start..end].to_vec());
        conn.send(piece).await?;
    }
    let (_, body) = conn.send(conn.client.put(format!("{session}&digest={}", digest_of(tar)))).await?;
    Some(parse_json(&body, "chunked commit"))
}
