//! Store tests: round trips through the served tar, ranges, dedup, garbage collection, recovery
//! after an interrupted write, and corruption detection.

use std::io::Read;

use serde_json::json;

use super::*;
use sha2::Digest;

/// Opens the store, waiting for a background collection pass of a handle dropped just before to
/// release the database lock (only a test reopens a store within one process), and returns it
/// once the collection recovery owes has run: tests write keys behind the store's back, which a
/// pass running meanwhile would take for garbage.
pub(super) fn open(dir: &Path) -> Store {
    // No repacker: its background writes would move what these tests count (its own tests turn
    // it on).
    open_with(dir, StoreOptions { repack_level: 0, ..StoreOptions::default() })
}

/// Opens `dir` once the store last opened there has let go of it (its background threads may
/// still hold it for a moment), and waits for recovery.
pub(super) fn open_with(dir: &Path, options: StoreOptions) -> Store {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let store = loop {
        match Store::open(dir, options.clone()) {
            Err(StorageError::Engine(e)) if std::time::Instant::now() < deadline && e.to_string().contains("lock") => {
                std::thread::sleep(std::time::Duration::from_millis(20))
            }
            other => break other.unwrap(),
        }
    };
    assert!(store.wait_recovered(std::time::Duration::from_secs(20)), "recovery did not finish in 20 s");
    store
}

/// Deterministic pseudo-random bytes (incompressible, no accidental dedup).
pub(crate) fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E3779B97F4A7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn write(store: &Store, files: &[(&str, Vec<u8>)]) -> PendingRevision {
    let mut writer = store.begin_revision().unwrap();
    for (path, data) in files {
        writer
            .add_file(path, if path.ends_with(".sh") { 0o755 } else { 0o644 }, data.len() as u64, &mut &data[..])
            .unwrap();
    }
    writer.finalize().unwrap()
}

pub(super) fn attach(name: &str, mut pending: PendingRevision) -> RevisionId {
    let id = pending.record().id;
    let key = ObjectKey::new("bundlecontents", "ns", name);
    let object = json!({"metadata": {"name": name}});
    pending
        .commit(vec![ObjectWrite::Put { key, object, precondition: Precondition::MustNotExist, revision: Some(id) }])
        .unwrap();
    id
}

fn read_all(store: &Store, rev: RevisionId, range: RangeSpec) -> Vec<u8> {
    let record = store.revision(rev).unwrap();
    let mut out = Vec::new();
    store
        .read_tar(rev, record.tar_size, range, &mut |b| {
            out.extend_from_slice(b);
            Ok(())
        })
        .unwrap();
    out
}

#[test]
fn served_tar_round_trips_and_matches_its_digest() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let big = noise(1, 300_000);
    let long = format!("{}/file.yaml", "deep/".repeat(40));
    let pending = write(
        &store,
        &[
            ("b.yaml", b"kind: X\n".to_vec()),
            ("a/big.bin", big.clone()),
            (&long, vec![]),
            ("run.sh", b"#!/bin/sh\n".to_vec()),
        ],
    );
    let rev = attach("c1", pending);
    let record = store.revision(rev).unwrap();
    let tar = read_all(&store, rev, RangeSpec { start: 0, end: record.tar_size });
    assert_eq!(tar.len() as u64, record.tar_size);
    assert_eq!(format!("sha256:{}", hex::encode(sha2::Sha256::digest(&tar))), record.digest);

    let mut archive = tar::Archive::new(&tar[..]);
    let mut seen = Vec::new();
    for entry in archive.entries().unwrap() {
        let mut entry = entry.unwrap();
        let mut data = Vec::new();
        entry.read_to_end(&mut data).unwrap();
        seen.push((entry.path().unwrap().to_string_lossy().into_owned(), entry.header().mode().unwrap(), data));
    }
    let paths: Vec<&str> = seen.iter().map(|s| s.0.as_str()).collect();
    assert_eq!(paths, vec!["a/big.bin", "b.yaml", long.as_str(), "run.sh"]);
    assert_eq!(seen[0].2, big);
    assert_eq!(seen[3].1, 0o755);
}

