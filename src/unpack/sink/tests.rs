use std::io::Read;

use super::*;
use crate::storage::{Store, StoreOptions};
use crate::unpack::source::UnpackLimits;

fn limits() -> UnpackLimits {
    UnpackLimits {
        max_total_bytes: 10 << 20,
        max_files: 10,
        max_file_bytes: 4 << 20,
        max_path_bytes: 40,
        max_expansion_ratio: 10,
        ..UnpackLimits::default()
    }
}

fn with_sink<T>(limits: UnpackLimits, budget: Arc<Budget>, f: impl FnOnce(&mut TreeSink<'_>) -> T) -> T {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
    let mut writer = store.begin_revision().unwrap();
    let mut sink = TreeSink::new(&mut writer, limits, budget);
    f(&mut sink)
}

fn zeros(n: u64) -> impl Read {
    std::io::repeat(0).take(n)
}

#[test]
fn files_are_placed_under_the_destination_and_paths_are_limited() {
    with_sink(limits(), Arc::default(), |sink| {
        sink.set_destination("charts/");
        sink.file("a.txt", 0o644, 3, &mut zeros(3)).unwrap();
        let long = "x".repeat(40);
        let err = sink.file(&long, 0o644, 1, &mut zeros(1)).unwrap_err();
        assert!(matches!(err, UnpackError::TooLarge(ref m) if m.contains("over the limit of 40")), "{err}");
    });
}

#[test]
fn single_file_total_and_count_limits_stop_the_stream() {
    with_sink(limits(), Arc::default(), |sink| {
        let err = sink.file("big", 0o644, 5 << 20, &mut zeros(5 << 20)).unwrap_err();
        assert!(matches!(err, UnpackError::TooLarge(ref m) if m.contains("a file is larger")), "{err}");
    });
    with_sink(limits(), Arc::default(), |sink| {
        for i in 0..3 {
            sink.file(&format!("f{i}"), 0o644, 3 << 20, &mut zeros(3 << 20)).unwrap();
        }
        let err = sink.file("f3", 0o644, 3 << 20, &mut zeros(3 << 20)).unwrap_err();
        assert!(matches!(err, UnpackError::TooLarge(ref m) if m.contains("content is larger")), "{err}");
    });
    with_sink(limits(), Arc::default(), |sink| {
        for i in 0..10 {
            sink.file(&format!("f{i}"), 0o644, 1, &mut zeros(1)).unwrap();
        }
        let err = sink.file("f10", 0o644, 1, &mut zeros(1)).unwrap_err();
        assert!(matches!(err, UnpackError::TooLarge(ref m) if m.contains("more than 10 files")), "{err}");
    });
}

#[test]
fn the_expansion_ratio_counts_downloaded_bytes() {
    let budget = Arc::new(Budget::default());
    budget.add_downloaded(200 << 10);
    with_sink(limits(), budget.clone(), |sink| {
        // 200 KiB downloaded: 1.5 MiB is within 10x, 2 MiB is not.
        sink.file("ok", 0o644, 1536 << 10, &mut zeros(1536 << 10)).unwrap();
        let err = sink.file("bomb", 0o644, 1 << 20, &mut zeros(1 << 20)).unwrap_err();
        assert!(matches!(err, UnpackError::TooLarge(ref m) if m.contains("expands more than 10x")), "{err}");
    });
}

#[test]
fn manifests_are_inspected_as_they_pass() {
    let report = with_sink(limits(), Arc::default(), |sink| {
        for (path, data) in [
            ("manifests/cm.yaml", "apiVersion: v1\nkind: ConfigMap\n"),
            ("manifests/svc.json", r#"{"apiVersion":"v1","kind":"Service"}"#),
        ] {
            sink.file(path, 0o644, data.len() as u64, &mut data.as_bytes()).unwrap();
        }
        let mut taken = TreeSink::new(sink.writer, sink.limits, sink.budget.clone());
        std::mem::swap(&mut taken.inspector, &mut sink.inspector);
        taken.files = sink.files;
        taken.finish("", true, false)
    })
    .unwrap();
    assert_eq!(report.format, "plain");
    assert_eq!(report.objects.len(), 2);
}

#[test]
fn a_tree_without_files_is_refused_unless_empty_content_is_intended() {
    let finish = |allow_empty: bool, declared: &str, fill: &dyn Fn(&mut TreeSink<'_>)| {
        with_sink(limits(), Arc::default(), |sink| {
            fill(sink);
            let mut taken = TreeSink::new(sink.writer, sink.limits, sink.budget.clone());
            std::mem::swap(&mut taken.inspector, &mut sink.inspector);
            taken.files = sink.files;
            taken.finish(declared, true, allow_empty)
        })
    };
    let only_dirs = |sink: &mut TreeSink<'_>| {
        sink.dir("charts", 0o755).unwrap();
        sink.dir("charts/sub", 0o700).unwrap();
    };
    for fill in [&(|_: &mut TreeSink<'_>| {}) as &dyn Fn(&mut TreeSink<'_>), &only_dirs] {
        let err = finish(false, "", fill).unwrap_err();
        assert!(matches!(err, UnpackError::Empty), "{err:?}");
        assert!(err.to_string().starts_with("archive holds no files"), "{err}");
        // Intended: accepted with no format, unless one is declared (empty is not a chart).
        assert_eq!(finish(true, "", fill).unwrap(), FormatReport::default());
        assert!(matches!(finish(true, "helm", fill), Err(UnpackError::InvalidFormat { .. })));
    }
    let one_link = |sink: &mut TreeSink<'_>| sink.symlink("l", "x").unwrap();
    assert!(finish(false, "", &one_link).is_err_and(|e| !matches!(e, UnpackError::Empty)), "a link is content");
}

#[test]
fn directories_count_against_the_entry_limit() {
    with_sink(limits(), Arc::default(), |sink| {
        for i in 0..10 {
            sink.dir(&format!("d{i}"), 0o755).unwrap();
        }
        let err = sink.file("f", 0o644, 1, &mut zeros(1)).unwrap_err();
        assert!(matches!(err, UnpackError::TooLarge(ref m) if m.contains("more than 10 files")), "{err}");
    });
}

#[test]
fn sources_share_directories_but_not_files() {
    with_sink(limits(), Arc::default(), |sink| {
        sink.set_destination("");
        sink.dir("manifests", 0o755).unwrap();
        sink.file("manifests/a.yaml", 0o644, 1, &mut zeros(1)).unwrap();
        sink.set_destination("extra");
        sink.file("x", 0o644, 1, &mut zeros(1)).unwrap();
        sink.set_destination("");
        sink.dir("manifests", 0o700).expect("a directory an earlier source made is shared");
        sink.file("manifests/b.yaml", 0o644, 1, &mut zeros(1)).unwrap();
        let err = sink.file("manifests/a.yaml", 0o644, 1, &mut zeros(1)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid entry \"manifests/a.yaml\": duplicate path: spec.sources[2] writes it, and spec.sources[0] \
             already did (give the sources destinations that do not overlap)"
        );
    });
}
