//! The workload the suite traces: a child process (this binary, re-executed under the shim) runs
//! writers of API objects, writers of revisions (begin, add files, finalize, attach with an object
//! write), deletions that release revisions, abandoned writes, garbage collection with pack
//! compaction, and restarts, all on `stowage::storage::Store`, concurrently. Before each write it
//! marks its intent, after it returns its acknowledgment (the resourceVersion), in the marks file,
//! which the shim records at its exact place in the trace.

use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use serde_json::json;
use stowage::storage::{ObjectKey, ObjectWrite, Precondition, StorageError, Store, StoreOptions};

use crate::rng::Rng;

pub const RESOURCE: &str = "bundlecontents";
pub const NAMESPACE: &str = "ns";
/// Revision writers, and rounds each writes, per phase.
const REVISION_WRITERS: u64 = 3;
const ROUNDS: u64 = 5;
/// Concurrent phases, with a restart after each.
const PHASES: u64 = 4;
/// Object writers, and objects each writes, per phase.
const OBJECT_WRITERS: u64 = 2;
const OBJECTS: u64 = 6;

/// What the workload says about one step of one object.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "k", rename_all = "camelCase")]
pub enum Mark {
    /// About to write step `step` of `obj`: a put (with the revision it attaches) or a delete.
    Intent { obj: String, step: u32, delete: bool, rev: Option<u64>, digest: Option<String> },
    /// Step `step` of `obj` returned: acknowledged at `rv`.
    Ack { obj: String, step: u32, rv: u64 },
}

struct Marks(Mutex<std::fs::File>);

impl Marks {
    fn mark(&self, mark: &Mark) {
        let mut line = serde_json::to_string(mark).unwrap();
        line.push('\n');
        // One write per line, in the order the marks are made.
        self.0.lock().unwrap().write_all(line.as_bytes()).unwrap();
    }
}

pub fn options() -> StoreOptions {
    StoreOptions { min_free_bytes: 0, ..StoreOptions::default() }
}

/// Opens the store, waiting for a collector thread of a dropped handle to let go of it.
pub fn open(dir: &Path) -> Store {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        match Store::open(dir, options()) {
            Err(StorageError::Engine(e)) if std::time::Instant::now() < deadline && e.to_string().contains("lock") => {
                std::thread::sleep(std::time::Duration::from_millis(20))
            }
            other => return other.unwrap(),
        }
    }
}

fn key(name: &str) -> ObjectKey {
    ObjectKey::new(RESOURCE, NAMESPACE, name)
}

/// Writes step `step` of `name`: a put of `{"spec": {"step": step}}` attaching `pending` if given.
/// Objects named `big-*` carry 140 KB, which sled keeps in a blob file of its own.
fn put(store: &Store, marks: &Marks, name: &str, step: u32, pending: Option<stowage::storage::PendingRevision>) {
    let mut object = json!({"metadata": {"name": name, "namespace": NAMESPACE}, "spec": {"step": step}});
    if name.starts_with("big-") {
        object["spec"]["data"] = json!("x".repeat(140_000));
    }
    let precondition = if step == 0 { Precondition::MustNotExist } else { Precondition::MustExist };
    let (rev, digest) = match &pending {
        Some(p) => (Some(p.record().id), Some(p.record().digest.clone())),
        None => (None, None),
    };
    marks.mark(&Mark::Intent { obj: name.into(), step, delete: false, rev, digest });
    let write = ObjectWrite::Put { key: key(name), object, precondition, revision: rev };
    let outcome = match pending {
        Some(mut p) => p.commit(vec![write]),
        None => store.write_objects(vec![write]),
    };
    let rv = outcome.unwrap_or_else(|e| panic!("writing {name} step {step}: {e}")).resource_version;
    marks.mark(&Mark::Ack { obj: name.into(), step, rv });
}

fn delete(store: &Store, marks: &Marks, name: &str, step: u32) {
    marks.mark(&Mark::Intent { obj: name.into(), step, delete: true, rev: None, digest: None });
    let write = ObjectWrite::Delete { key: key(name), precondition: Precondition::MustExist };
    let rv = store.write_objects(vec![write]).unwrap_or_else(|e| panic!("deleting {name}: {e}")).resource_version;
    marks.mark(&Mark::Ack { obj: name.into(), step, rv });
}

/// Text-like bytes (words of a small vocabulary): compresses about as bundle YAML does.
fn text(rng: &mut Rng, len: usize) -> Vec<u8> {
    const WORDS: &[&str] = &[
        "apiVersion",
        "kind",
        "metadata",
        "name",
        "namespace",
        "labels",
        "spec",
        "replicas",
        "template",
        "containers",
        "image",
        "ports",
        "containerPort",
        "resources",
        "limits",
        "cpu",
        "memory",
        "- name:",
        "value:",
        "true",
        "false",
        "\n  ",
        "\n    ",
        ": ",
        "{{ .Values.",
        " }}",
        "prometheus",
        "grafana",
    ];
    let mut out = Vec::with_capacity(len + 16);
    while out.len() < len {
        out.extend_from_slice(rng.pick(WORDS).unwrap().as_bytes());
        out.extend_from_slice(format!("{} ", rng.below(100_000)).as_bytes());
    }
    out.truncate(len);
    out
}

