//! A real OCI registry for tests: Debian's `docker-registry` (CNCF distribution) on 127.0.0.1,
//! optionally behind htpasswd basic auth or serving https with a given certificate, with helpers that push images, indexes and Helm charts
//! through the distribution API (plain reqwest: the fixtures never go through the code under
//! test). The registry is killed when the [`Registry`] is dropped.
//!
//! ```ignore
//! let reg = Registry::start().await;
//! let img = reg.push_image("team/app", "v1", &[Layer::gzip_tree(&tree)], "linux/amd64").await;
//! let spec_ref = format!("{}/team/app:v1", reg.host());   // also reg.reference("team/app", "v1")
//! // server flag: --insecure-registry <reg.host()>; digest: img.digest
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use base64::Engine;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::harness::poll_until;
use crate::tarutil::{self, Tree};

/// One layer blob and what it unpacks to.
#[derive(Clone)]
pub(crate) struct Layer {
    pub media_type: String,
    pub data: Vec<u8>,
}

impl Layer {
    pub fn tar(tar: Vec<u8>) -> Layer {
        Layer { media_type: "application/vnd.oci.image.layer.v1.tar".into(), data: tar }
    }
    pub fn gzip(tar: &[u8]) -> Layer {
        Layer { media_type: "application/vnd.oci.image.layer.v1.tar+gzip".into(), data: tarutil::gzip(tar) }
    }
    pub fn zstd(tar: &[u8]) -> Layer {
        Layer { media_type: "application/vnd.oci.image.layer.v1.tar+zstd".into(), data: tarutil::zstd(tar) }
    }
    /// A Docker (schema 2) gzip layer; use it with [`Registry::push_docker_image`].
    pub fn docker_gzip(tar: &[u8]) -> Layer {
        Layer { media_type: "application/vnd.docker.image.rootfs.diff.tar.gzip".into(), data: tarutil::gzip(tar) }
    }
    /// The usual layer: `tree` as a gzip tar.
    pub fn gzip_tree(tree: &Tree) -> Layer {
        Layer::gzip(&tarutil::build_tar(tree))
    }
    pub fn raw(media_type: &str, data: Vec<u8>) -> Layer {
        Layer { media_type: media_type.into(), data }
    }
}

/// A pushed manifest (image or index).
#[derive(Clone, Debug)]
pub(crate) struct Pushed {
    pub digest: String,
    pub size: u64,
    pub media_type: String,
}

pub(crate) struct Registry {
    child: Child,
    dir: tempfile::TempDir,
    port: u16,
    auth: Option<(String, String)>,
    /// Serving https (`http.tls` in its config) rather than plain http.
    tls: bool,
    http: reqwest::Client,
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const REGISTRY_BIN: &str = "/usr/bin/docker-registry";

/// `docker-registry serve CONFIG`, its output into `log`.
fn spawn(config: &Path, log: &Path) -> Child {
    let log_file = std::fs::File::create(log).expect("log file");
    Command::new(REGISTRY_BIN)
        .arg("serve")
        .arg(config)
        .stdin(Stdio::null())
        .stdout(log_file.try_clone().expect("log file"))
        .stderr(log_file)
        .spawn()
        .unwrap_or_else(|e| panic!("start {REGISTRY_BIN}: {e}"))
}

impl Registry {
    /// An anonymous registry.
    pub async fn start() -> Registry {
        Registry::launch(None, None).await
    }

    /// An anonymous registry serving https with this PEM certificate (chain) and key. The
    /// fixture's own client does not check the certificate: trust is what the tests exercise.
    pub async fn start_tls(cert_pem: &str, key_pem: &str) -> Registry {
        Registry::launch(None, Some((cert_pem.to_owned(), key_pem.to_owned()))).await
    }

    /// A registry that answers only to `user`/`pass` (HTTP basic auth, htpasswd).
    pub async fn start_with_auth(user: &str, pass: &str) -> Registry {
        Registry::launch(Some((user.to_owned(), pass.to_owned())), None).await
    }

