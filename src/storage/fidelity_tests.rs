//! The tree comes back as it went in: directories (empty ones too) and permission bits through the
//! served tar, subtrees and listings; file records of older stores still decode as they served.

use std::io::Read;

use serde_json::json;

use super::tests::open;
use super::*;

/// Writes a tree with directories and odd modes and attaches it.
fn tree_revision(store: &Store) -> RevisionId {
    let mut writer = store.begin_revision().unwrap();
    writer.add_file("a/secret", 0o600, 1, &mut &b"s"[..]).unwrap();
    writer.add_dir("charts", 0o755).unwrap();
    writer.add_dir("a", 0o700).unwrap();
    writer.add_file("bin/run", 0o4750, 2, &mut &b"#!"[..]).unwrap();
    writer.add_file("a-b", 0o444, 2, &mut &b"ab"[..]).unwrap();
    writer.add_symlink("link", "a-b").unwrap();
    assert!(writer.add_dir("a/", 0o755).is_err(), "a directory is added once");
    let mut pending = writer.finalize().unwrap();
    let id = pending.record().id;
    let key = ObjectKey::new("bundlecontents", "ns", "c1");
    let write = ObjectWrite::Put {
        key,
        object: json!({"metadata": {"name": "c1"}}),
        precondition: Precondition::MustNotExist,
        revision: Some(id),
    };
    pending.commit(vec![write]).unwrap();
    id
}

/// (path, type, mode, data) of every entry of a tar.
fn entries(tar: &[u8]) -> Vec<(String, tar::EntryType, u32, Vec<u8>)> {
    let mut archive = tar::Archive::new(tar);
    let mut out = Vec::new();
    for entry in archive.entries().unwrap() {
        let mut entry = entry.unwrap();
        let path = String::from_utf8(entry.path_bytes().into_owned()).unwrap();
        let (kind, mode) = (entry.header().entry_type(), entry.header().mode().unwrap());
        let mut data = Vec::new();
        entry.read_to_end(&mut data).unwrap();
        out.push((path, kind, mode, data));
    }
    out
}

fn read_tar(store: &Store, rev: RevisionId, start: u64, end: u64) -> Vec<u8> {
    let mut out = Vec::new();
    let size = store.revision(rev).unwrap().tar_size;
    store
        .read_tar(rev, size, RangeSpec { start, end }, &mut |b| {
            out.extend_from_slice(b);
            Ok(())
        })
        .unwrap();
    out
}

#[test]
fn directories_and_modes_come_back_in_the_served_tar() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let rev = tree_revision(&store);
    let record = store.revision(rev).unwrap();
    assert_eq!(record.files, 4, "files and symlinks count, directories do not");
    let tar = read_tar(&store, rev, 0, record.tar_size);
    use tar::EntryType::{Directory, Regular, Symlink};
    let all = entries(&tar);
    let got: Vec<(&str, tar::EntryType, u32)> = all.iter().map(|(p, k, m, _)| (p.as_str(), *k, *m)).collect();
    // A directory sorts right before its contents; setuid is not kept.
    assert_eq!(
        got,
        vec![
            ("a-b", Regular, 0o444),
            ("a/", Directory, 0o700),
            ("a/secret", Regular, 0o600),
            ("bin/run", Regular, 0o750),
            ("charts/", Directory, 0o755),
            ("link", Symlink, 0o777),
        ]
    );
    // Every range is the slice of the whole (ranges start at directory entries too).
    for start in (0..record.tar_size).step_by(256) {
        let end = (start + 700).min(record.tar_size);
        assert_eq!(read_tar(&store, rev, start, end), tar[start as usize..end as usize], "{start}-{end}");
    }
}