/// Writes a revision of a few files (one from a pool the writers share, so chunks are reused
/// across concurrent writers). Returns `None` when this round abandons it.
fn write_revision(store: &Store, rng: &mut Rng, shared: &[Vec<u8>]) -> Option<stowage::storage::PendingRevision> {
    let mut writer = store.begin_revision().unwrap();
    let files = 2 + rng.below(3);
    let abandon = rng.below(8);
    for f in 0..files {
        let len = 16_384 + rng.below(150_000) as usize;
        let data = text(rng, len);
        writer
            .add_file(
                &format!("dir{}/file{f}.yaml", f % 2),
                if f == 0 { 0o755 } else { 0o644 },
                data.len() as u64,
                &mut &data[..],
            )
            .unwrap();
        if abandon == 0 && f == 1 {
            return None; // dropped mid-write: released
        }
    }
    let common = rng.pick(shared).unwrap();
    writer.add_file("shared.yaml", 0o644, common.len() as u64, &mut &common[..]).unwrap();
    let pending = writer.finalize().unwrap();
    // Finalized, never attached: released when dropped.
    (abandon != 1).then_some(pending)
}

/// One concurrent phase: revision writers, object writers, and a collector that first deletes
/// `doomed` (objects at step 0 from earlier phases).
fn phase(store: &Store, marks: &Arc<Marks>, seed: u64, phase: u64, doomed: Vec<String>) -> Vec<String> {
    let done = Arc::new(AtomicBool::new(false));
    let mut shared_rng = Rng::new(seed ^ 0x5EED);
    let shared: Arc<Vec<Vec<u8>>> = Arc::new((0..4).map(|_| text(&mut shared_rng, 48_000)).collect());
    let mut writers = Vec::new();
    for t in 0..REVISION_WRITERS {
        let (store, marks, shared) = (store.clone(), marks.clone(), shared.clone());
        writers.push(std::thread::spawn(move || {
            let mut rng = Rng::new(seed ^ (phase << 32) ^ (t << 16) ^ 1);
            let mut committed: Vec<String> = Vec::new();
            for r in 0..ROUNDS {
                if let Some(pending) = write_revision(&store, &mut rng, &shared) {
                    let name = format!("rev-{phase}-{t}-{r}");
                    put(&store, &marks, &name, 0, Some(pending));
                    committed.push(name);
                }
                if committed.len() > 2 {
                    delete(&store, &marks, &committed.remove(0), 1);
                }
            }
            committed
        }));
    }
    for t in 0..OBJECT_WRITERS {
        let (store, marks) = (store.clone(), marks.clone());
        writers.push(std::thread::spawn(move || {
            let mut rng = Rng::new(seed ^ (phase << 32) ^ (t << 16) ^ 2);
            for k in 0..OBJECTS {
                let name = format!("obj-{phase}-{t}-{k}");
                for step in 0..3 {
                    put(&store, &marks, &name, step, None);
                }
                if rng.below(2) == 0 {
                    delete(&store, &marks, &name, 3);
                }
            }
            Vec::new()
        }));
    }
    let collector = {
        let (store, marks, done) = (store.clone(), marks.clone(), done.clone());
        std::thread::spawn(move || {
            for name in doomed {
                delete(&store, &marks, &name, 1);
            }
            while !done.load(Ordering::Acquire) {
                store.collect().unwrap();
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        })
    };
    let kept: Vec<String> = writers.into_iter().flat_map(|w| w.join().unwrap()).collect();
    done.store(true, Ordering::Release);
    collector.join().unwrap();
    kept
}

/// The child's whole run: base revisions, a restart, then concurrent phases, each deleting most
/// of what the one before kept (so packs get compacted, at runtime and at restarts), each followed
/// by a restart.
pub fn run(root: &Path, marks_path: &Path, seed: u64) {
    let dir = root.join("data");
    let marks = Arc::new(Marks(Mutex::new(std::fs::File::create(marks_path).unwrap())));
    let store = open(&dir);
    let mut rng = Rng::new(seed);
    let shared: Vec<Vec<u8>> = (0..2).map(|_| text(&mut rng, 48_000)).collect();
    let mut base = Vec::new();
    for i in 0..4 {
        let name = format!("base-{i}");
        let mut writer = store.begin_revision().unwrap();
        for f in 0..3 {
            let data = text(&mut rng, 100_000);
            writer.add_file(&format!("f{f}.yaml"), 0o644, data.len() as u64, &mut &data[..]).unwrap();
        }
        if i == 0 {
            // Entries in path order are laid out as they arrive: blocks are sealed into packs
            // before finalize, so crash points fall between them too.
            let data = text(&mut rng, 2_500_000);
            writer.add_file("g-big.yaml", 0o644, data.len() as u64, &mut &data[..]).unwrap();
        }
        writer.add_file("shared.yaml", 0o644, shared[i % 2].len() as u64, &mut &shared[i % 2][..]).unwrap();
        put(&store, &marks, &name, 0, Some(writer.finalize().unwrap()));
        base.push(name);
    }
    // Written here, where nothing runs beside it: sled rewrites a blob with every change of
    // any key in its page, which would make every flush of the concurrent phases a slow one.
    put(&store, &marks, "big-0", 0, None);
    drop(store);
    let mut store = open(&dir);
    // base-3 stays: its chunks are copied when its pack is compacted.
    let mut doomed: Vec<String> = base.drain(..3).collect();
    for p in 0..PHASES {
        let survivors = phase(&store, &marks, seed, p, doomed);
        // A restart: the active pack is sealed (compacted once mostly dead), sled recovers.
        drop(store);
        store = open(&dir);
        doomed = survivors.into_iter().take(3).collect();
    }
}