#[test]
fn every_range_equals_the_slice_of_the_whole() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let pending = write(&store, &[("x", noise(2, 200_000)), ("y", noise(3, 1000)), ("z/w", noise(4, 70_000))]);
    let rev = attach("c1", pending);
    let size = store.revision(rev).unwrap().tar_size;
    let whole = read_all(&store, rev, RangeSpec { start: 0, end: size });
    for (start, end) in
        [(0, 1), (100, 600), (511, 513), (512, 200_512), (199_000, 202_000), (size - 1030, size), (size - 1, size)]
    {
        assert_eq!(
            read_all(&store, rev, RangeSpec { start, end }),
            whole[start as usize..end as usize],
            "{start}-{end}"
        );
    }
    let entry = store.file(rev, "x").unwrap().unwrap();
    let mut part = Vec::new();
    store
        .read_file(rev, &entry, RangeSpec { start: 65_000, end: 140_000 }, &mut |b| {
            part.extend_from_slice(b);
            Ok(())
        })
        .unwrap();
    assert_eq!(part, noise(2, 200_000)[65_000..140_000]);
}

#[test]
fn a_file_whose_chunk_list_spans_segments_reads_back_across_them() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    // More than 2 × 1024 chunks of at most 64 KiB: three segment chunks.
    let data = noise(21, 70 << 20);
    let rev = attach("big", write(&store, &[("big.bin", data.clone())]));
    let entry = store.file(rev, "big.bin").unwrap().unwrap();
    assert!(matches!(&entry.chunks, manifest::ChunkList::Segments(s) if s.len() >= 2), "{:?}", entry.chunks);
    for (start, end) in [(0, data.len()), (1000, 40 << 20), (33 << 20, (33 << 20) + 10)] {
        let mut read = Vec::new();
        let range = RangeSpec { start: start as u64, end: end as u64 };
        store
            .read_file(rev, &entry, range, &mut |b| {
                read.extend_from_slice(b);
                Ok(())
            })
            .unwrap();
        assert!(read == data[start..end], "bytes {start}..{end} differ");
    }
}

/// Files met again (in the same revision or a later one) are not hashed again, yet every file's
/// `sha256` is its own: one sharing only its first chunks with another, or only its last, one
/// too large to be held back from hashing, and an empty one.
#[test]
fn every_file_keeps_its_own_sha256_when_its_content_was_met_before() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let base = noise(11, 400_000);
    let mut head_changed = noise(12, 1_000);
    head_changed.extend_from_slice(&base[1_000..]);
    let mut tail_changed = base[..390_000].to_vec();
    tail_changed.extend_from_slice(&noise(13, 10_000));
    let large = noise(14, 3_000_000);
    let files = [
        ("a/base", base.clone()),
        ("a/empty", Vec::new()),
        ("a/large", large.clone()),
        ("b/base", base.clone()),
        ("b/empty", Vec::new()),
        ("b/head-changed", head_changed),
        ("b/large", large),
        ("b/tail-changed", tail_changed),
    ];
    let first = attach("k1", write(&store, &files));
    let mut again: Vec<(&str, Vec<u8>)> = files.iter().map(|(p, d)| (*p, d.clone())).collect();
    again.push(("c/short", base[..200_000].to_vec()));
    let second = attach("k2", write(&store, &again));
    for (rev, files) in [(first, &files[..]), (second, &again[..])] {
        for (path, data) in files {
            let entry = store.file(rev, path).unwrap().unwrap();
            assert_eq!(entry.sha256, hex::encode(sha2::Sha256::digest(data)), "{path} in revision {rev:?}");
        }
    }
}

#[test]
fn identical_files_are_stored_once_and_deleting_releases_space() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let data = noise(5, 500_000);
    let r1 = attach("c1", write(&store, &[("a", data.clone())]));
    let after_one = store.stats().unwrap();
    attach("c2", write(&store, &[("b", data.clone()), ("c", data.clone())]));
    let after_two = store.stats().unwrap();
    // Only the new revision's manifest (a page and its index) is new.
    assert_eq!(after_two.chunks, after_one.chunks + 2, "same content adds no chunks");

    store
        .write_objects(vec![ObjectWrite::Delete {
            key: ObjectKey::new("bundlecontents", "ns", "c2"),
            precondition: Precondition::None,
        }])
        .unwrap();
    store.collect().unwrap();
    assert_eq!(store.stats().unwrap().chunks, after_one.chunks, "still referenced by c1");
    assert_eq!(read_all(&store, r1, RangeSpec { start: 512, end: 512 + 500_000 }), data);

    store
        .write_objects(vec![ObjectWrite::Delete {
            key: ObjectKey::new("bundlecontents", "ns", "c1"),
            precondition: Precondition::None,
        }])
        .unwrap();
    store.collect().unwrap();
    let empty = store.stats().unwrap();
    assert_eq!((empty.chunks, empty.revisions_committed, empty.revisions_deleting), (0, 0, 0));
}

