//! Tests for [`super::ingest`]: round trips, every rejection, and error attribution.

use super::paths::normalize;
use super::*;
use std::io::Write;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Event {
    File(String, u32, Vec<u8>),
    Dir(String, u32),
    Symlink(String, String),
    Hardlink(String, String),
}

#[derive(Debug, thiserror::Error)]
#[error("sink failed: {0}")]
struct SinkError(String);

#[derive(Default)]
struct VecSink {
    events: Vec<Event>,
    /// Read at most this many bytes of each file.
    read_limit: Option<usize>,
    /// Fail when asked to store this path.
    fail_on: Option<String>,
    /// Pretend read errors did not happen (store what was read).
    swallow_read_errors: bool,
}

impl EntrySink for VecSink {
    type Error = SinkError;
    fn file(&mut self, path: &str, mode: u32, size: u64, data: &mut dyn Read) -> Result<(), SinkError> {
        if self.fail_on.as_deref() == Some(path) {
            return Err(SinkError("disk full".into()));
        }
        let mut buf = Vec::new();
        let read = match self.read_limit {
            Some(n) => data.take(n as u64).read_to_end(&mut buf),
            None => data.read_to_end(&mut buf),
        };
        if !self.swallow_read_errors {
            read.map_err(|e| SinkError(e.to_string()))?;
            if self.read_limit.is_none() {
                assert_eq!(buf.len() as u64, size, "{path}: the data is not the size announced");
            }
        }
        self.events.push(Event::File(path.into(), mode, buf));
        Ok(())
    }
    fn dir(&mut self, path: &str, mode: u32) -> Result<(), SinkError> {
        self.events.push(Event::Dir(path.into(), mode));
        Ok(())
    }
    fn symlink(&mut self, path: &str, target: &str) -> Result<(), SinkError> {
        self.events.push(Event::Symlink(path.into(), target.into()));
        Ok(())
    }
    fn hardlink(&mut self, path: &str, target: &str) -> Result<(), SinkError> {
        self.events.push(Event::Hardlink(path.into(), target.into()));
        Ok(())
    }
}

fn run_with(
    body: &[u8],
    encoding: Encoding,
    limits: &IngestLimits,
) -> (Result<IngestStats, IngestError<SinkError>>, Vec<Event>) {
    let mut sink = VecSink::default();
    let result = ingest(body, encoding, limits, &mut sink);
    (result, sink.events)
}

fn run_ok(body: &[u8]) -> (IngestStats, Vec<Event>) {
    let (result, events) = run_with(body, Encoding::Identity, &IngestLimits::default());
    match result {
        Ok(stats) => (stats, events),
        Err(e) => panic!("expected success, got {e:?}"),
    }
}

fn run_err(body: &[u8]) -> IngestError<SinkError> {
    run_with(body, Encoding::Identity, &IngestLimits::default()).0.expect_err("expected an error")
}

#[track_caller]
fn assert_invalid(err: IngestError<SinkError>, want_path: &str, reason_part: &str) {
    match err {
        IngestError::InvalidEntry { path, reason } => {
            assert_eq!(path, want_path, "reason was {reason:?}");
            assert!(reason.contains(reason_part), "reason {reason:?} lacks {reason_part:?}");
        }
        other => panic!("expected InvalidEntry({want_path}), got {other:?}"),
    }
}

