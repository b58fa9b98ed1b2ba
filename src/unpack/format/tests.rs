use super::*;

fn inspect(files: &[(&str, &str)]) -> Inspector {
    let mut inspector = Inspector::default();
    for (path, text) in files {
        inspector.saw(path);
        if Inspector::wants(path) {
            inspector.observe(path, text.as_bytes());
        }
    }
    inspector
}

const DEPLOYMENT: &str = "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: a\n---\napiVersion: v1\nkind: Service\nmetadata:\n  name: a\n---\n";

#[test]
fn plain_is_detected_and_counts_objects_by_kind() {
    let report = inspect(&[
        ("manifests/app.yaml", DEPLOYMENT),
        ("manifests/cm.json", r#"{"apiVersion":"v1","kind":"ConfigMap"}"#),
    ])
    .finish("", true)
    .unwrap();
    assert_eq!(report.format, PLAIN);
    assert_eq!(report.objects.get("Deployment"), Some(&1));
    assert_eq!(report.objects.get("ConfigMap"), Some(&1));
}

#[test]
fn an_object_file_that_does_not_parse_is_named() {
    let err = inspect(&[("manifests/ok.yaml", DEPLOYMENT), ("manifests/bad.yaml", "kind: [unclosed")])
        .finish("", true)
        .unwrap_err();
    match err {
        UnpackError::InvalidFormat { path, .. } => assert_eq!(path, "manifests/bad.yaml"),
        other => panic!("unexpected {other:?}"),
    }
    let err = inspect(&[("manifests/x.yaml", "just: a map\n")]).finish(PLAIN, true).unwrap_err();
    assert_eq!(
        err.to_string(),
        "not a plain bundle: manifests/x.yaml: document 1 has no apiVersion and kind (both are required)"
    );
}

#[test]
fn parse_errors_say_where_and_never_quote_the_file() {
    let err = inspect(&[("manifests/x.yaml", "apiVersion: v1\nkind: [unclosed secret-words\n")])
        .finish(PLAIN, true)
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "not a plain bundle: manifests/x.yaml: document 1 is not valid YAML (line 3, column 1)"
    );
    let annotations = "annotations: secret-words\n";
    let err = inspect(&[("metadata/annotations.yaml", annotations)]).finish("", true).unwrap_err();
    assert_eq!(
        err.to_string(),
        "not a registry-v1 bundle: metadata/annotations.yaml: there is no `annotations` mapping"
    );
    let err = inspect(&[("Chart.yaml", "name: [secret-words")]).finish(HELM, true).unwrap_err();
    assert!(err.to_string().starts_with("not a helm chart: Chart.yaml: the file is not valid YAML (line "), "{err}");
    assert!(!err.to_string().contains("secret-words"), "{err}");
}

#[test]
fn registry_v1_needs_the_annotation_and_a_csv() {
    let annotations = "annotations:\n  operators.operatorframework.io.bundle.mediatype.v1: registry+v1\n  operators.operatorframework.io.bundle.package.v1: etcd\n";
    let csv = "apiVersion: operators.coreos.com/v1alpha1\nkind: ClusterServiceVersion\nmetadata:\n  name: etcd.v1\n";
    let report =
        inspect(&[("metadata/annotations.yaml", annotations), ("manifests/csv.yaml", csv)]).finish("", true).unwrap();
    assert_eq!(report.format, REGISTRY_V1);
    assert_eq!(report.facts.get("package").map(String::as_str), Some("etcd"));
    let err = inspect(&[("metadata/annotations.yaml", annotations), ("manifests/d.yaml", DEPLOYMENT)])
        .finish("", true)
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "not a registry-v1 bundle: manifests/ holds no ClusterServiceVersion (found Deployment, Service)"
    );
    let err = inspect(&[("manifests/csv.yaml", csv)]).finish(REGISTRY_V1, true).unwrap_err();
    assert_eq!(
        err.to_string(),
        "not a registry-v1 bundle: metadata/annotations.yaml is missing (found manifests/ at the root)"
    );
}

#[test]
fn helm_charts_at_the_root_or_in_one_directory() {
    let chart = "apiVersion: v2\nname: demo\nversion: 1.2.3\n";
    let root = inspect(&[("Chart.yaml", chart), ("templates/x.yaml", "{{ .Values }}")]).finish("", true).unwrap();
    assert_eq!((root.format.as_str(), root.facts.get("version").map(String::as_str)), (HELM, Some("1.2.3")));
    let nested = inspect(&[("demo/Chart.yaml", chart), ("demo/values.yaml", "a: 1")]).finish("", true).unwrap();
    assert_eq!(nested.facts.get("chart").map(String::as_str), Some("demo"));
    let err = inspect(&[("Chart.yaml", "name: x\n")]).finish(HELM, true).unwrap_err();
    assert_eq!(err.to_string(), "not a helm chart: Chart.yaml: name and version are required");
    let err = inspect(&[("a/Chart.yaml", chart), ("b/x", "")]).finish(HELM, true).unwrap_err();
    assert_eq!(
        err.to_string(),
        "not a helm chart: a/Chart.yaml is not at the root, and its directory is not the only top-level one \
         (found a/, b/)"
    );
}