#[test]
fn an_interrupted_write_leaves_nothing_after_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let kept;
    {
        let store = open(dir.path());
        kept = attach("c1", write(&store, &[("keep", noise(6, 100_000))]));
        let mut writer = store.begin_revision().unwrap();
        writer.add_file("lost", 0o644, 300_000, &mut &noise(7, 300_000)[..]).unwrap();
        store.flush().unwrap();
        assert_eq!(store.stats().unwrap().revisions_staging, 1);
        writer.simulate_crash();
    }
    let store = open(dir.path());
    let stats = store.stats().unwrap();
    assert_eq!(stats.revisions_staging, 0);
    assert_eq!(stats.revisions_committed, 1);
    let expected_chunks = {
        let fresh = tempfile::tempdir().unwrap();
        let other = open(fresh.path());
        attach("c1", write(&other, &[("keep", noise(6, 100_000))]));
        other.stats().unwrap().chunks
    };
    assert_eq!(stats.chunks, expected_chunks, "orphan chunks were collected");
    assert_eq!(read_all(&store, kept, RangeSpec { start: 512, end: 512 + 100_000 }), noise(6, 100_000));
}

#[test]
fn a_chunk_sealed_before_its_reference_survives_no_sweep_after_a_crash() {
    // A writer seals blocks before it records the segment that references their chunks; a pass in
    // between must keep those chunks, and a crash before the segment must still free them.
    let dir = tempfile::tempdir().unwrap();
    {
        let store = open(dir.path());
        let data = noise(11, 40_000);
        let hash = *blake3::hash(&data).as_bytes();
        assert!(store.pin_and_check(hash).unwrap().is_none());
        let mut block = chunks::BlockBuilder::default();
        block.push(hash, &data);
        store.seal_block(&mut block).unwrap();
        store.collect().unwrap();
        assert_eq!(store.stats().unwrap().chunks, 1, "a pinned chunk was swept");
        store.flush().unwrap();
    }
    let store = open(dir.path());
    assert_eq!(store.stats().unwrap().chunks, 0, "an unreferenced chunk outlived the crash");
}

#[test]
fn a_damaged_chunk_is_an_error_not_wrong_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let rev = {
        let store = open(dir.path());
        attach("c1", write(&store, &[("f", noise(8, 50_000))]))
    };
    let pack = std::fs::read_dir(dir.path().join("packs")).unwrap().next().unwrap().unwrap().path();
    let mut bytes = std::fs::read(&pack).unwrap();
    // Inside the first block's payload: the file's content (the manifest comes after it).
    bytes[2_000] ^= 0x55;
    std::fs::write(&pack, bytes).unwrap();
    // A fresh handle: nothing of the block is cached.
    let store = open(dir.path());
    let entry = store.file(rev, "f").unwrap().unwrap();
    let result = store.read_file(rev, &entry, RangeSpec { start: 0, end: 50_000 }, &mut |_| Ok(()));
    assert!(matches!(result, Err(StorageError::Corrupt(_))), "{result:?}");
}

#[test]
fn a_damaged_manifest_keeps_neither_the_store_closed_nor_its_other_revisions_from_serving() {
    let dir = tempfile::tempdir().unwrap();
    let kept = {
        let store = open(dir.path());
        attach("kept", write(&store, &[("k", noise(30, 100_000))]))
    };
    // Reopened: the next revision goes to a new pack, its manifest last.
    let damaged = {
        let store = open(dir.path());
        attach("damaged", write(&store, &[("d", noise(31, 100_000))]))
    };
    let newest = std::fs::read_dir(dir.path().join("packs")).unwrap().map(|e| e.unwrap().path()).max().unwrap();
    let mut bytes = std::fs::read(&newest).unwrap();
    let last = bytes.len() - 20;
    bytes[last] ^= 0x55;
    std::fs::write(&newest, bytes).unwrap();
    let store = open(dir.path());
    assert_eq!(read_all(&store, kept, RangeSpec { start: 512, end: 512 + 100_000 }), noise(30, 100_000));
    assert!(matches!(store.file(damaged, "d"), Err(StorageError::Corrupt(_))));
    // A pass that would sweep (an abandoned write) stops at the damage without taking anything.
    let mut abandoned = store.begin_revision().unwrap();
    abandoned.add_file("a", 0o644, 1000, &mut &noise(32, 1000)[..]).unwrap();
    drop(abandoned);
    // (The background collector may have run that pass already; either way it stopped.)
    let _ = store.collect();
    assert_eq!(read_all(&store, kept, RangeSpec { start: 512, end: 512 + 100_000 }), noise(30, 100_000));
}

