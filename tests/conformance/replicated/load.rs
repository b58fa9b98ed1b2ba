//! The clients of the failover and rolling-restart tests, all through the load balancer: each loops
//! over a seeded mix of uploads (small archives, now and then a multi-MB one), label updates,
//! create-then-delete, lists, reads and downloads checked against their digest, retrying only
//! requests whose connection died; every acknowledged write is recorded for the final checks.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reqwest::{Client, StatusCode};
use serde_json::{json, Value};

use super::retry::{expect, Stats};
use crate::harness::*;
use crate::tarutil::*;

/// Namespaces the clients write in; watchers follow each.
pub const NAMESPACES: usize = 4;

pub fn namespace(i: usize) -> String {
    format!("load-{}", i % NAMESPACES)
}

/// An acknowledged upload: the Bundle must keep this digest and its content read back with it.
#[derive(Clone, Debug)]
pub struct Upload {
    pub namespace: String,
    pub name: String,
    pub digest: String,
    pub content_name: String,
}

/// An acknowledged write: (name, resourceVersion, the event it makes).
pub type Write = (String, u64, &'static str);

/// Every write the server acknowledged, by namespace.
#[derive(Default)]
pub struct Acks {
    pub uploads: Mutex<Vec<Upload>>,
    pub writes: Mutex<BTreeMap<String, Vec<Write>>>,
    /// The last acknowledged `turn` label of each labelled Bundle (namespace/name).
    pub labels: Mutex<BTreeMap<String, String>>,
    /// Acknowledged deletes: namespace, name, and what the create and the delete answered.
    pub deleted: Mutex<Vec<(String, String, String)>>,
}

impl Acks {
    fn write(&self, ns: &str, name: &str, rv: u64, what: &'static str) {
        self.writes.lock().unwrap().entry(ns.to_owned()).or_default().push((name.to_owned(), rv, what));
    }
}

pub struct Worker {
    pub id: usize,
    pub client: Client,
    pub base: String,
    pub stats: Arc<Stats>,
    pub acks: Arc<Acks>,
}

fn rv_of(body: &[u8]) -> Option<(Value, u64)> {
    let v: Value = serde_json::from_slice(body).ok()?;
    let rv = v.pointer("/metadata/resourceVersion")?.as_str()?.parse().ok()?;
    Some((v, rv))
}

impl Worker {
    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Runs the mix until `deadline`.
    pub async fn run(self, seed: u64, deadline: Instant) {
        let ns = namespace(self.id);
        let mut rng = splitmix64(seed ^ (self.id as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let mut own: Vec<Upload> = Vec::new();
        let mut turn = 0u64;
        while Instant::now() < deadline {
            turn += 1;
            rng = splitmix64(rng);
            match rng % 100 {
                0..=1 => self.upload(&ns, turn, rng, true, &mut own).await,
                2..=24 => self.upload(&ns, turn, rng, false, &mut own).await,
                25..=39 if !own.is_empty() => self.label(&own[(rng >> 8) as usize % own.len()], turn).await,
                40..=44 => self.create_and_delete(&ns, turn).await,
                45..=64 => self.list(&ns).await,
                65..=89 if !own.is_empty() => self.download(&own[(rng >> 8) as usize % own.len()]).await,
                _ if !own.is_empty() => self.get(&own[(rng >> 8) as usize % own.len()]).await,
                _ => self.list(&ns).await,
            }
        }
    }

    /// Creates a Bundle, retrying a create whose answer was lost (then 409: it exists).
    async fn create(&self, ns: &str, name: &str) -> Option<u64> {
        let what = format!("create {ns}/{name}");
        let body = upload_bundle(ns, name).to_string();
        let ok = [StatusCode::CREATED, StatusCode::CONFLICT];
        let (status, resp, failed) = expect(&self.stats, "create", &what, &ok, || {
            self.client.post(self.url(&bundles(ns))).header("Content-Type", "application/json").body(body.clone())
        })
        .await?;
        if status == StatusCode::CONFLICT {
            if failed == 0 {
                self.stats.problem(format!("{what}: 409 on a first attempt"));
            }
            return None; // created by the attempt whose answer was lost: its version is unknown
        }
        let (_, rv) = rv_of(&resp)?;
        self.acks.write(ns, name, rv, "ADDED");
        Some(rv)
    }

    async fn upload(&self, ns: &str, turn: u64, rng: u64, big: bool, own: &mut Vec<Upload>) {
        let name = format!("c{}-{turn}", self.id);
        self.create(ns, &name).await;
        let mut tree = Tree::from([("Chart.yaml".to_string(), file(format!("name: {name}\nversion: 0.{turn}.0\n")))]);
        let files = 1 + rng % 3;
        for f in 0..files {
            let len = if big {
                (2 << 20) + (rng >> 20) as usize % (2 << 20)
            } else {
                1024 + (rng >> (8 * f)) as usize % 16384
            };
            tree.insert(format!("templates/f{f}.yaml"), file(random_bytes(rng.wrapping_add(f), len)));
        }
        let tar = build_tar(&tree);
        let kind = if big { "upload-big" } else { "upload" };
        let what = format!("upload {ns}/{name} ({} bytes)", tar.len());
        let Some((_, body, _)) = expect(&self.stats, kind, &what, &[StatusCode::OK], || {
            self.client
                .put(self.url(&bundle_content(ns, &name)))
                .header("Content-Type", "application/x-tar")
                .body(tar.clone())
        })
        .await
        else {
            return;
        };
        let Some((b, rv)) = rv_of(&body) else { return self.stats.problem(format!("{what}: not a Bundle")) };
        let (Some(digest), Some(content)) = (
            b.pointer("/status/digest").and_then(Value::as_str),
            b.pointer("/status/contentName").and_then(Value::as_str),
        ) else {
            return self.stats.problem(format!("{what}: acknowledged without status.digest/contentName: {b}"));
        };
        self.acks.write(ns, &name, rv, "MODIFIED");
        let upload = Upload { namespace: ns.into(), name, digest: digest.into(), content_name: content.into() };
        self.acks.uploads.lock().unwrap().push(upload.clone());
        own.push(upload);
    }

    async fn label(&self, target: &Upload, turn: u64) {
        let what = format!("label {}/{}", target.namespace, target.name);
        let patch = json!({"metadata": {"labels": {"turn": turn.to_string()}}}).to_string();
        let Some((_, body, _)) = expect(&self.stats, "update", &what, &[StatusCode::OK], || {
            self.client
                .patch(self.url(&bundle(&target.namespace, &target.name)))
                .header("Content-Type", "application/merge-patch+json")
                .body(patch.clone())
        })
        .await
        else {
            return;
        };
        if let Some((_, rv)) = rv_of(&body) {
            self.acks.write(&target.namespace, &target.name, rv, "MODIFIED");
            let key = format!("{}/{}", target.namespace, target.name);
            self.acks.labels.lock().unwrap().insert(key, turn.to_string());
        }
    }

    async fn create_and_delete(&self, ns: &str, turn: u64) {
        let name = format!("s{}-{turn}", self.id);
        let created = self.create(ns, &name).await;
        let what = format!("delete {ns}/{name}");
        let ok = [StatusCode::OK, StatusCode::ACCEPTED, StatusCode::NOT_FOUND];
        let Some((status, body, failed)) =
            expect(&self.stats, "delete", &what, &ok, || self.client.delete(self.url(&bundle(ns, &name)))).await
        else {
            return;
        };
        if status == StatusCode::NOT_FOUND && failed == 0 {
            self.stats.problem(format!("{what}: 404 right after its create"));
        }
        let deleted_at = rv_of(&body).map(|(_, rv)| rv);
        let answers = format!(
            "created at {created:?}, delete answered {status} at {deleted_at:?} after {failed} dead connections"
        );
        self.acks.deleted.lock().unwrap().push((ns.to_owned(), name, answers));
    }

    async fn list(&self, ns: &str) {
        let mut next = String::new();
        loop {
            let path = format!("{}?limit=100&continue={next}", bundles(ns));
            let what = format!("list {ns}");
            let Some((_, body, _)) =
                expect(&self.stats, "list", &what, &[StatusCode::OK], || self.client.get(self.url(&path))).await
            else {
                return;
            };
            let page: Value = serde_json::from_slice(&body).unwrap_or_default();
            match page.pointer("/metadata/continue").and_then(Value::as_str) {
                Some(token) if !token.is_empty() => next = token.to_owned(),
                _ => return,
            }
        }
    }

    async fn download(&self, u: &Upload) {
        let path = bundlecontent_content(&u.namespace, &u.content_name);
        let what = format!("download {path}");
        let Some((_, body, _)) =
            expect(&self.stats, "download", &what, &[StatusCode::OK], || self.client.get(self.url(&path))).await
        else {
            return;
        };
        if digest_of(&body) != u.digest {
            self.stats.problem(format!(
                "{what}: {} bytes with digest {}, acknowledged {}",
                body.len(),
                digest_of(&body),
                u.digest
            ));
        }
    }

    async fn get(&self, u: &Upload) {
        let path = bundle(&u.namespace, &u.name);
        let what = format!("get {path}");
        let Some((_, body, _)) =
            expect(&self.stats, "get", &what, &[StatusCode::OK], || self.client.get(self.url(&path))).await
        else {
            return;
        };
        let b: Value = serde_json::from_slice(&body).unwrap_or_default();
        if b.pointer("/status/digest").and_then(Value::as_str) != Some(u.digest.as_str()) {
            self.stats.problem(format!(
                "{what}: status.digest {:?}, acknowledged {}",
                b.pointer("/status/digest"),
                u.digest
            ));
        }
    }
}

/// Starts `clients` workers on their own connections until `deadline`.
pub fn spawn_workers(
    clients: usize,
    seed: u64,
    deadline: Instant,
    base: &str,
    make_client: impl Fn() -> Client,
    stats: &Arc<Stats>,
    acks: &Arc<Acks>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..clients)
        .map(|id| {
            let w =
                Worker { id, client: make_client(), base: base.to_owned(), stats: stats.clone(), acks: acks.clone() };
            tokio::spawn(w.run(seed, deadline))
        })
        .collect()
}

/// A count or duration from the environment, else `default`.
pub fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

pub fn secs(name: &str, default: u64) -> Duration {
    Duration::from_secs(env_or(name, default))
}