#[test]
fn undetectable_trees_fail_only_when_strict() {
    let files = [("README.md", "hi")];
    let err = inspect(&files).finish("", true).unwrap_err();
    assert_eq!(
        err.to_string(),
        "no bundle format detected: found README.md at the root; expected manifests/ (plain), \
         metadata/annotations.yaml (registry-v1) or Chart.yaml (helm) at the root"
    );
    let many: Vec<(String, &str)> = (0..70).map(|i| (format!("f{i:02}"), "")).collect();
    let many: Vec<(&str, &str)> = many.iter().map(|(p, t)| (p.as_str(), *t)).collect();
    let err = inspect(&many).finish(PLAIN, true).unwrap_err();
    assert_eq!(
        err.to_string(),
        "not a plain bundle: there is no manifests/ directory (found f00, f01, f02, f03, f04, f05, f06, f07 and 56 \
         or more others at the root)"
    );
    assert_eq!(inspect(&files).finish("", false).unwrap().format, "");
    // A declared format is always checked.
    assert!(inspect(&files).finish(PLAIN, false).is_err());
}

#[test]
fn what_the_inspector_keeps_is_bounded_whatever_the_tree() {
    let mut inspector = Inspector::default();
    for i in 0..(MAX_KINDS + 44) {
        let path = format!("manifests/{i}.yaml");
        inspector.saw(&path);
        inspector.observe(&path, format!("apiVersion: v1\nkind: Kind{i}\n").as_bytes());
    }
    let long = format!("apiVersion: v1\nkind: {}\n", "K".repeat(MAX_KIND_BYTES + 1));
    inspector.observe("manifests/long.yaml", long.as_bytes());
    for i in 0..1000 {
        inspector.observe(&format!("chart{i}/Chart.yaml"), b"name: c\nversion: 1.0.0\n");
    }
    assert_eq!(inspector.objects.len(), MAX_KINDS + 1);
    assert_eq!(inspector.objects.get(OTHER_KINDS), Some(&45));
    assert_eq!(inspector.charts, 1000);
    let report = inspector.finish(PLAIN, true).unwrap();
    assert_eq!(report.objects.values().sum::<u64>(), MAX_KINDS as u64 + 45);
}

#[test]
fn messages_say_where_each_source_was_placed() {
    let placed = |files: &[(&str, &str)], destinations: &[&str]| {
        let mut inspector = inspect(files);
        inspector.set_destinations(destinations.iter().map(|d| d.to_string()).collect());
        inspector
    };
    let one = placed(&[("from-git/manifests/a.yaml", DEPLOYMENT)], &["from-git/"]);
    assert_eq!(
        one.finish("", true).unwrap_err().to_string(),
        "no bundle format detected: found from-git/ at the root (spec.sources[0] under from-git/); expected \
         manifests/ (plain), metadata/annotations.yaml (registry-v1) or Chart.yaml (helm) at the root"
    );
    let chart = "apiVersion: v2\nname: kps\nversion: 1.0.0\n";
    let composed = [("from-git/manifests/a.yaml", DEPLOYMENT), ("charts/kps/Chart.yaml", chart)];
    let report = placed(&composed, &["from-git/", "charts/kps/"]).finish("", true).unwrap();
    assert_eq!(report, FormatReport::default(), "several sources, each placed: served as composed");
    assert_eq!(
        placed(&composed, &["from-git/", "charts/kps/"]).finish(PLAIN, true).unwrap_err().to_string(),
        "not a plain bundle: there is no manifests/ directory (found charts/, from-git/ at the root \
         (spec.sources[0] under from-git/, spec.sources[1] under charts/kps/))"
    );
    let root_and_placed = placed(&composed, &["", "charts/kps/"]);
    assert!(root_and_placed.finish("", true).is_err(), "a source at the root must be a bundle there");
}

#[test]
fn yaml_files_at_the_root_are_plain_only_under_manifests() {
    let flat = [("a.yaml", DEPLOYMENT), ("b.yml", DEPLOYMENT)];
    let one = |declared: &str| {
        let mut inspector = inspect(&flat);
        inspector.set_destinations(vec![String::new()]);
        inspector.finish(declared, true).unwrap_err().to_string()
    };
    assert_eq!(
        one(""),
        "no bundle format detected: found a.yaml, b.yml at the root; expected manifests/ (plain), \
         metadata/annotations.yaml (registry-v1) or Chart.yaml (helm) at the root; a plain bundle keeps its YAML \
         or JSON objects under manifests/, not at the root: set spec.sources[0].destination to manifests"
    );
    assert_eq!(
        one(PLAIN),
        "not a plain bundle: there is no manifests/ directory (found a.yaml, b.yml at the root); a plain bundle \
         keeps its YAML or JSON objects under manifests/, not at the root: set spec.sources[0].destination to \
         manifests"
    );
    let moved = inspect(&[("manifests/a.yaml", DEPLOYMENT)]).finish(PLAIN, true).unwrap();
    assert_eq!(moved.objects.get("Deployment"), Some(&1), "the same files under manifests/ are a plain bundle");
}
