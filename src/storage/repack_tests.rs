//! The repacker: a revision's blocks rewritten as long ones take less space, serve the same bytes,
//! keep zstd downloads made of stored frames (through compaction and reopening too), and leave
//! released revisions alone.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::frames_tests::{identity_tar, tar_download, text};
use super::*;

/// A chart-like tree whose second half repeats the first 1.6 MB later with a small change every
/// 4 KiB (so no chunk is shared): matches a 1 MiB block cannot see, a long block can.
fn far_repeats() -> Vec<(String, Vec<u8>)> {
    let first: Vec<(String, Vec<u8>)> = (0..40).map(|i| (format!("a/crd{i:02}.yaml"), text(100 + i, 40_000))).collect();
    let mut tree = first.clone();
    for (path, mut data) in first {
        for at in (0..data.len()).step_by(4096) {
            data[at] = b'#';
        }
        tree.push((path.replacen("a/", "b/", 1), data));
    }
    tree
}

fn write_tree(store: &Store, name: &str, files: &[(String, Vec<u8>)]) -> RevisionId {
    let mut writer = store.begin_revision().unwrap();
    for (path, data) in files {
        writer.add_file(path, 0o644, data.len() as u64, &mut &data[..]).unwrap();
    }
    super::tests::attach(name, writer.finalize().unwrap())
}

fn open_with(dir: &std::path::Path, repack_level: i32) -> Store {
    super::tests::open_with(dir, StoreOptions { repack_level, ..StoreOptions::default() })
}

fn repack(store: &Store, rev: RevisionId) {
    repack::repack_revision(&Arc::downgrade(&store.inner), rev).unwrap();
}

/// Stored bytes of the blocks a revision's plan names.
fn plan_bytes(store: &Store, rev: RevisionId) -> (usize, u64) {
    let plan = store.plan_entries(&store.revision(rev).unwrap()).unwrap();
    (plan.len(), plan.iter().map(|e| e.block.at.stored_len as u64).sum())
}

fn pack_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir.join("packs")).unwrap().map(|e| e.unwrap().metadata().unwrap().len()).sum()
}

/// [`far_repeats`] committed in a store that does not repack by itself, and its tar.
fn far_repeats_stored(name: &str) -> (tempfile::TempDir, Store, RevisionId, Vec<u8>) {
    let dir = tempfile::tempdir().unwrap();
    let store = open_with(dir.path(), 0);
    let rev = write_tree(&store, name, &far_repeats());
    let tar = identity_tar(&store, rev);
    (dir, store, rev, tar)
}

#[test]
fn a_repacked_revision_takes_less_space_and_its_zstd_download_is_still_stored_frames() {
    let (dir, store, rev, tar) = far_repeats_stored("far");
    let (blocks_before, bytes_before) = plan_bytes(&store, rev);
    let (wire_before, _, _) = tar_download(&store, rev).unwrap();
    assert!(blocks_before >= 3, "{blocks_before} blocks");
    let packs_before = pack_bytes(dir.path());

    repack(&store, rev);
    let record = store.revision(rev).unwrap();
    assert!(record.repacked && record.frames_anchored, "{record:?}");
    let (blocks, bytes) = plan_bytes(&store, rev);
    assert_eq!(blocks, 1, "3.3 MB of tar the plan covered whole is one block");
    assert!(bytes * 10 < bytes_before * 7, "stored {bytes_before} -> {bytes} bytes");
    assert!(identity_tar(&store, rev) == tar, "the same tar");
    let (wire, plain, stats) = tar_download(&store, rev).unwrap();
    assert!(plain == tar, "the zstd download decodes to the tar");
    assert_eq!(stats.stored, tar.len() as u64, "{stats:?}");
    assert!(wire.len() < wire_before.len() * 7 / 10, "{} -> {} bytes on the wire", wire_before.len(), wire.len());

    // The old blocks go: the collector sweeps the old plan and compacts the pack, copying the new
    // block whole — the plan's anchor finds it there (this pass, or the one the repacker asked for).
    store.collect().unwrap();
    assert!(store.counts().packs_compacted >= 1, "{:?}", store.counts());
    let packs_after = pack_bytes(dir.path());
    assert!(packs_after * 10 < packs_before * 7, "packs {packs_before} -> {packs_after} bytes");
    let (_, plain, stats) = tar_download(&store, rev).unwrap();
    assert!(plain == tar);
    assert_eq!(stats.stored, tar.len() as u64, "after compaction: {stats:?}");

    drop(store);
    let store = open_with(dir.path(), 0);
    let (_, plain, stats) = tar_download(&store, rev).unwrap();
    assert!(plain == tar && identity_tar(&store, rev) == tar);
    assert_eq!(stats.stored, tar.len() as u64, "after reopening: {stats:?}");
}