    async fn launch(auth: Option<(String, String)>, tls: Option<(String, String)>) -> Registry {
        assert!(
            Path::new(REGISTRY_BIN).exists(),
            "{REGISTRY_BIN} missing: install the Debian package docker-registry (scripts/test.sh does)"
        );
        let dir = tempfile::tempdir().expect("temp dir");
        let mut last_log = String::new();
        // A port picked by binding :0 may be taken again before the registry binds it: retry.
        for _ in 0..5 {
            let port =
                std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("free port").port();
            let config = write_config(dir.path(), port, auth.as_ref(), tls.as_ref());
            let log = dir.path().join(format!("registry-{port}.log"));
            let mut child = spawn(&config, &log);
            let http = reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .tls_danger_accept_invalid_certs(tls.is_some())
                .build()
                .expect("http client");
            let base = format!("{}://127.0.0.1:{port}", if tls.is_some() { "https" } else { "http" });
            if wait_ready(&mut child, &http, &base).await {
                return Registry { child, dir, port, auth, tls: tls.is_some(), http };
            }
            last_log = std::fs::read_to_string(&log).unwrap_or_default();
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("docker-registry did not start; its log:\n{last_log}");
    }

    /// Stops the registry (connections are refused); what it stores stays for [`Self::restart`].
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts an anonymous plain-http registry again on the same port and storage.
    pub async fn restart(&mut self) {
        assert!(self.auth.is_none() && !self.tls, "restart is for anonymous plain-http registries");
        let config = write_config(self.dir.path(), self.port, None, None);
        self.child = spawn(&config, &self.dir.path().join("registry-restarted.log"));
        let base = format!("http://127.0.0.1:{}", self.port);
        assert!(wait_ready(&mut self.child, &self.http, &base).await, "docker-registry did not start again");
    }

    /// `127.0.0.1:PORT`: the registry part of references, and the `--insecure-registry` value.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `HOST/repo:tag`.
    pub fn reference(&self, repo: &str, tag: &str) -> String {
        format!("{}/{repo}:{tag}", self.host())
    }

    /// `HOST/repo@digest`.
    pub fn pinned(&self, repo: &str, digest: &str) -> String {
        format!("{}/{repo}@{digest}", self.host())
    }

    /// A `.dockerconfigjson` with `user`/`pass` for this registry (a pull secret's content).
    pub fn docker_config(&self, user: &str, pass: &str) -> Vec<u8> {
        let auth = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"));
        serde_json::to_vec(&json!({"auths": {self.host(): {"auth": auth}}})).expect("json")
    }

    fn base(&self) -> String {
        format!("{}://{}", if self.tls { "https" } else { "http" }, self.host())
    }

    fn req(&self, method: reqwest::Method, url: &str) -> reqwest::RequestBuilder {
        let r = self.http.request(method, url);
        match &self.auth {
            Some((u, p)) => r.basic_auth(u, Some(p)),
            None => r,
        }
    }

    /// Uploads a blob (monolithic: POST then PUT) and returns its digest.
    pub async fn push_blob(&self, repo: &str, data: &[u8]) -> String {
        let digest = digest_of(data);
        let resp = self
            .req(reqwest::Method::POST, &format!("{}/v2/{repo}/blobs/uploads/", self.base()))
            .send()
            .await
            .expect("POST upload");
        assert_eq!(resp.status().as_u16(), 202, "start upload: {}", resp.text().await.unwrap_or_default());
        let location =
            resp.headers().get("location").and_then(|v| v.to_str().ok()).expect("upload location").to_owned();
        let url = if location.starts_with("http") { location } else { format!("{}{location}", self.base()) };
        let sep = if url.contains('?') { '&' } else { '?' };
        let resp = self
            .req(reqwest::Method::PUT, &format!("{url}{sep}digest={digest}"))
            .header("content-type", "application/octet-stream")
            .body(data.to_vec())
            .send()
            .await
            .expect("PUT blob");
        assert_eq!(resp.status().as_u16(), 201, "finish upload: {}", resp.text().await.unwrap_or_default());
        digest
    }

    /// Stores `manifest` under `reference` (a tag or its digest).
    pub async fn push_manifest(&self, repo: &str, reference: &str, media_type: &str, manifest: &[u8]) -> Pushed {
        let resp = self
            .req(reqwest::Method::PUT, &format!("{}/v2/{repo}/manifests/{reference}", self.base()))
            .header("content-type", media_type)
            .body(manifest.to_vec())
            .send()
            .await
            .expect("PUT manifest");
        assert_eq!(
            resp.status().as_u16(),
            201,
            "push manifest {repo}:{reference}: {}",
            resp.text().await.unwrap_or_default()
        );
        Pushed { digest: digest_of(manifest), size: manifest.len() as u64, media_type: media_type.to_owned() }
    }

    /// An OCI image of `layers` (bottom first) for `platform` (`os/arch[/variant]`), tagged `tag`
    /// (empty: untagged, reachable by digest only).
    pub async fn push_image(&self, repo: &str, tag: &str, layers: &[Layer], platform: &str) -> Pushed {
        let mut parts = platform.split('/');
        let (os, arch, variant) = (parts.next().unwrap_or("linux"), parts.next().unwrap_or("amd64"), parts.next());
        let mut config =
            json!({"architecture": arch, "os": os, "rootfs": {"type": "layers", "diff_ids": []}, "config": {}});
        if let Some(v) = variant {
            config["variant"] = json!(v);
        }
        self.push_with_config(
            repo,
            tag,
            "application/vnd.oci.image.manifest.v1+json",
            "application/vnd.oci.image.config.v1+json",
            &serde_json::to_vec(&config).expect("json"),
            layers,
        )
        .await
    }

    /// A Docker schema 2 image (use [`Layer::docker_gzip`] layers).
    pub async fn push_docker_image(&self, repo: &str, tag: &str, layers: &[Layer]) -> Pushed {
        let config = json!({"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": []}});
        self.push_with_config(
            repo,
            tag,
            "application/vnd.docker.distribution.manifest.v2+json",
            "application/vnd.docker.container.image.v1+json",
            &serde_json::to_vec(&config).expect("json"),
            layers,
        )
        .await
    }