#[track_caller]
fn assert_corrupt(err: IngestError<SinkError>, part: &str) {
    match err {
        IngestError::Corrupt(msg) => assert!(msg.contains(part), "{msg:?} lacks {part:?}"),
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

fn builder() -> tar::Builder<Vec<u8>> {
    tar::Builder::new(Vec::new())
}

fn add_file(b: &mut tar::Builder<Vec<u8>>, path: &str, mode: u32, data: &[u8]) {
    let mut h = tar::Header::new_gnu();
    h.set_size(data.len() as u64);
    h.set_mode(mode);
    h.set_entry_type(tar::EntryType::Regular);
    b.append_data(&mut h, path, data).unwrap();
}

fn add_dir(b: &mut tar::Builder<Vec<u8>>, path: &str) {
    let mut h = tar::Header::new_gnu();
    h.set_size(0);
    h.set_mode(0o755);
    h.set_entry_type(tar::EntryType::Directory);
    b.append_data(&mut h, path, io::empty()).unwrap();
}

fn add_link(b: &mut tar::Builder<Vec<u8>>, kind: tar::EntryType, path: &str, target: &str) {
    let mut h = tar::Header::new_gnu();
    h.set_size(0);
    h.set_mode(0o777);
    h.set_entry_type(kind);
    b.append_link(&mut h, path, target).unwrap();
}

/// A raw header with arbitrary name/link bytes (bypassing the builder's path checks).
fn raw_entry(name: &[u8], kind: u8, link: &[u8], data: &[u8]) -> Vec<u8> {
    let mut h = tar::Header::new_gnu();
    h.as_old_mut().name[..name.len()].copy_from_slice(name);
    h.as_old_mut().linkname[..link.len()].copy_from_slice(link);
    h.as_old_mut().linkflag = [kind];
    h.set_size(data.len() as u64);
    h.set_mode(0o644);
    h.set_cksum();
    let mut out = h.as_bytes().to_vec();
    out.extend_from_slice(data);
    out.resize(out.len().div_ceil(512) * 512, 0);
    out
}

fn raw_archive(entries: &[Vec<u8>]) -> Vec<u8> {
    let mut out: Vec<u8> = entries.concat();
    out.extend_from_slice(&[0; 1024]);
    out
}

fn good_tar() -> Vec<u8> {
    let long = format!("deep/{}/file.txt", "x".repeat(150));
    let mut b = builder();
    add_dir(&mut b, "./");
    add_dir(&mut b, "./bin/");
    add_file(&mut b, "./bin/run.sh", 0o755, b"#!/bin/sh\necho hi\n");
    add_file(&mut b, "data//nested/./a.txt", 0o644, b"hello");
    add_file(&mut b, &long, 0o600, &[7u8; 1000]);
    add_link(&mut b, tar::EntryType::Symlink, "bin/latest", "../data/nested/a.txt");
    add_link(&mut b, tar::EntryType::Link, "copy.txt", "./data/nested/a.txt");
    add_link(&mut b, tar::EntryType::Link, "copy2.txt", "copy.txt");
    add_file(&mut b, "empty", 0o644, b"");
    b.into_inner().unwrap()
}

fn good_events() -> Vec<Event> {
    let long = format!("deep/{}/file.txt", "x".repeat(150));
    vec![
        Event::Dir("bin".into(), 0o755),
        Event::File("bin/run.sh".into(), 0o755, b"#!/bin/sh\necho hi\n".to_vec()),
        Event::File("data/nested/a.txt".into(), 0o644, b"hello".to_vec()),
        Event::File(long, 0o600, vec![7u8; 1000]),
        Event::Symlink("bin/latest".into(), "../data/nested/a.txt".into()),
        Event::Hardlink("copy.txt".into(), "data/nested/a.txt".into()),
        // A link to a link names the link: it is a regular file (a copy) by then.
        Event::Hardlink("copy2.txt".into(), "copy.txt".into()),
        Event::File("empty".into(), 0o644, Vec::new()),
    ]
}

const GOOD_STATS: IngestStats = IngestStats { files: 6, symlinks: 1, dirs: 1, bytes: 18 + 5 + 1000 + 5 + 5 };

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    enc.write_all(data).unwrap();
    enc.finish().unwrap()
}

#[test]
fn good_tar_round_trips() {
    let (stats, events) = run_ok(&good_tar());
    assert_eq!(events, good_events());
    assert_eq!(stats, GOOD_STATS);
}

/// Directories the archive names reach the sink once each, with their modes (the first entry's
/// if named twice), empty ones too, before or after their contents; implied ones do not. Modes
/// keep their permission bits only.
#[test]
fn named_directories_and_permission_bits_reach_the_sink() {
    let mut b = builder();
    add_file(&mut b, "tree/late/f", 0o4755, b"x");
    let dir = |b: &mut tar::Builder<Vec<u8>>, path: &str, mode: u32| {
        let mut h = tar::Header::new_gnu();
        h.set_size(0);
        h.set_mode(mode);
        h.set_entry_type(tar::EntryType::Directory);
        b.append_data(&mut h, path, io::empty()).unwrap();
    };
    dir(&mut b, "tree/late/", 0o700);
    dir(&mut b, "charts/", 0o1777);
    dir(&mut b, "charts/", 0o755);
    add_file(&mut b, "secret", 0o600, b"s");
    add_file(&mut b, "odd", 0o100640, b"o");
    let (stats, events) = run_ok(&b.into_inner().unwrap());
    assert_eq!(
        events,
        vec![
            Event::File("tree/late/f".into(), 0o755, b"x".to_vec()),
            Event::Dir("tree/late".into(), 0o700),
            Event::Dir("charts".into(), 0o777),
            Event::File("secret".into(), 0o600, b"s".to_vec()),
            Event::File("odd".into(), 0o640, b"o".to_vec()),
        ]
    );
    assert_eq!((stats.files, stats.dirs), (3, 2));
}

#[test]
fn pax_long_path_and_link() {
    let path = format!("pax/{}/f", "p".repeat(200));
    let target = format!("../{}", "t".repeat(150));
    let mut b = builder();
    b.append_pax_extensions([("path", path.as_bytes())]).unwrap();
    let mut h = tar::Header::new_ustar();
    h.set_path("short-name").unwrap();
    h.set_size(3);
    h.set_mode(0o644);
    h.set_cksum();
    b.append(&h, &b"abc"[..]).unwrap();
    b.append_pax_extensions([("linkpath", target.as_bytes())]).unwrap();
    let mut h = tar::Header::new_ustar();
    h.set_path("pax/link").unwrap();
    h.set_entry_type(tar::EntryType::Symlink);
    h.set_size(0);
    h.set_cksum();
    b.append(&h, io::empty()).unwrap();
    // A global header is ignored.
    let mut g = tar::Header::new_ustar();
    g.set_path("pax_global_header").unwrap();
    g.set_entry_type(tar::EntryType::XGlobalHeader);
    g.set_size(20);
    g.set_cksum();
    b.append(&g, &b"20 comment=abcdefgh\n"[..]).unwrap();
    let (stats, events) = run_ok(&b.into_inner().unwrap());
    assert_eq!(events, vec![Event::File(path, 0o644, b"abc".to_vec()), Event::Symlink("pax/link".into(), target)]);
    assert_eq!(stats.files, 1);
}

#[test]
fn gzip_and_zstd_declared_and_sniffed() {
    let tar = good_tar();
    let gz = gzip(&tar);
    let zst = zstd::encode_all(&tar[..], 3).unwrap();
    let limits = IngestLimits::default();
    for (body, enc) in
        [(&gz, Encoding::Gzip), (&gz, Encoding::Identity), (&zst, Encoding::Zstd), (&zst, Encoding::Identity)]
    {
        let (result, events) = run_with(body, enc, &limits);
        assert_eq!(result.unwrap(), GOOD_STATS, "{enc:?}");
        assert_eq!(events, good_events());
    }
    // Concatenated gzip members decode as one stream.
    let mut two = gzip(&tar[..700]);
    two.extend(gzip(&tar[700..]));
    assert_eq!(run_with(&two, Encoding::Gzip, &limits).0.unwrap(), GOOD_STATS);
    // Declared gzip that is not gzip.
    assert_corrupt(run_with(&tar, Encoding::Gzip, &limits).0.unwrap_err(), "gzip");
    assert_corrupt(run_with(&tar, Encoding::Zstd, &limits).0.unwrap_err(), "zstd");
}

/// A decoder may take any amount of input before it gives anything back (zstd skippable
/// frames): the body keeps going to the decoder thread while the reader waits for its output.
#[test]
fn compressed_bytes_that_decode_to_nothing_for_a_while_do_not_stall() {
    let mut body = Vec::new();
    for _ in 0..3 {
        body.extend_from_slice(&0x184D_2A50u32.to_le_bytes());
        body.extend_from_slice(&(1u32 << 20).to_le_bytes());
        body.extend(std::iter::repeat_n(0x5a, 1 << 20));
    }
    body.extend(zstd::encode_all(&good_tar()[..], 3).unwrap());
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(run_with(&body, Encoding::Zstd, &IngestLimits::default()));
    });
    let (result, events) = finished.recv_timeout(std::time::Duration::from_secs(30)).expect("the ingest stalled");
    assert_eq!(result.unwrap(), GOOD_STATS);
    assert_eq!(events, good_events());
}

