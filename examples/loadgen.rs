//! Load generator for the Bundle API of a running `stowage serve` (used by `scripts/bench.sh api`).
//!
//! `wrk` and friends cannot present client certificates; this talks HTTPS with the admin
//! kubeconfig's CA, client certificate and key (reqwest + rustls, tokio), and prints one JSON line
//! per run on stdout (progress and errors go to stderr):
//!
//! ```text
//! loadgen --kubeconfig DATA/admin.kubeconfig seed 10000 --concurrency 32
//! loadgen --kubeconfig … seed 2000 --upload      # each Bundle also gets content: one revision each
//! loadgen --kubeconfig … get --concurrency 32 --duration 10     # GET of random Bundles
//! loadgen --kubeconfig … list --limit 500 --concurrency 2 --duration 10
//! loadgen --kubeconfig … watch --watchers 200 --events 1000    # fan-out: events/s, lag
//! loadgen --kubeconfig … watch --watchers 1000 --events 1000 --rate 100   # paced writes
//! ```
//!
//! Requests go over HTTP/2 (one connection per `--connections`, streams multiplexed, as client-go
//! does) unless `--http1`. Latencies are per request, from send to the last body byte.

// A benchmark tool run by scripts/bench.sh: any surprise should stop it loudly.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context, Result};
use base64::Engine;
use clap::{Parser, Subcommand, ValueEnum};
use futures_util::StreamExt;
use reqwest::{Certificate, Client, Identity, StatusCode};
use serde_json::{json, Value};

const API_VERSION: &str = "content.stowage.dev/v1alpha1";
/// The annotation a watch-run write carries: when it was sent (Unix nanoseconds).
const SENT: &str = "loadgen.stowage.dev/sent";

#[derive(Parser)]
#[command(about = "Load generator for the stowage Bundle API (client-certificate HTTPS)")]
struct Cli {
    /// Admin kubeconfig with a client certificate (the one `stowage serve` writes).
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: PathBuf,
    /// Namespace of the Bundles.
    #[arg(long, default_value = "bench")]
    namespace: String,
    /// HTTP/1.1 only (a pool of connections) instead of HTTP/2 over ALPN.
    #[arg(long)]
    http1: bool,
    /// Connections (clients) the workers of get/list/seed are spread over.
    #[arg(long, default_value_t = 1)]
    connections: usize,
    /// Authenticate with this bearer token instead of the kubeconfig's client certificate (to
    /// measure the token + RBAC policy path).
    #[arg(long)]
    token: Option<String>,
    /// Send the requests to this base URL instead of the kubeconfig's server (the same paths, the
    /// same CA): `scripts/bench.sh api` points it at nginx serving the same JSON from files.
    #[arg(long)]
    server: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Creates COUNT Bundles named PREFIX00000…; existing ones count as done.
    Seed {
        count: usize,
        #[arg(long, default_value_t = 32)]
        concurrency: usize,
        #[arg(long, default_value = "b")]
        prefix: String,
        /// Also upload a small tar of its own to every Bundle created, so each gets a revision
        /// (a store of COUNT revisions, for the startup benchmark).
        #[arg(long)]
        upload: bool,
    },
    /// GETs random Bundles of the namespace for DURATION seconds.
    Get {
        #[arg(long, default_value_t = 32)]
        concurrency: usize,
        #[arg(long, default_value_t = 10.0)]
        duration: f64,
    },
    /// LISTs the namespace's Bundles (`?limit=LIMIT`, 0 = no limit; first page only) for DURATION s.
    List {
        #[arg(long, default_value_t = 0)]
        limit: u64,
        #[arg(long, default_value_t = 2)]
        concurrency: usize,
        #[arg(long, default_value_t = 10.0)]
        duration: f64,
    },
    /// Opens WATCHERS watches of the namespace (one connection each), then writes EVENTS objects
    /// and measures how fast and how late the events reach every watcher.
    Watch {
        #[arg(long, default_value_t = 200)]
        watchers: usize,
        #[arg(long, default_value_t = 1000)]
        events: usize,
        /// Concurrent writers.
        #[arg(long, default_value_t = 16)]
        concurrency: usize,
        /// patch: annotate existing Bundles (MODIFIED); create: new Bundles (ADDED, deleted after).
        #[arg(long, value_enum, default_value_t = Op::Patch)]
        op: Op,
        /// Writes per second, all writers together (0: as fast as they go).
        #[arg(long, default_value_t = 0.0)]
        rate: f64,
        /// Give up waiting for events after this many seconds.
        #[arg(long, default_value_t = 120.0)]
        timeout: f64,
        /// The server's pid: report its resident memory while the watches are open.
        #[arg(long)]
        pid: Option<u32>,
    },
}

