//! Byte-level clients for the load and slow-client tests — TLS connections that send exactly what a
//! test says (headers a byte at a time, a body that trickles, nothing at all) — and probes of the
//! server process (resident memory, open sockets) and of how long normal requests take meanwhile.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use crate::harness::*;

/// Opens TLS connections to the server as its admin.
pub struct RawTls {
    connector: TlsConnector,
    pub addr: SocketAddr,
}

impl RawTls {
    pub fn new(server: &Server) -> RawTls {
        RawTls::with_alpn(server, b"http/1.1")
    }

    /// Offering only `protocol` by ALPN (`h2` for raw HTTP/2).
    pub fn with_alpn(server: &Server, protocol: &[u8]) -> RawTls {
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let pki = server.data_dir().join("pki");
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(pki.join("ca.crt")).expect("read ca.crt") {
            roots.add(cert.expect("parse ca.crt")).expect("add CA");
        }
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(pki.join("admin.crt"))
            .expect("read admin.crt")
            .map(|c| c.expect("parse admin.crt"))
            .collect();
        let key = PrivateKeyDer::from_pem_file(pki.join("admin.key")).expect("read admin.key");
        let mut config = rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)
            .expect("client TLS config");
        config.alpn_protocols = vec![protocol.to_vec()];
        RawTls { connector: TlsConnector::from(Arc::new(config)), addr: server_addr(server) }
    }

    pub async fn connect(&self) -> std::io::Result<TlsStream<TcpStream>> {
        let tcp = TcpStream::connect(self.addr).await?;
        let name = ServerName::try_from("localhost").expect("server name");
        self.connector.connect(name, tcp).await
    }
}

/// The server's address, from its URL.
pub fn server_addr(server: &Server) -> SocketAddr {
    let host_port = server.url.strip_prefix("https://").expect("https URL");
    host_port.parse().unwrap_or_else(|e| panic!("server address {host_port:?}: {e}"))
}

/// Reads until the server closes the connection (or fails it); returns everything read and how long
/// that took, or `None` if it was still open after `limit`.
pub async fn read_until_closed<S>(stream: &mut S, limit: Duration) -> Option<(Vec<u8>, Duration)>
where
    S: tokio::io::AsyncRead + Unpin,
{
    let started = Instant::now();
    let mut received = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let left = limit.checked_sub(started.elapsed())?;
        match tokio::time::timeout(left, stream.read(&mut buf)).await {
            Err(_) => return None,
            Ok(Ok(0)) | Ok(Err(_)) => return Some((received, started.elapsed())),
            Ok(Ok(n)) => received.extend_from_slice(&buf[..n]),
        }
    }
}

/// Writes `bytes` one piece of `piece` bytes every `every`; stops quietly when the server closes.
pub async fn trickle<S>(stream: &mut S, bytes: &[u8], piece: usize, every: Duration) -> std::io::Result<()>
where
    S: tokio::io::AsyncWrite + Unpin,
{
    for chunk in bytes.chunks(piece) {
        stream.write_all(chunk).await?;
        stream.flush().await?;
        tokio::time::sleep(every).await;
    }
    Ok(())
}

/// The HTTP status of a raw HTTP/1.1 response, if `bytes` starts with one.
pub fn http1_status(bytes: &[u8]) -> Option<u16> {
    let line = bytes.split(|b| *b == b'\r').next()?;
    std::str::from_utf8(line).ok()?.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()
}

/// Resident set size (VmRSS) of a process, in KiB.
pub fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read /proc/PID/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/PID/status")
}

/// Sockets a process holds open (its listener, client connections, outgoing connections).
pub fn open_sockets(pid: u32) -> usize {
    let Ok(entries) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { return 0 };
    entries
        .filter_map(Result::ok)
        .filter(|e| std::fs::read_link(e.path()).is_ok_and(|target| target.to_string_lossy().starts_with("socket:")))
        .count()
}

/// Raises this process's soft open-file limit to its hard limit (thousands of test connections).
pub fn raise_open_file_limit() -> u64 {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit only read and write the struct passed.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit { rlim_cur: limit.rlim_max, rlim_max: limit.rlim_max };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                limit = raised;
            }
        }
    }
    limit.rlim_cur
}

/// One GET on a brand-new connection (TCP, TLS, HTTP/1.1, `Connection: close`); its status.
pub async fn fresh_connection_get(raw: &RawTls, path: &str) -> std::io::Result<Option<u16>> {
    let mut tls = raw.connect().await?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    tls.write_all(request.as_bytes()).await?;
    tls.flush().await?;
    let Some((response, _)) = read_until_closed(&mut tls, Duration::from_secs(20)).await else {
        return Ok(None);
    };
    Ok(http1_status(&response))
}

/// Normal requests made while an attack runs, each one's latency recorded (`None`: it failed):
/// alternately on a kept HTTP/2 connection and on a brand-new connection, as clients arriving
/// during the attack would.
pub struct BystanderProbe {
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<Vec<Option<Duration>>>,
}

impl BystanderProbe {
    /// Starts probing `path` (a GET that answers 200) every `every`.
    pub fn start(server: &Server, path: &str, every: Duration) -> BystanderProbe {
        let url = server.url(path);
        let path = path.to_owned();
        let kept = server.second_client();
        let raw = RawTls::new(server);
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut turn = 0usize;
            while !*stopped.borrow() {
                turn += 1;
                let started = Instant::now();
                let ok = if turn.is_multiple_of(2) {
                    match kept.get(&url).timeout(Duration::from_secs(20)).send().await {
                        Ok(resp) => resp.status() == StatusCode::OK && resp.bytes().await.is_ok(),
                        Err(_) => false,
                    }
                } else {
                    matches!(fresh_connection_get(&raw, &path).await, Ok(Some(200)))
                };
                latencies.push(ok.then(|| started.elapsed()));
                let _ = tokio::time::timeout(every, stopped.changed()).await;
            }
            latencies
        });
        BystanderProbe { stop, task }
    }

    /// Stops probing and asserts every probe succeeded within `bound`; returns the slowest.
    pub async fn finish(self, what: &str, bound: Duration) -> Duration {
        let _ = self.stop.send(true);
        let latencies = self.task.await.expect("bystander task");
        let failed = latencies.iter().filter(|l| l.is_none()).count();
        assert!(!latencies.is_empty(), "{what}: no normal request was made");
        assert_eq!(failed, 0, "{what}: {failed} of {} normal requests failed", latencies.len());
        let slowest = latencies.iter().flatten().max().copied().unwrap_or_default();
        report(&format!("{what}: {} normal requests during the attack, slowest {slowest:?}", latencies.len()));
        assert!(slowest <= bound, "{what}: a normal request took {slowest:?} (bound {bound:?})");
        slowest
    }
}
