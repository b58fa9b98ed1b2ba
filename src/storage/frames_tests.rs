//! zstd downloads made of stored frames: what they decode to, how much of them is stored frames,
//! and that a damaged block is refused rather than sent.

use super::tests::open;
use super::*;

/// Compressible text, different per seed (YAML-like lines).
pub(super) fn text(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E3779B97F4A7C15) | 1;
    let mut out = Vec::with_capacity(len + 64);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(format!("  key{}: value-{} # {}\n", x % 997, (x >> 20) % 89, seed).as_bytes());
    }
    out.truncate(len);
    out
}

/// Files of a chart-like tree, listed out of path order (as `tar` of a directory lists them).
fn tree(seed: u64, files: usize) -> Vec<(String, Vec<u8>)> {
    let mut tree: Vec<(String, Vec<u8>)> = (0..files)
        .map(|i| {
            (
                format!("charts/c{}/templates/t{i:04}.yaml", i % 7),
                text(seed * 1000 + i as u64, 2_000 + (i * 7_919) % 60_000),
            )
        })
        .collect();
    tree.reverse();
    tree
}

fn write_tree(store: &Store, name: &str, files: &[(String, Vec<u8>)]) -> RevisionId {
    let mut writer = store.begin_revision().unwrap();
    writer.add_dir("charts", 0o755).unwrap();
    for (path, data) in files {
        writer.add_file(path, 0o644, data.len() as u64, &mut &data[..]).unwrap();
    }
    super::tests::attach(name, writer.finalize().unwrap())
}

pub(super) fn identity_tar(store: &Store, rev: RevisionId) -> Vec<u8> {
    let record = store.revision(rev).unwrap();
    let mut out = Vec::new();
    store
        .read_tar(rev, record.tar_size, RangeSpec { start: 0, end: record.tar_size }, &mut |b| {
            out.extend_from_slice(b);
            Ok(())
        })
        .unwrap();
    out
}

/// The whole zstd download: its bytes on the wire, what they decode to, and how they were made.
fn zstd_download(store: &Store, mut download: ZstdDownload) -> Result<(Vec<u8>, Vec<u8>, FrameStats)> {
    let mut wire = Vec::new();
    while store.zstd_step(&mut download, &mut wire)? {}
    let plain = zstd::stream::decode_all(&wire[..]).expect("a valid zstd stream");
    Ok((wire, plain, download.stats()))
}

pub(super) fn tar_download(store: &Store, rev: RevisionId) -> Result<(Vec<u8>, Vec<u8>, FrameStats)> {
    zstd_download(store, ZstdDownload::tar(&store.revision(rev).unwrap()))
}

#[test]
fn a_fresh_revisions_zstd_download_is_its_stored_frames_and_decodes_to_its_tar() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let rev = write_tree(&store, "fresh", &tree(1, 300));
    let tar = identity_tar(&store, rev);
    let (wire, plain, stats) = tar_download(&store, rev).unwrap();
    assert!(plain == tar, "the zstd download decodes to the identity tar");
    assert_eq!(stats.stored + stats.fresh, tar.len() as u64);
    // Blocks follow the tar although the files were written out of path order, headers, padding
    // and trailer included: the whole download is stored frames.
    assert_eq!(stats.stored, tar.len() as u64, "{stats:?} of {} bytes", tar.len());
    assert!(wire.len() * 4 < tar.len(), "{} bytes on the wire for {}", wire.len(), tar.len());
}

#[test]
fn a_revision_sharing_chunks_with_another_decodes_to_its_tar() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let first = tree(2, 200);
    write_tree(&store, "first", &first);
    // Every third file changed, the others shared with the first revision, and one file twice.
    let mut second: Vec<(String, Vec<u8>)> = first
        .iter()
        .enumerate()
        .map(|(i, (path, data))| {
            (path.clone(), if i % 3 == 0 { text(7_000 + i as u64, data.len()) } else { data.clone() })
        })
        .collect();
    second.push(("copy.yaml".into(), second[5].1.clone()));
    let rev = write_tree(&store, "second", &second);
    let tar = identity_tar(&store, rev);
    let (_, plain, stats) = tar_download(&store, rev).unwrap();
    assert!(plain == tar, "the zstd download decodes to the identity tar");
    // New files between shared ones make blocks too small to be worth a stretch of their own:
    // they are packed compactly and this download is compressed afresh.
    assert!(stats.fresh > 0, "shared chunks are compressed afresh: {stats:?}");
}

