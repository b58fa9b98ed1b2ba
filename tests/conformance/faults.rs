//! The fault suite: kill -9 at seeded random moments while uploads (single PUT and chunked),
//! unpacks of `http` sources and Bundle deletes run concurrently, cycle after cycle on one data
//! directory. After every restart: the store opens and is ready, every acknowledged revision is
//! listed and downloads with its digest, every visible BundleContent verifies (nothing
//! half-written), interrupted unpacks finish, acknowledged creations exist and acknowledged
//! deletes stay deleted. At the end, deleting everything returns the store to empty (no leaked
//! chunks, revisions, pack bytes or spooled uploads).
//!
//! Replay a failure with the seed and cycle count it prints:
//! `STOWAGE_FAULT_SEED=… STOWAGE_FAULT_CYCLES=… cargo test --test conformance faults::`

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::fault_ops::{self, Ack, Conn, Op, NS};
use crate::harness::*;
use crate::http_server::{HttpAuth, HttpServer};
use crate::store_check::*;
use crate::tarutil::*;

const DEFAULT_SEED: u64 = 0x5EED_0007;
const DEFAULT_CYCLES: u64 = 100;
/// How long an interrupted unpack may take to finish after a restart.
const UNPACK_WAIT: Duration = Duration::from_secs(30);
/// Uploads planned per Bundle at most (below [`fault_ops::HISTORY_LIMIT`]).
const MAX_UPLOADS: u32 = 4;
/// Live Bundles above which every cycle also deletes one.
const POPULATION: usize = 10;

fn env_u64(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v.parse().unwrap_or_else(|_| panic!("{name}={v:?} is not an unsigned integer")),
        Err(_) => default,
    }
}

/// splitmix64 as a stream.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = splitmix64(self.0);
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> Option<&'a T> {
        (!items.is_empty()).then(|| &items[self.below(items.len() as u64) as usize])
    }
}

/// The http sources nginx serves: URL, sha256 of the file, the tree inside.
struct Source {
    url: String,
    sha256: String,
    tree: Tree,
}

/// What the test knows about the server's state, from acknowledgements only.
#[derive(Default)]
struct Model {
    ledger: Ledger,
    /// Bundles whose creation was acknowledged.
    created: BTreeSet<String>,
    /// Deletes sent but not acknowledged: the Bundle may or may not be gone.
    delete_attempted: BTreeSet<String>,
    uploads: HashMap<String, u32>,
    /// http Bundles whose served tree was already compared with their source.
    trees_checked: BTreeSet<String>,
    stats: Stats,
}

/// How often the kill hit something, for the report (a suite whose kills all land between
/// operations would prove little).
#[derive(Default, Debug)]
struct Stats {
    ops: u64,
    acks: u64,
    kills_mid_operation: u64,
    unpacks_resumed: u64,
}

impl Model {
    fn record(&mut self, ack: Ack) {
        self.stats.acks += 1;
        match ack {
            Ack::Created(name) => {
                self.created.insert(name);
            }
            Ack::Uploaded(bundle) => self.ledger.acknowledged(NS, &bundle),
            Ack::Deleted(name) => {
                self.delete_attempted.remove(&name);
                self.created.remove(&name);
                self.ledger.bundle_deleted(NS, &name);
            }
        }
    }
}

/// Prints how to replay when the suite fails.
struct Replay {
    seed: u64,
    cycles: u64,
    cycle: u64,
}

impl Drop for Replay {
    fn drop(&mut self) {
        if std::thread::panicking() {
            report(&format!(
                "fault suite FAILED in cycle {} of {}: replay with STOWAGE_FAULT_SEED={} STOWAGE_FAULT_CYCLES={}",
                self.cycle,
                self.cycles,
                self.seed,
                self.cycle + 1
            ));
        }
    }
}

/// The Bundles of the namespace: name → object.
async fn list_bundles(server: &Server) -> BTreeMap<String, Value> {
    let list = server.get_json(&bundles(NS)).await;
    let items = list["items"].as_array().cloned().unwrap_or_default();
    items.into_iter().map(|b| (str_at(&b, "/metadata/name").to_owned(), b)).collect()
}

