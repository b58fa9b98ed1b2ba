//! Bad input: each is refused with a clear `Status`, and the Bundle keeps serving its previous
//! revision, byte-identical.

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::harness::*;
use crate::tarutil::*;

const NS: &str = "bad";
const NAME: &str = "victim";
const MAX_BODY: u64 = 4 << 20;
const MAX_UNPACKED: u64 = 16 << 20;

/// A server with small limits and a Bundle holding one good revision.
struct Fixture {
    server: Server,
    tree: Tree,
    digest: String,
    content_name: String,
}

async fn fixture() -> Fixture {
    let server = Server::start_temp(&[
        "--max-body-bytes",
        &MAX_BODY.to_string(),
        "--max-unpacked-bytes",
        &MAX_UNPACKED.to_string(),
    ]);
    let mut tree = Tree::new();
    tree.insert("manifests/deployment.yaml".into(), file(random_bytes(1, 150_000)));
    tree.insert("manifests/crds/crd.yaml".into(), file(random_bytes(2, 60_000)));
    tree.insert("bin/run.sh".into(), Node::File { data: b"#!/bin/sh\necho hi\n".to_vec(), exec: true });
    tree.insert("docs/README.md".into(), file(b"# victim\n".to_vec()));
    tree.insert("README.md".into(), Node::Symlink("docs/README.md".into()));
    tree.insert("empty".into(), file(Vec::new()));
    server.create_bundle(NS, NAME).await;
    let b = server.upload_ok(NS, NAME, build_tar(&tree), None).await;
    let fx = Fixture {
        digest: str_at(&b, "/status/digest").to_owned(),
        content_name: str_at(&b, "/status/contentName").to_owned(),
        server,
        tree,
    };
    fx.assert_intact().await;
    fx
}

impl Fixture {
    /// The good revision is still what the Bundle says and serves, and nothing else appeared.
    async fn assert_intact(&self) {
        let s = &self.server;
        let b = s.get_json(&bundle(NS, NAME)).await;
        assert_eq!(str_at(&b, "/status/digest"), self.digest, "status.digest changed");
        assert_eq!(str_at(&b, "/status/contentName"), self.content_name);
        assert_eq!(
            s.bundlecontent_names(NS).await,
            vec![self.content_name.clone()],
            "BundleContents besides the good revision"
        );
        let tar = s.download(&bundle_content(NS, NAME)).await;
        assert_eq!(digest_of(&tar), self.digest, "served tar changed");
        assert_trees_equal(&self.tree, &parse_served_tar(&tar), "good revision");
        let tar = s.download(&bundlecontent_content(NS, &self.content_name)).await;
        assert_eq!(digest_of(&tar), self.digest, "bundlecontents/…/content changed");
    }

    /// Uploads `body`, expects this Status, checks the good revision; returns the message.
    async fn reject(&self, body: Vec<u8>, encoding: Option<&str>, code: u16, reason: &str) -> String {
        let resp = self.server.upload(NS, NAME, body, encoding).await;
        let status = expect_status(resp, code, reason).await;
        self.assert_intact().await;
        status["message"].as_str().unwrap().to_owned()
    }
}

/// A valid tar entry to put before the bad one, so that the bad one is not simply the first.
fn ok_entry() -> Vec<u8> {
    raw_entry("manifests/ok.yaml", b'0', b"kind: ConfigMap\n", "")
}

fn assert_names(message: &str, path: &str) {
    assert!(message.contains(path), "message does not name {path:?}: {message}");
}

#[tokio::test(flavor = "multi_thread")]
async fn rejects_parent_dir_path() {
    let fx = fixture().await;
    let tar = raw_tar(&[ok_entry(), raw_entry("../x", b'0', b"evil", "")]);
    let msg = fx.reject(tar, None, 422, "Invalid").await;
    assert_names(&msg, "../x");
    let tar = raw_tar(&[raw_entry("manifests/../../y", b'0', b"evil", "")]);
    let msg = fx.reject(tar, None, 422, "Invalid").await;
    assert_names(&msg, "manifests/../../y");
}

