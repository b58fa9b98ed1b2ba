//! A replica's caches against a real etcd and Garage. The object cache ([`super::remote::Mirror`]):
//! a replica whose cache stalled never answers a consistent read with older data than etcd holds,
//! and one past its bound answers what etcd answers. The block cache
//! ([`super::remote::DiskBlocks`]): a Bundle read again, or read on the replica that wrote it,
//! comes from the replica's disk, verified.

use std::time::{Duration, Instant};

use super::remote::RemoteMetrics;
use super::remote::{Remote, RemoteOptions, CATCH_UP_WAIT};
use super::remote_tests::{put, remote_options, replica, start_backends, tar_digest};
use super::tests::noise;
use super::tests::{delete_obj, name_and_v, put_v};
use super::*;

fn list(store: &Store) -> (u64, Vec<(String, u64)>) {
    let query = ListQuery { resource: "bundles", namespace: Some("ns"), at: None, after: None, limit: None };
    let page = store.list_page(&query, None).unwrap();
    (page.resource_version, name_and_v(&page.items))
}

fn version_of(store: &Store, name: &str) -> Option<(u64, u64)> {
    let found = store.get_object(&ObjectKey::new("bundles", "ns", name)).unwrap()?;
    Some((found.resource_version, found.value["v"].as_u64().unwrap()))
}