fn is_http(bundle: &Value) -> bool {
    bundle.pointer("/spec/sources/0/http").is_some()
}

/// Unpacked=True for the current generation.
fn is_unpacked(b: &Value) -> bool {
    let conditions = b.pointer("/status/conditions").and_then(Value::as_array).cloned().unwrap_or_default();
    conditions.iter().any(|c| {
        c["type"] == "Unpacked" && c["status"] == "True" && c["observedGeneration"] == b["metadata"]["generation"]
    })
}

/// Everything that must hold after a restart; returns the Bundles that exist.
async fn check_after_restart(
    server: &Server,
    model: &mut Model,
    sources: &[Source],
    context: &str,
) -> BTreeMap<String, Value> {
    let ready = server.get("/readyz").await;
    assert_eq!(ready.status().as_u16(), 200, "{context}: /readyz after the restart");
    let mut listed = list_bundles(server).await;
    // A delete that got no answer may have happened: the Bundle is then gone for good.
    for name in std::mem::take(&mut model.delete_attempted) {
        if !listed.contains_key(&name) {
            model.record(Ack::Deleted(name));
        }
    }
    for name in &model.created {
        assert!(listed.contains_key(name), "{context}: Bundle {name}, whose creation was acknowledged, is gone");
    }
    // Interrupted unpacks resume and finish.
    let http: Vec<String> = listed.iter().filter(|(_, b)| is_http(b)).map(|(n, _)| n.clone()).collect();
    for name in http {
        if !is_unpacked(&listed[&name]) {
            model.stats.unpacks_resumed += 1;
        }
        let b = eventually(UNPACK_WAIT, &format!("{context}: {name} unpacked after the restart"), || async {
            let b = server.get_json(&bundle(NS, &name)).await;
            if is_unpacked(&b) {
                Ok(b)
            } else {
                Err(format!("{}", b["status"]))
            }
        })
        .await;
        if model.trees_checked.insert(name.clone()) {
            let url = str_at(&b, "/spec/sources/0/http/url");
            let source = sources.iter().find(|s| s.url == url).expect("a source of the suite");
            let served = parse_served_tar(&server.download(&bundle_content(NS, &name)).await);
            assert_trees_equal(&source.tree, &served, &format!("{context}: {name}"));
        }
        listed.insert(name, b);
    }
    let contents = verify_contents(server, NS, &model.ledger, context).await;
    // Every Bundle that shows content points at a listed revision with its digest.
    for (name, b) in &listed {
        if let Some(digest) = b.pointer("/status/digest").and_then(Value::as_str) {
            let content = str_at(b, "/status/contentName");
            assert_eq!(contents.get(content).map(String::as_str), Some(digest), "{context}: Bundle {name}: {b:#}");
        }
    }
    listed
}