#[test]
fn a_large_files_zstd_download_is_mostly_stored_frames() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let big = text(3, 6 << 20);
    let rev = write_tree(&store, "big", &[("small.yaml".into(), text(4, 3_000)), ("big.yaml".into(), big.clone())]);
    let entry = store.file(rev, "big.yaml").unwrap().unwrap();
    let (_, plain, stats) = zstd_download(&store, ZstdDownload::file(&store.revision(rev).unwrap(), entry)).unwrap();
    assert!(plain == big, "the zstd download decodes to the file");
    // The file starts a block; only its last one holds tar bytes past it.
    assert!(stats.stored * 100 >= big.len() as u64 * 80, "{stats:?}");
}

#[test]
fn after_compaction_a_zstd_download_still_decodes_to_the_tar() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let kept = write_tree(&store, "kept", &tree(5, 40));
    write_tree(&store, "gone", &tree(6, 300));
    store
        .write_objects(vec![ObjectWrite::Delete {
            key: ObjectKey::new("bundlecontents", "ns", "gone"),
            precondition: Precondition::None,
        }])
        .unwrap();
    // The pack is mostly dead: this pass (or the one the delete asked for) seals and compacts it.
    store.collect().unwrap();
    assert!(store.counts().packs_compacted >= 1, "{:?}", store.counts());
    let tar = identity_tar(&store, kept);
    let (_, plain, _) = tar_download(&store, kept).unwrap();
    assert!(plain == tar, "the zstd download decodes to the identity tar");
}

#[test]
fn a_damaged_stored_block_is_refused_not_sent() {
    let dir = tempfile::tempdir().unwrap();
    let rev = {
        let store = open(dir.path());
        write_tree(&store, "c", &tree(8, 100))
    };
    let pack = std::fs::read_dir(dir.path().join("packs")).unwrap().next().unwrap().unwrap().path();
    let mut bytes = std::fs::read(&pack).unwrap();
    // Inside the first block's payload (its directory is a few hundred bytes).
    bytes[20_000] ^= 0x01;
    std::fs::write(&pack, bytes).unwrap();
    let store = open(dir.path());
    let result = tar_download(&store, rev);
    assert!(matches!(result, Err(StorageError::Corrupt(_))), "{:?}", result.map(|r| r.2));
}

#[test]
fn chunks_repeated_within_a_revision_are_stored_once_and_compressed_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let chart = tree(9, 60);
    let one = write_tree(&store, "one", &chart);
    let one_copy = store.revision(one).unwrap().stored_size;
    // Five copies of one chart, as the corpus holds five versions of kube-prometheus-stack.
    let copies: Vec<(String, Vec<u8>)> =
        (0..5).flat_map(|v| chart.iter().map(move |(p, d)| (format!("v{v}/{p}"), d.clone()))).collect();
    let dir2 = tempfile::tempdir().unwrap();
    let store = open(dir2.path());
    let rev = write_tree(&store, "copies", &copies);
    let stored = store.revision(rev).unwrap().stored_size;
    assert!(
        stored < one_copy + one_copy / 10,
        "repeats are stored once: {stored} bytes against {one_copy} for one copy"
    );
    let tar = identity_tar(&store, rev);
    let (wire, plain, first) = tar_download(&store, rev).unwrap();
    assert!(plain == tar, "the zstd download decodes to the identity tar");
    assert!(first.stored * 100 >= tar.len() as u64 * 15, "the first copy is stored frames: {first:?}");
    assert!(first.fresh > 0 && first.cached == 0, "{first:?}");
    // The next downloads send the repeats as cached frames, recompressed smaller in the background.
    store.inner.fresh_frames.wait_for_upgrades();
    let (again, plain, second) = tar_download(&store, rev).unwrap();
    assert!(plain == tar, "the cached frames decode to the identity tar");
    assert_eq!(second, FrameStats { stored: first.stored, fresh: 0, cached: first.fresh });
    assert!(again.len() < wire.len(), "upgraded frames are smaller: {} against {}", again.len(), wire.len());
    // Filler is carried by the chunks' shares: a pass that frees nothing rewrites nothing.
    store.collect().unwrap();
    assert_eq!(store.counts().packs_compacted, 0, "{:?}", store.counts());
}

