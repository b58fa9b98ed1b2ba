//! The spool's files and offsets: fresh, resumed and whole downloads, a server ignoring `Range`,
//! and what a failed check leaves behind.

use std::cell::Cell;
use std::collections::HashSet;
use std::io::Read;

use super::*;

fn data() -> Vec<u8> {
    (0..300_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect()
}

fn spool(dir: &tempfile::TempDir) -> Spool {
    Downloads::new(dir.path().join("downloads")).for_bundle("0b6e4b3c-uid")
}

/// An opener serving `data` from the offset asked for (or whole), recording the offsets asked.
fn server<'a>(data: &'a [u8], asked: &'a Cell<Vec<u64>>, whole: bool) -> OpenRest<'a> {
    Box::new(move |offset| {
        let mut seen = asked.take();
        seen.push(offset);
        asked.set(seen);
        let start = if whole { 0 } else { offset as usize };
        let body: Box<dyn Read> = Box::new(data.get(start..).unwrap_or_default());
        Ok(if whole { Rest::Whole(body) } else { Rest::From(body) })
    })
}

fn never<'a>() -> OpenRest<'a> {
    Box::new(|offset| panic!("the network was asked for the rest from {offset}"))
}

/// Reads `n` bytes, then drops the reader: what a crash or a cut connection leaves.
fn read_some(download: &Download, data: &[u8], n: usize) {
    let asked = Cell::new(Vec::new());
    let mut reader = download.reader(server(data, &asked, false)).unwrap();
    let mut buf = vec![0; n];
    reader.read_exact(&mut buf).unwrap();
    assert_eq!(buf, data[..n]);
}

fn read_all(mut reader: SpoolReader<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    reader.read_to_end(&mut out).unwrap();
    out
}

#[test]
fn a_cut_download_resumes_from_its_offset_and_is_kept_complete() {
    let (dir, data) = (tempfile::tempdir().unwrap(), data());
    let spool = spool(&dir);
    let key = "sha256-abc";
    let first = spool.open(key, Some(data.len() as u64), &Scratch::default()).unwrap();
    assert_eq!((first.on_disk(), first.is_whole()), (0, false));
    read_some(&first, &data, 100_000);
    let partial = dir.path().join("downloads/0b6e4b3c-uid/sha256-abc.partial");
    assert_eq!(std::fs::read(&partial).unwrap(), data[..100_000], "the partial file is what was read");

    let second = spool.open(key, Some(data.len() as u64), &Scratch::default()).unwrap();
    assert_eq!((second.on_disk(), second.is_whole()), (100_000, false));
    let asked = Cell::new(Vec::new());
    assert_eq!(read_all(second.reader(server(&data, &asked, false)).unwrap()), data);
    assert_eq!(asked.take(), vec![100_000], "only the rest was asked for");
    assert_eq!(std::fs::read(&partial).unwrap(), data);
    second.settle(Ok(())).unwrap();
    assert!(!partial.exists());
    assert_eq!(std::fs::read(dir.path().join("downloads/0b6e4b3c-uid/sha256-abc")).unwrap(), data);

    let third = spool.open(key, Some(data.len() as u64), &Scratch::default()).unwrap();
    assert_eq!((third.on_disk(), third.is_whole()), (data.len() as u64, true));
    assert_eq!(read_all(third.reader(never()).unwrap()), data, "a complete download is read from disk only");
}

#[test]
fn a_server_ignoring_range_has_the_bytes_on_disk_skipped() {
    let (dir, data) = (tempfile::tempdir().unwrap(), data());
    let spool = spool(&dir);
    read_some(&spool.open("k", None, &Scratch::default()).unwrap(), &data, 70_000);
    let resumed = spool.open("k", None, &Scratch::default()).unwrap();
    let asked = Cell::new(Vec::new());
    assert_eq!(read_all(resumed.reader(server(&data, &asked, true)).unwrap()), data);
    assert_eq!(asked.take(), vec![70_000]);
    assert_eq!(std::fs::read(dir.path().join("downloads/0b6e4b3c-uid/k.partial")).unwrap(), data, "nothing twice");
}

#[test]
fn a_failed_check_drops_the_download_and_a_resumed_one_is_retried() {
    let (dir, data) = (tempfile::tempdir().unwrap(), data());
    let spool = spool(&dir);
    let files = |key: &str| {
        let base = dir.path().join("downloads/0b6e4b3c-uid").join(key);
        (base.exists(), base.with_extension("partial").exists())
    };
    let mismatch = || UnpackError::DigestMismatch { what: "b".into(), expected: "x".into(), actual: "y".into() };

    // Fresh: the mismatch stands (the source is wrong), and nothing is kept.
    let fresh = spool.open("fresh", None, &Scratch::default()).unwrap();
    read_some(&fresh, &data, 10);
    assert!(matches!(fresh.settle::<()>(Err(mismatch())), Err(UnpackError::DigestMismatch { .. })));
    assert_eq!(files("fresh"), (false, false));

    // Resumed: the bytes on disk may be at fault: dropped, and the failure is transient.
    read_some(&spool.open("resumed", None, &Scratch::default()).unwrap(), &data, 10);
    let resumed = spool.open("resumed", None, &Scratch::default()).unwrap();
    let err = resumed.settle::<()>(Err(UnpackError::CorruptArchive("truncated archive".into()))).unwrap_err();
    assert!(err.is_transient() && err.to_string().contains("downloads it again"), "{err}");
    assert_eq!(files("resumed"), (false, false));

    // A network failure keeps what is on disk, to resume from.
    read_some(&spool.open("cut", None, &Scratch::default()).unwrap(), &data, 10);
    let cut = spool.open("cut", None, &Scratch::default()).unwrap();
    assert!(cut.settle::<()>(Err(UnpackError::Fetch("connection reset".into()))).is_err());
    assert_eq!(files("cut"), (false, true));

    // A partial file as long as the whole blob cannot be a prefix of it: dropped.
    let long = spool.open("cut", Some(10), &Scratch::default()).unwrap();
    assert_eq!(long.on_disk(), 0);
    assert_eq!(files("cut"), (false, false));
}

#[test]
fn sweeping_keeps_only_the_named_bundles_and_remove_empties_one() {
    let dir = tempfile::tempdir().unwrap();
    let downloads = Downloads::new(dir.path().join("downloads"));
    let data = data();
    for uid in ["keep-me", "stale"] {
        read_some(&downloads.for_bundle(uid).open("k", None, &Scratch::default()).unwrap(), &data, 10);
    }
    downloads.sweep(&HashSet::from(["keep-me".to_owned()]));
    assert!(dir.path().join("downloads/keep-me/k.partial").exists());
    assert!(!dir.path().join("downloads/stale").exists());
    downloads.for_bundle("keep-me").remove();
    assert!(!dir.path().join("downloads/keep-me").exists());
    // Names that are not plain file names never leave the directory.
    let odd = downloads.for_bundle("../../escape");
    read_some(&odd.open("../x", None, &Scratch::default()).unwrap(), &data, 10);
    let entries: Vec<_> = std::fs::read_dir(dir.path().join("downloads")).unwrap().flatten().collect();
    assert_eq!(entries.len(), 1);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}
