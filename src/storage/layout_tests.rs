//! The served tar laid out as entries arrive (in path order) or by finalize (in any other order):
//! the same revision either way.

use super::chunks::BLOCK_TARGET;
use super::frames_tests::{identity_tar, tar_download, text};
use super::tests::{attach, open};
use super::*;

#[derive(Clone)]
enum Add {
    Dir,
    File(Vec<u8>),
    Symlink(&'static str),
    /// A hard link to the earlier file at this path (served as a copy of it).
    Hardlink(String),
}

/// Bytes also in the revision written before the tree (its chunks are stored already).
fn shared() -> Vec<u8> {
    text(7, 200_000)
}

/// A tree in path order (a directory's path with its `/`): small files, a file over a block, a
/// symlink, a file repeated inside the tree, an empty file and the shared bytes.
fn tree() -> Vec<(String, Add)> {
    let mut tree = vec![("a/".to_string(), Add::Dir), ("a/big.yaml".to_string(), Add::File(text(1, 3_500_000)))];
    for i in 0..60 {
        tree.push((format!("a/t/{i:03}.yaml"), Add::File(text(100 + i, 1_000 + (i as usize * 7_919) % 40_000))));
    }
    tree.push(("b-empty".to_string(), Add::File(Vec::new())));
    tree.push(("b-link".to_string(), Add::Symlink("a/big.yaml")));
    tree.push(("c/again.yaml".to_string(), Add::File(text(1, 3_500_000))));
    tree.push(("c/shared.yaml".to_string(), Add::File(shared())));
    tree.push(("d/more.yaml".to_string(), Add::File(text(3, 900_000))));
    tree
}

/// Writes `entries` (in the order given) into `store` after a revision holding the shared bytes;
/// returns the revision and the bytes spooled before finalize.
fn write(store: &Store, name: &str, entries: &[(String, Add)]) -> (RevisionId, u64) {
    let mut before = store.begin_revision().unwrap();
    let shared = shared();
    before.add_file("old/shared.yaml", 0o644, shared.len() as u64, &mut &shared[..]).unwrap();
    attach(&format!("{name}-before"), before.finalize().unwrap());
    let mut writer = store.begin_revision().unwrap();
    for (path, add) in entries {
        match add {
            Add::Dir => writer.add_dir(path, 0o755).unwrap(),
            Add::File(data) => writer.add_file(path, 0o644, data.len() as u64, &mut &data[..]).unwrap(),
            Add::Symlink(target) => writer.add_symlink(path, target).unwrap(),
            Add::Hardlink(target) => drop(writer.add_hardlink(path, target).unwrap()),
        }
    }
    let spooled = writer.spooled_bytes();
    (attach(name, writer.finalize().unwrap()), spooled)
}

/// What a user sees of a revision: its record's figures and its tar; and its zstd download's
/// make-up (stored frames or fresh).
fn served(store: &Store, rev: RevisionId) -> (String, u64, u64, u64, Vec<u8>, FrameStats) {
    let record = store.revision(rev).unwrap();
    let tar = identity_tar(store, rev);
    let (_, plain, stats) = tar_download(store, rev).unwrap();
    assert!(plain == tar, "the zstd download decodes to the tar");
    (record.digest, record.tar_size, record.files, record.stored_size, tar, stats)
}

#[test]
fn entries_in_path_order_skip_the_spool_and_give_the_revision_any_order_gives() {
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let stores: Vec<_> = dirs.iter().map(|d| open(d.path())).collect();
    let in_order = tree();
    let mut reversed = tree();
    reversed.reverse();
    // In order until a hard link (to a file already stored as a block) stops it, past the first
    // blocks: the tree is the same, as a hard link is served as a copy.
    let mut late_break = tree();
    let copy = late_break.iter_mut().find(|(path, _)| path == "c/again.yaml").unwrap();
    copy.1 = Add::Hardlink("a/big.yaml".into());

    let (a, spooled_a) = write(&stores[0], "ordered", &in_order);
    let (b, spooled_b) = write(&stores[1], "reversed", &reversed);
    let (c, spooled_c) = write(&stores[2], "late-break", &late_break);
    assert_eq!(spooled_a, 0, "entries in path order are laid out as they arrive");
    assert!(spooled_b > 4_000_000, "entries out of order are spooled ({spooled_b} bytes)");
    assert!(spooled_c > 0 && spooled_c < 2_000_000, "spooled after the break only ({spooled_c} bytes)");

    let (ordered, reverse, broken) = (served(&stores[0], a), served(&stores[1], b), served(&stores[2], c));
    assert!(ordered.4 == reverse.4, "the same tar");
    assert!(broken.4 == reverse.4, "the same tar after a late break");
    let figures = |s: &(String, u64, u64, u64, Vec<u8>, FrameStats)| (s.0.clone(), s.1, s.2);
    assert_eq!(figures(&ordered), figures(&reverse), "digest, tar size, files");
    assert_eq!(figures(&broken), figures(&reverse), "digest, tar size, files");
    // The same blocks and plan: the same stored size and download.
    assert_eq!(ordered.3, reverse.3, "stored size");
    assert_eq!(ordered.5, reverse.5, "zstd download");
    // All but the repeats and the shared bytes (about 3.7 MB) is sent as stored frames.
    assert!(reverse.5.stored > 5_000_000, "{:?}", reverse.5);
    for (path, add) in &in_order {
        let path = path.trim_end_matches('/');
        let (x, y) = (stores[0].file(a, path).unwrap(), stores[1].file(b, path).unwrap());
        assert_eq!(x.map(|e| (e.sha256, e.tar_offset)), y.map(|e| (e.sha256, e.tar_offset)), "{path}");
        if let Add::File(data) = add {
            let entry = stores[2].file(c, path).unwrap().unwrap();
            assert_eq!(entry.sha256, hex::encode(<sha2::Sha256 as sha2::Digest>::digest(data)), "{path}");
        }
    }
}

/// Reversed input stops laying out at its second entry: the block being built then is not
/// sealed but laid out again by finalize, so the plan still covers the whole tar.
#[test]
fn an_early_break_loses_no_stored_frame() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let mut writer = store.begin_revision().unwrap();
    let files: Vec<_> = (0..40).map(|i| (format!("f/{i:02}.yaml"), text(500 + i, 20_000))).collect();
    for (path, data) in files.iter().rev() {
        writer.add_file(path, 0o644, data.len() as u64, &mut &data[..]).unwrap();
    }
    let rev = attach("early", writer.finalize().unwrap());
    let tar = identity_tar(&store, rev);
    let (_, plain, stats) = tar_download(&store, rev).unwrap();
    assert!(plain == tar);
    assert_eq!(stats.stored, tar.len() as u64, "{stats:?}");
}

