//! What a user reads when content is refused: the exact `Status` message of an upload and the
//! exact `Unpacked` condition message of an unpack. Archive errors name the entry and the rule,
//! never echo the body's bytes or a library's wording; a path appears once; a format error says
//! which format was expected and what is missing (and, for detection, what was found).

use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::{json, Value};

use crate::harness::*;
use crate::http_server::{HttpAuth, HttpServer};
use crate::tarutil::*;
use crate::unpack::{condition, create, http_server_args, wait_reason};

const NS: &str = "msgs";
const NAME: &str = "b";

/// Text that is plainly not a tar: a README, longer than one tar block.
const README: &str = "# stowage\n\nBundle content — operator bundles, Helm charts and plain manifest trees — of \
any size, stored in an embedded, compressed, content-addressed store and served through the Kubernetes \
API.\n\n## Install\n\n    cargo install --locked --path .\n\nThen `stowage serve` and point kubectl at the \
kubeconfig it writes. Uploads are tarballs, optionally compressed; downloads are deterministic tars \
whose sha256 is the Bundle's digest.\n\n## Who may do what\n\nNamespaced roles aggregate the \
stowage rules; the content subresource can be granted separately from metadata.\n";

const NOT_TAR: &str = "not a tar archive (plain, gzip or zstd): the first 512 bytes are not a tar header";

static NEXT: AtomicUsize = AtomicUsize::new(0);

/// Uploads `body` to a fresh upload Bundle (with `spec` merged in), expects `code`/`reason`;
/// returns the Status message, the Bundle's name replaced by `NAME`.
async fn refused(
    server: &Server,
    spec: Value,
    body: Vec<u8>,
    encoding: Option<&str>,
    code: u16,
    reason: &str,
) -> String {
    let name = format!("{NAME}-{}", NEXT.fetch_add(1, Ordering::Relaxed));
    let mut object = upload_bundle(NS, &name);
    if let (Some(have), Some(more)) = (object["spec"].as_object_mut(), spec.as_object()) {
        have.extend(more.clone());
    }
    let resp = server.post_json(&bundles(NS), &object).await;
    assert_eq!(resp.status().as_u16(), 201, "create {name}: {}", resp.text().await.unwrap_or_default());
    let status = expect_status(server.upload(NS, &name, body, encoding).await, code, reason).await;
    str_at(&status, "/message").replace(&format!("{name:?}"), "\"NAME\"")
}