#[tokio::test(flavor = "multi_thread")]
async fn rejects_absolute_path() {
    let fx = fixture().await;
    let tar = raw_tar(&[ok_entry(), raw_entry("/abs", b'0', b"evil", "")]);
    let msg = fx.reject(tar, None, 422, "Invalid").await;
    assert_names(&msg, "/abs");
}

#[tokio::test(flavor = "multi_thread")]
async fn rejects_escaping_symlink() {
    let fx = fixture().await;
    let tar = raw_tar(&[ok_entry(), raw_entry("sub/a", b'2', b"", "../../etc/passwd")]);
    let msg = fx.reject(tar, None, 422, "Invalid").await;
    assert_names(&msg, "sub/a");
    let tar = raw_tar(&[raw_entry("abs-link", b'2', b"", "/etc/passwd")]);
    let msg = fx.reject(tar, None, 422, "Invalid").await;
    assert_names(&msg, "abs-link");
}

#[tokio::test(flavor = "multi_thread")]
async fn rejects_escaping_hardlink() {
    let fx = fixture().await;
    let tar = raw_tar(&[ok_entry(), raw_entry("hard-link", b'1', b"", "../outside")]);
    let msg = fx.reject(tar, None, 422, "Invalid").await;
    assert_names(&msg, "hard-link");
}

#[tokio::test(flavor = "multi_thread")]
async fn rejects_device_files() {
    let fx = fixture().await;
    let tar = raw_tar(&[ok_entry(), raw_entry("dev/console", b'3', b"", "")]);
    let msg = fx.reject(tar, None, 422, "Invalid").await;
    assert_names(&msg, "dev/console");
    let tar = raw_tar(&[raw_entry("dev/sda", b'4', b"", "")]);
    let msg = fx.reject(tar, None, 422, "Invalid").await;
    assert_names(&msg, "dev/sda");
}

#[tokio::test(flavor = "multi_thread")]
async fn rejects_duplicate_path() {
    let fx = fixture().await;
    let tar = raw_tar(&[
        raw_entry("dup/same.yaml", b'0', b"one", ""),
        ok_entry(),
        raw_entry("dup/same.yaml", b'0', b"two", ""),
    ]);
    let msg = fx.reject(tar, None, 422, "Invalid").await;
    assert_names(&msg, "dup/same.yaml");
}

fn mentions_any(message: &str, words: &[&str]) -> bool {
    let m = message.to_lowercase();
    words.iter().any(|w| m.contains(w))
}

