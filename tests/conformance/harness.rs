//! The server under test (a child process) and the clients that talk to it.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use reqwest::header::HeaderMap;
use reqwest::{Certificate, Client, Identity, Response, StatusCode};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

pub const API_VERSION: &str = "content.stowage.dev/v1alpha1";
pub const API: &str = "/apis/content.stowage.dev/v1alpha1";

/// Timeout for ordinary (non-bulk) requests.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// The log buffer keeps at most this much (the newest part).
const LOG_CAP: usize = 4 << 20;

// ---------------------------------------------------------------------------------------------
// Paths

pub fn bundles(ns: &str) -> String {
    format!("{API}/namespaces/{ns}/bundles")
}
pub fn bundle(ns: &str, name: &str) -> String {
    format!("{API}/namespaces/{ns}/bundles/{name}")
}
pub fn bundle_content(ns: &str, name: &str) -> String {
    format!("{API}/namespaces/{ns}/bundles/{name}/content")
}
pub fn bundlecontents(ns: &str) -> String {
    format!("{API}/namespaces/{ns}/bundlecontents")
}
pub fn bundlecontent(ns: &str, name: &str) -> String {
    format!("{API}/namespaces/{ns}/bundlecontents/{name}")
}
pub fn bundlecontent_content(ns: &str, name: &str) -> String {
    format!("{API}/namespaces/{ns}/bundlecontents/{name}/content")
}

/// `base?path=FILE`, FILE percent-encoded (except `/`).
pub fn with_path(base: &str, file: &str) -> String {
    let mut q = String::new();
    for b in file.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            q.push(b as char);
        } else {
            q.push_str(&format!("%{b:02X}"));
        }
    }
    format!("{base}?path={q}")
}

/// A Bundle with one `upload` source.
pub fn upload_bundle(ns: &str, name: &str) -> Value {
    json!({
        "apiVersion": API_VERSION,
        "kind": "Bundle",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"sources": [{"upload": {}}]},
    })
}

// ---------------------------------------------------------------------------------------------
// Small helpers

pub fn sha256_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

/// `"sha256:<hex>"` of `data`: the form of `status.digest`.
pub fn digest_of(data: &[u8]) -> String {
    format!("sha256:{}", sha256_hex(data))
}

/// The bundles the tests upload, fetch and compare: the generated fixtures (`fixtures/`), or
/// with `$STOWAGE_CORPUS` set, a corpus of real bundles of the same layout (an extra pass).
pub fn corpus() -> PathBuf {
    let Some(dir) = std::env::var_os("STOWAGE_CORPUS").filter(|d| !d.is_empty()).map(PathBuf::from) else {
        return crate::fixtures::root().to_path_buf();
    };
    assert!(
        dir.join("kube-prometheus-stack").is_dir(),
        "STOWAGE_CORPUS={} holds no kube-prometheus-stack/ (unset it to use the generated fixtures)",
        dir.display()
    );
    dir
}

/// `s` parsed as JSON, with the text in the panic message when it is not.
pub fn parse_json(body: &[u8], what: &str) -> Value {
    serde_json::from_slice(body).unwrap_or_else(|e| {
        panic!("{what}: body is not JSON ({e}): {}", String::from_utf8_lossy(&body[..body.len().min(2000)]))
    })
}

/// Reads a string field by JSON pointer, panicking with the whole object when it is absent.
pub fn str_at<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or_else(|| panic!("no string at {pointer} in {v:#}"))
}

pub fn u64_at(v: &Value, pointer: &str) -> u64 {
    v.pointer(pointer).and_then(Value::as_u64).unwrap_or_else(|| panic!("no unsigned integer at {pointer} in {v:#}"))
}

/// How often the waits below look again unless told otherwise.
pub const POLL: Duration = Duration::from_millis(200);

/// Looks at `check` every `every` until it returns `Ok`; `Err` with the last observation once
/// `timeout` has passed (the check is made once more at the deadline). The one place the async
/// waits of the tests pause.
pub async fn poll_until<T, F, Fut>(timeout: Duration, every: Duration, mut check: F) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        match check().await {
            Ok(v) => return Ok(v),
            Err(last) if Instant::now() >= deadline => return Err(last),
            Err(_) => tokio::time::sleep(every.min(deadline.saturating_duration_since(Instant::now()))).await,
        }
    }
}

/// Polls `check` every 200 ms until it returns `Ok`, panicking with `what` after `timeout`.
pub async fn eventually<T, F, Fut>(timeout: Duration, what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    eventually_every(timeout, POLL, what, check).await
}