#[derive(Clone, Copy, PartialEq, ValueEnum)]
enum Op {
    Patch,
    Create,
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let mut target = Target::from_kubeconfig(&cli.kubeconfig, &cli.namespace, cli.http1, cli.server.as_deref())?;
    target.token = cli.token.clone();
    let result = runtime.block_on(async {
        match cli.command {
            Command::Seed { count, concurrency, prefix, upload } => {
                seed(&target, cli.connections, count, concurrency, &prefix, upload).await
            }
            Command::Get { concurrency, duration } => get(&target, cli.connections, concurrency, duration).await,
            Command::List { limit, concurrency, duration } => {
                list(&target, cli.connections, limit, concurrency, duration).await
            }
            Command::Watch { watchers, events, concurrency, op, rate, timeout, pid } => {
                let pace = WritePace { concurrency, rate };
                watch(&target, watchers, events, pace, op, timeout, pid).await
            }
        }
    })?;
    println!("{result}");
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Connection

/// Where the server is and who we are, from a kubeconfig.
struct Target {
    /// `https://HOST:PORT/apis/…/namespaces/NS/bundles`
    bundles: String,
    ca_pem: Vec<u8>,
    identity_pem: Vec<u8>,
    http1: bool,
    token: Option<String>,
}

impl Target {
    fn from_kubeconfig(path: &Path, namespace: &str, http1: bool, server: Option<&str>) -> Result<Target> {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let config: Value = serde_yaml_ng::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        let current = config["current-context"].as_str().context("kubeconfig without current-context")?;
        let named = |list: &str, name: &str, field: &str| -> Result<Value> {
            config[list]
                .as_array()
                .and_then(|l| l.iter().find(|e| e["name"] == name))
                .map(|e| e[field].clone())
                .ok_or_else(|| anyhow!("kubeconfig has no {list} entry {name:?}"))
        };
        let context = named("contexts", current, "context")?;
        let cluster = named("clusters", context["cluster"].as_str().unwrap_or(""), "cluster")?;
        let user = named("users", context["user"].as_str().unwrap_or(""), "user")?;
        let base = path.parent().unwrap_or(Path::new("."));
        // `X-data` (base64) or `X` (a file path, relative to the kubeconfig).
        let material = |section: &Value, key: &str| -> Result<Vec<u8>> {
            if let Some(data) = section[format!("{key}-data")].as_str() {
                return base64::engine::general_purpose::STANDARD.decode(data).context(format!("{key}-data"));
            }
            let file = section[key].as_str().ok_or_else(|| anyhow!("kubeconfig has neither {key} nor {key}-data"))?;
            std::fs::read(base.join(file)).with_context(|| format!("reading {file}"))
        };
        let server = match server {
            Some(url) => url,
            None => cluster["server"].as_str().context("cluster without server")?,
        }
        .trim_end_matches('/');
        let mut identity_pem = material(&user, "client-certificate")?;
        identity_pem.push(b'\n');
        identity_pem.extend(material(&user, "client-key")?);
        Ok(Target {
            bundles: format!("{server}/apis/{API_VERSION}/namespaces/{namespace}/bundles"),
            ca_pem: material(&cluster, "certificate-authority")?,
            identity_pem,
            http1,
            token: None,
        })
    }

    /// A new client: its own connection (HTTP/2) or pool (HTTP/1.1).
    fn client(&self) -> Result<Client> {
        let roots = Certificate::from_pem_bundle(&self.ca_pem).context("parsing the CA")?;
        let mut builder = Client::builder().tls_certs_only(roots);
        match &self.token {
            Some(token) => {
                let mut headers = reqwest::header::HeaderMap::new();
                let value = format!("Bearer {token}").parse().context("the token is not a valid header value")?;
                headers.insert(reqwest::header::AUTHORIZATION, value);
                builder = builder.default_headers(headers);
            }
            None => {
                let identity =
                    Identity::from_pem(&self.identity_pem).context("parsing the client certificate and key")?;
                builder = builder.identity(identity);
            }
        }
        let mut builder = builder.no_proxy().tcp_nodelay(true).connect_timeout(Duration::from_secs(10));
        if self.http1 {
            builder = builder.http1_only();
        }
        builder.build().context("building the HTTP client")
    }