#[test]
fn mostly_dead_packs_are_compacted() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    attach("small", write(&store, &[("s", noise(9, 100_000))]));
    attach("big", write(&store, &[("b", noise(10, 2_000_000))]));
    let pack_bytes = || -> u64 {
        std::fs::read_dir(dir.path().join("packs")).unwrap().map(|e| e.unwrap().metadata().unwrap().len()).sum()
    };
    let before = pack_bytes();
    store
        .write_objects(vec![ObjectWrite::Delete {
            key: ObjectKey::new("bundlecontents", "ns", "big"),
            precondition: Precondition::None,
        }])
        .unwrap();
    // The pack holding both is still the active one: once less than half of it is live, a pass
    // seals it and compacts it (this one, or the one the delete asked for).
    store.collect().unwrap();
    let after = pack_bytes();
    assert!(after + 1_900_000 < before, "packs {before} -> {after}");
    // The counts say so: a sweep, the pack compacted with small's ~100 KB of incompressible
    // chunks copied, flushes along the way.
    let counts = store.counts();
    assert!(counts.sweeps >= 1 && counts.flushes >= 1, "{counts:?}");
    assert!(counts.packs_compacted >= 1 && counts.compacted_bytes > 90_000, "{counts:?}");
    let rev = store.get_object(&ObjectKey::new("bundlecontents", "ns", "small")).unwrap().unwrap().revision.unwrap();
    assert_eq!(read_all(&store, rev, RangeSpec { start: 512, end: 512 + 100_000 }), noise(9, 100_000));
}

#[test]
fn the_change_log_stays_within_its_byte_budget_and_says_what_it_no_longer_covers() {
    let dir = tempfile::tempdir().unwrap();
    let options = StoreOptions { change_log_bytes: 64 << 10, ..StoreOptions::default() };
    let store = Store::open(dir.path(), options.clone()).unwrap();
    let mut last = 0;
    for i in 0..3000u64 {
        // Incompressible enough that the budget, not the length, bounds the log.
        let noise = hex::encode(noise(i, 200));
        last = store.write_objects(vec![put_v(&format!("o{}", i % 50), i)]).unwrap().resource_version;
        let mut object = serde_json::json!({"metadata": {"name": format!("n{i}")}, "data": noise});
        object["i"] = serde_json::json!(i);
        store
            .write_objects(vec![ObjectWrite::Put {
                key: ObjectKey::new("bundles", "ns", &format!("n{}", i % 50)),
                object,
                precondition: Precondition::None,
                revision: None,
            }])
            .unwrap();
    }
    let logged: u64 = store.tree().range(key(b'l', &[])..key(b'm', &[])).map(|i| i.unwrap().1.len() as u64).sum();
    assert!(logged <= 64 << 10, "the log holds {logged} bytes");
    assert!(!store.log_covers(1).unwrap(), "the oldest changes went");
    assert!(store.log_covers(last).unwrap());
    let recent: Vec<u64> = store.changes_since(last - 1).map(|c| c.unwrap().0).collect();
    assert_eq!(recent, vec![last, last + 1], "recent changes read back whole");
    // Reopened, the budget still holds (the log's size is counted at open).
    drop(store);
    let store = Store::open(dir.path(), options).unwrap();
    for i in 0..500u64 {
        store.write_objects(vec![put_v("again", i)]).unwrap();
    }
    let logged: u64 = store.tree().range(key(b'l', &[])..key(b'm', &[])).map(|i| i.unwrap().1.len() as u64).sum();
    assert!(logged <= 64 << 10, "the log holds {logged} bytes after a restart");
}

#[test]
fn resource_versions_are_monotonic_and_preconditions_hold() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let key = ObjectKey::new("bundles", "ns", "b");
    let put = |precondition| ObjectWrite::Put {
        key: key.clone(),
        object: json!({"metadata": {"name": "b"}}),
        precondition,
        revision: None,
    };
    let first = store.write_objects(vec![put(Precondition::MustNotExist)]).unwrap().resource_version;
    assert!(matches!(store.write_objects(vec![put(Precondition::MustNotExist)]), Err(StorageError::AlreadyExists(_))));
    assert!(matches!(
        store.write_objects(vec![put(Precondition::ResourceVersion(first + 7))]),
        Err(StorageError::Conflict(_))
    ));
    let second = store.write_objects(vec![put(Precondition::ResourceVersion(first))]).unwrap().resource_version;
    assert!(second > first);
    let stored = store.get_object(&key).unwrap().unwrap();
    assert_eq!(stored.value["metadata"]["resourceVersion"], json!(second.to_string()));
    let events: Vec<_> = store.changes_since(0).map(|e| e.unwrap()).collect();
    assert_eq!(events.iter().map(|(_, e)| e.kind.as_str()).collect::<Vec<_>>(), vec!["ADDED", "MODIFIED"]);
}