/// A seeded mix of 2–5 operations on distinct Bundles.
fn plan(
    rng: &mut Rng,
    model: &mut Model,
    existing: &BTreeMap<String, Value>,
    sources: &[Source],
    cycle: u64,
) -> Vec<Op> {
    let mut used = BTreeSet::new();
    let uploadable: Vec<String> = existing
        .iter()
        .filter(|(n, b)| !is_http(b) && model.uploads.get(*n).copied().unwrap_or(0) < MAX_UPLOADS)
        .map(|(n, _)| n.clone())
        .collect();
    let names: Vec<String> = existing.keys().cloned().collect();
    let mut ops = Vec::new();
    let count = 2 + rng.below(4);
    for i in 0..count {
        let fresh = format!("b{cycle}-{i}");
        let tar = build_tar(&random_tree(rng.next(), 1 + rng.below(4), 128 << 10 << rng.below(3)));
        let target = rng.pick(&uploadable).filter(|n| !used.contains(*n)).cloned();
        let roll = rng.below(100);
        let op = match (roll, target) {
            (0..=49, Some(bundle)) if roll >= 30 => Op::Put { bundle, create: false, tar },
            (0..=49, _) => Op::Put { bundle: fresh, create: true, tar },
            (50..=69, Some(bundle)) if roll < 60 => Op::Chunked { bundle, create: false, tar, pieces: 3 },
            (50..=69, _) => Op::Chunked { bundle: fresh, create: true, tar, pieces: 2 + rng.below(3) as usize },
            (70..=84, _) => {
                let source = rng.pick(sources).expect("sources");
                Op::Http { bundle: format!("h{cycle}-{i}"), url: source.url.clone(), sha256: source.sha256.clone() }
            }
            _ => match rng.pick(&names).filter(|n| !used.contains(*n)) {
                Some(bundle) => Op::Delete { bundle: bundle.clone() },
                None => Op::Put { bundle: fresh, create: true, tar },
            },
        };
        match &op {
            Op::Put { bundle, .. } | Op::Chunked { bundle, .. } => {
                *model.uploads.entry(bundle.clone()).or_insert(0) += 1
            }
            Op::Delete { bundle } => {
                model.delete_attempted.insert(bundle.clone());
            }
            Op::Http { .. } => {}
        }
        let (Op::Put { bundle, .. } | Op::Chunked { bundle, .. } | Op::Http { bundle, .. } | Op::Delete { bundle }) =
            &op;
        used.insert(bundle.clone());
        ops.push(op);
    }
    if existing.len() > POPULATION {
        if let Some(bundle) = names.iter().find(|n| !used.contains(*n)) {
            model.delete_attempted.insert(bundle.clone());
            ops.push(Op::Delete { bundle: bundle.clone() });
        }
    }
    ops
}

/// Runs the operations and kills the server at a seeded moment: before anything, inside the
/// operations (uploads take tens of milliseconds here), once an unpack is under way, or right
/// after the last answer.
async fn run_and_kill(server: &mut Server, rng: &mut Rng, model: &mut Model, ops: Vec<Op>) {
    let conn = Conn { client: server.client().clone(), url: server.url.clone() };
    let unpacking: Vec<String> = ops
        .iter()
        .filter_map(|op| if let Op::Http { bundle, .. } = op { Some(bundle.clone()) } else { None })
        .collect();
    let tasks: Vec<_> = ops.into_iter().map(|op| tokio::spawn(fault_ops::run(conn.clone(), op))).collect();
    let roll = rng.below(100);
    let kill_at = match roll {
        0..=9 => Duration::ZERO,
        10..=14 => Duration::from_secs(10), // after everything answered
        _ => Duration::from_millis(rng.below(120)),
    };
    if roll >= 60 && !unpacking.is_empty() {
        wait_unpacking(server, &unpacking).await;
    } else {
        // The kill comes at `kill_at`, or once every operation has its answer if that is sooner.
        let _ = poll_until(kill_at, Duration::from_millis(2), || async {
            match tasks.iter().filter(|t| !t.is_finished()).count() {
                0 => Ok(()),
                left => Err(format!("{left} operation(s) unanswered")),
            }
        })
        .await;
    }
    model.stats.kills_mid_operation += u64::from(!tasks.iter().all(|t| t.is_finished()));
    server.kill9();
    for task in tasks {
        for ack in task.await.expect("operation task") {
            model.record(ack);
        }
    }
}

/// Returns once one of the Bundles is `Unpacking` (or after 3 s).
async fn wait_unpacking(server: &Server, names: &[String]) {
    // Looked for often and briefly: the kill is meant to land while the unpack runs (if it has
    // not started within 3 s, the kill comes anyway).
    let _ = poll_until(Duration::from_secs(3), Duration::from_millis(2), || async {
        for name in names {
            let resp = server.get(&bundle(NS, name)).await;
            if resp.status().is_success() {
                let b: Value = resp.json().await.unwrap_or_default();
                if b.pointer("/status/phase").and_then(Value::as_str) == Some("Unpacking") {
                    return Ok(());
                }
            }
        }
        Err("no unpack under way".to_owned())
    })
    .await;
}

