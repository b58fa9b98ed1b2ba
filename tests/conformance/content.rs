//! Every bundle of the corpus round-trips byte-identical: as a tar, file by file, as a listing,
//! and as subtrees.

use std::path::{Path, PathBuf};

use reqwest::StatusCode;
use serde_json::Value;

use crate::harness::*;
use crate::tarutil::*;

/// Bundle directories of one corpus group: the directories `depth` levels below it.
fn bundle_dirs(group: &str, depth: usize) -> Vec<PathBuf> {
    let mut dirs = vec![corpus().join(group)];
    for _ in 0..depth {
        let mut next = Vec::new();
        for d in dirs {
            for e in std::fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    next.push(p);
                }
            }
        }
        dirs = next;
    }
    dirs.sort();
    assert!(!dirs.is_empty(), "no bundles under corpus/{group}");
    dirs
}

/// `kube-prometheus-stack/88.5.3` → `kube-prometheus-stack-88-5-3`.
fn bundle_name(dir: &Path) -> String {
    let rel = dir.strip_prefix(corpus()).unwrap().to_str().unwrap();
    rel.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' }).collect()
}

async fn listing(server: &Server, path: &str) -> Value {
    let resp = server.client().get(server.url(path)).header("Accept", "application/json").send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK, "listing {path}");
    let body = resp.bytes().await.unwrap();
    parse_json(&body, "file listing")
}

/// Uploads `dir` (tarred by the system tar) to its own Bundle and checks everything a user can
/// read back. Returns the Bundle.
async fn round_trip(server: &Server, ns: &str, dir: &Path) -> Value {
    let name = bundle_name(dir);
    let ctx = format!("{ns}/{name} ({})", dir.display());
    let expected = tree_from_dir(dir);
    let exact = entries_from_dir(dir);
    let (files, size) = file_count_and_size(&expected);

    server.create_bundle(ns, &name).await;
    let b = server.upload_ok(ns, &name, system_tar(dir), None).await;
    let digest = str_at(&b, "/status/digest").to_owned();
    assert_eq!(u64_at(&b, "/status/files"), files, "{ctx}: status.files");
    assert_eq!(u64_at(&b, "/status/size"), size, "{ctx}: status.size");
    let fetched = server.get_json(&bundle(ns, &name)).await;
    assert_eq!(fetched["status"], b["status"], "{ctx}: GET shows the upload's status");

    // The whole tar.
    let resp = server.get(&bundle_content(ns, &name)).await;
    assert_eq!(resp.status(), StatusCode::OK, "{ctx}");
    let etag = header(resp.headers(), "etag").map(str::to_owned);
    assert_eq!(etag.as_deref(), Some(format!("\"{digest}\"").as_str()), "{ctx}: ETag");
    let tar = resp.bytes().await.unwrap();
    assert_eq!(digest_of(&tar), digest, "{ctx}: sha256 of the tar is status.digest");
    assert_trees_equal(&expected, &parse_served_tar(&tar), &ctx);
    // Exactly: every directory too, and the permission bits (the corpus is 0444/0555).
    assert_entries_equal(&exact, &parse_served_entries(&tar), &ctx);

    // The same revision by its immutable name.
    let content_name = str_at(&b, "/status/contentName");
    let bc = server.get_json(&bundlecontent(ns, content_name)).await;
    assert_eq!(bc["kind"], "BundleContent", "{bc:#}");
    assert_eq!(str_at(&bc, "/spec/bundle"), name, "{ctx}: spec.bundle");
    assert_eq!(str_at(&bc, "/spec/digest"), digest, "{ctx}: spec.digest");
    assert_eq!(u64_at(&bc, "/spec/files"), files, "{ctx}: spec.files");
    assert_eq!(u64_at(&bc, "/spec/size"), size, "{ctx}: spec.size");
    assert!(u64_at(&bc, "/spec/storedSize") > 0, "{ctx}: spec.storedSize");
    let owners = bc["metadata"]["ownerReferences"].as_array().cloned().unwrap_or_default();
    assert!(
        owners.iter().any(|o| o["kind"] == "Bundle" && o["name"] == name.as_str() && o["uid"] == b["metadata"]["uid"]),
        "{ctx}: BundleContent not owned by its Bundle: {bc:#}"
    );
    let again = server.download(&bundlecontent_content(ns, content_name)).await;
    assert_eq!(digest_of(&again), digest, "{ctx}: bundlecontents/…/content");

    // The listing: one entry per file, symlink and directory, right type, size, mode and sha256.
    let list = listing(server, &bundle_content(ns, &name)).await;
    assert_eq!(list["kind"], "BundleContentFileList", "{list:#}");
    assert_eq!(list["apiVersion"], API_VERSION);
    assert_eq!(list["digest"], digest.as_str(), "{ctx}: listing digest");
    let entries = list["files"].as_array().expect("files array");
    assert_eq!(entries.len(), exact.len(), "{ctx}: one listing entry per file and directory");
    for e in entries {
        let path = str_at(e, "/path");
        let Some(node) = exact.get(path) else {
            panic!("{ctx}: listing has {path}, not in the source");
        };
        match node {
            Entry::File { data, mode } => {
                assert_eq!(e["type"], "file", "{ctx}: {e}");
                assert_eq!(u64_at(e, "/size"), data.len() as u64, "{ctx}: {path} size");
                assert_eq!(str_at(e, "/sha256"), sha256_hex(data), "{ctx}: {path} sha256");
                assert_eq!(u64_at(e, "/mode"), u64::from(*mode), "{ctx}: {path} mode");
            }
            Entry::Dir { mode } => {
                assert_eq!(e["type"], "directory", "{ctx}: {e}");
                assert_eq!(u64_at(e, "/mode"), u64::from(*mode), "{ctx}: {path} mode");
            }
            Entry::Symlink(target) => {
                assert_eq!(e["type"], "symlink", "{ctx}: {e}");
                assert_eq!(str_at(e, "/target"), target, "{ctx}: {path} target");
            }
        }
    }

    // `?path=` of single files: the first, the largest and the last.
    let regular: Vec<(&String, &Vec<u8>)> = expected
        .iter()
        .filter_map(|(p, n)| match n {
            Node::File { data, .. } => Some((p, data)),
            Node::Symlink(_) => None,
        })
        .collect();
    let largest = regular.iter().max_by_key(|(_, d)| d.len()).unwrap();
    for (path, data) in [regular[0], *largest, regular[regular.len() - 1]] {
        let resp = server.get(&with_path(&bundle_content(ns, &name), path)).await;
        assert_eq!(resp.status(), StatusCode::OK, "{ctx}: ?path={path}");
        let etag = header(resp.headers(), "etag").map(str::to_owned);
        let want_etag = format!("\"sha256:{}\"", sha256_hex(data));
        assert_eq!(etag, Some(want_etag), "{ctx}: ?path={path} ETag");
        let body = resp.bytes().await.unwrap();
        assert!(body[..] == data[..], "{ctx}: ?path={path} bytes differ");
    }

    // `?path=DIR/`: the subtree with full paths, headed by the directory itself.
    if let Some((dir_prefix, _)) = expected.keys().find_map(|p| p.split_once('/')) {
        let sub = server.download(&with_path(&bundle_content(ns, &name), &format!("{dir_prefix}/"))).await;
        let want: Entries = exact
            .iter()
            .filter(|(p, _)| p.starts_with(&format!("{dir_prefix}/")))
            .map(|(p, n)| (p.clone(), n.clone()))
            .collect();
        assert_entries_equal(&want, &parse_served_entries(&sub), &format!("{ctx} ?path={dir_prefix}/"));
    }

    let resp = server.get(&with_path(&bundle_content(ns, &name), "no/such/file.yaml")).await;
    expect_status(resp, 404, "NotFound").await;

    b
}