#[test]
fn change_log_reads_never_split_one_resource_version() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let put = |name: &str| ObjectWrite::Put {
        key: ObjectKey::new("bundles", "ns", name),
        object: json!({"metadata": {"name": name}}),
        precondition: Precondition::MustNotExist,
        revision: None,
    };
    store.write_objects(vec![put("a")]).unwrap();
    let both = store.write_objects(vec![put("b"), put("c")]).unwrap().resource_version;
    store.write_objects(vec![put("d")]).unwrap();
    // A limit of 2 would end between b and c: the read takes c along.
    let first = store.changes_after(0, 2).unwrap();
    assert_eq!(first.iter().map(|(_, e)| e.name.as_str()).collect::<Vec<_>>(), vec!["a", "b", "c"]);
    assert_eq!(first.last().unwrap().0, both);
    let rest = store.changes_after(both, 2).unwrap();
    assert_eq!(rest.iter().map(|(_, e)| e.name.as_str()).collect::<Vec<_>>(), vec!["d"]);
}

/// A paged list started at one resourceVersion stays at it: later creates, updates and deletes do
/// not show up in the remaining pages, until the log no longer covers it.
#[test]
fn paged_lists_are_consistent_snapshots() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), StoreOptions { change_log_len: 8, ..StoreOptions::default() }).unwrap();
    let put = |name: &str, v: u64| ObjectWrite::Put {
        key: ObjectKey::new("bundles", "ns", name),
        object: json!({"metadata": {"name": name}, "v": v}),
        precondition: Precondition::None,
        revision: None,
    };
    for name in ["a", "b", "c", "d", "e"] {
        store.write_objects(vec![put(name, 1)]).unwrap();
    }
    let all = None;
    let names = |page: &ListPage| {
        page.items.iter().map(|o| o["metadata"]["name"].as_str().unwrap().to_string()).collect::<Vec<_>>()
    };
    let query = |at, after, limit| ListQuery { resource: "bundles", namespace: Some("ns"), at, after, limit };
    let first = store.list_page(&query(None, None, Some(2)), all).unwrap();
    assert_eq!(names(&first), ["a", "b"]);
    assert_eq!(first.last.as_deref(), Some("ns/b"));
    // Changes after the first page: c modified, d deleted, f and b2 created.
    store.write_objects(vec![put("c", 2)]).unwrap();
    store
        .write_objects(vec![ObjectWrite::Delete {
            key: ObjectKey::new("bundles", "ns", "d"),
            precondition: Precondition::None,
        }])
        .unwrap();
    store.write_objects(vec![put("f", 1), put("b2", 1)]).unwrap();
    let at = Some(first.resource_version);
    let second = store.list_page(&query(at, first.last.as_deref(), Some(2)), all).unwrap();
    assert_eq!(names(&second), ["c", "d"]);
    assert_eq!(second.items[0]["v"], json!(1), "c as it was at the snapshot");
    let third = store.list_page(&query(at, second.last.as_deref(), Some(2)), all).unwrap();
    assert_eq!(names(&third), ["e"]);
    assert!(third.last.is_none());
    // A filter counts toward the limit only for objects it keeps.
    let only_v2 = |o: &serde_json::Value| o["v"] == json!(2);
    assert_eq!(names(&store.list_page(&query(None, None, Some(1)), Some(&only_v2)).unwrap()), ["c"]);
    // Too new, then too old once the log moved on.
    let current = store.current_resource_version().unwrap();
    assert!(matches!(store.list_page(&query(Some(current + 5), None, None), all), Err(StorageError::TooNew { .. })));
    for v in 0..20 {
        store.write_objects(vec![put("a", v)]).unwrap();
    }
    assert!(matches!(store.list_page(&query(at, first.last.as_deref(), Some(2)), all), Err(StorageError::Expired(_))));
}