#[test]
fn corrupt_and_truncated_compression() {
    let gz = gzip(&good_tar());
    let limits = IngestLimits::default();
    let err = run_with(&gz[..gz.len() / 2], Encoding::Gzip, &limits).0.unwrap_err();
    assert_corrupt(err, "truncated");
    let mut bad = gz.clone();
    let n = bad.len();
    bad[n - 6] ^= 0xff; // CRC
    assert_corrupt(run_with(&bad, Encoding::Gzip, &limits).0.unwrap_err(), "gzip");
    let zst = zstd::encode_all(&good_tar()[..], 3).unwrap();
    let err = run_with(&zst[..zst.len() - 3], Encoding::Zstd, &limits).0.unwrap_err();
    assert_corrupt(err, "truncated");
}

#[test]
fn trailing_bytes_after_end_marker_are_ignored() {
    let mut tar = good_tar();
    tar.extend_from_slice(&[0u8; 10240]);
    tar.extend_from_slice(b"trailing garbage");
    let (stats, events) = run_ok(&tar);
    assert_eq!(events, good_events());
    assert_eq!(stats, GOOD_STATS);
    // A single zero block also ends the archive.
    let mut one = raw_entry(b"a", b'0', b"", b"x");
    one.extend_from_slice(&[0; 512]);
    assert_eq!(run_ok(&one).0.files, 1);
}