/// [`eventually`], looking every `every` (for a state that lasts only a moment).
pub async fn eventually_every<T, F, Fut>(timeout: Duration, every: Duration, what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    poll_until(timeout, every, check)
        .await
        .unwrap_or_else(|last| panic!("{what}: not true within {timeout:?}; last observation: {last}"))
}

/// Asserts that something does NOT happen: `check` must hold (`Ok`) at every look, every
/// `every`, for all of `bound`; the first look at which it does not fails the test at once.
/// `bound` is the longest the server would take to do the thing that must not happen (its own
/// timing: a backoff's ceiling, a poll interval, a timeout); each caller states which.
pub async fn holds_for<F, Fut>(bound: Duration, every: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let broke = poll_until(bound, every, || {
        let look = check();
        async move {
            match look.await {
                Ok(()) => Err(String::new()),
                Err(why) => Ok(why),
            }
        }
    })
    .await;
    if let Ok(why) = broke {
        panic!("{what}: stopped holding within {bound:?}: {why}");
    }
}

/// [`poll_until`] for threads and blocking code: looks at `check` every `every` until it returns
/// `Ok`; `Err` with the last observation once `timeout` has passed.
pub fn poll_until_blocking<T>(
    timeout: Duration,
    every: Duration,
    mut check: impl FnMut() -> Result<T, String>,
) -> Result<T, String> {
    let deadline = Instant::now() + timeout;
    loop {
        match check() {
            Ok(v) => return Ok(v),
            Err(last) if Instant::now() >= deadline => return Err(last),
            Err(_) => std::thread::sleep(every.min(deadline.saturating_duration_since(Instant::now()))),
        }
    }
}

/// Blocks until `check` returns `Ok` (looking every `every`), panicking with `what` and the last
/// observation after `timeout`.
pub fn wait_until<T>(timeout: Duration, every: Duration, what: &str, check: impl FnMut() -> Result<T, String>) -> T {
    poll_until_blocking(timeout, every, check)
        .unwrap_or_else(|last| panic!("{what}: not true within {timeout:?}; last observation: {last}"))
}

/// Asserts that `resp` is a Kubernetes `Status` failure with this code and reason; returns it.
pub async fn expect_status(resp: Response, code: u16, reason: &str) -> Value {
    let http = resp.status();
    let url = resp.url().clone();
    let body = resp.bytes().await.expect("read error body");
    assert_eq!(
        http.as_u16(),
        code,
        "{url}: expected HTTP {code} {reason}, got {http}: {}",
        String::from_utf8_lossy(&body[..body.len().min(2000)])
    );
    let status = parse_json(&body, &format!("{url}: error body"));
    assert_eq!(status["kind"], "Status", "{url}: not a Status: {status:#}");
    assert_eq!(status["apiVersion"], "v1", "{url}: {status:#}");
    assert_eq!(status["status"], "Failure", "{url}: {status:#}");
    assert_eq!(status["code"], code, "{url}: {status:#}");
    assert_eq!(status["reason"], reason, "{url}: {status:#}");
    let message = status["message"].as_str().unwrap_or("");
    assert!(!message.is_empty(), "{url}: Status without a message: {status:#}");
    status
}

pub fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// Prometheus text exposition → `{"name{labels}": value}`.
pub fn parse_metrics(text: &str) -> HashMap<String, f64> {
    let mut out = HashMap::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        // `name{labels} value [timestamp]`; labels may contain spaces inside quotes.
        let key_end = match line.find('}') {
            Some(i) if line[..i].contains('{') => i + 1,
            _ => line.find(char::is_whitespace).unwrap_or(line.len()),
        };
        let key: String = line[..key_end].chars().filter(|c| !c.is_whitespace()).collect();
        let value = line[key_end..].split_whitespace().next().unwrap_or("");
        if let Ok(v) = value.parse::<f64>() {
            out.insert(key, v);
        }
    }
    out
}

/// Writes a line to the real stderr, past libtest's output capture, so measurements show up in
/// a normal `cargo test` run.
pub fn report(line: &str) {
    let _ = writeln!(std::io::stderr(), "[conformance] {line}");
}

// ---------------------------------------------------------------------------------------------
// The server process

