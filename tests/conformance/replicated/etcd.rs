//! A real single-member etcd (Debian's `etcd-server`) on loopback ports, in its own data
//! directory, killed on drop.

use std::process::Command;
use std::time::Duration;

use super::process::{free_port, Proc};
use crate::harness::eventually_every;

const START_TIMEOUT: Duration = Duration::from_secs(30);

pub struct Etcd {
    /// `http://127.0.0.1:PORT`, the value of `--etcd-servers`.
    pub url: String,
    proc: Proc,
    _dir: tempfile::TempDir,
}

impl Etcd {
    /// The etcd process (to pause and resume it).
    pub fn process(&self) -> &Proc {
        &self.proc
    }

    /// Starts etcd and waits until it answers a status request.
    pub async fn start() -> Etcd {
        let dir = tempfile::Builder::new().prefix("stowage-etcd-").tempdir().expect("etcd tempdir");
        let (client, peer) = (free_port(), free_port());
        let url = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let mut cmd = Command::new(std::env::var("STOWAGE_ETCD").unwrap_or_else(|_| "etcd".into()));
        cmd.arg("--name")
            .arg("test")
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .arg("--listen-client-urls")
            .arg(&url)
            .arg("--advertise-client-urls")
            .arg(&url)
            .arg("--listen-peer-urls")
            .arg(&peer_url)
            .arg("--initial-advertise-peer-urls")
            .arg(&peer_url)
            .arg("--initial-cluster")
            .arg(format!("test={peer_url}"))
            .arg("--initial-cluster-state")
            .arg("new")
            .arg("--logger")
            .arg("zap")
            .arg("--log-level")
            .arg("warn")
            // The tests write much; no snapshots or quota surprises within a test.
            .arg("--quota-backend-bytes")
            .arg((2u64 << 30).to_string());
        let mut proc = Proc::spawn("etcd", cmd);
        proc.wait_listening(format!("127.0.0.1:{client}").parse().unwrap(), START_TIMEOUT);
        let etcd = Etcd { url, proc, _dir: dir };
        etcd.wait_healthy().await;
        etcd
    }

    async fn wait_healthy(&self) {
        eventually_every(START_TIMEOUT, Duration::from_millis(100), "etcd healthy", || async {
            let error = match self.client().await {
                Ok(mut c) => match c.status().await {
                    Ok(_) => return Ok(()),
                    Err(e) => e.to_string(),
                },
                Err(e) => e.to_string(),
            };
            Err(format!("{error}; log:\n{}", self.proc.tail()))
        })
        .await;
    }

    /// A client of this etcd (the crate the server uses).
    pub async fn client(&self) -> Result<etcd_client::Client, etcd_client::Error> {
        let options = etcd_client::ConnectOptions::new().with_connect_timeout(Duration::from_secs(5));
        etcd_client::Client::connect([self.url.as_str()], Some(options)).await
    }

    /// The keys under `prefix` (how many), to see what a test left in etcd.
    pub async fn count_prefix(&self, prefix: &str) -> i64 {
        let mut client = self.client().await.expect("connect to etcd");
        let options = etcd_client::GetOptions::new().with_prefix().with_count_only();
        client.get(prefix, Some(options)).await.expect("count keys").count()
    }
}
