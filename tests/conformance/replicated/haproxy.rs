//! Debian's haproxy in TCP mode in front of the replicas, like a Service: round robin, an HTTPS
//! health check on `/readyz` every 500 ms (down after 2 failures, up after 1 success), and its
//! view of the backends read from its stats socket (`show stat`), sampled over time.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::Command;
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use super::process::{free_port, Proc};
use crate::harness::eventually_every;

const BACKEND: &str = "replicas";

pub struct Haproxy {
    /// `https://127.0.0.1:PORT` (TLS passes through to the replicas).
    pub url: String,
    socket: PathBuf,
    _proc: Proc,
    _dir: tempfile::TempDir,
}

impl Haproxy {
    /// Starts haproxy with one server per backend address (`127.0.0.1:PORT`), named `r0`, `r1`, …
    pub fn start(backends: &[u16]) -> Haproxy {
        let dir = tempfile::Builder::new().prefix("stowage-haproxy-").tempdir().expect("haproxy tempdir");
        let port = free_port();
        let socket = dir.path().join("admin.sock");
        let servers: String =
            backends.iter().enumerate().map(|(i, p)| format!("    server r{i} 127.0.0.1:{p}\n")).collect();
        let config = format!(
            "global\n    stats socket {} mode 600 level admin\n    maxconn 4096\n\n\
             defaults\n    mode tcp\n    timeout connect 2s\n    timeout client 15m\n    timeout server 15m\n    timeout check 2s\n\
             \x20   retries 2\n    option redispatch\n\n\
             frontend api\n    bind 127.0.0.1:{port}\n    default_backend {BACKEND}\n\n\
             backend {BACKEND}\n    balance roundrobin\n    option httpchk GET /readyz\n\
             \x20   default-server check check-ssl verify none inter 500ms fall 2 rise 1\n{servers}",
            socket.display()
        );
        let file = dir.path().join("haproxy.cfg");
        std::fs::write(&file, config).unwrap();
        let mut cmd = Command::new(std::env::var("STOWAGE_HAPROXY").unwrap_or_else(|_| "haproxy".into()));
        cmd.arg("-f").arg(&file).arg("-db");
        let mut proc = Proc::spawn("haproxy", cmd);
        proc.wait_listening(format!("127.0.0.1:{port}").parse().unwrap(), Duration::from_secs(10));
        Haproxy { url: format!("https://127.0.0.1:{port}"), socket, _proc: proc, _dir: dir }
    }

    /// Each server's status as haproxy shows it: `UP`, `DOWN`, `UP 1/2` (going down),
    /// `DOWN 1/1` (going up), `MAINT`, `no check`.
    pub fn status(&self) -> Result<BTreeMap<String, String>, String> {
        let mut stream = UnixStream::connect(&self.socket).map_err(|e| format!("connect to the stats socket: {e}"))?;
        stream.set_read_timeout(Some(Duration::from_secs(2))).map_err(|e| e.to_string())?;
        stream.write_all(b"show stat\n").map_err(|e| format!("write to the stats socket: {e}"))?;
        let mut csv = String::new();
        stream.read_to_string(&mut csv).map_err(|e| format!("read the stats socket: {e}"))?;
        parse_show_stat(&csv)
    }

    /// How many servers haproxy would route to now (status `UP` or `UP n/m`).
    pub fn up_count(&self) -> Result<usize, String> {
        Ok(self.status()?.values().filter(|s| s.starts_with("UP")).count())
    }