/// A file whose data is not the size declared for it is refused (its header would lie); the
/// writer goes on, and the revision is the one written without it.
#[test]
fn a_file_not_of_its_declared_size_is_refused_and_the_rest_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let (a, c) = (text(1, 70_000), text(2, 3_000));
    let mut writer = store.begin_revision().unwrap();
    writer.add_file("a.yaml", 0o644, a.len() as u64, &mut &a[..]).unwrap();
    for (path, declared, len) in [("b-short", 100_000, 50_000), ("b-long", 10, 20)] {
        let data = text(9, len);
        let err = writer.add_file(path, 0o644, declared, &mut &data[..]).unwrap_err();
        assert!(
            matches!(&err, StorageError::InvalidEntry { path: p, reason } if p == path && reason.contains("size declared")),
            "{err:?}"
        );
    }
    writer.add_file("c.yaml", 0o644, c.len() as u64, &mut &c[..]).unwrap();
    let rev = attach("sizes", writer.finalize().unwrap());

    let other = tempfile::tempdir().unwrap();
    let clean = open(other.path());
    let mut writer = clean.begin_revision().unwrap();
    writer.add_file("a.yaml", 0o644, a.len() as u64, &mut &a[..]).unwrap();
    writer.add_file("c.yaml", 0o644, c.len() as u64, &mut &c[..]).unwrap();
    let expected = attach("clean", writer.finalize().unwrap());
    assert_eq!(store.revision(rev).unwrap().digest, clean.revision(expected).unwrap().digest);
    assert!(identity_tar(&store, rev) == identity_tar(&clean, expected));
}