/// Deletes every Bundle; the store must come back to empty.
async fn assert_no_leaks(server: &mut Server, context: &str) {
    for name in list_bundles(server).await.keys() {
        let resp = server.delete(&bundle(NS, name)).await;
        assert!(resp.status().is_success(), "{context}: delete {name}: {}", resp.status());
    }
    eventually(Duration::from_secs(60), &format!("{context}: every BundleContent collected"), || async {
        let names = server.bundlecontent_names(NS).await;
        if names.is_empty() {
            Ok(())
        } else {
            Err(format!("{names:?}"))
        }
    })
    .await;
    // A restart seals the active pack, so recovery may drop it too.
    server.restart();
    let data = server.data_dir().to_owned();
    eventually(Duration::from_secs(60), &format!("{context}: the store is empty again"), || async {
        let m = server.metrics().await;
        let revisions: f64 = ["committed", "staging", "deleting"]
            .iter()
            .map(|s| m.get(&format!("stowage_revisions{{state=\"{s}\"}}")).copied().unwrap_or(-1.0))
            .sum();
        let packs = dir_bytes(&data.join("store/packs"));
        let spooled = std::fs::read_dir(data.join("uploads")).map(|d| d.count()).unwrap_or(0);
        let state = (m.get("stowage_chunks").copied(), revisions, packs, spooled);
        if state == (Some(0.0), 0.0, 0, 0) {
            Ok(())
        } else {
            Err(format!("(chunks, revisions, pack bytes, spooled uploads) = {state:?}"))
        }
    })
    .await;
}

fn dir_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| entries.filter_map(|e| e.ok()?.metadata().ok()).map(|m| m.len()).sum())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn kill9_at_random_points_loses_nothing_acknowledged() {
    let seed = env_u64("STOWAGE_FAULT_SEED", DEFAULT_SEED);
    let cycles = env_u64("STOWAGE_FAULT_CYCLES", DEFAULT_CYCLES);
    let mut replay = Replay { seed, cycles, cycle: 0 };
    let started = Instant::now();
    let mut rng = Rng(seed);
    let web = HttpServer::start(HttpAuth::None);
    let sources: Vec<Source> = (0..3)
        .map(|i| {
            let tree = plain_bundle_tree(seed ^ (1000 + i), 6, 512 << 10);
            let tgz = gzip(&build_tar(&tree));
            web.put(&format!("source-{i}.tar.gz"), &tgz);
            Source { url: web.url(&format!("source-{i}.tar.gz")), sha256: sha256_hex(&tgz), tree }
        })
        .collect();
    let tmp = tempfile::Builder::new().prefix("stowage-faults-").tempdir().expect("tempdir");
    let args = ["--insecure-source-host", &web.host_port(), "--upload-session-timeout", "4s"];
    let mut server = Server::start(&tmp.path().join("data"), &args);
    let mut model = Model::default();
    let mut peak_disk = 0u64;
    for cycle in 0..cycles {
        replay.cycle = cycle;
        if cycle > 0 {
            server.restart();
        }
        let context = format!("cycle {cycle} (STOWAGE_FAULT_SEED={seed})");
        let existing = check_after_restart(&server, &mut model, &sources, &context).await;
        peak_disk = peak_disk.max(server.metrics().await.get("stowage_disk_bytes").copied().unwrap_or(0.0) as u64);
        let ops = plan(&mut rng, &mut model, &existing, &sources, cycle);
        model.stats.ops += ops.len() as u64;
        run_and_kill(&mut server, &mut rng, &mut model, ops).await;
        if cycle % 10 == 9 {
            report(&format!("faults: {} cycles in {:.0}s", cycle + 1, started.elapsed().as_secs_f64()));
        }
    }
    replay.cycle = cycles;
    server.restart();
    let context = format!("after the last cycle (STOWAGE_FAULT_SEED={seed})");
    check_after_restart(&server, &mut model, &sources, &context).await;
    let acknowledged = model.ledger.contents.len();
    assert_no_leaks(&mut server, &context).await;
    report(&format!(
        "faults: seed {seed}, {cycles} cycles, {acknowledged} acknowledged revisions alive at the end, \
         {} acknowledged deletes, {:?}, peak store {} KiB, {:.1}s",
        model.ledger.deleted_bundles.len(),
        model.stats,
        peak_disk >> 10,
        started.elapsed().as_secs_f64()
    ));
}
