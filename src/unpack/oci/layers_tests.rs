//! Whiteout and shadowing rules of [`LayerSink`], layer by layer, without archives.

use std::collections::BTreeMap;
use std::io::Read;

use super::LayerSink;
use crate::unpack::error::UnpackError;
use crate::unpack::EntrySink;

#[derive(Default)]
struct Recorder(BTreeMap<String, String>);

impl EntrySink for Recorder {
    type Error = UnpackError;
    fn file(&mut self, path: &str, _: u32, _: u64, data: &mut dyn Read) -> Result<(), UnpackError> {
        let mut s = String::new();
        data.read_to_string(&mut s).map_err(|e| UnpackError::from_io(path, e))?;
        self.0.insert(path.to_owned(), s);
        Ok(())
    }
    fn dir(&mut self, path: &str, mode: u32) -> Result<(), UnpackError> {
        let previous = self.0.insert(format!("{path}/"), format!("dir {mode:o}"));
        assert!(previous.is_none(), "directory {path} forwarded twice");
        Ok(())
    }
    fn symlink(&mut self, path: &str, target: &str) -> Result<(), UnpackError> {
        self.0.insert(path.to_owned(), format!("-> {target}"));
        Ok(())
    }
    fn hardlink(&mut self, path: &str, target: &str) -> Result<(), UnpackError> {
        let data = self.0.get(target).cloned().unwrap_or_default();
        self.0.insert(path.to_owned(), data);
        Ok(())
    }
}

enum E {
    F(&'static str, &'static str),
    L(&'static str, &'static str),
    H(&'static str, &'static str),
    D(&'static str, u32),
}

/// Applies `layers` (bottom first, as in a manifest) top-down and returns the flattened tree.
fn flatten(layers: &[&[E]]) -> Result<BTreeMap<String, String>, UnpackError> {
    let mut rec = Recorder::default();
    {
        let mut sink = LayerSink::new(&mut rec);
        for layer in layers.iter().rev() {
            for e in layer.iter() {
                match e {
                    E::F(p, d) => sink.file(p, 0o644, d.len() as u64, &mut d.as_bytes())?,
                    E::L(p, t) => sink.symlink(p, t)?,
                    E::H(p, t) => sink.hardlink(p, t)?,
                    E::D(p, mode) => sink.dir(p, *mode)?,
                }
            }
            sink.finish_layer();
        }
    }
    Ok(rec.0)
}

fn tree(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect()
}

#[test]
fn upper_file_wins_and_whiteouts_delete() {
    let got = flatten(&[
        &[E::F("a", "old"), E::F("b", "b"), E::F("d/x", "x"), E::F("d/y", "y"), E::F("keep", "k")],
        &[E::F("a", "new"), E::F(".wh.b", ""), E::F("d/.wh.x", "")],
    ])
    .unwrap();
    assert_eq!(got, tree(&[("a", "new"), ("d/y", "y"), ("keep", "k")]));
}

#[test]
fn whiteout_of_a_directory_removes_its_subtree_and_later_layers_can_recreate_it() {
    let got = flatten(&[&[E::F("d/x", "x"), E::F("d/e/y", "y")], &[E::F(".wh.d", "")], &[E::F("d/z", "z")]]).unwrap();
    assert_eq!(got, tree(&[("d/z", "z")]));
}

#[test]
fn opaque_directory_hides_lower_content_only() {
    let got = flatten(&[
        &[E::F("d/x", "x"), E::F("d/sub/y", "y"), E::F("dd", "sibling")],
        &[E::F("d/.wh..wh..opq", ""), E::F("d/new", "n")],
    ])
    .unwrap();
    assert_eq!(got, tree(&[("d/new", "n"), ("dd", "sibling")]));
}

#[test]
fn non_directory_replaces_a_lower_subtree_and_directory_replaces_a_lower_file() {
    let got = flatten(&[
        &[E::F("a/x", "x"), E::F("b", "file"), E::F("c/y", "y")],
        &[E::F("a", "now a file"), E::F("b/z", "z"), E::L("c", "a")],
    ])
    .unwrap();
    assert_eq!(got, tree(&[("a", "now a file"), ("b/z", "z"), ("c", "-> a")]));
}

#[test]
fn hard_links_need_a_target_written_by_the_same_layer() {
    let ok = flatten(&[&[E::F("t", "data"), E::H("l", "t")]]).unwrap();
    assert_eq!(ok, tree(&[("l", "data"), ("t", "data")]));
    let err = flatten(&[&[E::F("t", "old"), E::H("l", "t")], &[E::F("t", "new")]]).unwrap_err();
    assert!(matches!(err, UnpackError::InvalidEntry { ref path, .. } if path == "l"), "{err:?}");
}

#[test]
fn opaque_root_and_malformed_whiteouts() {
    let got = flatten(&[&[E::F("x", "x")], &[E::F(".wh..wh..opq", ""), E::F("y", "y")]]).unwrap();
    assert_eq!(got, tree(&[("y", "y")]));
    for bad in [".wh.", "d/.wh..wh.x", ".wh.d/x", "a/.wh..."] {
        let err = flatten(&[&[E::F(bad, "")]]).unwrap_err();
        assert!(matches!(err, UnpackError::InvalidEntry { .. }), "{bad}: {err:?}");
    }
}

#[test]
fn whiteouts_under_paths_decided_above_change_nothing() {
    let got = flatten(&[
        &[E::F("d/x", "lowest")],
        &[E::F("d/.wh.x", ""), E::F("e/.wh..wh..opq", "")],
        &[E::F("d", "a file now"), E::F(".wh.e", "")],
    ])
    .unwrap();
    assert_eq!(got, tree(&[("d", "a file now")]));
}

#[test]
fn directories_take_the_upper_mode_and_whiteouts_remove_them() {
    // Bottom layer first.
    let got = flatten(&[
        &[
            E::D("etc", 0o755),
            E::D("gone", 0o700),
            E::D("gone/sub", 0o700),
            E::D("opq", 0o755),
            E::D("opq/sub", 0o755),
            E::D("f", 0o755),
            E::D("only", 0o701),
        ],
        &[E::D("etc", 0o700), E::F(".wh.gone", ""), E::F("opq/.wh..wh..opq", ""), E::F("f", "a file now")],
        &[E::D("etc", 0o750), E::D("new", 0o711), E::F("only/implied", "i")],
    ])
    .unwrap();
    // `only` is implied by a file above and named only below: the lower entry gives its mode.
    let want = [
        ("etc/", "dir 750"),
        ("f", "a file now"),
        ("new/", "dir 711"),
        ("only/", "dir 701"),
        ("only/implied", "i"),
        ("opq/", "dir 755"),
    ];
    assert_eq!(got, tree(&want));
    let err = flatten(&[&[E::D("d/.wh.x", 0o755)]]).unwrap_err();
    assert!(matches!(err, UnpackError::InvalidEntry { .. }), "{err:?}");
}