pub struct Server {
    child: Option<Child>,
    /// `https://127.0.0.1:PORT`, from the ready line.
    pub url: String,
    data_dir: PathBuf,
    extra_args: Vec<String>,
    log: Arc<Mutex<String>>,
    client: Client,
    /// Keeps a temporary data directory alive for as long as the server (dropped last).
    _tmp: Option<tempfile::TempDir>,
}

impl Server {
    /// Starts `stowage serve` on `data_dir` and waits for its ready line.
    pub fn start(data_dir: &Path, extra_args: &[&str]) -> Server {
        let log = Arc::new(Mutex::new(String::new()));
        let extra_args: Vec<String> = extra_args.iter().map(|s| s.to_string()).collect();
        let (child, url) = spawn(data_dir, &extra_args, &log);
        let client = client_for(data_dir, true);
        Server { child: Some(child), url, data_dir: data_dir.to_owned(), extra_args, log, client, _tmp: None }
    }

    /// Starts a server on a fresh temporary data directory that lives as long as the server.
    /// The data directory itself does not exist beforehand: the server creates it.
    pub fn start_temp(extra_args: &[&str]) -> Server {
        let tmp = tempfile::Builder::new().prefix("stowage-conformance-").tempdir().expect("create tempdir");
        let mut server = Server::start(&tmp.path().join("data"), extra_args);
        server._tmp = Some(tmp);
        server
    }

    /// Starts a server on a fresh temporary directory whose users come from a token file holding
    /// `tokens` (`--token-auth-file`, kube-apiserver's CSV) and whose rules from an RBAC policy
    /// file holding `policy` (`--authorization-policy-file`), both beside its data directory.
    pub fn start_with_users(tokens: &str, policy: &str) -> Server {
        let tmp = tempfile::Builder::new().prefix("stowage-conformance-").tempdir().expect("create tempdir");
        let (token_file, policy_file) = (tmp.path().join("tokens.csv"), tmp.path().join("policy.yaml"));
        std::fs::write(&token_file, tokens).unwrap();
        std::fs::write(&policy_file, policy).unwrap();
        let mut server = Server::start(
            &tmp.path().join("data"),
            &[
                "--token-auth-file",
                token_file.to_str().unwrap(),
                "--authorization-policy-file",
                policy_file.to_str().unwrap(),
            ],
        );
        server._tmp = Some(tmp);
        server
    }

    /// A kubeconfig for token user `user` (token `USER-token`) in `namespace`, as the README
    /// shows one, written beside the data directory.
    pub fn token_kubeconfig(&self, user: &str, namespace: &str) -> PathBuf {
        let ca = self.data_dir.join("pki/ca.crt");
        let config = format!(
            "apiVersion: v1\nkind: Config\n\
             clusters: [{{name: stowage, cluster: {{server: \"{}\", certificate-authority: \"{}\"}}}}]\n\
             users: [{{name: {user}, user: {{token: {user}-token}}}}]\n\
             contexts: [{{name: {user}, context: {{cluster: stowage, user: {user}, namespace: {namespace}}}}}]\n\
             current-context: {user}\n",
            self.url,
            ca.display()
        );
        let path = self.data_dir.with_file_name(format!("{user}.kubeconfig"));
        std::fs::write(&path, config).unwrap();
        path
    }

    pub fn kubeconfig(&self) -> PathBuf {
        self.data_dir.join("admin.kubeconfig")
    }

    /// The admin client (CA from `pki/ca.crt` as the only root, identity `pki/admin.{crt,key}`).
    pub fn client(&self) -> &Client {
        &self.client
    }

    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// Another admin client, on its own connections (an HTTP/2 connection's flow-control window is
    /// shared by its streams).
    pub fn second_client(&self) -> Client {
        client_for(&self.data_dir, true)
    }