/// `copies` copies of one chart under `v0/`, `v1/`, …: the repeats are compressed afresh.
fn copies_of(chart: &[(String, Vec<u8>)], copies: usize) -> Vec<(String, Vec<u8>)> {
    (0..copies).flat_map(|v| chart.iter().map(move |(p, d)| (format!("v{v}/{p}"), d.clone()))).collect()
}

fn warm(store: &Store, rev: RevisionId) {
    super::frames::warm_fresh_frames(&std::sync::Arc::downgrade(&store.inner), rev).unwrap();
}

#[test]
fn a_warmed_revisions_first_zstd_download_compresses_nothing_and_is_smaller() {
    let copies = copies_of(&tree(12, 40), 4);
    // The same revision in a store that was not warmed: what a cold first download sends.
    let cold_dir = tempfile::tempdir().unwrap();
    let cold_store = open(cold_dir.path());
    let cold_rev = write_tree(&cold_store, "copies", &copies);
    let (cold_wire, _, cold) = tar_download(&cold_store, cold_rev).unwrap();
    assert!(cold.fresh > 0 && cold.cached == 0, "{cold:?}");

    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let rev = write_tree(&store, "copies", &copies);
    warm(&store, rev);
    let tar = identity_tar(&store, rev);
    let (wire, plain, first) = tar_download(&store, rev).unwrap();
    assert!(plain == tar, "the warmed frames decode to the identity tar");
    // All of it long frames, stored blocks' stretches too.
    assert_eq!(first, FrameStats { stored: 0, fresh: 0, cached: tar.len() as u64 });
    assert!(wire.len() < cold_wire.len(), "warmed at the upgrade level: {} against {}", wire.len(), cold_wire.len());
}

#[test]
fn a_warmed_revision_sends_fewer_bytes_than_its_stored_frames() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let rev = write_tree(&store, "fresh", &tree(14, 300));
    let tar = identity_tar(&store, rev);
    let (stored_wire, _, stored) = tar_download(&store, rev).unwrap();
    assert_eq!(stored.stored, tar.len() as u64, "{stored:?}");
    warm(&store, rev);
    let (wire, plain, warmed) = tar_download(&store, rev).unwrap();
    assert!(plain == tar, "the long frames decode to the identity tar");
    assert_eq!(warmed, FrameStats { stored: 0, fresh: 0, cached: tar.len() as u64 });
    assert!(wire.len() < stored_wire.len(), "long frames: {} bytes, stored frames: {}", wire.len(), stored_wire.len());
    // A download of one file starts inside a long frame: it is made of the stored frames, as before.
    let entry = store.file(rev, &tree(14, 300)[7].0).unwrap().unwrap();
    let data = tree(14, 300)[7].1.clone();
    let (_, plain, _) = zstd_download(&store, ZstdDownload::file(&store.revision(rev).unwrap(), entry)).unwrap();
    assert!(plain == data);
}

#[test]
fn content_that_hardly_compresses_is_not_warmed() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let rev = write_tree(&store, "noise", &[("noise.bin".into(), super::tests::noise(9, 3 << 20))]);
    warm(&store, rev);
    assert_eq!(store.inner.fresh_frames.bytes(), 0);
}

