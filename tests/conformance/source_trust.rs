//! `--source-ca-file` and `--source-credentials` end to end, in standalone mode: a registry, an
//! nginx and a git server (behind an nginx proxy) serving https with a certificate from a private
//! CA are refused until the CA is trusted; git and http sources behind authentication unpack
//! with credentials from the file; both files are re-read at the next retry, without a restart.

use std::path::Path;
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use serde_json::{json, Value};

use crate::git_server::GitServer;
use crate::harness::*;
use crate::http_server::{HttpAuth, HttpServer};
use crate::registry::{Layer, Registry};
use crate::tarutil::{assert_trees_equal, build_tar, gzip};
use crate::unpack::{condition, corpus_tree, create, served, wait_reason};

const NS: &str = "unpack";
/// Retries back off from 5 s and double: a fix is seen within the second or third retry.
const RETRY: Duration = Duration::from_secs(90);

/// A private CA, a server certificate it signed for 127.0.0.1, and an unrelated CA.
struct Pki {
    ca_pem: String,
    other_ca_pem: String,
    cert_pem: String,
    key_pem: String,
}

fn new_ca(name: &str) -> (String, Issuer<'static, KeyPair>) {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    // Distinct names: a CA of the same name but another key is a different refusal (signature).
    params.distinguished_name.push(DnType::CommonName, name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let pem = params.self_signed(&key).unwrap().pem();
    (pem, Issuer::new(params, key))
}

impl Pki {
    fn new() -> Pki {
        let (ca_pem, issuer) = new_ca("stowage test CA");
        let (other_ca_pem, _) = new_ca("unrelated CA");
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec!["127.0.0.1".to_owned()]).unwrap().signed_by(&key, &issuer).unwrap();
        Pki { ca_pem, other_ca_pem, cert_pem: cert.pem(), key_pem: key.serialize_pem() }
    }
}

/// The Bundle's `Unpacked` message once its reason is `reason` for the current generation.
async fn message(server: &Server, name: &str, reason: &str) -> String {
    let b = wait_reason(server, name, reason).await;
    str_at(&condition(&b, "Unpacked"), "/message").to_owned()
}

/// Waits until every Bundle in `names` has unpacked (after retries).
async fn wait_all_unpacked(server: &Server, names: &[&str]) {
    for name in names {
        eventually(RETRY, &format!("{name} unpacks on a retry"), || async {
            let b = server.get_json(&bundle(NS, name)).await;
            let c = condition(&b, "Unpacked");
            match c["status"] == "True" {
                true => Ok(()),
                false => Err(c.to_string()),
            }
        })
        .await;
    }
}