    /// A Helm chart as `helm push` stores it: the chart `.tgz` as the one layer, `Chart.yaml`'s
    /// name and version as the config.
    pub async fn push_helm_chart(&self, repo: &str, tag: &str, chart_tgz: &[u8], name: &str, version: &str) -> Pushed {
        let config = serde_json::to_vec(&json!({"name": name, "version": version, "apiVersion": "v2"})).expect("json");
        let layer = Layer::raw("application/vnd.cncf.helm.chart.content.v1.tar+gzip", chart_tgz.to_vec());
        self.push_with_config(
            repo,
            tag,
            "application/vnd.oci.image.manifest.v1+json",
            "application/vnd.cncf.helm.config.v1+json",
            &config,
            &[layer],
        )
        .await
    }

    async fn push_with_config(
        &self,
        repo: &str,
        tag: &str,
        manifest_type: &str,
        config_type: &str,
        config: &[u8],
        layers: &[Layer],
    ) -> Pushed {
        let config_digest = self.push_blob(repo, config).await;
        let mut descriptors = Vec::new();
        for layer in layers {
            let digest = self.push_blob(repo, &layer.data).await;
            descriptors.push(json!({"mediaType": layer.media_type, "digest": digest, "size": layer.data.len()}));
        }
        let manifest = json!({
            "schemaVersion": 2,
            "mediaType": manifest_type,
            "config": {"mediaType": config_type, "digest": config_digest, "size": config.len()},
            "layers": descriptors,
        });
        let bytes = serde_json::to_vec(&manifest).expect("json");
        let reference = if tag.is_empty() { digest_of(&bytes) } else { tag.to_owned() };
        self.push_manifest(repo, &reference, manifest_type, &bytes).await
    }