#[tokio::test(flavor = "multi_thread")]
async fn rejects_truncated_archive() {
    let fx = fixture().await;
    let mut tree = Tree::new();
    tree.insert("a.bin".into(), file(random_bytes(3, 100_000)));
    tree.insert("b.bin".into(), file(random_bytes(4, 100_000)));
    let mut tar = build_tar(&tree);
    tar.truncate(tar.len() / 2); // in the middle of a file's data
    let msg = fx.reject(tar.clone(), None, 400, "BadRequest").await;
    assert!(
        mentions_any(&msg, &["truncat", "unexpected end", "eof", "incomplete", "corrupt"]),
        "message does not say the archive is truncated: {msg}"
    );
    // Also truncated inside the compressed stream.
    let full = build_tar(&tree);
    let mut gz = gzip(&full);
    gz.truncate(gz.len() / 2);
    fx.reject(gz, Some("gzip"), 400, "BadRequest").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn rejects_garbage() {
    let fx = fixture().await;
    let msg = fx.reject(random_bytes(5, 64 << 10), None, 400, "BadRequest").await;
    assert!(
        mentions_any(&msg, &["tar", "archive", "header", "checksum", "corrupt", "invalid"]),
        "message does not say the body is not a tar: {msg}"
    );
    // Claims gzip, is not.
    fx.reject(random_bytes(6, 4096), Some("gzip"), 400, "BadRequest").await;
}

/// A tar of one file of zeros, `MAX_UNPACKED * 4` bytes long: tiny when compressed.
fn bomb_tar() -> Vec<u8> {
    let mut t = Tree::new();
    t.insert("zeros.bin".into(), file(vec![0u8; (MAX_UNPACKED * 4) as usize]));
    build_tar(&t)
}

#[tokio::test(flavor = "multi_thread")]
async fn rejects_gzip_bomb() {
    let fx = fixture().await;
    let bomb = gzip(&bomb_tar());
    assert!((bomb.len() as u64) < MAX_BODY / 8);
    let msg = fx.reject(bomb, Some("gzip"), 413, "RequestEntityTooLarge").await;
    assert!(
        mentions_any(&msg, &[&MAX_UNPACKED.to_string(), "limit", "too large", "exceed"]),
        "message does not name the limit: {msg}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn rejects_zstd_bomb() {
    let fx = fixture().await;
    let bomb = zstd(&bomb_tar());
    fx.reject(bomb, None, 413, "RequestEntityTooLarge").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn rejects_body_over_limit() {
    let fx = fixture().await;
    // A perfectly good tar, just bigger than --max-body-bytes.
    let mut t = Tree::new();
    t.insert("big.bin".into(), file(random_bytes(7, (MAX_BODY + (1 << 20)) as usize)));
    let msg = fx.reject(build_tar(&t), None, 413, "RequestEntityTooLarge").await;
    assert!(
        mentions_any(&msg, &[&MAX_BODY.to_string(), "limit", "too large", "exceed"]),
        "message does not name the limit: {msg}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn rejects_invalid_bundle_name() {
    let server = Server::start_temp(&[]);
    for bad in ["Bad_Name", "-leading-dash", "has.UPPER", &"x".repeat(254)] {
        let resp = server.post_json(&bundles(NS), &upload_bundle(NS, bad)).await;
        let status = expect_status(resp, 422, "Invalid").await;
        let causes = status["details"]["causes"].as_array().cloned().unwrap_or_default();
        assert!(
            causes.iter().any(|c| c["field"] == "metadata.name"),
            "{bad}: no cause with field metadata.name: {status:#}"
        );
        assert!(status["message"].as_str().unwrap().contains(bad), "{bad}: message does not name it: {status:#}");
    }
    let list = server.get_json(&bundles(NS)).await;
    assert_eq!(list["items"], json!([]), "invalid bundles were stored: {list:#}");
}

#[tokio::test(flavor = "multi_thread")]
async fn rejects_unknown_field_under_strict_validation() {
    let server = Server::start_temp(&[]);
    let mut obj = upload_bundle(NS, "strict");
    obj["spec"]["bogus"] = json!(true);
    let path = format!("{}?fieldValidation=Strict", bundles(NS));
    let status = expect_status(server.post_json(&path, &obj).await, 400, "BadRequest").await;
    let msg = status["message"].as_str().unwrap();
    assert!(msg.contains(r#"strict decoding error: unknown field "spec.bogus""#), "{msg}");
    let resp = server.get(&bundle(NS, "strict")).await;
    assert_eq!(resp.status(), StatusCode::NOT_FOUND, "rejected Bundle was stored");
}

#[tokio::test(flavor = "multi_thread")]
async fn rejects_duplicate_create() {
    let server = Server::start_temp(&[]);
    let created = server.create_bundle(NS, "twice").await;
    let resp = server.post_json(&bundles(NS), &upload_bundle(NS, "twice")).await;
    let status = expect_status(resp, 409, "AlreadyExists").await;
    assert!(status["message"].as_str().unwrap().contains("twice"), "{status:#}");
    let now = server.get_json(&bundle(NS, "twice")).await;
    assert_eq!(now["metadata"]["uid"], created["metadata"]["uid"], "object replaced");
}

#[tokio::test(flavor = "multi_thread")]
async fn rejects_stale_resource_version() {
    let fx = fixture().await;
    let s = &fx.server;
    let before: Value = s.get_json(&bundle(NS, NAME)).await;

    let mut update = before.clone();
    update["metadata"]["labels"] = json!({"team": "a"});
    let resp = s.put_json(&bundle(NS, NAME), &update).await;
    assert_eq!(resp.status(), StatusCode::OK, "{}", resp.text().await.unwrap());

    let mut stale = before.clone();
    stale["metadata"]["labels"] = json!({"team": "b"});
    let status = expect_status(s.put_json(&bundle(NS, NAME), &stale).await, 409, "Conflict").await;
    assert!(status["message"].as_str().unwrap().contains(NAME), "{status:#}");
    let now = s.get_json(&bundle(NS, NAME)).await;
    assert_eq!(now["metadata"]["labels"], json!({"team": "a"}), "stale update applied");
    fx.assert_intact().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn missing_objects_are_404_status() {
    let fx = fixture().await;
    let s = &fx.server;
    for path in [
        bundle(NS, "nope"),
        bundle_content(NS, "nope"),
        bundle("other-ns", NAME),
        bundlecontent(NS, "nope-0123456789"),
        bundlecontent_content(NS, "nope-0123456789"),
    ] {
        let status = expect_status(s.get(&path).await, 404, "NotFound").await;
        assert!(
            status["message"].as_str().unwrap().contains("nope") || status["message"].as_str().unwrap().contains(NAME),
            "{path}: {status:#}"
        );
    }
    let resp = s.upload(NS, "nope", build_tar(&fx.tree), None).await;
    expect_status(resp, 404, "NotFound").await;
    let status = expect_status(s.delete(&bundle(NS, "nope")).await, 404, "NotFound").await;
    assert!(status["message"].as_str().unwrap().contains("nope"));
    fx.assert_intact().await;
}

/// Without credentials a request runs as system:anonymous, which no policy allows here: 403 with
/// kube-apiserver's message, and nothing is touched.
#[tokio::test(flavor = "multi_thread")]
async fn requests_without_credentials_are_anonymous_and_forbidden() {
    let fx = fixture().await;
    let anonymous = fx.server.anonymous_client();
    let get = anonymous
        .get(fx.server.url(&bundle_content(NS, NAME)))
        .send()
        .await
        .expect("TLS without a client certificate is accepted and answered");
    let status = expect_status(get, 403, "Forbidden").await;
    assert_eq!(
        str_at(&status, "/message"),
        format!(
            "bundles.content.stowage.dev \"{NAME}\" is forbidden: User \"system:anonymous\" cannot get resource \
             \"bundles/content\" in API group \"content.stowage.dev\" in the namespace \"{NS}\""
        )
    );
    let put = anonymous
        .put(fx.server.url(&bundle_content(NS, NAME)))
        .body(build_tar(&Tree::from([("x".to_string(), file(b"x".to_vec()))])))
        .send()
        .await
        .unwrap();
    expect_status(put, 403, "Forbidden").await;
    let list = anonymous.get(fx.server.url(&bundles(NS))).send().await.unwrap();
    expect_status(list, 403, "Forbidden").await;
    // A forged bearer token is 401, never anonymous.
    let forged = anonymous.get(fx.server.url(&bundles(NS))).bearer_auth("made-up").send().await.unwrap();
    expect_status(forged, 401, "Unauthorized").await;
    fx.assert_intact().await;
}

/// With anonymous requests switched off, no credentials is 401.
#[tokio::test(flavor = "multi_thread")]
async fn without_anonymous_auth_requests_without_credentials_are_401() {
    let server = Server::start_temp(&["--anonymous-auth=false"]);
    let resp = server.anonymous_client().get(server.url(&bundles(NS))).send().await.unwrap();
    expect_status(resp, 401, "Unauthorized").await;
    assert_eq!(server.anonymous_client().get(server.url("/healthz")).send().await.unwrap().status(), 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn upload_to_bundle_without_upload_source_is_400() {
    let server = Server::start_temp(&[]);
    let obj = json!({
        "apiVersion": API_VERSION,
        "kind": "Bundle",
        "metadata": {"name": "from-http", "namespace": NS},
        "spec": {"sources": [{"http": {"url": "http://127.0.0.1:9/bundle.tar"}}]},
    });
    let resp = server.post_json(&bundles(NS), &obj).await;
    assert_eq!(resp.status(), StatusCode::CREATED, "{}", resp.text().await.unwrap());
    let tar = build_tar(&Tree::from([("a".to_string(), file(b"a".to_vec()))]));
    let status = expect_status(server.upload(NS, "from-http", tar, None).await, 400, "BadRequest").await;
    assert!(
        status["message"].as_str().unwrap().contains("upload"),
        "message does not say the Bundle has no upload source: {status:#}"
    );
    assert_eq!(server.bundlecontent_names(NS).await, Vec::<String>::new());
}
