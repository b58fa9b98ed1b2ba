//! The replicated store against a real etcd and a real S3-compatible server (Garage), both started
//! here on 127.0.0.1: two `Store` handles with different replica ids on one prefix and bucket are
//! two replicas. `etcd` must be on PATH and Garage at `$STOWAGE_GARAGE` (scripts/test.sh installs
//! both); a missing one fails these tests.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use sha2::Digest;

use super::remote::{Remote, RemoteOptions};
use super::tests::noise;
use super::*;

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn wait_for_port(port: u16, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "{what} did not listen on {port}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// etcd and Garage, killed on drop.
pub(crate) struct Backends {
    children: Vec<Child>,
    _dir: tempfile::TempDir,
    etcd: String,
    s3: String,
    key_id: String,
    secret: String,
}

impl Drop for Backends {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn garage_binary() -> PathBuf {
    match std::env::var_os("STOWAGE_GARAGE") {
        Some(path) => PathBuf::from(path),
        None => PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/stowage-tools/garage-2.5.0/bin/garage"),
    }
}

fn garage(config: &Path, args: &[&str]) -> String {
    let out = Command::new(garage_binary()).arg("-c").arg(config).args(args).output().expect("running garage");
    assert!(out.status.success(), "garage {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub(crate) fn start_backends() -> Backends {
    let dir = tempfile::tempdir().unwrap();
    let (client, peer) = (free_port(), free_port());
    let etcd = Command::new("etcd")
        .arg("--data-dir")
        .arg(dir.path().join("etcd"))
        .args(["--listen-client-urls", &format!("http://127.0.0.1:{client}")])
        .args(["--advertise-client-urls", &format!("http://127.0.0.1:{client}")])
        .args(["--listen-peer-urls", &format!("http://127.0.0.1:{peer}")])
        .args(["--initial-advertise-peer-urls", &format!("http://127.0.0.1:{peer}")])
        .args(["--initial-cluster", &format!("default=http://127.0.0.1:{peer}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("etcd must be installed (Debian etcd-server)");
    let mut children = vec![etcd];
    let (s3, rpc, admin) = (free_port(), free_port(), free_port());
    let config = dir.path().join("garage.toml");
    let root = dir.path().display();
    std::fs::write(
        &config,
        format!(
            "metadata_dir = \"{root}/meta\"\ndata_dir = \"{root}/data\"\ndb_engine = \"sqlite\"\n\
             replication_factor = 1\nrpc_bind_addr = \"127.0.0.1:{rpc}\"\nrpc_public_addr = \"127.0.0.1:{rpc}\"\n\
             rpc_secret = \"{}\"\n[s3_api]\ns3_region = \"garage\"\napi_bind_addr = \"127.0.0.1:{s3}\"\n\
             root_domain = \".s3.garage.localhost\"\n[admin]\napi_bind_addr = \"127.0.0.1:{admin}\"\n\
             admin_token = \"{}\"\n",
            hex::encode(noise(7, 32)),
            hex::encode(noise(8, 16)),
        ),
    )
    .unwrap();
    let server = Command::new(garage_binary())
        .arg("-c")
        .arg(&config)
        .arg("server")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("Garage must be built (scripts/test.sh builds it once)");
    children.push(server);
    wait_for_port(client, "etcd");
    wait_for_port(rpc, "garage");
    let deadline = Instant::now() + Duration::from_secs(20);
    let node = loop {
        let out = Command::new(garage_binary()).arg("-c").arg(&config).args(["node", "id", "-q"]).output().unwrap();
        if out.status.success() {
            break String::from_utf8_lossy(&out.stdout).split('@').next().unwrap_or_default().trim().to_string();
        }
        assert!(Instant::now() < deadline, "garage did not start");
        std::thread::sleep(Duration::from_millis(100));
    };
    garage(&config, &["layout", "assign", "-z", "dc1", "-c", "1G", &node]);
    garage(&config, &["layout", "apply", "--version", "1"]);
    garage(&config, &["bucket", "create", "stowage"]);
    let key = garage(&config, &["key", "create", "stowage-key"]);
    garage(&config, &["bucket", "allow", "--read", "--write", "--owner", "stowage", "--key", "stowage-key"]);
    let field = |name: &str| {
        key.lines().find_map(|l| l.strip_prefix(name)).map(|v| v.trim_start_matches(':').trim().to_string()).unwrap()
    };
    Backends {
        children,
        _dir: dir,
        etcd: format!("http://127.0.0.1:{client}"),
        s3: format!("http://127.0.0.1:{s3}"),
        key_id: field("Key ID"),
        secret: field("Secret key"),
    }
}

/// The options of replica `id` on `backends`.
pub(crate) fn remote_options(backends: &Backends, id: &str) -> RemoteOptions {
    RemoteOptions {
        etcd_servers: vec![backends.etcd.clone()],
        etcd_prefix: "/test".into(),
        s3_endpoint: Some(backends.s3.clone()),
        s3_bucket: "stowage".into(),
        s3_region: "garage".into(),
        s3_path_style: true,
        s3_access_key_id: Some(backends.key_id.clone()),
        s3_secret_access_key: Some(backends.secret.clone()),
        replica_id: id.into(),
        // Old enough to be compacted within the test, young enough that no write takes half of it.
        block_grace: Duration::from_secs(5),
        collect_every: Duration::from_secs(3600),
        object_cache_bytes: 64 << 20,
        block_cache_bytes: 64 << 20,
        ..RemoteOptions::default()
    }
}

pub(super) fn replica(backends: &Backends, id: &str, scratch: &Path) -> Store {
    let remote = Remote::connect(remote_options(backends, id)).unwrap();
    Store::open_replicated(&scratch.join(id), StoreOptions::default(), remote).unwrap()
}

fn leader_of<'a>(stores: &'a [&'a Store]) -> &'a Store {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Some(leader) = stores.iter().find(|s| s.elects_leader() && s.is_leader()) {
            return leader;
        }
        assert!(Instant::now() < deadline, "no replica became leader");
        std::thread::sleep(Duration::from_millis(100));
    }
}

pub(super) fn put(store: &Store, name: &str, files: &[(String, Vec<u8>)]) -> (RevisionId, String) {
    let mut writer = store.begin_revision().unwrap();
    for (path, data) in files {
        writer.add_file(path, 0o644, data.len() as u64, &mut &data[..]).unwrap();
    }
    let mut pending = writer.finalize().unwrap();
    let (id, digest) = (pending.record().id, pending.record().digest.clone());
    let key = ObjectKey::new("bundlecontents", "ns", name);
    let object = json!({"metadata": {"name": name}});
    pending
        .commit(vec![ObjectWrite::Put { key, object, precondition: Precondition::MustNotExist, revision: Some(id) }])
        .unwrap();
    (id, digest)
}

pub(super) fn tar_digest(store: &Store, id: RevisionId) -> String {
    let record = store.revision(id).unwrap();
    let mut hash = sha2::Sha256::new();
    store
        .read_tar(id, record.tar_size, RangeSpec { start: 0, end: record.tar_size }, &mut |b| {
            hash.update(b);
            Ok(())
        })
        .unwrap();
    format!("sha256:{}", hex::encode(hash.finalize()))
}

#[test]
fn replicas_share_objects_content_and_changes() {
    let backends = start_backends();
    let scratch = tempfile::tempdir().unwrap();
    let a = replica(&backends, "a", scratch.path());
    let b = replica(&backends, "b", scratch.path());
    let mut changes = b.subscribe();
    let files = vec![("x.yaml".to_string(), noise(1, 150_000)), ("y.yaml".to_string(), b"kind: Y\n".to_vec())];
    let (id, digest) = put(&a, "one", &files);
    // Read through the other replica: the object, its change, and its content.
    let seen = b.get_object(&ObjectKey::new("bundlecontents", "ns", "one")).unwrap().expect("visible on b");
    assert_eq!(seen.revision, Some(id));
    let rv = seen.resource_version;
    let deadline = Instant::now() + Duration::from_secs(10);
    while changes.try_recv().map_or(true, |announced| announced < rv) {
        assert!(Instant::now() < deadline, "b was not told of a's write");
        std::thread::sleep(Duration::from_millis(20));
    }
    let logged = b.changes_after(rv - 1, 10).unwrap();
    assert_eq!(logged.first().map(|(at, e)| (*at, e.name.as_str())), Some((rv, "one")));
    assert_eq!(tar_digest(&b, id), digest);
    // Writes on both replicas get dense resourceVersions in one order.
    let (_, _) = put(&b, "two", &files[1..]);
    let (_, _) = put(&a, "three", &files[..1]);
    let (objects, at) = a.list_objects("bundlecontents", None).unwrap();
    assert_eq!(objects.len(), 3);
    let mut rvs: Vec<u64> = objects.iter().map(|o| o.resource_version).collect();
    rvs.sort();
    assert_eq!(rvs, vec![rv, rv + 1, rv + 2], "one counter across replicas");
    assert_eq!(at, rv + 2);
}

/// Writers on both replicas keep uploading content that reuses chunks of released revisions while
/// the leader collects without pause; at the end every committed revision reads back whole.
/// `STOWAGE_SEED` replays a run.
#[test]
fn collection_on_the_leader_never_takes_a_chunk_a_writer_elsewhere_reuses() {
    let seed: u64 = std::env::var("STOWAGE_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x5eed_0017);
    eprintln!("seed {seed} (STOWAGE_SEED={seed} replays it)");
    let backends = start_backends();
    let scratch = tempfile::tempdir().unwrap();
    let a = replica(&backends, "a", scratch.path());
    let b = replica(&backends, "b", scratch.path());
    let leader = leader_of(&[&a, &b]).clone();
    // A small pool of files, so that uploads keep reusing what earlier ones had and deleted.
    let pool: Arc<Vec<Vec<u8>>> = Arc::new((0..6).map(|i| noise(seed ^ (i + 1), 120_000)).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let removed = Arc::new(AtomicU64::new(0));
    let collector = {
        let (stop, removed) = (stop.clone(), removed.clone());
        std::thread::spawn(move || {
            let mut passes = 0u64;
            while !stop.load(Ordering::Acquire) {
                let report = leader.collect().unwrap();
                removed.fetch_add(report.chunks_removed, Ordering::Relaxed);
                passes += 1;
            }
            passes
        })
    };
    let writers: Vec<_> = [(a.clone(), "a"), (b.clone(), "b")]
        .into_iter()
        .enumerate()
        .map(|(n, (store, name))| {
            let pool = pool.clone();
            std::thread::spawn(move || {
                let mut x = seed.wrapping_add(n as u64 * 0x9E37_79B9) | 1;
                let mut next = move || {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x
                };
                let mut kept: Vec<(String, RevisionId, String)> = Vec::new();
                for i in 0..30 {
                    let mut files: Vec<(String, Vec<u8>)> = (0..3)
                        .map(|f| {
                            let pick = (next() % pool.len() as u64) as usize;
                            (format!("f{f}-{pick}.bin"), pool[pick].clone())
                        })
                        .collect();
                    files.push((format!("own-{i}"), noise(next(), 2_000)));
                    let object = format!("{name}-{i}");
                    let (id, digest) = put(&store, &object, &files);
                    kept.push((object, id, digest));
                    // Release most of what was written, so its chunks become garbage to reuse.
                    if next() % 3 != 0 && kept.len() > 1 {
                        let (gone, _, _) = kept.remove((next() % (kept.len() as u64 - 1)) as usize);
                        let key = ObjectKey::new("bundlecontents", "ns", &gone);
                        store
                            .write_objects(vec![ObjectWrite::Delete { key, precondition: Precondition::None }])
                            .unwrap();
                    }
                }
                kept
            })
        })
        .collect();
    let kept: Vec<_> = writers.into_iter().flat_map(|w| w.join().unwrap()).collect();
    stop.store(true, Ordering::Release);
    let passes = collector.join().unwrap();
    let last = leader_of(&[&a, &b]).collect().unwrap();
    let removed = removed.load(Ordering::Relaxed) + last.chunks_removed;
    eprintln!("{passes} collection passes removed {removed} chunks; {} revisions kept", kept.len());
    assert!(removed > 0, "the collector must have had garbage to race with");
    for (object, id, digest) in &kept {
        for store in [&a, &b] {
            assert_eq!(&tar_digest(store, *id), digest, "{object} (revision {id}) reads back whole");
        }
    }
}

/// A replica remembers where the chunks it read are (no etcd round trip per chunk on the next
/// read); when compaction on the leader moves them and deletes their old block, it reads them
/// from where they went.
#[test]
fn remembered_chunk_locations_follow_compaction() {
    let backends = start_backends();
    let scratch = tempfile::tempdir().unwrap();
    let a = replica(&backends, "a", scratch.path());
    let b = replica(&backends, "b", scratch.path());
    let live = ("live.bin".to_string(), noise(7, 40_000));
    let (_, _) = put(&a, "old", &[live.clone(), ("dead.bin".to_string(), noise(8, 600_000))]);
    let (kept, digest) = put(&a, "kept", std::slice::from_ref(&live));
    assert_eq!(tar_digest(&b, kept), digest, "read once through b: b remembers the locations");
    // Past the grace period, the old block may be compacted once most of it is garbage.
    std::thread::sleep(Duration::from_secs(6));
    let key = ObjectKey::new("bundlecontents", "ns", "old");
    a.write_objects(vec![ObjectWrite::Delete { key, precondition: Precondition::None }]).unwrap();
    // The leader's own collector may get there first: its count says it happened.
    let leader = leader_of(&[&a, &b]).clone();
    let deadline = Instant::now() + Duration::from_secs(20);
    while leader.counts().packs_compacted == 0 {
        assert!(Instant::now() < deadline, "the old block was not compacted");
        leader.collect().unwrap();
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(tar_digest(&b, kept), digest, "b reads the moved chunks");
    assert_eq!(tar_digest(&a, kept), digest);
}

/// Lists on one replica while another writes are exact snapshots, also when the objects span
/// several etcd pages (16 keys a page in these tests) and the list catches up with the change log
/// once per page instead of once per object.
#[test]
fn lists_on_one_replica_while_another_writes_are_exact_snapshots() {
    let backends = start_backends();
    let scratch = tempfile::tempdir().unwrap();
    let a = replica(&backends, "a", scratch.path());
    let b = replica(&backends, "b", scratch.path());
    super::tests::check_exact_snapshots(&a, &b);
}