/// Writers reusing chunks while other revisions sharing them are deleted and collected, all at
/// once: every revision that was committed reads back whole, and nothing survives deletion.
#[test]
fn collection_never_takes_a_chunk_a_concurrent_writer_reuses() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let shared: Vec<Vec<u8>> = (0..6).map(|i| noise(100 + i, 120_000)).collect();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let collector = {
        let (store, stop) = (store.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                store.collect().unwrap();
            }
        })
    };
    let writers: Vec<_> = (0..2)
        .map(|w| {
            let (store, shared) = (store.clone(), shared.clone());
            std::thread::spawn(move || {
                let mut kept = Vec::new();
                for round in 0..12 {
                    let name = format!("w{w}-{round}");
                    let mut files: Vec<(String, Vec<u8>)> =
                        shared.iter().enumerate().map(|(i, d)| (format!("s{i}"), d.clone())).collect();
                    files.push(("own".into(), noise(1000 + w * 100 + round, 50_000)));
                    let refs: Vec<(&str, Vec<u8>)> = files.iter().map(|(p, d)| (p.as_str(), d.clone())).collect();
                    let rev = attach(&name, write(&store, &refs));
                    if round % 2 == 0 {
                        // Delete every other revision right away: its shared chunks stay referenced.
                        let key = ObjectKey::new("bundlecontents", "ns", &name);
                        store
                            .write_objects(vec![ObjectWrite::Delete { key, precondition: Precondition::None }])
                            .unwrap();
                    } else {
                        kept.push((rev, files));
                    }
                }
                kept
            })
        })
        .collect();
    let kept: Vec<_> = writers.into_iter().flat_map(|w| w.join().unwrap()).collect();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    collector.join().unwrap();
    store.collect().unwrap();
    for (rev, files) in &kept {
        for (path, data) in files {
            let entry = store.file(*rev, path).unwrap().unwrap();
            let mut got = Vec::new();
            store
                .read_file(*rev, &entry, RangeSpec { start: 0, end: entry.size }, &mut |b| {
                    got.extend_from_slice(b);
                    Ok(())
                })
                .unwrap();
            assert!(got == *data, "revision {rev} file {path} damaged");
        }
    }
    let stats = store.stats().unwrap();
    assert_eq!((stats.revisions_committed, stats.revisions_deleting, stats.revisions_staging), (12, 0, 0));
}

pub(super) fn put_v(name: &str, v: u64) -> ObjectWrite {
    ObjectWrite::Put {
        key: ObjectKey::new("bundles", "ns", name),
        object: json!({"metadata": {"name": name}, "v": v}),
        precondition: Precondition::None,
        revision: None,
    }
}

pub(super) fn delete_obj(name: &str) -> ObjectWrite {
    ObjectWrite::Delete { key: ObjectKey::new("bundles", "ns", name), precondition: Precondition::None }
}

/// `(name, v)` of every object of a page.
pub(super) fn name_and_v(items: &[serde_json::Value]) -> Vec<(String, u64)> {
    items.iter().map(|o| (o["metadata"]["name"].as_str().unwrap().to_string(), o["v"].as_u64().unwrap())).collect()
}

/// A sink that runs `on_first` when it gets its first object, and counts restarts.
struct Intercept<F: FnMut()> {
    items: Vec<serde_json::Value>,
    on_first: Option<F>,
    restarts: usize,
}

impl<F: FnMut()> ListSink for Intercept<F> {
    fn push(&mut self, object: Listed<'_>) -> Result<()> {
        if let Some(mut on_first) = self.on_first.take() {
            on_first();
        }
        self.items.push(object.into_value()?);
        Ok(())
    }
    fn restart(&mut self) {
        self.restarts += 1;
        self.items.clear();
    }
}

/// A list takes no lock writers need: writes made (from another thread) while a list is being read
/// complete at once, and the list still shows the state it started at.
#[test]
fn a_list_in_progress_neither_blocks_writers_nor_sees_their_changes() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let names = ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j"];
    for name in names {
        store.write_objects(vec![put_v(name, 1)]).unwrap();
    }
    let at = store.current_resource_version().unwrap();
    let writer = store.clone();
    let write_meanwhile = move || {
        let (done, finished) = std::sync::mpsc::channel();
        let writer = writer.clone();
        std::thread::spawn(move || {
            // Later in key order than the page's first object: the scan has not passed them yet.
            writer.write_objects(vec![put_v("h", 2)]).unwrap();
            writer.write_objects(vec![delete_obj("i")]).unwrap();
            writer.write_objects(vec![put_v("c2", 1), put_v("z", 1)]).unwrap();
            done.send(()).unwrap();
        });
        let waited = finished.recv_timeout(std::time::Duration::from_secs(10));
        assert!(waited.is_ok(), "a writer was blocked by a list in progress");
    };
    let sink = Intercept { items: Vec::new(), on_first: Some(write_meanwhile), restarts: 0 };
    let query = ListQuery { resource: "bundles", namespace: Some("ns"), at: None, after: None, limit: None };
    let page = store.list_into(&query, None, sink).unwrap();
    assert_eq!(page.resource_version, at);
    let expected: Vec<(String, u64)> = names.iter().map(|n| (n.to_string(), 1)).collect();
    assert_eq!(name_and_v(&page.items.items), expected, "the list is the state it started at");
    assert_eq!(page.items.restarts, 0);
    // The next list sees the writes.
    let after = store.list_page(&query, None).unwrap();
    let names_now: Vec<String> = name_and_v(&after.items).into_iter().map(|(n, _)| n).collect();
    assert_eq!(names_now, ["a", "b", "c", "c2", "d", "e", "f", "g", "h", "j", "z"]);
    assert!(after.resource_version > at);
}