/// Replaces `path` the way an editor or a mounted Secret does: write aside, then rename.
fn replace(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn assert_untrusted(name: &str, message: &str) {
    assert!(message.contains("TLS certificate is not trusted"), "{name}: {message}");
    assert!(message.contains("--source-ca-file"), "{name} says what to do: {message}");
    for internal in ["UnknownIssuer", "invalid peer certificate", "client error", "Connect"] {
        assert!(!message.contains(internal), "{name}: no TLS library internals ({internal}): {message}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_private_ca_is_trusted_only_through_source_ca_file_and_a_fixed_file_is_picked_up() {
    let pki = Pki::new();
    let image_tree = corpus_tree("rukpak-testdata/registry/valid");
    let registry = Registry::start_tls(&pki.cert_pem, &pki.key_pem).await;
    registry.push_image("bundles/etcd", "v1", &[Layer::gzip_tree(&image_tree)], "linux/amd64").await;
    let web_tree = corpus_tree("rukpak-testdata/plain-v0/valid");
    let web = HttpServer::start_tls(&pki.cert_pem, &pki.key_pem, None);
    web.put("plain.tgz", &gzip(&build_tar(&web_tree)));
    let git = GitServer::start().await;
    git.create("repo");
    git.commit_dir("repo", "main", &corpus().join("rukpak-testdata/plain-v0/valid"));
    let git_tls = HttpServer::start_tls(&pki.cert_pem, &pki.key_pem, Some(&git.host_port()));
    let sources = [
        ("image", json!({"image": {"ref": registry.reference("bundles/etcd", "v1")}})),
        ("web", json!({"http": {"url": web.url("plain.tgz")}})),
        ("repo", json!({"git": {"repository": git_tls.url("repo.git"), "ref": {"branch": "main"}}})),
    ];

    // No flag: the system's roots alone, and the registry is not an --insecure-registry.
    let plain = Server::start_temp(&[]);
    for (name, source) in &sources {
        create(&plain, name, json!({"sources": [source]})).await;
    }
    for (name, _) in &sources {
        let text = message(&plain, name, "PullFailed").await;
        report(&format!("{name} without --source-ca-file: {text}"));
        assert_untrusted(name, &text);
    }
    drop(plain);

    // The flag names a file holding another CA: still refused. Then the right CA is added.
    let files = tempfile::tempdir().unwrap();
    let ca_file = files.path().join("ca.pem");
    std::fs::write(&ca_file, &pki.other_ca_pem).unwrap();
    let server = Server::start_temp(&["--source-ca-file", ca_file.to_str().unwrap()]);
    for (name, source) in &sources {
        create(&server, name, json!({"sources": [source]})).await;
    }
    for (name, _) in &sources {
        assert_untrusted(name, &message(&server, name, "PullFailed").await);
    }
    replace(&ca_file, &format!("{}{}", pki.other_ca_pem, pki.ca_pem));
    wait_all_unpacked(&server, &["image", "web", "repo"]).await;
    assert_trees_equal(&image_tree, &served(&server, "image").await, "image over https with a private CA");
    assert_trees_equal(&web_tree, &served(&server, "web").await, "http source over https with a private CA");
    assert_trees_equal(&web_tree, &served(&server, "repo").await, "git over https with a private CA");

    // A file that is no longer PEM: a new Bundle says so, naming the flag.
    replace(&ca_file, "not a certificate\n");
    create(&server, "broken", json!({"sources": [sources[1].1.clone()]})).await;
    let text = message(&server, "broken", "PullFailed").await;
    assert!(text.contains("--source-ca-file") && text.contains("holds no PEM certificate"), "{text}");
}

#[tokio::test(flavor = "multi_thread")]
async fn git_and_http_credentials_come_from_source_credentials_and_changes_are_picked_up() {
    let git = GitServer::start_with_auth("ci", "git-pass-1");
    let git = git.await;
    git.create("repo");
    let tree = corpus_tree("rukpak-testdata/plain-v0/valid");
    git.commit_dir("repo", "main", &corpus().join("rukpak-testdata/plain-v0/valid"));
    let web = HttpServer::start(HttpAuth::Bearer("web-token-1".into()));
    web.put("plain.tar", &build_tar(&tree));
    let sources: [(&str, Value); 2] = [
        ("repo", json!({"git": {"repository": git.url("repo"), "ref": {"branch": "main"}}})),
        ("web", json!({"http": {"url": web.url("plain.tar")}})),
    ];
    let hosts = ["--insecure-source-host", &git.host_port(), "--insecure-source-host", &web.host_port()];

    // Without the flag: refused by the servers.
    let plain = Server::start_temp(&hosts);
    for (name, source) in &sources {
        create(&plain, name, json!({"sources": [source]})).await;
    }
    let git_refused = message(&plain, "repo", "PullFailed").await;
    report(&format!("git without credentials: {git_refused}"));
    assert!(git_refused.contains(&git.url("repo")), "{git_refused}");
    assert!(git_refused.contains("the server asks for credentials, and this source has none"), "{git_refused}");
    let web_refused = message(&plain, "web", "AccessDenied").await;
    report(&format!("http without credentials: {web_refused}"));
    assert!(web_refused.contains("401"), "{web_refused}");
    drop(plain);

    // The flag names a file that does not exist yet, then one with wrong secrets, then the
    // right ones: each is seen at the next retry.
    let files = tempfile::tempdir().unwrap();
    let creds = files.path().join("credentials.yaml");
    let mut args = hosts.to_vec();
    args.extend(["--source-credentials", creds.to_str().unwrap()]);
    let server = Server::start_temp(&args);
    for (name, source) in &sources {
        create(&server, name, json!({"sources": [source]})).await;
    }
    for (name, _) in &sources {
        let text = message(&server, name, "PullFailed").await;
        assert!(text.contains(&format!("--source-credentials {}: cannot be read", creds.display())), "{name}: {text}");
    }
    let file = |git_pass: &str, token: &str| {
        format!(
            "hosts:\n  \"{}\":\n    username: ci\n    password: {git_pass}\n  \"{}\":\n    token: {token}\n",
            git.host_port(),
            web.host_port()
        )
    };
    replace(&creds, &file("wrong-git-pass", "wrong-web-token"));
    for (name, _) in &sources {
        eventually(RETRY, &format!("{name} tries the wrong credentials"), || async {
            let b = server.get_json(&bundle(NS, name)).await;
            let text = condition(&b, "Unpacked")["message"].as_str().unwrap_or_default().to_owned();
            assert!(!text.contains("wrong-"), "{name}: never the credentials: {text}");
            match text.contains("cannot be read") {
                false => {
                    report(&format!("{name} with wrong credentials: {text}"));
                    Ok(())
                }
                true => Err(text),
            }
        })
        .await;
    }
    replace(&creds, &file("git-pass-1", "web-token-1"));
    wait_all_unpacked(&server, &["repo", "web"]).await;
    assert_trees_equal(&tree, &served(&server, "repo").await, "git with basic auth from the file");
    assert_trees_equal(&tree, &served(&server, "web").await, "http with a token from the file");

    // A file that does not parse: a new Bundle says where, without quoting the file.
    replace(&creds, &format!("hosts:\n  \"{}\":\n    token: [secret-in-a-list\n", web.host_port()));
    create(&server, "broken", json!({"sources": [sources[1].1.clone()]})).await;
    let text = message(&server, "broken", "PullFailed").await;
    assert!(text.contains("--source-credentials") && text.contains("is not valid YAML or JSON (line"), "{text}");
    assert!(!text.contains("secret-in-a-list"), "{text}");
}