    /// A client that trusts the server's CA but presents no client certificate.
    pub fn anonymous_client(&self) -> Client {
        client_for(&self.data_dir, false)
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.url, path)
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("server not running").id()
    }

    /// Peak resident set size (VmHWM) of the server process, in KiB.
    pub fn peak_rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).expect("read /proc/PID/status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmHWM in /proc/PID/status")
    }

    /// SIGKILL, no chance to clean up.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM, then waits for the process to exit (at most `limit`); returns how long it took,
    /// or `None` if it was still running at `limit` (it is then killed).
    pub fn terminate(&mut self, limit: Duration) -> Option<Duration> {
        let mut child = self.child.take()?;
        terminate_child(&mut child, limit)
    }

    /// Starts the server again on the same data directory with the same arguments (killing it
    /// first if it still runs). The admin client is kept: certificates must be reused.
    pub fn restart(&mut self) {
        self.kill9();
        self.log.lock().unwrap().push_str("\n======== restart ========\n");
        let (child, url) = spawn(&self.data_dir, &self.extra_args, &self.log);
        self.child = Some(child);
        self.url = url;
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    // -- requests --------------------------------------------------------------------------

    pub async fn get(&self, path: &str) -> Response {
        self.client
            .get(self.url(path))
            .timeout(REQUEST_TIMEOUT)
            .send()
            .await
            .unwrap_or_else(|e| panic!("GET {path}: {e}"))
    }

    /// GET returning the JSON body; asserts 200.
    pub async fn get_json(&self, path: &str) -> Value {
        let resp = self.get(path).await;
        let status = resp.status();
        let body = resp.bytes().await.expect("read body");
        assert_eq!(status, StatusCode::OK, "GET {path}: {}", String::from_utf8_lossy(&body));
        parse_json(&body, &format!("GET {path}"))
    }

    /// `method` of `body` (as `content_type`) to `path`; panics only if no response came.
    async fn send_json(&self, method: reqwest::Method, path: &str, content_type: &str, body: &Value) -> Response {
        self.client
            .request(method.clone(), self.url(path))
            .timeout(REQUEST_TIMEOUT)
            .header("Content-Type", content_type)
            .body(body.to_string())
            .send()
            .await
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
    }

    pub async fn post_json(&self, path: &str, body: &Value) -> Response {
        self.send_json(reqwest::Method::POST, path, "application/json", body).await
    }

    pub async fn put_json(&self, path: &str, body: &Value) -> Response {
        self.send_json(reqwest::Method::PUT, path, "application/json", body).await
    }

    /// A JSON merge patch of the object at `path`, which must succeed.
    pub async fn merge_patch_ok(&self, path: &str, patch: &Value) {
        let resp = self.send_json(reqwest::Method::PATCH, path, "application/merge-patch+json", patch).await;
        assert_eq!(resp.status().as_u16(), 200, "patch {path}");
    }

    pub async fn delete(&self, path: &str) -> Response {
        self.client
            .delete(self.url(path))
            .timeout(REQUEST_TIMEOUT)
            .send()
            .await
            .unwrap_or_else(|e| panic!("DELETE {path}: {e}"))
    }

    /// Creates a Bundle with an upload source (strict field validation, as kubectl does);
    /// asserts 201 and returns the created object.
    pub async fn create_bundle(&self, ns: &str, name: &str) -> Value {
        let path = format!("{}?fieldValidation=Strict", bundles(ns));
        let resp = self.post_json(&path, &upload_bundle(ns, name)).await;
        let status = resp.status();
        let body = resp.bytes().await.expect("read body");
        assert_eq!(status, StatusCode::CREATED, "create bundle {ns}/{name}: {}", String::from_utf8_lossy(&body));
        parse_json(&body, "created bundle")
    }

    /// Creates Bundle `ns/name` with `spec`; asserts 201.
    pub async fn create_bundle_with(&self, ns: &str, name: &str, spec: Value) {
        let body = json!({"apiVersion": "content.stowage.dev/v1alpha1", "kind": "Bundle",
            "metadata": {"name": name, "namespace": ns}, "spec": spec});
        let resp = self.post_json(&bundles(ns), &body).await;
        let status = resp.status();
        assert_eq!(status, StatusCode::CREATED, "create {ns}/{name}: {}", resp.text().await.unwrap_or_default());
    }

    /// PUTs a tar (optionally with a `Content-Encoding`) into a Bundle's content subresource.
    pub async fn upload(
        &self,
        ns: &str,
        name: &str,
        body: impl Into<reqwest::Body>,
        encoding: Option<&str>,
    ) -> Response {
        self.try_upload(ns, name, body, encoding).await.unwrap_or_else(|e| panic!("PUT content of {ns}/{name}: {e}"))
    }

    pub async fn try_upload(
        &self,
        ns: &str,
        name: &str,
        body: impl Into<reqwest::Body>,
        encoding: Option<&str>,
    ) -> reqwest::Result<Response> {
        let mut req =
            self.client.put(self.url(&bundle_content(ns, name))).header("Content-Type", "application/x-tar").body(body);
        if let Some(enc) = encoding {
            req = req.header("Content-Encoding", enc);
        }
        req.send().await
    }

    /// Uploads and asserts the contract of a successful upload: 200 with the updated Bundle,
    /// `Unpacked`, a well-formed digest, and the content name derived from it.
    pub async fn upload_ok(
        &self,
        ns: &str,
        name: &str,
        body: impl Into<reqwest::Body>,
        encoding: Option<&str>,
    ) -> Value {
        let resp = self.upload(ns, name, body, encoding).await;
        let status = resp.status();
        let body = resp.bytes().await.expect("read upload response");
        assert_eq!(
            status,
            StatusCode::OK,
            "upload to {ns}/{name}: {}",
            String::from_utf8_lossy(&body[..body.len().min(4000)])
        );
        let b = parse_json(&body, "upload response");
        assert_eq!(b["kind"], "Bundle", "upload response is the Bundle: {b:#}");
        assert_eq!(str_at(&b, "/metadata/name"), name);
        assert_unpacked(&b);
        b
    }

    /// GET returning the body; asserts 200.
    pub async fn download(&self, path: &str) -> Vec<u8> {
        let resp = self.get(path).await;
        let status = resp.status();
        let body = resp.bytes().await.expect("read body");
        assert_eq!(status, StatusCode::OK, "GET {path}: {}", String::from_utf8_lossy(&body[..body.len().min(2000)]));
        body.to_vec()
    }

    pub async fn metrics(&self) -> HashMap<String, f64> {
        let text = self.download("/metrics").await;
        parse_metrics(&String::from_utf8_lossy(&text))
    }

    /// The names of the BundleContents in a namespace.
    pub async fn bundlecontent_names(&self, ns: &str) -> Vec<String> {
        let list = self.get_json(&bundlecontents(ns)).await;
        let mut names: Vec<String> = list["items"]
            .as_array()
            .unwrap_or_else(|| panic!("list without items: {list:#}"))
            .iter()
            .map(|i| str_at(i, "/metadata/name").to_owned())
            .collect();
        names.sort();
        names
    }
}