#[tokio::test(flavor = "multi_thread")]
async fn corpus_rukpak_testdata_round_trips() {
    let server = Server::start_temp(&[]);
    for dir in bundle_dirs("rukpak-testdata", 2) {
        round_trip(&server, "rukpak", &dir).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn corpus_operator_registry_round_trips() {
    let server = Server::start_temp(&[]);
    for dir in bundle_dirs("operator-registry", 1) {
        round_trip(&server, "registry", &dir).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn corpus_kube_prometheus_stack_round_trips() {
    let server = Server::start_temp(&[]);
    for dir in bundle_dirs("kube-prometheus-stack", 1) {
        round_trip(&server, "kps", &dir).await;
    }
}

/// The same tree (files, directories, modes), tarred differently (another tool, owners, times,
/// order) and compressed or not, is the same revision.
#[tokio::test(flavor = "multi_thread")]
async fn identical_content_is_the_same_revision() {
    let server = Server::start_temp(&[]);
    let dir = corpus().join("kube-prometheus-stack/88.5.3");
    server.create_bundle("ns", "kps").await;
    let first = server.upload_ok("ns", "kps", system_tar(&dir), None).await;
    let digest = str_at(&first, "/status/digest").to_owned();
    let content_name = str_at(&first, "/status/contentName").to_owned();

    let ours = tar_of_entries(&entries_from_dir(&dir));
    let variants: Vec<(&str, Vec<u8>, Option<&str>)> = vec![
        ("tar::Builder tar", ours.clone(), None),
        ("gzip, Content-Encoding: gzip", gzip(&ours), Some("gzip")),
        ("zstd, Content-Encoding: zstd", zstd(&ours), Some("zstd")),
        ("gzip, sniffed", gzip(&ours), None),
        ("zstd, sniffed", zstd(&ours), None),
    ];
    for (what, body, encoding) in variants {
        let b = server.upload_ok("ns", "kps", body, encoding).await;
        assert_eq!(str_at(&b, "/status/digest"), digest, "{what}: digest");
        assert_eq!(str_at(&b, "/status/contentName"), content_name, "{what}");
        assert_eq!(
            server.bundlecontent_names("ns").await,
            vec![content_name.clone()],
            "{what}: still exactly one revision"
        );
    }
    let tar = server.download(&bundle_content("ns", "kps")).await;
    assert_eq!(digest_of(&tar), digest);

    // A different version is a different revision, and the Bundle serves it.
    let other = corpus().join("kube-prometheus-stack/88.5.2");
    let b = server.upload_ok("ns", "kps", system_tar(&other), None).await;
    assert_ne!(str_at(&b, "/status/digest"), digest);
    let tar = server.download(&bundle_content("ns", "kps")).await;
    assert_eq!(digest_of(&tar), str_at(&b, "/status/digest"));
    assert_trees_equal(&tree_from_dir(&other), &parse_served_tar(&tar), "88.5.2 after 88.5.3");
}

/// `Accept-Encoding: zstd` / `gzip` compress whole downloads (decompressing gives the digest's bytes);
/// a Range request is answered with identity bytes, as the ETag and Content-Range describe them.
#[tokio::test(flavor = "multi_thread")]
async fn downloads_honour_accept_encoding() {
    let server = Server::start_temp(&[]);
    let kps = corpus().join("kube-prometheus-stack/88.5.3");
    server.create_bundle("enc", "kps").await;
    let bundle = server.upload_ok("enc", "kps", system_tar(&kps), None).await;
    let digest = str_at(&bundle, "/status/digest").to_owned();
    let url = server.url(&bundle_content("enc", "kps"));
    for encoding in ["zstd", "gzip"] {
        let resp = server.client().get(&url).header("accept-encoding", encoding).send().await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(header(resp.headers(), "content-encoding"), Some(encoding));
        let body = resp.bytes().await.unwrap();
        let plain = match encoding {
            "zstd" => zstd::stream::decode_all(&body[..]).unwrap(),
            _ => {
                let mut out = Vec::new();
                std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&body[..]), &mut out).unwrap();
                out
            }
        };
        assert!(
            body.len() * 4 < plain.len(),
            "{encoding}: {} -> {} bytes is hardly compressed",
            plain.len(),
            body.len()
        );
        assert_eq!(digest_of(&plain), digest, "{encoding}");
    }
    // The zstd representation has an ETag of its own (weak: its frames depend on how the store
    // laid the content out), answers If-None-Match with it, and says it varies with Accept-Encoding.
    let identity = server.client().get(&url).send().await.unwrap();
    let identity_etag = header(identity.headers(), "etag").unwrap().to_owned();
    let zstd = server.client().get(&url).header("accept-encoding", "gzip, zstd").send().await.unwrap();
    assert_eq!(header(zstd.headers(), "content-encoding"), Some("zstd"));
    assert_eq!(header(zstd.headers(), "vary"), Some("accept-encoding"));
    let zstd_etag = header(zstd.headers(), "etag").unwrap().to_owned();
    assert!(zstd_etag.starts_with("W/") && zstd_etag != identity_etag, "{zstd_etag} vs {identity_etag}");
    let not_modified = server
        .client()
        .get(&url)
        .header("accept-encoding", "zstd")
        .header("if-none-match", &zstd_etag)
        .send()
        .await
        .unwrap();
    assert_eq!(not_modified.status(), StatusCode::NOT_MODIFIED);
    // One file (`?path=`), as zstd, decodes to its bytes.
    let crd = "charts/crds/crds/crd-prometheuses.yaml";
    let resp = server.client().get(format!("{url}?path={crd}")).header("accept-encoding", "zstd").send().await.unwrap();
    assert_eq!(header(resp.headers(), "content-encoding"), Some("zstd"));
    let body = resp.bytes().await.unwrap();
    let plain = zstd::stream::decode_all(&body[..]).unwrap();
    assert!(plain == std::fs::read(kps.join(crd)).unwrap(), "the file's bytes");
    assert!(body.len() * 4 < plain.len(), "{} -> {} bytes is hardly compressed", plain.len(), body.len());

    let ranged = server
        .client()
        .get(&url)
        .header("accept-encoding", "zstd")
        .header("range", "bytes=100-199")
        .send()
        .await
        .unwrap();
    assert_eq!(ranged.status(), StatusCode::PARTIAL_CONTENT);
    assert_eq!(header(ranged.headers(), "content-encoding"), None);
    assert_eq!(ranged.bytes().await.unwrap().len(), 100);

    // Content the store could not compress is sent as is: compressing it again would only cost a
    // core per download.
    let mut noise = Tree::new();
    noise.insert("blob.bin".into(), file(random_bytes(7, 3 << 20)));
    server.create_bundle("enc", "noise").await;
    let bundle = server.upload_ok("enc", "noise", build_tar(&noise), None).await;
    let digest = str_at(&bundle, "/status/digest").to_owned();
    let url = server.url(&bundle_content("enc", "noise"));
    for query in ["", "?path=blob.bin"] {
        let resp = server.client().get(format!("{url}{query}")).header("accept-encoding", "zstd").send().await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(header(resp.headers(), "content-encoding"), None, "{query}");
        let body = resp.bytes().await.unwrap();
        match query {
            "" => assert_eq!(digest_of(&body), digest),
            _ => assert!(body[..] == random_bytes(7, 3 << 20)[..], "the file's bytes"),
        }
    }
}