#[test]
fn warming_stops_at_half_the_cache() {
    // Several long frames' worth of tar.
    let copies = copies_of(&tree(13, 40), 60);
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let rev = write_tree(&store, "copies", &copies);
    warm(&store, rev);
    let all = store.inner.fresh_frames.bytes();
    let (_, _, warmed) = tar_download(&store, rev).unwrap();
    assert!(warmed.fresh == 0 && warmed.cached > 0, "{warmed:?}");

    assert!(store.revision(rev).unwrap().tar_size > 3 * super::frame_cache::LONG_FRAME);
    // A cache a quarter larger than all the frames: warming fills half of it, then stops.
    let limit = all * 5 / 4;
    let small_dir = tempfile::tempdir().unwrap();
    let small =
        Store::open(small_dir.path(), StoreOptions { frame_cache_bytes: limit, ..StoreOptions::default() }).unwrap();
    let rev = write_tree(&small, "copies", &copies);
    warm(&small, rev);
    let held = small.inner.fresh_frames.bytes();
    assert!(held > 0 && held < all, "{held} bytes held in a cache of {limit}, all of them {all}");
    let tar_len = small.revision(rev).unwrap().tar_size;
    let (_, _, partly) = tar_download(&small, rev).unwrap();
    assert!(partly.cached > 0 && partly.cached < tar_len, "{partly:?}");
}

#[test]
fn the_fresh_frame_cache_is_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let options = StoreOptions { frame_cache_bytes: 0, ..StoreOptions::default() };
    let store = Store::open(dir.path(), options).unwrap();
    let chart = tree(10, 30);
    let copies: Vec<(String, Vec<u8>)> =
        (0..2).flat_map(|v| chart.iter().map(move |(p, d)| (format!("v{v}/{p}"), d.clone()))).collect();
    let rev = write_tree(&store, "copies", &copies);
    let (_, _, first) = tar_download(&store, rev).unwrap();
    let (_, _, second) = tar_download(&store, rev).unwrap();
    assert!(first.fresh > 0);
    assert_eq!(second, first, "nothing kept with a cache of 0 bytes");
}

#[test]
fn incompressible_blocks_go_out_as_raw_zstd_frames() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let noise = super::tests::noise(11, 3 << 20);
    let rev = write_tree(&store, "noise", &[("blob.bin".into(), noise.clone()), ("a.yaml".into(), text(1, 5_000))]);
    let tar = identity_tar(&store, rev);
    let (wire, plain, stats) = tar_download(&store, rev).unwrap();
    assert!(plain == tar, "the zstd download decodes to the identity tar");
    assert_eq!(stats.stored, tar.len() as u64, "{stats:?}");
    assert!(wire.len() < tar.len() + tar.len() / 100, "raw frames cost a few bytes per 128 KiB");
    let entry = store.file(rev, "blob.bin").unwrap().unwrap();
    let (_, plain, _) = zstd_download(&store, ZstdDownload::file(&store.revision(rev).unwrap(), entry)).unwrap();
    assert!(plain == noise, "one file as zstd decodes to its bytes");
}

#[test]
fn raw_frames_decode_at_every_size() {
    for len in [0usize, 1, 131_071, 131_072, 131_073, 1 << 20] {
        let data = super::tests::noise(len as u64, len);
        let frame = super::frames::raw_frame_for_tests(&data);
        assert_eq!(zstd::stream::decode_all(&frame[..]).unwrap(), data, "{len} bytes");
    }
}

#[test]
fn a_lost_frame_plan_costs_speed_not_the_download() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let rev = write_tree(&store, "c", &tree(12, 50));
    let root = store.revision(rev).unwrap().frames_root().unwrap().expect("a fresh revision has a plan");
    store.tree().remove(super::chunks::chunk_key(&root.hash)).unwrap();
    let tar = identity_tar(&store, rev);
    let (_, plain, stats) = tar_download(&store, rev).unwrap();
    assert!(plain == tar, "the zstd download decodes to the identity tar");
    assert_eq!(stats.stored, 0, "without its plan, every stretch is rebuilt from verified chunks");
}