#[test]
fn a_directory_heads_its_subtree_and_lists_with_its_mode() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let rev = tree_revision(&store);
    let sub: Vec<FileEntry> = store.files_after(rev, "a/", None).collect::<Result<_>>().unwrap();
    let paths: Vec<(&str, EntryKind, u32)> = sub.iter().map(|e| (e.path.as_str(), e.kind, e.mode())).collect();
    assert_eq!(paths, vec![("a/", EntryKind::Directory, 0o700), ("a/secret", EntryKind::File, 0o600)]);
    // A listing resumed after the directory goes on with its contents.
    let rest: Vec<String> = store.files_after(rev, "", Some("a/")).map(|e| e.unwrap().path).collect();
    assert_eq!(rest, vec!["a/secret", "bin/run", "charts/", "link"]);
    let empty: Vec<FileEntry> = store.files_after(rev, "charts/", None).collect::<Result<_>>().unwrap();
    assert_eq!(empty.len(), 1);
    assert!(empty[0].is_dir() && empty[0].size == 0);
    let mut tar = Vec::new();
    store
        .read_entry_tar(rev, &empty[0], 0, Store::entry_tar_len(&empty[0]), &mut |b| {
            tar.extend_from_slice(b);
            Ok(())
        })
        .unwrap();
    tar.resize(tar.len() + tarfmt::TRAILER_LEN as usize, 0);
    assert_eq!(entries(&tar), vec![("charts/".to_string(), tar::EntryType::Directory, 0o755, vec![])]);
}

#[test]
fn kinds_and_modes_round_trip_through_a_manifest_page() {
    use super::manifest::{decode_page, encode_entry, ChunkList};
    let entry = |path: &str, kind, mode, target: Option<&str>| FileEntry {
        path: path.into(),
        kind,
        target: target.map(str::to_string),
        mode,
        size: 0,
        sha256: "ab".repeat(32),
        tar_offset: 1024,
        chunks: if kind == EntryKind::File { ChunkList::Inline(Vec::new()) } else { ChunkList::None },
    };
    let entries = [
        entry("a", EntryKind::File, 0o644, None),
        entry("b", EntryKind::File, 0o600, None),
        entry("c", EntryKind::File, 0o000, None),
        entry("d/", EntryKind::Directory, 0o700, None),
        entry("e/", EntryKind::Directory, 0o755, None),
        entry("f", EntryKind::Symlink, 0o777, Some("../t")),
    ];
    let mut page = (entries.len() as u32).to_le_bytes().to_vec();
    for e in &entries {
        encode_entry(e, &mut page);
    }
    let back = decode_page(&page).unwrap();
    for (e, b) in entries.iter().zip(&back) {
        assert_eq!((&b.path, b.kind, b.mode(), &b.target), (&e.path, e.kind, e.mode, &e.target), "{}", e.path);
        assert_eq!(&b.chunks, &e.chunks);
    }
}

#[test]
fn one_tar_cursor_reads_any_sequence_of_ranges_across_pages() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let mut writer = store.begin_revision().unwrap();
    for i in 0..3_000 {
        let data = format!("file {i} ").repeat(i % 7);
        writer.add_file(&format!("d/{i:05}"), 0o644, data.len() as u64, &mut data.as_bytes()).unwrap();
    }
    let rev = super::tests::attach("many", writer.finalize().unwrap());
    assert!(store.manifest(rev).unwrap().pages.len() > 3, "the manifest spans pages");
    let size = store.revision_record(rev).unwrap().tar_size;
    let whole = {
        let mut out = Vec::new();
        let mut cursor = TarCursor::new(rev, size);
        // Forward in uneven steps, as a download does.
        let mut pos = 0;
        while pos < size {
            let end = (pos + 6_007).min(size);
            let range = RangeSpec { start: pos, end };
            store
                .read_tar_at(&mut cursor, range, &mut |b| {
                    out.extend_from_slice(b);
                    Ok(())
                })
                .unwrap();
            pos = end;
        }
        out
    };
    assert_eq!(whole.len() as u64, size);
    assert_eq!(entries(&whole).len(), 3_000);
    // Backwards and jumping around with the same cursor: each range is the slice of the whole.
    let mut cursor = TarCursor::new(rev, size);
    for start in [size - 1_500, 0, size / 2, 512, size / 3, size - 1] {
        let end = (start + 40_000).min(size);
        let mut out = Vec::new();
        store
            .read_tar_at(&mut cursor, RangeSpec { start, end }, &mut |b| {
                out.extend_from_slice(b);
                Ok(())
            })
            .unwrap();
        assert_eq!(out, whole[start as usize..end as usize], "{start}-{end}");
    }
}