/// Asserts a Bundle's status describes an unpacked revision.
pub fn assert_unpacked(b: &Value) {
    let name = str_at(b, "/metadata/name");
    assert_eq!(b.pointer("/status/phase"), Some(&json!("Unpacked")), "{b:#}");
    let digest = str_at(b, "/status/digest");
    let hex = digest.strip_prefix("sha256:").unwrap_or_else(|| panic!("digest {digest:?} is not sha256:<hex>"));
    assert!(
        hex.len() == 64 && hex.bytes().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()),
        "digest {digest:?} is not sha256:<64 lowercase hex>"
    );
    assert_eq!(
        str_at(b, "/status/contentName"),
        format!("{name}-{}", &hex[..10]),
        "contentName is NAME-<first 10 hex of digest>"
    );
    let conditions = b
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .unwrap_or_else(|| panic!("no status.conditions: {b:#}"));
    assert!(
        conditions.iter().any(|c| c["type"] == "Unpacked" && c["status"] == "True"),
        "condition Unpacked=True missing: {b:#}"
    );
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill9();
        if std::thread::panicking() {
            eprintln!(
                "======== stowage server log ({}) ========\n{}\n======== end of server log ========",
                self.data_dir.display(),
                self.log()
            );
        }
    }
}

/// SIGTERM to `child`, then waits for it to exit (at most `limit`, then SIGKILL); how long it
/// took, or `None` when it had to be killed.
pub fn terminate_child(child: &mut Child, limit: Duration) -> Option<Duration> {
    let started = Instant::now();
    // SAFETY: sending a signal to our own child process.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let exited = poll_until_blocking(limit, Duration::from_millis(20), || match child.try_wait() {
        Ok(Some(_)) => Ok(started.elapsed()),
        other => Err(format!("{other:?}")),
    });
    if exited.is_err() {
        let _ = child.kill();
        let _ = child.wait();
    }
    exited.ok()
}

fn client_for(data_dir: &Path, with_identity: bool) -> Client {
    client_builder_for(data_dir, with_identity).build().expect("build HTTP client")
}

fn client_builder_for(data_dir: &Path, with_identity: bool) -> reqwest::ClientBuilder {
    let read = |p: &str| {
        std::fs::read(data_dir.join(p)).unwrap_or_else(|e| panic!("read {}: {e}", data_dir.join(p).display()))
    };
    let roots = Certificate::from_pem_bundle(&read("pki/ca.crt")).expect("parse pki/ca.crt");
    let mut builder = Client::builder().tls_certs_only(roots).no_proxy().connect_timeout(Duration::from_secs(10));
    // A delegated (cluster mode) server writes no admin credential: its clients are the cluster's.
    if with_identity && data_dir.join("pki/admin.crt").exists() {
        let mut pem = read("pki/admin.crt");
        pem.push(b'\n');
        pem.extend(read("pki/admin.key"));
        builder = builder.identity(Identity::from_pem(&pem).expect("parse admin.crt + admin.key"));
    }
    builder
}