/// No word of the body, no binary, no library wording in the message.
fn assert_no_echo(message: &str, body: &[u8]) {
    assert!(message.is_ascii(), "binary or body text echoed: {message:?}");
    for word in String::from_utf8_lossy(body).split_whitespace().filter(|w| w.len() > 5) {
        assert!(!message.contains(word), "the message echoes the body ({word:?}): {message}");
    }
    for library in ["cksum", "numeric field", "when getting", "invalid gzip header", "corrupt deflate", "Unknown frame"]
    {
        assert!(!message.contains(library), "a library's wording: {message}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn archives_that_are_not_tar_are_named_in_plain_words() {
    let server = Server::start_temp(&[]);
    let none = json!({});

    let readme = README.as_bytes().to_vec();
    assert!(readme.len() > 512);
    let msg = refused(&server, none.clone(), readme.clone(), None, 400, "BadRequest").await;
    assert_eq!(msg, NOT_TAR, "a README uploaded as a tar");
    assert_no_echo(&msg, &readme);

    let short = b"# just a title\n".to_vec();
    let msg = refused(&server, none.clone(), short.clone(), None, 400, "BadRequest").await;
    assert_eq!(
        msg, "not a tar archive (plain, gzip or zstd): 15 bytes, shorter than one 512-byte tar header",
        "a short text file"
    );

    let binary = random_bytes(11, 64 << 10);
    let msg = refused(&server, none.clone(), binary.clone(), None, 400, "BadRequest").await;
    assert_eq!(msg, NOT_TAR, "random bytes");
    assert_no_echo(&msg, &binary);

    let msg = refused(&server, none.clone(), gzip(README.as_bytes()), None, 400, "BadRequest").await;
    assert_eq!(
        msg, "not a tar archive: the gzip data holds no tar header (its first 512 bytes, decompressed, are not one)",
        "gzip of a README"
    );
    let msg = refused(&server, none.clone(), zstd(&random_bytes(12, 4096)), None, 400, "BadRequest").await;
    assert_eq!(
        msg, "not a tar archive: the zstd data holds no tar header (its first 512 bytes, decompressed, are not one)",
        "zstd of random bytes"
    );

    let msg = refused(&server, none.clone(), random_bytes(13, 4096), Some("gzip"), 400, "BadRequest").await;
    assert_eq!(msg, "not valid gzip data: nothing could be decompressed", "Content-Encoding: gzip on random bytes");

    // A good first entry, then a header whose checksum does not add up.
    let mut bad = raw_entry("manifests/two.yaml", b'0', b"b: 2\n", "");
    bad[0] = b'M';
    let tar = raw_tar(&[raw_entry("manifests/one.yaml", b'0', b"a: 1\n", ""), bad]);
    let msg = refused(&server, none.clone(), tar, None, 400, "BadRequest").await;
    assert_eq!(msg, "corrupt archive: entry 2 (after \"manifests/one.yaml\"): the header checksum does not match");

    // Cut in the middle of the second file's data.
    let mut tree = Tree::new();
    tree.insert("a.txt".into(), file(b"one\n".to_vec()));
    tree.insert("b.bin".into(), file(random_bytes(14, 10_000)));
    let mut tar = build_tar(&tree);
    tar.truncate(512 * 4);
    let msg = refused(&server, none.clone(), tar, None, 400, "BadRequest").await;
    assert_eq!(msg, "truncated archive: entry 1 (\"b.bin\") ends 8464 bytes early");
    let mut gz = gzip(&build_tar(&tree));
    gz.truncate(gz.len() / 2);
    let msg = refused(&server, none, gz, None, 400, "BadRequest").await;
    assert!(msg.starts_with("truncated archive: the gzip data ends early, after "), "{msg}");
    assert!(msg.ends_with(" decompressed bytes"), "{msg}");
}

#[tokio::test(flavor = "multi_thread")]
async fn unsafe_entries_name_their_path_once() {
    let server = Server::start_temp(&[]);
    let tar =
        raw_tar(&[raw_entry("manifests/ok.yaml", b'0', b"a: 1\n", ""), raw_entry("../../etc/evil", b'0', b"x", "")]);
    let msg = refused(&server, json!({}), tar, None, 422, "Invalid").await;
    assert_eq!(msg, "Bundle.content.stowage.dev \"NAME\" is invalid: ../../etc/evil: path contains a '..' component");
    assert_eq!(msg.matches("etc/evil").count(), 1, "{msg}");

    let tar = raw_tar(&[raw_entry("sub/link", b'2', b"", "../../etc/passwd")]);
    let msg = refused(&server, json!({}), tar, None, 422, "Invalid").await;
    assert_eq!(msg, "Bundle.content.stowage.dev \"NAME\" is invalid: sub/link: symlink target escapes the bundle root");
}

fn tar_of(files: &[(&str, &str)]) -> Vec<u8> {
    let mut tree = Tree::new();
    for (path, text) in files {
        tree.insert((*path).into(), file(text.as_bytes().to_vec()));
    }
    build_tar(&tree)
}

const CM: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n";

#[tokio::test(flavor = "multi_thread")]
async fn format_errors_say_which_format_and_what_is_missing() {
    let server = Server::start_temp(&[]);
    let registry = json!({"format": "registry-v1"});
    let msg = refused(&server, registry, tar_of(&[("manifests/cm.yaml", CM)]), None, 422, "Invalid").await;
    assert_eq!(
        msg,
        "Bundle.content.stowage.dev \"NAME\" is invalid: not a registry-v1 bundle: metadata/annotations.yaml is missing \
         (found manifests/ at the root)"
    );

    let helm = json!({"format": "helm"});
    let tar = tar_of(&[("manifests/cm.yaml", CM), ("values.yaml", "a: 1\n")]);
    let msg = refused(&server, helm, tar, None, 422, "Invalid").await;
    assert_eq!(
        msg,
        "Bundle.content.stowage.dev \"NAME\" is invalid: not a helm chart: no Chart.yaml at the root or in a single \
         top-level directory (found manifests/, values.yaml)"
    );

    let plain = json!({"format": "plain"});
    let tar = tar_of(&[("manifests/broken.yaml", "apiVersion: v1\nkind: [unclosed\n")]);
    let msg = refused(&server, plain, tar, None, 422, "Invalid").await;
    assert_eq!(
        msg,
        "Bundle.content.stowage.dev \"NAME\" is invalid: not a plain bundle: manifests/broken.yaml: document 1 is not \
         valid YAML (line 3, column 1)"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn unpack_conditions_speak_plainly_too() {
    let web = HttpServer::start(HttpAuth::None);
    web.put("readme.tar", README.as_bytes());
    web.put("manifests.tar", &tar_of(&[("manifests/cm.yaml", CM)]));
    web.put("docs.tar", &tar_of(&[("README.md", "# hi\n"), ("docs/intro.md", "hello\n")]));
    let args = http_server_args(&web.host_port());
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let server = Server::start_temp(&refs);

    let cases = [
        (
            "readme",
            json!({"sources": [{"http": {"url": web.url("readme.tar")}}]}),
            "InvalidContent",
            format!("http source {}: {NOT_TAR}", web.url("readme.tar")),
        ),
        (
            "nocsv",
            json!({"sources": [{"http": {"url": web.url("manifests.tar")}}], "format": "registry-v1"}),
            "InvalidFormat",
            "not a registry-v1 bundle: metadata/annotations.yaml is missing (found manifests/ at the root)".to_owned(),
        ),
        (
            "nochart",
            json!({"sources": [{"http": {"url": web.url("manifests.tar")}}], "format": "helm"}),
            "InvalidFormat",
            "not a helm chart: no Chart.yaml at the root or in a single top-level directory (found manifests/)"
                .to_owned(),
        ),
        (
            "docs",
            json!({"sources": [{"http": {"url": web.url("docs.tar")}}]}),
            "InvalidFormat",
            "no bundle format detected: found README.md, docs/ at the root; expected manifests/ (plain), \
             metadata/annotations.yaml (registry-v1) or Chart.yaml (helm) at the root"
                .to_owned(),
        ),
    ];
    for (name, spec, _, _) in &cases {
        create(&server, name, spec.clone()).await;
    }
    for (name, _, reason, message) in &cases {
        let b = wait_reason(&server, name, reason).await;
        let unpacked = condition(&b, "Unpacked");
        assert_eq!(unpacked["message"], message.as_str(), "{name}: {unpacked}");
    }
}