/// A fresh list whose version the change log drops while the list is being read starts over once,
/// at a newer version; a continuation at a named version is Expired instead.
#[test]
fn a_fresh_list_the_log_outran_starts_over_at_a_newer_version() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), StoreOptions { change_log_len: 4, ..StoreOptions::default() }).unwrap();
    for name in ["a", "b", "c", "d", "e"] {
        store.write_objects(vec![put_v(name, 1)]).unwrap();
    }
    let started_at = store.current_resource_version().unwrap();
    let writer = store.clone();
    // Ten writes while the first object is handed over: the log (4 entries) no longer covers the
    // version the list started at. No lock is held, so this thread may write itself.
    let outrun = move || {
        for v in 2..12 {
            writer.write_objects(vec![put_v("d", v)]).unwrap();
        }
    };
    let sink = Intercept { items: Vec::new(), on_first: Some(outrun), restarts: 0 };
    let query = ListQuery { resource: "bundles", namespace: Some("ns"), at: None, after: None, limit: None };
    let page = store.list_into(&query, None, sink).unwrap();
    assert_eq!(page.items.restarts, 1);
    assert_eq!(page.resource_version, started_at + 10);
    let expected: Vec<(String, u64)> =
        [("a", 1), ("b", 1), ("c", 1), ("d", 11), ("e", 1)].iter().map(|(n, v)| (n.to_string(), *v)).collect();
    assert_eq!(name_and_v(&page.items.items), expected);

    // The same at an explicit version: no second chance.
    let at = store.current_resource_version().unwrap();
    let writer = store.clone();
    let outrun = move || {
        for v in 20..30 {
            writer.write_objects(vec![put_v("d", v)]).unwrap();
        }
    };
    let sink = Intercept { items: Vec::new(), on_first: Some(outrun), restarts: 0 };
    let query = ListQuery { at: Some(at), ..query };
    assert!(matches!(store.list_into(&query, None, sink), Err(StorageError::Expired(_))));
}

/// Lists and paged lists read while a writer creates, updates and deletes objects are each exactly
/// the state at their resourceVersion.
#[test]
fn lists_during_concurrent_writes_are_exact_snapshots() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    check_exact_snapshots(&store, &store);
}

/// `writer` writes a seeded sequence while `lister` lists whole and in pages of 7 without pause;
/// every list must be exactly the state at its resourceVersion. (Two replicas in replicated mode.)
pub(super) fn check_exact_snapshots(store: &Store, lister: &Store) {
    use std::collections::BTreeMap;
    let mut model: BTreeMap<String, u64> = BTreeMap::new();
    for i in 0..40 {
        let name = format!("o{i:02}");
        store.write_objects(vec![put_v(&name, 0)]).unwrap();
        model.insert(name, 0);
    }
    let mut history = vec![(store.current_resource_version().unwrap(), model.clone())];
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let lister = {
        let (store, stop) = (lister.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut seen: Vec<(u64, Vec<(String, u64)>)> = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let query =
                    |at, after, limit| ListQuery { resource: "bundles", namespace: Some("ns"), at, after, limit };
                let whole = store.list_page(&query(None, None, None), None).unwrap();
                seen.push((whole.resource_version, name_and_v(&whole.items)));
                // Pages of 7, every page at the first one's version.
                let first = store.list_page(&query(None, None, Some(7)), None).unwrap();
                let mut items = name_and_v(&first.items);
                let mut last = first.last.clone();
                while let Some(after) = last {
                    let next = ListQuery {
                        at: Some(first.resource_version),
                        after: Some(&after),
                        ..query(None, None, Some(7))
                    };
                    let page = store.list_page(&next, None).unwrap();
                    assert_eq!(page.resource_version, first.resource_version);
                    items.extend(name_and_v(&page.items));
                    last = page.last;
                }
                seen.push((first.resource_version, items));
            }
            seen
        })
    };
    let mut x: u64 = 7;
    for step in 1..=400u64 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let name = format!("o{:02}", x % 50);
        let write = if model.contains_key(&name) && x.is_multiple_of(3) {
            model.remove(&name);
            delete_obj(&name)
        } else {
            model.insert(name.clone(), step);
            put_v(&name, step)
        };
        let rv = store.write_objects(vec![write]).unwrap().resource_version;
        history.push((rv, model.clone()));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let seen = lister.join().unwrap();
    let (first, last) = (history[0].0, history[history.len() - 1].0);
    assert!(seen.iter().any(|(rv, _)| *rv > first && *rv < last), "no list ran while the writer wrote");
    for (rv, items) in seen {
        let state = &history.iter().rev().find(|(at, _)| *at <= rv).unwrap().1;
        let expected: Vec<(String, u64)> = state.iter().map(|(n, v)| (n.clone(), *v)).collect();
        assert_eq!(items, expected, "list at {rv}");
    }
}