    /// An OCI image index over already pushed images, each with its platform (`os/arch[/variant]`).
    pub async fn push_index(&self, repo: &str, tag: &str, images: &[(&str, &Pushed)]) -> Pushed {
        let manifests: Vec<Value> = images
            .iter()
            .map(|(platform, img)| {
                let mut parts = platform.split('/');
                let mut p =
                    json!({"os": parts.next().unwrap_or_default(), "architecture": parts.next().unwrap_or_default()});
                if let Some(v) = parts.next() {
                    p["variant"] = json!(v);
                }
                json!({"mediaType": img.media_type, "digest": img.digest, "size": img.size, "platform": p})
            })
            .collect();
        let index =
            json!({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": manifests});
        let bytes = serde_json::to_vec(&index).expect("json");
        self.push_manifest(repo, tag, "application/vnd.oci.image.index.v1+json", &bytes).await
    }

    /// Points `tag` at the manifest `to` (what a `docker push` of a new version does).
    pub async fn move_tag(&self, repo: &str, tag: &str, to: &Pushed) {
        let resp = self
            .req(reqwest::Method::GET, &format!("{}/v2/{repo}/manifests/{}", self.base(), to.digest))
            .header("accept", &to.media_type)
            .send()
            .await
            .expect("GET manifest");
        assert!(resp.status().is_success(), "GET manifest {}: {}", to.digest, resp.status());
        let bytes = resp.bytes().await.expect("manifest body");
        self.push_manifest(repo, tag, &to.media_type, &bytes).await;
    }

    /// Corrupts the stored blob `digest` in place (same size, one byte flipped in the middle):
    /// the registry keeps serving it under its old digest.
    pub fn tamper_blob(&self, digest: &str) {
        let hex = digest.strip_prefix("sha256:").expect("sha256 digest");
        let path = self.storage().join(format!("docker/registry/v2/blobs/sha256/{}/{hex}/data", &hex[..2]));
        let mut data = std::fs::read(&path).unwrap_or_else(|e| panic!("read blob {}: {e}", path.display()));
        let mid = data.len() / 2;
        data[mid] ^= 0x55;
        std::fs::write(&path, data).expect("write tampered blob");
    }

    fn storage(&self) -> PathBuf {
        self.dir.path().join("storage")
    }
}

/// Whether the registry answers `/v2/` within 20 s (`false` at once if it exited: its port was
/// taken).
async fn wait_ready(child: &mut Child, http: &reqwest::Client, base: &str) -> bool {
    let child = std::cell::RefCell::new(child);
    let ready = poll_until(Duration::from_secs(20), Duration::from_millis(50), || async {
        if let Ok(Some(status)) = child.borrow_mut().try_wait() {
            return Ok(Err(status));
        }
        match http.get(format!("{base}/v2/")).send().await {
            Ok(resp) if matches!(resp.status().as_u16(), 200 | 401) => Ok(Ok(())),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    matches!(ready, Ok(Ok(())))
}

fn write_config(dir: &Path, port: u16, auth: Option<&(String, String)>, tls: Option<&(String, String)>) -> PathBuf {
    let storage = dir.join("storage");
    std::fs::create_dir_all(&storage).expect("storage dir");
    let mut yaml = format!(
        "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\n\
         http:\n  addr: 127.0.0.1:{port}\n  secret: stowage-test-secret\n",
        storage.display()
    );
    if let Some((cert, key)) = tls {
        let (cert_path, key_path) = (dir.join("tls.crt"), dir.join("tls.key"));
        std::fs::write(&cert_path, cert).expect("registry certificate");
        std::fs::write(&key_path, key).expect("registry key");
        yaml.push_str(&format!("  tls:\n    certificate: {}\n    key: {}\n", cert_path.display(), key_path.display()));
    }
    if let Some((user, pass)) = auth {
        let hash = bcrypt::hash(pass, 4).expect("bcrypt");
        let htpasswd = dir.join("htpasswd");
        std::fs::write(&htpasswd, format!("{user}:{hash}\n")).expect("htpasswd");
        yaml.push_str(&format!("auth:\n  htpasswd:\n    realm: stowage-test\n    path: {}\n", htpasswd.display()));
    }
    let path = dir.join(format!("config-{port}.yml"));
    std::fs::write(&path, yaml).expect("registry config");
    path
}

pub(crate) fn digest_of(data: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(data)))
}

/// `dir` as a Helm chart archive: a gzip tar whose entries are `NAME/…`.
pub(crate) fn chart_tgz(dir: &Path, name: &str) -> Vec<u8> {
    let tree: BTreeMap<String, tarutil::Node> =
        tarutil::tree_from_dir(dir).into_iter().map(|(path, node)| (format!("{name}/{path}"), node)).collect();
    tarutil::gzip(&tarutil::build_tar(&tree))
}