/// Files of about 50 kB under `dir`, in path order.
fn files_under(dir: &str, seed: u64, count: u64) -> Vec<(String, Vec<u8>)> {
    (0..count).map(|i| (format!("{dir}/{i:04}.yaml"), text(seed + i, 40_000 + (i as usize * 7_919) % 20_000))).collect()
}

/// The tar written in path order into a store of its own: (digest, tar).
fn written_in_order(files: &[(String, Vec<u8>)]) -> (String, Vec<u8>) {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let mut sorted = files.to_vec();
    sorted.sort();
    let mut writer = store.begin_revision().unwrap();
    for (path, data) in &sorted {
        writer.add_file(path, 0o644, data.len() as u64, &mut &data[..]).unwrap();
    }
    let rev = attach("in-order", writer.finalize().unwrap());
    (store.revision(rev).unwrap().digest, identity_tar(&store, rev))
}

/// In order for 6 MB, then entries that sort before all of it and between two of its directories:
/// the blocks sealed before the break whose stretch no later entry splits are sent as they are
/// stored, at their new offsets; the download is still exactly the tar.
#[test]
fn a_late_break_keeps_the_blocks_sealed_before_it_in_the_plan() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let (a, c) = (files_under("a", 1_000, 60), files_under("c", 2_000, 60));
    let late = [files_under("b", 3_000, 20), files_under("0-first", 4_000, 2)].concat();
    let before_break: u64 = a.iter().chain(&c).map(|(_, d)| d.len() as u64).sum();
    let mut writer = store.begin_revision().unwrap();
    for (path, data) in a.iter().chain(&c).chain(&late) {
        writer.add_file(path, 0o644, data.len() as u64, &mut &data[..]).unwrap();
    }
    assert!(writer.spooled_bytes() < 1_500_000, "the break came late ({} bytes spooled)", writer.spooled_bytes());
    let rev = attach("late", writer.finalize().unwrap());

    let tar = identity_tar(&store, rev);
    let (digest, expected) = written_in_order(&[a.clone(), c.clone(), late.clone()].concat());
    assert_eq!(store.revision(rev).unwrap().digest, digest);
    assert!(tar == expected, "the same tar as written in path order");
    let (_, plain, stats) = tar_download(&store, rev).unwrap();
    assert!(plain == tar, "the zstd download decodes to the tar");
    // All of `a/` and `c/` but the block holding both ends and the one built at the break.
    let kept_at_least = before_break - 3 * BLOCK_TARGET as u64;
    assert!(stats.stored >= kept_at_least, "{stats:?}: {before_break} bytes came before the break");
}

/// A file that fails part way after blocks of it were sealed is no entry of the revision: the
/// blocks holding its bytes (and the one holding its header) get no place in the plan.
#[test]
fn blocks_holding_a_file_that_failed_part_way_are_not_placed() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let a = files_under("a", 1_000, 30);
    let mut writer = store.begin_revision().unwrap();
    for (path, data) in &a {
        writer.add_file(path, 0o644, data.len() as u64, &mut &data[..]).unwrap();
    }
    let cut_short = text(9, 2_600_000);
    let err = writer.add_file("b/cut-short.yaml", 0o644, 3_000_000, &mut &cut_short[..]).unwrap_err();
    assert!(matches!(err, StorageError::InvalidEntry { .. }), "{err:?}");
    let c = files_under("c", 2_000, 10);
    for (path, data) in &c {
        writer.add_file(path, 0o644, data.len() as u64, &mut &data[..]).unwrap();
    }
    let rev = attach("failed", writer.finalize().unwrap());

    let tar = identity_tar(&store, rev);
    let (digest, expected) = written_in_order(&[a.clone(), c.clone()].concat());
    assert_eq!(store.revision(rev).unwrap().digest, digest);
    assert!(tar == expected);
    let (_, plain, stats) = tar_download(&store, rev).unwrap();
    assert!(plain == tar, "no block of the failed file is sent: {stats:?}");
}