fn append_log(log: &Mutex<String>, line: &str) {
    let mut log = log.lock().unwrap();
    log.push_str(line);
    if !line.ends_with('\n') {
        log.push('\n');
    }
    if log.len() > LOG_CAP {
        let mut cut = log.len() - LOG_CAP / 2;
        while !log.is_char_boundary(cut) {
            cut += 1;
        }
        log.replace_range(..cut, "[… earlier log dropped …]\n");
    }
}

fn spawn(data_dir: &Path, extra_args: &[String], log: &Arc<Mutex<String>>) -> (Child, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_stowage"))
        .arg("serve")
        .arg("--data-dir")
        .arg(data_dir)
        .arg("--listen")
        .arg("127.0.0.1:0")
        .args(extra_args)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the stowage binary");

    // Drain both pipes for the life of the process so that they never fill up.
    let (tx, rx) = mpsc::channel::<String>();
    let pipes: [Box<dyn Read + Send>; 2] =
        [Box::new(child.stdout.take().unwrap()), Box::new(child.stderr.take().unwrap())];
    for pipe in pipes {
        let (tx, log) = (tx.clone(), log.clone());
        std::thread::spawn(move || {
            let mut reader = BufReader::new(pipe);
            let mut buf = Vec::new();
            loop {
                buf.clear();
                match reader.read_until(b'\n', &mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        let line = String::from_utf8_lossy(&buf).into_owned();
                        append_log(&log, &line);
                        let _ = tx.send(line);
                    }
                }
            }
        });
    }
    drop(tx);

    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) if line.contains("stowage ready") => match parse_url(&line) {
                Some(url) => return (child, url),
                None => {
                    let _ = child.kill();
                    panic!("no https://127.0.0.1:PORT in the ready line {line:?}");
                }
            },
            Ok(_) => {}
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("stowage not ready within {READY_TIMEOUT:?}; log:\n{}", log.lock().unwrap());
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let status = child.wait();
                panic!("stowage exited before it was ready ({status:?}); log:\n{}", log.lock().unwrap());
            }
        }
    }
}

/// Finds `https://HOST:PORT` in a log line (ANSI colour codes removed).
fn parse_url(line: &str) -> Option<String> {
    let mut plain = String::new();
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ params final-byte
            if chars.peek() == Some(&'[') {
                for c in chars.by_ref() {
                    if c.is_ascii_alphabetic() {
                        break;
                    }
                }
            }
            continue;
        }
        plain.push(c);
    }
    let start = plain.find("https://")?;
    let rest = &plain[start + "https://".len()..];
    let host: String =
        rest.chars().take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | ':' | '[' | ']' | '-')).collect();
    let port = host.rsplit_once(':')?.1;
    port.parse::<u16>().ok().filter(|p| *p != 0)?;
    Some(format!("https://{host}"))
}

#[test]
fn parses_ready_line() {
    assert_eq!(
        parse_url("2026-01-01T00:00:00Z  INFO stowage ready url=https://127.0.0.1:4321/ pid=1"),
        Some("https://127.0.0.1:4321".into())
    );
    assert_eq!(
        parse_url("\u{1b}[32m INFO\u{1b}[0m stowage ready on \"https://127.0.0.1:80\","),
        Some("https://127.0.0.1:80".into())
    );
    assert_eq!(parse_url("stowage ready https://127.0.0.1:0"), None);
    let m = parse_metrics(
        "# HELP x\nstowage_chunks 12\nstowage_revisions{state=\"staging\"} 0\nstowage_revisions{state=\"committed\"} 3 1700000000\n",
    );
    assert_eq!(m["stowage_chunks"], 12.0);
    assert_eq!(m["stowage_revisions{state=\"staging\"}"], 0.0);
    assert_eq!(m["stowage_revisions{state=\"committed\"}"], 3.0);
}

impl Server {
    /// An admin client that speaks HTTP/1.1 only, on its own connections.
    pub fn http1_client(&self) -> Client {
        client_builder_for(&self.data_dir, true).http1_only().build().expect("build HTTP/1.1 client")
    }
}