/// Lists and gets send an object's JSON as the store holds it, without decoding it: those bytes
/// must be exactly what serialising the decoded object writes (escapes, non-ASCII text, numbers,
/// key order), for the live object and for one a list reads back from the change log.
#[test]
fn stored_json_is_what_the_decoded_object_serialises_to() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let object = |v: u64| {
        json!({
            "metadata": {"name": "a", "labels": {"z": "1", "a": "\u{e9}t\u{e9} \"quoted\" \\ \n\t\u{1f600}"}},
            "spec": {"zeta": 1.5e-7, "alpha": -12, "big": u64::MAX, "list": [true, null, {"k": "\u{7}"}], "v": v},
        })
    };
    let put = |v: u64| ObjectWrite::Put {
        key: ObjectKey::new("bundles", "ns", "a"),
        object: object(v),
        precondition: Precondition::None,
        revision: None,
    };
    store.write_objects(vec![put(1)]).unwrap();
    let at = store.current_resource_version().unwrap();
    let key = ObjectKey::new("bundles", "ns", "a");
    let decoded = store.get_object(&key).unwrap().unwrap().value;
    assert_eq!(decoded["spec"]["v"], json!(1));
    let json = store.get_object_json(&key).unwrap().unwrap();
    assert_eq!(String::from_utf8(json).unwrap(), serde_json::to_string(&decoded).unwrap());

    /// Keeps the JSON each object is listed with.
    struct Json(Vec<String>);
    impl ListSink for Json {
        fn push(&mut self, object: Listed<'_>) -> Result<()> {
            let mut out = Vec::new();
            object.write_json(&mut out);
            self.0.push(String::from_utf8(out).unwrap());
            Ok(())
        }
        fn restart(&mut self) {
            self.0.clear();
        }
    }
    let query = |at| ListQuery { resource: "bundles", namespace: Some("ns"), at, after: None, limit: None };
    let live = store.list_into(&query(None), None, Json(Vec::new())).unwrap().items.0;
    assert_eq!(live, [serde_json::to_string(&decoded).unwrap()]);
    // Changed since: the list at `at` reads the object from the log, decoded.
    store.write_objects(vec![put(2)]).unwrap();
    let past = store.list_into(&query(Some(at)), None, Json(Vec::new())).unwrap().items.0;
    assert_eq!(past, live, "the object as it was at {at}");
    let now = store.list_into(&query(None), None, Json(Vec::new())).unwrap().items.0;
    assert_eq!(now, [serde_json::to_string(&store.get_object(&key).unwrap().unwrap().value).unwrap()]);
    assert!(now[0].contains("\"v\":2"), "{}", now[0]);
}

/// An envelope is split without reading its object, with or without a revision; any other
/// spelling still reads (through serde), and what is not an envelope is refused.
#[test]
fn stored_envelopes_split_into_version_and_object_json() {
    use super::objects::decode_stored;
    let object = r#"{"metadata":{"name":"a \"}\" b"},"v":[1,{"x":"}"}]}"#;
    for envelope in [
        format!(r#"{{"rv":42,"object":{object}}}"#),
        format!(r#"{{"rv":42,"revision":7,"object":{object}}}"#),
        format!(r#"{{ "rv": 42, "object": {object} }}"#),
        format!(r#"{{"object":{object},"rv":42}}"#),
    ] {
        let found = decode_stored(envelope.as_bytes()).unwrap();
        assert_eq!((found.rv, std::str::from_utf8(found.object).unwrap()), (42, object), "{envelope}");
    }
    for broken in [r#"{"rv":42}"#, r#"{"rv":"x","object":{}}"#, "", r#"{"rv":42,"object":{"#] {
        assert!(decode_stored(broken.as_bytes()).is_err(), "{broken}");
    }
}