    fn clients(&self, n: usize) -> Result<Vec<Client>> {
        (0..n.max(1)).map(|_| self.client()).collect()
    }

    fn bundle(&self, name: &str) -> String {
        format!("{}/{name}", self.bundles)
    }
}

/// Every Bundle name in the namespace (following `continue`) and the list's resourceVersion.
async fn names_and_rv(client: &Client, target: &Target) -> Result<(Vec<String>, String)> {
    let mut names = Vec::new();
    let mut token = String::new();
    loop {
        let mut url = format!("{}?limit=5000", target.bundles);
        if !token.is_empty() {
            url.push_str(&format!("&continue={token}"));
        }
        let resp = client.get(&url).send().await.context("listing Bundles")?;
        let status = resp.status();
        let body = resp.bytes().await?;
        if status != StatusCode::OK {
            bail!("list: {status}: {}", String::from_utf8_lossy(&body[..body.len().min(500)]));
        }
        let list: Value = serde_json::from_slice(&body)?;
        for item in list["items"].as_array().map(Vec::as_slice).unwrap_or_default() {
            names.push(item["metadata"]["name"].as_str().unwrap_or_default().to_owned());
        }
        token = list["metadata"]["continue"].as_str().unwrap_or_default().to_owned();
        if token.is_empty() {
            let rv = list["metadata"]["resourceVersion"].as_str().context("list without resourceVersion")?;
            return Ok((names, rv.to_owned()));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Measurements

/// What the workers of one run saw.
#[derive(Default)]
struct Stats {
    latencies_us: Vec<u64>,
    errors: u64,
    bytes: u64,
    first_error: Option<String>,
}

impl Stats {
    fn merge(&mut self, other: Stats) {
        self.latencies_us.extend(other.latencies_us);
        self.errors += other.errors;
        self.bytes += other.bytes;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
    }

    fn error(&mut self, message: String) {
        self.errors += 1;
        if self.first_error.is_none() {
            self.first_error = Some(message);
        }
    }

    /// `requests`, `errors`, `rps`, `p50_ms`, `p99_ms`, `max_ms` over `elapsed`.
    fn summary(mut self, command: &str, elapsed: Duration) -> Value {
        self.latencies_us.sort_unstable();
        let secs = elapsed.as_secs_f64();
        let ok = self.latencies_us.len() as u64;
        if let Some(e) = &self.first_error {
            eprintln!("loadgen {command}: {} errors, first: {e}", self.errors);
        }
        json!({
            "command": command,
            "requests": ok + self.errors,
            "errors": self.errors,
            "duration_s": round(secs, 3),
            "rps": round(ok as f64 / secs, 1),
            "p50_ms": round(percentile(&self.latencies_us, 50.0) as f64 / 1000.0, 3),
            "p99_ms": round(percentile(&self.latencies_us, 99.0) as f64 / 1000.0, 3),
            "max_ms": round(self.latencies_us.last().copied().unwrap_or(0) as f64 / 1000.0, 3),
            "mb_per_s": round(self.bytes as f64 / 1e6 / secs, 2),
        })
    }
}

/// Nearest-rank percentile of sorted values (0 when empty).
fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn round(x: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (x * f).round() / f
}

fn unix_nanos() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
}

/// A small xorshift generator (random names without a dependency).
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

/// Sends `request`, reads the whole body, records latency and bytes; errors are counted.
async fn timed(stats: &mut Stats, request: reqwest::RequestBuilder, expect: &[StatusCode]) -> Option<StatusCode> {
    let started = Instant::now();
    let result = async {
        let resp = request.send().await?;
        let status = resp.status();
        let body = resp.bytes().await?;
        Ok::<_, reqwest::Error>((status, body))
    }
    .await;
    match result {
        Ok((status, body)) if expect.contains(&status) => {
            stats.latencies_us.push(started.elapsed().as_micros() as u64);
            stats.bytes += body.len() as u64;
            Some(status)
        }
        Ok((status, body)) => {
            stats.error(format!("{status}: {}", String::from_utf8_lossy(&body[..body.len().min(300)])));
            None
        }
        Err(e) => {
            stats.error(e.to_string());
            None
        }
    }
}

async fn join_all(tasks: Vec<tokio::task::JoinHandle<Stats>>) -> Result<Stats> {
    let mut total = Stats::default();
    for task in tasks {
        total.merge(task.await?);
    }
    Ok(total)
}

fn bundle_body(name: &str, annotations: Value) -> String {
    json!({
        "apiVersion": API_VERSION,
        "kind": "Bundle",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"sources": [{"upload": {}}]},
    })
    .to_string()
}

// ---------------------------------------------------------------------------------------------
// seed / get / list

/// A tar of one small file whose bytes name `name`: content no other Bundle has.
fn small_tar(name: &str) -> Vec<u8> {
    let data = format!("content of {name}\n").repeat(8);
    let mut header = tar::Header::new_ustar();
    header.set_size(data.len() as u64);
    header.set_mode(0o644);
    header.set_cksum();
    let mut builder = tar::Builder::new(Vec::new());
    builder.append_data(&mut header, "index.txt", data.as_bytes()).unwrap();
    builder.into_inner().unwrap()
}

async fn seed(
    target: &Target,
    connections: usize,
    count: usize,
    concurrency: usize,
    prefix: &str,
    upload: bool,
) -> Result<Value> {
    let clients = target.clients(connections)?;
    let next = Arc::new(AtomicUsize::new(0));
    let existing = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for worker in 0..concurrency.max(1) {
        let (client, next, existing) = (clients[worker % clients.len()].clone(), next.clone(), existing.clone());
        let (url, prefix) = (target.bundles.clone(), prefix.to_owned());
        tasks.push(tokio::spawn(async move {
            let mut stats = Stats::default();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= count {
                    return stats;
                }
                let name = format!("{prefix}{i:05}");
                let body = bundle_body(&name, json!({}));
                let request = client.post(&url).header("Content-Type", "application/json").body(body);
                match timed(&mut stats, request, &[StatusCode::CREATED, StatusCode::CONFLICT]).await {
                    Some(StatusCode::CONFLICT) => {
                        existing.fetch_add(1, Ordering::Relaxed);
                    }
                    Some(_) if upload => {
                        let put = client.put(format!("{url}/{name}/content")).body(small_tar(&name));
                        timed(&mut stats, put, &[StatusCode::OK]).await;
                    }
                    _ => {}
                }
            }
        }));
    }
    let stats = join_all(tasks).await?;
    let mut summary = stats.summary("seed", started.elapsed());
    summary["existing"] = json!(existing.load(Ordering::Relaxed));
    Ok(summary)
}

async fn get(target: &Target, connections: usize, concurrency: usize, duration: f64) -> Result<Value> {
    let clients = target.clients(connections)?;
    let (names, _) = names_and_rv(&clients[0], target).await?;
    if names.is_empty() {
        bail!("no Bundles in the namespace (run seed first)");
    }
    let names = Arc::new(names);
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(duration);
    let mut tasks = Vec::new();
    for worker in 0..concurrency.max(1) {
        let (client, names, base) = (clients[worker % clients.len()].clone(), names.clone(), target.bundle(""));
        tasks.push(tokio::spawn(async move {
            let mut stats = Stats::default();
            let mut rng = Rng::new(unix_nanos() ^ worker as u64);
            while Instant::now() < deadline {
                let name = &names[rng.below(names.len())];
                timed(&mut stats, client.get(format!("{base}{name}")), &[StatusCode::OK]).await;
            }
            stats
        }));
    }
    let stats = join_all(tasks).await?;
    let mut summary = stats.summary("get", started.elapsed());
    summary["objects"] = json!(names.len());
    summary["concurrency"] = json!(concurrency);
    Ok(summary)
}

async fn list(target: &Target, connections: usize, limit: u64, concurrency: usize, duration: f64) -> Result<Value> {
    let clients = target.clients(connections)?;
    let url = if limit > 0 { format!("{}?limit={limit}", target.bundles) } else { target.bundles.clone() };
    // One list up front: how many items a response holds and whether the server paged.
    let probe: Value = clients[0].get(&url).send().await?.error_for_status()?.json().await?;
    let items = probe["items"].as_array().map_or(0, Vec::len);
    let paged = probe["metadata"]["continue"].as_str().is_some_and(|c| !c.is_empty());
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(duration);
    let mut tasks = Vec::new();
    for worker in 0..concurrency.max(1) {
        let (client, url) = (clients[worker % clients.len()].clone(), url.clone());
        tasks.push(tokio::spawn(async move {
            let mut stats = Stats::default();
            while Instant::now() < deadline {
                timed(&mut stats, client.get(&url), &[StatusCode::OK]).await;
            }
            stats
        }));
    }
    let stats = join_all(tasks).await?;
    let requests = stats.latencies_us.len() as f64;
    let bytes = stats.bytes as f64;
    let mut summary = stats.summary("list", started.elapsed());
    summary["limit"] = json!(limit);
    summary["items_per_response"] = json!(items);
    summary["continue"] = json!(paged);
    summary["bytes_per_response"] = json!(if requests > 0.0 { (bytes / requests).round() } else { 0.0 });
    summary["concurrency"] = json!(concurrency);
    Ok(summary)
}

// ---------------------------------------------------------------------------------------------
// watch fan-out

/// What one watcher saw: lags of the events carrying [`SENT`], when the last one arrived.
struct Seen {
    lags_us: Vec<u64>,
    last: Option<Instant>,
    error: Option<String>,
}

/// The `SENT` annotation of a watch event line.
fn sent_of(line: &[u8]) -> Option<u64> {
    let key = format!("\"{SENT}\":\"");
    let text = std::str::from_utf8(line).ok()?;
    if let Some(at) = text.find(&key) {
        let rest = &text[at + key.len()..];
        return rest[..rest.find('"')?].parse().ok();
    }
    let event: Value = serde_json::from_slice(line).ok()?;
    event["object"]["metadata"]["annotations"][SENT].as_str()?.parse().ok()
}

async fn follow(resp: reqwest::Response, expected: usize, deadline: tokio::time::Instant) -> Seen {
    let mut seen = Seen { lags_us: Vec::with_capacity(expected), last: None, error: None };
    let mut stream = resp.bytes_stream();
    let mut buffer: Vec<u8> = Vec::new();
    while seen.lags_us.len() < expected {
        let chunk = match tokio::time::timeout_at(deadline, stream.next()).await {
            Ok(Some(Ok(chunk))) => chunk,
            Ok(Some(Err(e))) => {
                seen.error = Some(e.to_string());
                break;
            }
            Ok(None) => {
                seen.error = Some("watch ended".into());
                break;
            }
            Err(_) => break,
        };
        buffer.extend_from_slice(&chunk);
        let mut start = 0;
        while let Some(end) = buffer[start..].iter().position(|b| *b == b'\n') {
            let line = &buffer[start..start + end];
            start += end + 1;
            if let Some(sent) = sent_of(line) {
                let now = unix_nanos();
                seen.lags_us.push(now.saturating_sub(sent) / 1000);
                seen.last = Some(Instant::now());
            }
        }
        buffer.drain(..start);
    }
    seen
}

/// `VmRSS` and `VmHWM` of a process, in MiB.
fn memory_mib(pid: u32) -> Option<(f64, f64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| -> Option<f64> {
        let kib: f64 =
            status.lines().find_map(|l| l.strip_prefix(name))?.trim().trim_end_matches("kB").trim().parse().ok()?;
        Some(round(kib / 1024.0, 1))
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

/// How the writes of a watch run are sent: by this many writers, at most this many per second
/// together (0: unpaced).
struct WritePace {
    concurrency: usize,
    rate: f64,
}

async fn watch(
    target: &Target,
    watchers: usize,
    events: usize,
    pace: WritePace,
    op: Op,
    timeout: f64,
    pid: Option<u32>,
) -> Result<Value> {
    let writer = target.client()?;
    let (names, rv) = names_and_rv(&writer, target).await?;
    if op == Op::Patch && names.len() < events {
        bail!("patch needs at least {events} Bundles in the namespace, found {} (seed more)", names.len());
    }

    // Open every watch (one connection each, like separate controllers) before writing.
    let url = format!("{}?watch=true&resourceVersion={rv}&timeoutSeconds=3600", target.bundles);
    let deadline = tokio::time::Instant::now() + Duration::from_secs_f64(timeout);
    let mut followers = Vec::new();
    let mut opening = Vec::new();
    for _ in 0..watchers {
        let (client, url) = (target.client()?, url.clone());
        opening.push(tokio::spawn(async move { client.get(&url).send().await }));
    }
    for task in opening {
        let resp = task.await?.context("opening a watch")?;
        if resp.status() != StatusCode::OK {
            bail!("watch: {}", resp.status());
        }
        followers.push(tokio::spawn(follow(resp, events, deadline)));
    }
    let memory_open = pid.and_then(memory_mib);
    eprintln!("loadgen watch: {watchers} watches open from resourceVersion {rv}");

    // Writes, each stamped with its send time.
    let run = format!("{:x}", unix_nanos());
    let next = Arc::new(AtomicUsize::new(0));
    let names = Arc::new(names);
    let started = Instant::now();
    let start = tokio::time::Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..pace.concurrency.max(1) {
        let (client, next, names, base, run) =
            (writer.clone(), next.clone(), names.clone(), target.bundles.clone(), run.clone());
        let rate = pace.rate;
        tasks.push(tokio::spawn(async move {
            let mut stats = Stats::default();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= events {
                    return stats;
                }
                if rate > 0.0 {
                    tokio::time::sleep_until(start + Duration::from_secs_f64(i as f64 / rate)).await;
                }
                let annotations = json!({SENT: unix_nanos().to_string()});
                let request = match op {
                    Op::Patch => client
                        .patch(format!("{base}/{}", names[i]))
                        .header("Content-Type", "application/merge-patch+json")
                        .body(json!({"metadata": {"annotations": annotations}}).to_string()),
                    Op::Create => client
                        .post(&base)
                        .header("Content-Type", "application/json")
                        .body(bundle_body(&format!("lg-{run}-{i}"), annotations)),
                };
                timed(&mut stats, request, &[StatusCode::OK, StatusCode::CREATED]).await;
            }
        }));
    }
    let writes = join_all(tasks).await?;
    let write_secs = started.elapsed().as_secs_f64();
    let memory_busy = pid.and_then(memory_mib);

    let mut lags = Vec::with_capacity(watchers * events);
    let mut last = started;
    let mut errors = Vec::new();
    for follower in followers {
        let seen = follower.await?;
        lags.extend(seen.lags_us);
        last = last.max(seen.last.unwrap_or(started));
        errors.extend(seen.error);
    }
    if let Some(e) = errors.first() {
        eprintln!("loadgen watch: {} watchers ended early, first: {e}", errors.len());
    }
    lags.sort_unstable();
    let delivered = lags.len();
    let secs = last.duration_since(started).as_secs_f64().max(1e-9);

    if op == Op::Create {
        // Leave the namespace as it was (not measured).
        let client = writer.clone();
        let mut stats = Stats::default();
        for i in 0..events {
            timed(&mut stats, client.delete(target.bundle(&format!("lg-{run}-{i}"))), &[StatusCode::OK]).await;
        }
    }

    let write_errors = writes.errors;
    let mut write_summary = writes.summary("write", Duration::from_secs_f64(write_secs));
    let mut result = json!({
        "command": "watch",
        "op": match op { Op::Patch => "patch", Op::Create => "create" },
        "watchers": watchers,
        "events": events,
        "expected": watchers * events,
        "delivered": delivered,
        "missing": watchers * events - delivered.min(watchers * events),
        "duration_s": round(secs, 3),
        "events_per_s": round(delivered as f64 / secs, 1),
        "lag_p50_ms": round(percentile(&lags, 50.0) as f64 / 1000.0, 3),
        "lag_p99_ms": round(percentile(&lags, 99.0) as f64 / 1000.0, 3),
        "lag_max_ms": round(lags.last().copied().unwrap_or(0) as f64 / 1000.0, 3),
        "write_rps": write_summary["rps"].take(),
        "write_p99_ms": write_summary["p99_ms"].take(),
        "write_errors": write_errors,
        "watch_errors": errors.len(),
    });
    if let Some((rss, hwm)) = memory_open {
        result["server_rss_mib_watches_open"] = json!(rss);
        result["server_hwm_mib_watches_open"] = json!(hwm);
    }
    if let Some((rss, hwm)) = memory_busy {
        result["server_rss_mib_after_writes"] = json!(rss);
        result["server_hwm_mib_after_writes"] = json!(hwm);
    }
    Ok(result)
}