    /// Waits until server `name` has a status starting with `prefix` (`UP` or `DOWN`).
    pub async fn wait_status(&self, name: &str, prefix: &str, timeout: Duration) {
        let what = format!("haproxy: {name} {prefix}");
        eventually_every(timeout, Duration::from_millis(50), &what, || async {
            match self.status() {
                Ok(s) if s.get(name).is_some_and(|v| v.starts_with(prefix)) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
        .await;
    }

    /// Samples `show stat` every `every` until the sampler is stopped.
    pub fn sample(self: &Arc<Self>, every: Duration) -> Sampler {
        let samples = Arc::new(Mutex::new(Vec::new()));
        let (stop, stopped) = mpsc::channel::<()>();
        let (this, s) = (self.clone(), samples.clone());
        let thread = std::thread::spawn(move || loop {
            let at = Instant::now();
            let status = this.status();
            s.lock().unwrap().push(Sample { at, status });
            // Until the next sample is due, or at once when the sampler is stopped (or dropped).
            match stopped.recv_timeout(every.saturating_sub(at.elapsed())) {
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                _ => return,
            }
        });
        Sampler { samples, stop: Some(stop), thread: Some(thread) }
    }
}

/// The server rows of haproxy's CSV: `svname` → `status`.
fn parse_show_stat(csv: &str) -> Result<BTreeMap<String, String>, String> {
    let mut lines = csv.lines();
    let header = lines.next().and_then(|h| h.strip_prefix("# ")).ok_or_else(|| format!("no CSV header in {csv:?}"))?;
    let column = |name: &str| header.split(',').position(|c| c == name).ok_or_else(|| format!("no {name} column"));
    let (px, sv, st) = (column("pxname")?, column("svname")?, column("status")?);
    let mut out = BTreeMap::new();
    for line in lines {
        let fields: Vec<&str> = line.split(',').collect();
        let (Some(p), Some(s), Some(status)) = (fields.get(px), fields.get(sv), fields.get(st)) else { continue };
        if *p == BACKEND && *s != "BACKEND" {
            out.insert((*s).to_owned(), (*status).to_owned());
        }
    }
    if out.is_empty() {
        return Err(format!("no servers of {BACKEND} in {csv:?}"));
    }
    Ok(out)
}

pub struct Sample {
    pub at: Instant,
    pub status: Result<BTreeMap<String, String>, String>,
}

/// haproxy's view of the backends, sampled by a thread.
pub struct Sampler {
    samples: Arc<Mutex<Vec<Sample>>>,
    /// Dropping it stops the thread.
    stop: Option<mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Sampler {
    /// Stops sampling; the samples taken.
    pub fn finish(mut self) -> Vec<Sample> {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        std::mem::take(&mut *self.samples.lock().unwrap())
    }

    /// Waits until a sample taken since `since` shows server `name` `DOWN`.
    pub async fn wait_down(&self, name: &str, since: Instant, timeout: Duration) {
        let what = format!("a sample shows {name} DOWN");
        eventually_every(timeout, Duration::from_millis(50), &what, || async {
            let samples = self.samples.lock().unwrap();
            match time_to_down(&samples, name, since) {
                Some(_) => Ok(()),
                None => Err(format!("{} samples", samples.len())),
            }
        })
        .await;
    }
}

/// The fewest servers `UP` in any sample, with the time of that sample; failed reads of the
/// socket are returned too (a sampler that could not see is not a sampler that saw servers up).
pub fn fewest_up(samples: &[Sample]) -> (usize, Option<Instant>, Vec<String>) {
    let mut fewest = (usize::MAX, None);
    let mut errors = Vec::new();
    for s in samples {
        match &s.status {
            Ok(m) => {
                let up = m.values().filter(|v| v.starts_with("UP")).count();
                if up < fewest.0 {
                    fewest = (up, Some(s.at));
                }
            }
            Err(e) => errors.push(e.clone()),
        }
    }
    (fewest.0, fewest.1, errors)
}

/// How long after `killed` server `name` was first seen `DOWN` (fully, not `UP 1/2`).
pub fn time_to_down(samples: &[Sample], name: &str, killed: Instant) -> Option<Duration> {
    samples.iter().filter(|s| s.at >= killed).find_map(|s| match &s.status {
        Ok(m) if m.get(name).is_some_and(|v| v.starts_with("DOWN")) => Some(s.at - killed),
        _ => None,
    })
}

#[test]
fn parses_show_stat() {
    let csv = "# pxname,svname,qcur,status,weight\napi,FRONTEND,,OPEN,\nreplicas,r0,0,UP,1\n\
               replicas,r1,0,DOWN,1\nreplicas,r2,0,UP 1/2,1\nreplicas,BACKEND,0,UP,2\n\n";
    let m = parse_show_stat(csv).unwrap();
    assert_eq!(m.len(), 3);
    assert_eq!(m["r1"], "DOWN");
    assert_eq!(m["r2"], "UP 1/2");
}