/// What a GET answers on the async runtime at once (`None`: it hands the read to a blocking
/// thread), as the object's `v`.
fn version_now(store: &Store, name: &str) -> Option<Option<u64>> {
    let key = ObjectKey::new("bundles", "ns", name);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let json = runtime.block_on(store.get_object_json_now(&key)).unwrap()?;
    Some(json.map(|json| serde_json::from_slice::<serde_json::Value>(&json).unwrap()["v"].as_u64().unwrap()))
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !done() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A replica with these options, its scratch under `scratch` (named by its id).
fn replica_with(options: RemoteOptions, scratch: &std::path::Path) -> Store {
    let dir = scratch.join(&options.replica_id);
    let remote = Remote::connect(options).unwrap();
    Store::open_replicated(&dir, StoreOptions::default(), remote).unwrap()
}

fn etcd_pages(store: &Store) -> u64 {
    store.tree().pages_read().unwrap()
}

#[test]
fn a_replica_whose_cache_stalled_answers_what_etcd_holds() {
    let backends = start_backends();
    let scratch = tempfile::tempdir().unwrap();
    let a = replica(&backends, "a", scratch.path());
    let b = replica(&backends, "b", scratch.path());
    for i in 0..20 {
        b.write_objects(vec![put_v(&format!("o{i:02}"), 0)]).unwrap();
    }
    let mirror = a.backend().mirror().expect("the tests' replicas have an object cache").clone();
    wait_until("a's object cache never served", || mirror.serves());
    // Served from memory: a list of a's reads no etcd page.
    let pages = etcd_pages(&a);
    let (_, items) = list(&a);
    assert_eq!(items.len(), 20);
    assert_eq!(etcd_pages(&a), pages, "a served a list from etcd while its cache was caught up");
    assert_eq!(version_now(&a, "o03"), Some(Some(0)), "a caught-up cache did not answer a GET at once");

    // The watch stalls; b goes on writing. Every consistent read on a shows b's last write.
    mirror.pause(true);
    let mut marked = Instant::now();
    for step in 1..=4u64 {
        if step == 2 {
            marked = Instant::now();
        }
        let rv = b.write_objects(vec![put_v("o03", step)]).unwrap().resource_version;
        assert_eq!(version_now(&a, "o03"), None, "a's stalled cache answered a GET at once");
        assert_eq!(version_of(&a, "o03"), Some((rv, step)), "a's GET showed older data than etcd's");
        let (at, items) = list(&a);
        assert!(at >= rv, "a listed at {at}, before b's acknowledged write at {rv}");
        assert!(items.contains(&("o03".to_string(), step)), "a's LIST showed older data than etcd's");
    }
    // Only the first read waited for the stalled cache; the six after it went to etcd at once.
    let later = marked.elapsed();
    assert!(later < CATCH_UP_WAIT * 3, "six reads of a cache marked behind took {later:?}");
    b.write_objects(vec![delete_obj("o04")]).unwrap();
    assert_eq!(version_of(&a, "o04"), None, "a still showed an object b deleted");
    assert!(!list(&a).1.iter().any(|(name, _)| name == "o04"));
    assert!(!mirror.serves(), "a stalled cache was still asked");

    // The watch resumes: the cache catches up and answers again, with the same data.
    mirror.pause(false);
    wait_until("a's object cache did not catch up", || {
        a.consistent_resource_version().unwrap();
        mirror.serves()
    });
    let pages = etcd_pages(&a);
    assert_eq!(version_of(&a, "o03").map(|(_, v)| v), Some(4));
    assert_eq!(list(&a).1, list(&b).1);
    assert_eq!(etcd_pages(&a), pages, "the caught-up cache did not answer");
    assert_eq!(version_now(&a, "o03"), Some(Some(4)));
    assert_eq!(version_now(&a, "o04"), Some(None), "a deleted object was not answered as absent");
    // What it missed reaches a's watchers too.
    let logged = a.changes_after(0, 100).unwrap();
    assert!(logged.iter().any(|(_, change)| change.name == "o04" && change.kind == "DELETED"));
}

#[test]
fn writes_built_from_a_stale_cache_are_built_again_from_etcd() {
    let backends = start_backends();
    let scratch = tempfile::tempdir().unwrap();
    let a = replica(&backends, "a", scratch.path());
    let b = replica(&backends, "b", scratch.path());
    let create = |name: &str, v: u64, precondition| ObjectWrite::Put {
        key: ObjectKey::new("bundles", "ns", name),
        object: serde_json::json!({"metadata": {"name": name}, "v": v}),
        precondition,
        revision: None,
    };
    a.write_objects(vec![create("x", 1, Precondition::MustNotExist)]).unwrap();
    let mirror = a.backend().mirror().unwrap().clone();
    wait_until("a's object cache never served", || mirror.serves());
    mirror.pause(true);
    // a's cache still has x, and not y: both writes must be decided on etcd's state.
    b.write_objects(vec![delete_obj("x")]).unwrap();
    let y = b.write_objects(vec![create("y", 1, Precondition::MustNotExist)]).unwrap().resource_version;
    let again = a.write_objects(vec![create("x", 2, Precondition::MustNotExist)]).unwrap();
    assert!(again.resource_version > y);
    a.write_objects(vec![create("y", 2, Precondition::ResourceVersion(y))]).unwrap();
    let refused = a.write_objects(vec![create("y", 3, Precondition::ResourceVersion(y))]);
    assert!(matches!(refused, Err(StorageError::Conflict(_))), "{refused:?}");
    mirror.pause(false);
    assert_eq!(version_of(&b, "x").map(|(_, v)| v), Some(2));
    assert_eq!(version_of(&b, "y").map(|(_, v)| v), Some(2));
    // Many writes on both replicas: one dense order, none lost.
    let writers: Vec<_> = [a.clone(), b.clone()]
        .into_iter()
        .enumerate()
        .map(|(w, store)| {
            std::thread::spawn(move || {
                (0..50u64)
                    .map(|i| store.write_objects(vec![put_v(&format!("w{w}-{i}"), i)]).unwrap().resource_version)
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let mut rvs: Vec<u64> = writers.into_iter().flat_map(|w| w.join().unwrap()).collect();
    rvs.sort();
    rvs.dedup();
    assert_eq!(rvs.len(), 100, "two writes got one resourceVersion");
    assert_eq!(list(&a).1.len(), 102);
}

#[test]
fn a_cache_past_its_bound_falls_back_to_etcd_with_the_same_answers() {
    let backends = start_backends();
    let scratch = tempfile::tempdir().unwrap();
    let options = RemoteOptions { object_cache_bytes: 8 << 10, ..remote_options(&backends, "small") };
    let small = replica_with(options, scratch.path());
    let big = replica(&backends, "big", scratch.path());
    let mirror = small.backend().mirror().unwrap().clone();
    wait_until("the small cache never served while it fit", || mirror.serves());
    // Each write adds an object and a change-log entry: the small cache soon outgrows 8 KiB.
    for i in 0..60 {
        big.write_objects(vec![put_v(&format!("o{i:02}"), i)]).unwrap();
    }
    wait_until("the small cache did not give up", || !mirror.serves());
    assert_eq!(mirror.bytes(), 0, "a cache past its bound kept its objects");
    let pages = etcd_pages(&small);
    let (small_at, small_items) = list(&small);
    assert!(etcd_pages(&small) > pages, "a list on the small replica was not read from etcd");
    let (big_at, big_items) = list(&big);
    assert_eq!(small_items, big_items);
    assert_eq!(small_items.len(), 60);
    assert_eq!(small_at, big_at);
    for name in ["o00", "o31", "o59", "absent"] {
        assert_eq!(version_of(&small, name), version_of(&big, name), "{name}");
    }
    assert_eq!(small.changes_after(0, 1000).unwrap().len(), big.changes_after(0, 1000).unwrap().len());
}

#[test]
fn a_bundle_read_again_or_where_it_was_written_comes_from_the_replicas_disk_verified() {
    let backends = start_backends();
    let scratch = tempfile::tempdir().unwrap();
    let writer_metrics = RemoteMetrics::default();
    let a = replica_with(
        RemoteOptions { metrics: writer_metrics.clone(), ..remote_options(&backends, "a") },
        scratch.path(),
    );
    let metrics = RemoteMetrics::default();
    let b = replica_with(RemoteOptions { metrics: metrics.clone(), ..remote_options(&backends, "b") }, scratch.path());
    let files = vec![("big.bin".to_string(), noise(3, 3 << 20)), ("x.yaml".to_string(), b"kind: X\n".to_vec())];
    let (id, digest) = put(&a, "one", &files);
    // The replica that took the upload kept its blocks as it wrote them: none read from the bucket.
    a.inner.blocks.clear();
    assert_eq!(tar_digest(&a, id), digest);
    let (written_hits, written_misses) = writer_metrics.block_cache_counts();
    assert_eq!(written_misses, 0, "the writer read its own blocks back from the bucket");
    assert!(written_hits > 0, "the writer's read did not use its block cache");
    assert_eq!(tar_digest(&b, id), digest);
    let (hits, misses) = metrics.block_cache_counts();
    assert!(misses > 0, "the first read did not go to the bucket");
    // Read again, past the blocks decompressed in memory: every block from b's disk.
    b.inner.blocks.clear();
    assert_eq!(tar_digest(&b, id), digest);
    let (hits_again, misses_again) = metrics.block_cache_counts();
    assert_eq!(misses_again, misses, "a block was read from the bucket again");
    assert!(hits_again >= hits + misses, "{hits_again} hits after {misses} blocks were kept");
    // Damaged on disk: the read notices, reads the bucket again, and the bytes are right.
    let cached = scratch.path().join("b").join("block-cache");
    for entry in std::fs::read_dir(&cached).unwrap() {
        let path = entry.unwrap().path();
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0x40;
        std::fs::write(&path, bytes).unwrap();
    }
    b.inner.blocks.clear();
    assert_eq!(tar_digest(&b, id), digest, "a damaged cached block reached the reader");
    assert!(metrics.block_cache_counts().1 > misses_again, "the damaged blocks were not read from the bucket");
}