#[test]
fn partial_reads_by_the_sink_do_not_desync() {
    let mut sink = VecSink { read_limit: Some(2), ..Default::default() };
    let stats = ingest(&good_tar()[..], Encoding::Identity, &IngestLimits::default(), &mut sink).unwrap();
    assert_eq!(stats, GOOD_STATS);
    let files: Vec<_> = sink
        .events
        .iter()
        .filter_map(|e| match e {
            Event::File(p, _, d) => Some((p.as_str(), d.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(files[0], ("bin/run.sh", b"#!".to_vec()));
    assert_eq!(files[2].1, vec![7u8; 2]);
    assert_eq!(files.len(), 4);
}

#[test]
fn sink_error_is_passed_through() {
    let mut sink = VecSink { fail_on: Some("data/nested/a.txt".into()), ..Default::default() };
    let err = ingest(&good_tar()[..], Encoding::Identity, &IngestLimits::default(), &mut sink);
    assert!(matches!(err, Err(IngestError::Sink(SinkError(m))) if m == "disk full"));
}

#[test]
fn rejects_dotdot_and_absolute_paths() {
    let a = raw_archive(&[raw_entry(b"a/../../etc/passwd", b'0', b"", b"x")]);
    assert_invalid(run_err(&a), "a/../../etc/passwd", "..");
    let a = raw_archive(&[raw_entry(b"/etc/passwd", b'0', b"", b"x")]);
    assert_invalid(run_err(&a), "/etc/passwd", "absolute");
    let a = raw_archive(&[raw_entry(b"bad\xffname", b'0', b"", b"x")]);
    assert_invalid(run_err(&a), "bad\u{fffd}name", "UTF-8");
    let a = raw_archive(&[raw_entry(b"./", b'0', b"", b"x")]);
    assert_invalid(run_err(&a), "./", "empty path");
    let a = raw_archive(&[raw_entry(b"dir/", b'2', b"x", b"")]);
    assert_invalid(run_err(&a), "dir/", "trailing");
    // Path length limit.
    let limits = IngestLimits { max_path_bytes: 10, ..Default::default() };
    let a = raw_archive(&[raw_entry(b"0123456789a", b'0', b"", b"x")]);
    let (r, _) = run_with(&a, Encoding::Identity, &limits);
    assert_invalid(r.unwrap_err(), "0123456789a", "longer than 10");
    // A GNU long name past the limit is refused before it is buffered.
    let mut b = builder();
    add_file(&mut b, &"n".repeat(300), 0o644, b"x");
    let (r, _) = run_with(&b.into_inner().unwrap(), Encoding::Identity, &limits);
    assert_invalid(r.unwrap_err(), "././@LongLink", "GNU long name");
}

#[test]
fn rejects_nul_in_pax_path() {
    let mut b = builder();
    b.append_pax_extensions([("path", &b"a\0b"[..])]).unwrap();
    let mut h = tar::Header::new_ustar();
    h.set_path("x").unwrap();
    h.set_size(0);
    h.set_cksum();
    b.append(&h, io::empty()).unwrap();
    assert_invalid(run_err(&b.into_inner().unwrap()), "a\u{fffd}b", "NUL");
}

#[test]
fn rejects_escaping_symlinks() {
    let a = raw_archive(&[raw_entry(b"a/link", b'2', b"../../etc", b"")]);
    assert_invalid(run_err(&a), "a/link", "escapes the bundle root");
    let a = raw_archive(&[raw_entry(b"link", b'2', b"/etc/passwd", b"")]);
    assert_invalid(run_err(&a), "link", "escapes the bundle root");
    let a = raw_archive(&[raw_entry(b"link", b'2', b"a/../..", b"")]);
    assert_invalid(run_err(&a), "link", "escapes the bundle root");
    let a = raw_archive(&[raw_entry(b"link", b'2', b"", b"")]);
    assert_invalid(run_err(&a), "link", "without a target");
    // `d/up -> ..` is fine, but `l -> d/up/..` would leave the root through it.
    let a = raw_archive(&[raw_entry(b"d/up", b'2', b"..", b""), raw_entry(b"l", b'2', b"d/up/..", b"")]);
    assert_invalid(run_err(&a), "l", "escapes the bundle root");
    // ... whereas `..` after a real directory is fine, even when the directory comes later.
    let a = raw_archive(&[
        raw_entry(b"l", b'2', b"d/../f", b""),
        raw_entry(b"d/g", b'0', b"", b"x"),
        raw_entry(b"f", b'0', b"", b"y"),
    ]);
    assert_eq!(run_ok(&a).0.symlinks, 1);
    // Entries below a symlink are refused (the symlink is not a directory).
    let a = raw_archive(&[raw_entry(b"s", b'2', b"d", b""), raw_entry(b"s/f", b'0', b"", b"x")]);
    assert_invalid(run_err(&a), "s/f", "parent");
}

#[test]
fn rejects_bad_hardlinks() {
    let a = raw_archive(&[raw_entry(b"h", b'1', b"missing", b"")]);
    assert_invalid(run_err(&a), "h", "not an earlier regular file");
    let a = raw_archive(&[raw_entry(b"h", b'1', b"../x", b"")]);
    assert_invalid(run_err(&a), "h", "hard link target");
    let a = raw_archive(&[raw_entry(b"s", b'2', b"f", b""), raw_entry(b"h", b'1', b"s", b"")]);
    assert_invalid(run_err(&a), "h", "not an earlier regular file");
    let a = raw_archive(&[raw_entry(b"d/", b'5', b"", b""), raw_entry(b"h", b'1', b"d", b"")]);
    assert_invalid(run_err(&a), "h", "not an earlier regular file");
    // Forward reference.
    let a = raw_archive(&[raw_entry(b"h", b'1', b"f", b""), raw_entry(b"f", b'0', b"", b"x")]);
    assert_invalid(run_err(&a), "h", "not an earlier regular file");
}

#[test]
fn rejects_special_files() {
    let a = raw_archive(&[raw_entry(b"dev/null", b'3', b"", b"")]);
    assert_invalid(run_err(&a), "dev/null", "device files are not allowed");
    let a = raw_archive(&[raw_entry(b"dev/sda", b'4', b"", b"")]);
    assert_invalid(run_err(&a), "dev/sda", "device files are not allowed");
    let a = raw_archive(&[raw_entry(b"pipe", b'6', b"", b"")]);
    assert_invalid(run_err(&a), "pipe", "FIFO");
    let a = raw_archive(&[raw_entry(b"weird", b'Z', b"", b"")]);
    assert_invalid(run_err(&a), "weird", "unsupported entry type");
    let a = raw_archive(&[raw_entry(b"sparse", b'S', b"", b"")]);
    assert_invalid(run_err(&a), "sparse", "sparse");
}

#[test]
fn rejects_duplicates_and_conflicts() {
    let f = |name: &[u8]| raw_entry(name, b'0', b"", b"x");
    let d = |name: &[u8]| raw_entry(name, b'5', b"", b"");
    assert_invalid(run_err(&raw_archive(&[f(b"a"), f(b"./a")])), "a", "duplicate path");
    // file, then explicit directory / implicit directory
    assert_invalid(run_err(&raw_archive(&[f(b"a"), d(b"a/")])), "a", "conflicts");
    assert_invalid(run_err(&raw_archive(&[f(b"a"), f(b"a/b")])), "a/b", "parent");
    // explicit / implicit directory, then file
    assert_invalid(run_err(&raw_archive(&[d(b"a/"), f(b"a")])), "a", "conflicts with a directory");
    assert_invalid(run_err(&raw_archive(&[f(b"a/b"), f(b"a")])), "a", "conflicts with a directory");
    // symlink vs directory
    let s = raw_entry(b"a", b'2', b"b", b"");
    assert_invalid(run_err(&raw_archive(&[f(b"a/b"), s])), "a", "conflicts with a directory");
    // repeated directories are fine
    let (stats, _) = run_ok(&raw_archive(&[d(b"a/"), f(b"a/b"), d(b"a")]));
    assert_eq!(stats.files, 1);
}

#[test]
fn truncated_archives() {
    let tar = good_tar();
    // Mid-file: the 1000-byte entry starts somewhere after byte 2048.
    let cut = tar.len() - 3000;
    assert_corrupt(run_err(&tar[..cut]), "truncated archive");
    // Mid-file with a sink that reads everything: the sink must not see a short file.
    let a = raw_archive(&[raw_entry(b"f", b'0', b"", &[1u8; 2000])]);
    let (r, events) = run_with(&a[..1500], Encoding::Identity, &IngestLimits::default());
    assert_corrupt(r.unwrap_err(), "truncated archive");
    assert!(events.is_empty());
    // At an entry boundary: no zero blocks at all.
    let a = raw_archive(&[raw_entry(b"f", b'0', b"", b"x")]);
    let (r, events) = run_with(&a[..1024], Encoding::Identity, &IngestLimits::default());
    assert_corrupt(r.unwrap_err(), "truncated archive");
    assert_eq!(events.len(), 1); // the sink saw it, but the caller discards
                                 // Missing padding of the last entry.
    assert_corrupt(run_err(&a[..600]), "truncated archive");
    // Mid-header.
    assert_corrupt(run_err(&a[..1100]), "truncated archive");
    // Gzip of a truncated tar.
    let (r, _) = run_with(&gzip(&a[..1024]), Encoding::Gzip, &IngestLimits::default());
    assert_corrupt(r.unwrap_err(), "truncated archive");
}

#[test]
fn empty_and_garbage_bodies() {
    assert_corrupt(run_err(b""), "empty");
    assert_corrupt(run_err(&[0x1f]), "");
    assert_corrupt(run_err(b"this is not a tar archive at all"), "");
    assert_corrupt(run_err(&[b'x'; 4096]), "");
    let (r, _) = run_with(b"", Encoding::Gzip, &IngestLimits::default());
    assert!(matches!(r, Err(IngestError::Corrupt(_))), "{r:?}");
    // An empty but well-formed tar is accepted.
    assert_eq!(run_ok(&[0u8; 1024]).0, IngestStats::default());
}

#[test]
fn gzip_bomb_is_too_large() {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    {
        let mut b = tar::Builder::new(&mut enc);
        let mut h = tar::Header::new_gnu();
        h.set_size(50 << 20);
        h.set_mode(0o644);
        b.append_data(&mut h, "zeros", io::repeat(0).take(50 << 20)).unwrap();
        b.finish().unwrap();
    }
    let gz = enc.finish().unwrap();
    assert!(gz.len() < 1 << 20);
    let limits = IngestLimits { max_unpacked_bytes: 10 << 20, ..Default::default() };
    let (r, _) = run_with(&gz, Encoding::Identity, &limits);
    assert!(matches!(r, Err(IngestError::TooLarge { limit }) if limit == 10 << 20), "{r:?}");
    // Hard links count as copies.
    let a = raw_archive(&[
        raw_entry(b"f", b'0', b"", &[1u8; 600]),
        raw_entry(b"h1", b'1', b"f", b""),
        raw_entry(b"h2", b'1', b"f", b""),
    ]);
    let limits = IngestLimits { max_unpacked_bytes: 1500, ..Default::default() };
    let (r, _) = run_with(&a, Encoding::Identity, &limits);
    assert!(matches!(r, Err(IngestError::TooLarge { limit: 1500 })), "{r:?}");
}

#[test]
fn too_many_entries() {
    let entries: Vec<_> = (0..5).map(|i| raw_entry(format!("f{i}").as_bytes(), b'0', b"", b"")).collect();
    let limits = IngestLimits { max_entries: 4, ..Default::default() };
    let (r, _) = run_with(&raw_archive(&entries), Encoding::Identity, &limits);
    assert!(matches!(r, Err(IngestError::TooLarge { limit: 4 })), "{r:?}");
}

/// Yields `data`, then fails with a recognisable error.
struct FailingReader {
    data: io::Cursor<Vec<u8>>,
}

impl Read for FailingReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self.data.read(buf)? {
            0 => Err(io::Error::new(io::ErrorKind::ConnectionReset, "client went away")),
            n => Ok(n),
        }
    }
}

#[track_caller]
fn assert_source(r: Result<IngestStats, IngestError<SinkError>>) {
    match r {
        Err(IngestError::Source(e)) => {
            assert_eq!(e.kind(), io::ErrorKind::ConnectionReset);
            assert_eq!(e.to_string(), "client went away");
        }
        other => panic!("expected Source, got {other:?}"),
    }
}

#[test]
fn source_errors_pass_through() {
    let tar = good_tar();
    let limits = IngestLimits::default();
    // Mid-header, mid-file (inside the sink's read), and in the compressed stream.
    for cut in [0, 700, 3000] {
        let mut sink = VecSink::default();
        let body = FailingReader { data: io::Cursor::new(tar[..cut].to_vec()) };
        assert_source(ingest(body, Encoding::Identity, &limits, &mut sink));
    }
    let gz = gzip(&tar);
    for enc in [Encoding::Gzip, Encoding::Identity] {
        let mut sink = VecSink::default();
        let body = FailingReader { data: io::Cursor::new(gz[..gz.len() / 2].to_vec()) };
        assert_source(ingest(body, enc, &limits, &mut sink));
    }
    // Even after a complete archive (while draining).
    let mut sink = VecSink::default();
    let body = FailingReader { data: io::Cursor::new(tar) };
    assert_source(ingest(body, Encoding::Identity, &limits, &mut sink));
}

#[test]
fn oversized_pax_header_and_pax_sparse_are_refused() {
    let mut b = builder();
    let big = vec![b'v'; 2 << 20];
    b.append_pax_extensions([("comment", &big[..])]).unwrap();
    add_file(&mut b, "f", 0o644, b"x");
    let err = run_err(&b.into_inner().unwrap());
    assert_invalid(err, "(PAX extended header)", "exceeds the 1048576-byte limit");
    let mut b = builder();
    b.append_pax_extensions([("GNU.sparse.major", &b"1"[..]), ("GNU.sparse.minor", b"0")]).unwrap();
    add_file(&mut b, "s", 0o644, b"map-and-data");
    assert_invalid(run_err(&b.into_inner().unwrap()), "s", "sparse");
}

#[test]
fn v7_directories_and_contiguous_files() {
    let a = raw_archive(&[
        raw_entry(b"dir/", 0, b"", b""),
        raw_entry(b"dir/f", 0, b"", b"old"),
        raw_entry(b"c", b'7', b"", b"contig"),
    ]);
    let (stats, events) = run_ok(&a);
    assert_eq!((stats.files, stats.dirs), (2, 1));
    // A v7 directory is a regular entry whose name ends with '/'.
    assert_eq!(events[0], Event::Dir("dir".into(), 0o644));
    assert_eq!(events[1], Event::File("dir/f".into(), 0o644, b"old".to_vec()));
    assert_eq!(events[2], Event::File("c".into(), 0o644, b"contig".to_vec()));
    let a = raw_archive(&[raw_entry(b"dir", 0, b"", b"x"), raw_entry(b"dir/", 0, b"", b"")]);
    assert_invalid(run_err(&a), "dir", "conflicts");
}

#[test]
fn read_errors_win_over_sink_reactions() {
    let a = raw_archive(&[raw_entry(b"f", b'0', b"", &[1u8; 2000])]);
    // A sink that swallows the truncation error still gets Corrupt back.
    let mut sink = VecSink { swallow_read_errors: true, ..Default::default() };
    let r = ingest(&a[..1500], Encoding::Identity, &IngestLimits::default(), &mut sink);
    assert_corrupt(r.unwrap_err(), "truncated archive");
    // The body failing inside the sink's read is Source, not Sink.
    for swallow in [false, true] {
        let mut sink = VecSink { swallow_read_errors: swallow, ..Default::default() };
        let body = FailingReader { data: io::Cursor::new(a[..1000].to_vec()) };
        assert_source(ingest(body, Encoding::Identity, &IngestLimits::default(), &mut sink));
    }
    // The bomb limit hit inside the sink's read is TooLarge.
    let limits = IngestLimits { max_unpacked_bytes: 4096, ..Default::default() };
    let big = raw_archive(&[raw_entry(b"f", b'0', b"", &[1u8; 2000]), raw_entry(b"g", b'0', b"", &[2u8; 2000])]);
    let (r, events) = run_with(&big, Encoding::Identity, &limits);
    assert!(matches!(r, Err(IngestError::TooLarge { limit: 4096 })), "{r:?}");
    assert_eq!(events.len(), 1); // `g` failed inside the sink's read
}

#[test]
fn sink_that_reads_nothing() {
    let mut sink = VecSink { read_limit: Some(0), ..Default::default() };
    let gz = gzip(&good_tar());
    let stats = ingest(&gz[..], Encoding::Gzip, &IngestLimits::default(), &mut sink).unwrap();
    assert_eq!(stats, GOOD_STATS);
    assert_eq!(sink.events.len(), good_events().len());
}

#[test]
fn normalize_paths() {
    let n = |p: &str| normalize(p.as_bytes(), 4096).map(|n| n.path);
    assert_eq!(n("./a//b/./c/").unwrap(), "a/b/c");
    assert_eq!(n("././a").unwrap(), "a");
    assert_eq!(n(".").unwrap(), "");
    assert!(n("").is_err());
    assert!(n("a/..").is_err());
    assert!(n("//a").is_err());
    assert!(normalize(b"a/b/", 4096).unwrap().trailing_slash);
}

#[track_caller]
fn assert_message(err: IngestError<SinkError>, want: &str) {
    match err {
        IngestError::Corrupt(msg) => assert_eq!(msg, want),
        other => panic!("expected Corrupt({want:?}), got {other:?}"),
    }
}

/// The reader's messages are its own: entry and rule named, never the data or the crate's words.
#[test]
fn corrupt_archives_are_described_plainly() {
    let not_tar = "not a tar archive (plain, gzip or zstd): the first 512 bytes are not a tar header";
    assert_message(run_err(&[b'x'; 4096]), not_tar);
    assert_message(
        run_err(b"this is not a tar archive at all"),
        "not a tar archive (plain, gzip or zstd): 32 bytes, shorter than one 512-byte tar header",
    );
    assert_message(run_err(b""), "empty archive: there is no data");
    let (r, _) = run_with(&gzip(&[b'x'; 4096]), Encoding::Identity, &IngestLimits::default());
    assert_message(
        r.unwrap_err(),
        "not a tar archive: the gzip data holds no tar header (its first 512 bytes, decompressed, are not one)",
    );
    let (r, _) = run_with(&[b'x'; 4096], Encoding::Zstd, &IngestLimits::default());
    assert_message(r.unwrap_err(), "not valid zstd data: nothing could be decompressed");

    // A header whose checksum is wrong, after a good entry.
    let mut second = raw_entry(b"b", b'0', b"", b"2");
    second[0] = b'c';
    assert_message(
        run_err(&raw_archive(&[raw_entry(b"a", b'0', b"", b"1"), second])),
        "corrupt archive: entry 2 (after \"a\"): the header checksum does not match",
    );
    // Numeric fields that are not numbers (checksum fixed up so only the field is wrong).
    let with_field = |at: std::ops::Range<usize>| {
        let mut h = tar::Header::new_gnu();
        h.as_old_mut().name[..1].copy_from_slice(b"m");
        h.set_size(1);
        h.set_mode(0o644);
        h.as_mut_bytes()[at].copy_from_slice(b"zz zz\0\0\0");
        h.set_cksum();
        let mut out = h.as_bytes().to_vec();
        out.resize(1024, 0);
        raw_archive(&[out])
    };
    assert_message(
        run_err(&with_field(100..108)),
        "corrupt archive: entry 1 (\"m\"): the mode field is not an octal number",
    );
    let mut size = with_field(100..108);
    size[100..108].copy_from_slice(b"0000644\0");
    size[124..132].copy_from_slice(b"zz zz\0\0\0");
    let mut h = tar::Header::new_old();
    h.as_mut_bytes().copy_from_slice(&size[..512]);
    h.set_cksum();
    size[..512].copy_from_slice(h.as_bytes());
    assert_message(run_err(&size), "corrupt archive: entry 1: the size field is not a number");
    // Truncated inside the second header.
    let two = raw_archive(&[raw_entry(b"a", b'0', b"", b"1"), raw_entry(b"b", b'0', b"", b"2")]);
    assert_message(
        run_err(&two[..1300]),
        "truncated archive: the data ends inside the header of entry 2 (after \"a\")",
    );
    assert_message(
        run_err(&two[..1024]),
        "truncated archive: the data ends after entry 1 (\"a\") without the end-of-archive marker",
    );
}