#[test]
fn the_store_repacks_what_it_commits_and_what_an_earlier_run_left() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_with(dir.path(), 0);
    let left = write_tree(&store, "left", &far_repeats());
    assert!(!store.revision(left).unwrap().repacked);
    assert_eq!(store.stats().unwrap().revisions_repack_pending, 0, "a store that does not repack owes none");
    drop(store);

    let store = open_with(dir.path(), repack::REPACK_LEVEL);
    let new = write_tree(
        &store,
        "new",
        &super::frames_tests::text(7, 2_000_000)
            .chunks(50_000)
            .enumerate()
            .map(|(i, c)| (format!("f{i:03}"), c.to_vec()))
            .collect::<Vec<_>>(),
    );
    store.warm_zstd_frames(new);
    let deadline = Instant::now() + Duration::from_secs(60);
    while store.stats().unwrap().revisions_repack_pending > 0 {
        assert!(Instant::now() < deadline, "still repacking after 60 s: {:?}", store.stats().unwrap());
        std::thread::sleep(Duration::from_millis(50));
    }
    for rev in [left, new] {
        assert!(store.revision(rev).unwrap().repacked, "revision {rev}");
        let (_, plain, stats) = tar_download(&store, rev).unwrap();
        assert!(plain == identity_tar(&store, rev));
        assert_eq!(stats.fresh, 0, "{stats:?}");
    }
}

#[test]
fn a_released_revision_is_not_repacked() {
    let (dir, store, rev, _) = far_repeats_stored("gone");
    let before = pack_bytes(dir.path());
    store.release_revision(rev).unwrap();
    repack(&store, rev);
    // The collector the release asked for may have removed the record already.
    match store.revision_record(rev) {
        Ok(record) => assert!(record.state == RevisionState::Deleting && !record.repacked, "{record:?}"),
        Err(e) => assert!(matches!(e, StorageError::NotFound(_)), "{e}"),
    }
    assert!(pack_bytes(dir.path()) <= before, "nothing written for it");
}

#[test]
fn content_that_does_not_compress_is_left_as_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_with(dir.path(), 0);
    let rev = write_tree(&store, "noise", &[("n.bin".to_string(), super::tests::noise(3, 3_000_000))]);
    let (blocks_before, bytes_before) = plan_bytes(&store, rev);
    let (_, _, before) = tar_download(&store, rev).unwrap();
    repack(&store, rev);
    let record = store.revision(rev).unwrap();
    assert!(record.repacked, "gone over");
    assert_eq!(plan_bytes(&store, rev), (blocks_before, bytes_before), "the same blocks");
    let (_, plain, stats) = tar_download(&store, rev).unwrap();
    assert!(plain == identity_tar(&store, rev));
    assert_eq!(stats.stored, before.stored, "{stats:?} against {before:?}");
}

#[test]
fn a_repack_cut_short_after_its_block_moved_chunks_leaves_a_store_that_serves_and_finishes() {
    let (dir, store, rev, tar) = far_repeats_stored("cut");
    let record = store.revision(rev).unwrap();
    // The stretch rewritten and its chunks moved, then nothing: no new plan, no `repacked`.
    let mut cursor = super::TarCursor::new(rev, record.tar_size);
    let (mut compressor, mut identity) = (repack::compressor(repack::REPACK_LEVEL).unwrap(), Vec::new());
    let weak = Arc::downgrade(&store.inner);
    let entry = repack::repack_stretch(&weak, &record, &mut cursor, 0, record.tar_size, &mut compressor, &mut identity);
    assert!(entry.unwrap().is_some(), "the stretch was rewritten");
    assert!(!store.revision(rev).unwrap().repacked);
    let (_, plain, _) = tar_download(&store, rev).unwrap();
    assert!(plain == tar && identity_tar(&store, rev) == tar, "served whole before the plan changed");
    drop(store);

    let store = open_with(dir.path(), repack::REPACK_LEVEL);
    let deadline = Instant::now() + Duration::from_secs(60);
    while store.stats().unwrap().revisions_repack_pending > 0 {
        assert!(Instant::now() < deadline, "the repack was not finished after 60 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(store.revision(rev).unwrap().repacked);
    store.collect().unwrap();
    let (_, plain, _) = tar_download(&store, rev).unwrap();
    assert!(plain == tar && identity_tar(&store, rev) == tar, "served whole after it was gone over again");
}
