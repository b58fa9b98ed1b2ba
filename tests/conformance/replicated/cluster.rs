//! N `stowage serve` replicas in the replicated store mode, sharing one etcd prefix and one Garage
//! bucket, each on its own fixed loopback port and data directory (certificates and scratch only),
//! all presenting replica 0's serving certificate and trusting its client CA, as replicas of one
//! Deployment do from one Secret. A replica can be killed with SIGKILL, stopped with SIGTERM and
//! started again on its port and data directory.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use reqwest::{Certificate, Client, Identity};

use super::etcd::Etcd;
use super::garage::Garage;
use super::haproxy::Haproxy;
use super::process::{free_port, Proc};
use crate::harness::eventually_every;

const READY_TIMEOUT: Duration = Duration::from_secs(60);

pub struct Replica {
    pub index: usize,
    pub port: u16,
    pub data_dir: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    proc: Option<Proc>,
    starts: usize,
}

impl Replica {
    /// `https://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// haproxy's name for this replica.
    pub fn name(&self) -> String {
        format!("r{}", self.index)
    }

    /// Spawns the replica and waits for its ready line (not yet for `/readyz`).
    fn spawn(&mut self) {
        assert!(self.proc.is_none(), "replica {} already runs", self.index);
        self.starts += 1;
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_stowage"));
        cmd.arg("serve")
            .arg("--data-dir")
            .arg(&self.data_dir)
            .arg("--listen")
            .arg(format!("127.0.0.1:{}", self.port))
            .args(&self.args)
            .arg("--replica-id")
            .arg(format!("{}-{}", self.name(), self.starts))
            .env("NO_COLOR", "1")
            .envs(self.env.iter().map(|(k, v)| (k, v)));
        let mut proc = Proc::spawn(&format!("stowage replica {} (start {})", self.index, self.starts), cmd);
        proc.wait_line("stowage ready", READY_TIMEOUT);
        self.proc = Some(proc);
    }

    /// Waits until `/readyz` answers 200 (the replica reaches etcd and S3).
    pub async fn wait_ready(&mut self, client: &Client) {
        let url = format!("{}/readyz", self.url());
        let (index, proc) = (self.index, std::cell::RefCell::new(&mut self.proc));
        let what = format!("replica {index} ready");
        eventually_every(READY_TIMEOUT, Duration::from_millis(100), &what, || async {
            let last = match client.get(&url).timeout(Duration::from_secs(5)).send().await {
                Ok(r) if r.status().is_success() => return Ok(()),
                Ok(r) => format!("{}: {}", r.status(), r.text().await.unwrap_or_default()),
                Err(e) => format!("{e:?}"),
            };
            if let Some(status) = proc.borrow_mut().as_mut().and_then(Proc::exited) {
                panic!("replica {index} exited ({status}) before ready; last /readyz: {last}");
            }
            Err(format!("last /readyz: {last}"))
        })
        .await;
    }

    /// SIGKILL.
    pub fn kill9(&mut self) {
        if let Some(mut p) = self.proc.take() {
            p.kill9();
            self.keep_log(p);
        }
    }

    /// SIGTERM and wait for the exit (killed after `limit`); how long it took.
    pub fn terminate(&mut self, limit: Duration) -> Option<Duration> {
        let mut p = self.proc.take()?;
        let took = p.terminate(limit);
        self.keep_log(p);
        took
    }

    /// Starts the replica again on its port and data directory and waits until it is ready.
    pub async fn restart(&mut self, client: &Client) {
        self.spawn();
        self.wait_ready(client).await;
    }

    /// Earlier runs' logs are kept in the data directory's parent for a failing test to show.
    fn keep_log(&self, p: Proc) {
        let path = self.data_dir.with_file_name(format!("replica-{}.log", self.index));
        let mut text = std::fs::read_to_string(&path).unwrap_or_default();
        text.push_str(&format!("======== {} ========\n", p.name()));
        text.push_str(&p.into_log());
        let _ = std::fs::write(&path, text);
    }

    /// Every run's log so far, the current one last.
    pub fn log(&self) -> String {
        let path = self.data_dir.with_file_name(format!("replica-{}.log", self.index));
        let mut text = std::fs::read_to_string(path).unwrap_or_default();
        if let Some(p) = &self.proc {
            text.push_str(&format!("======== {} (running) ========\n{}", p.name(), p.log()));
        }
        text
    }
}

/// The shared store (etcd, Garage), the replicas, and optionally haproxy in front of them.
pub struct Cluster {
    pub replicas: Vec<Replica>,
    pub haproxy: Option<Arc<Haproxy>>,
    pub prefix: String,
    client: Client,
    dir: tempfile::TempDir,
    // Dropped after the replicas (fields drop in order), so replicas never lose their store first.
    pub garage: Garage,
    pub etcd: Etcd,
}

impl Cluster {
    /// Starts etcd, Garage and `n` replicas under etcd prefix `/stowage-NAME`, bucket `NAME`.
    pub async fn start(name: &str, n: usize, extra_args: &[&str]) -> Cluster {
        let etcd = Etcd::start().await;
        let garage = Garage::start(name);
        Cluster::start_on(name, n, extra_args, etcd, garage).await
    }

    pub async fn start_on(name: &str, n: usize, extra_args: &[&str], etcd: Etcd, garage: Garage) -> Cluster {
        let dir = tempfile::Builder::new().prefix(&format!("stowage-{name}-")).tempdir().expect("cluster tempdir");
        let prefix = format!("/stowage-{name}");
        let s3 = &garage.s3;
        let mut args: Vec<String> = vec![
            "--etcd-servers".into(),
            etcd.url.clone(),
            "--etcd-prefix".into(),
            prefix.clone(),
            "--s3-endpoint".into(),
            s3.endpoint.clone(),
            "--s3-bucket".into(),
            s3.bucket.clone(),
            "--s3-region".into(),
            s3.region.clone(),
            "--s3-path-style".into(),
        ];
        args.extend(extra_args.iter().map(|s| s.to_string()));
        let env = vec![
            ("AWS_ACCESS_KEY_ID".to_owned(), s3.key_id.clone()),
            ("AWS_SECRET_ACCESS_KEY".to_owned(), s3.secret.clone()),
        ];
        let mut replicas: Vec<Replica> = (0..n)
            .map(|index| Replica {
                index,
                port: free_port(),
                data_dir: dir.path().join(format!("replica-{index}")),
                args: args.clone(),
                env: env.clone(),
                proc: None,
                starts: 0,
            })
            .collect();
        // Replica 0 makes the certificates; the others get copies before their first start.
        replicas[0].spawn();
        let client = admin_client(&replicas[0].data_dir);
        replicas[0].wait_ready(&client).await;
        for r in replicas.iter_mut().skip(1) {
            copy_identity(&dir.path().join("replica-0"), &r.data_dir);
            r.spawn();
            r.wait_ready(&client).await;
        }
        Cluster { replicas, haproxy: None, prefix, client, dir, garage, etcd }
    }

    /// Puts haproxy in front of every replica and waits until it sees them all up.
    pub async fn with_haproxy(mut self) -> Cluster {
        let haproxy = Arc::new(Haproxy::start(&self.replicas.iter().map(|r| r.port).collect::<Vec<_>>()));
        for r in &self.replicas {
            haproxy.wait_status(&r.name(), "UP", Duration::from_secs(10)).await;
        }
        self.haproxy = Some(haproxy);
        self
    }

    /// The admin client (the shared CA as its only root, the admin client certificate).
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Another admin client on its own connections.
    pub fn new_client(&self) -> Client {
        admin_client(&self.replicas[0].data_dir)
    }

    /// `https://127.0.0.1:PORT` of haproxy.
    pub fn lb_url(&self) -> String {
        self.haproxy.as_ref().expect("no haproxy in this cluster").url.clone()
    }

    /// An admin kubeconfig whose server is `url` (haproxy's, or one replica's).
    pub fn kubeconfig(&self, url: &str) -> PathBuf {
        let pki = self.replicas[0].data_dir.join("pki");
        let path = self.dir.path().join(format!("admin-{}.kubeconfig", url.rsplit(':').next().unwrap_or("x")));
        let config = format!(
            "apiVersion: v1\nkind: Config\n\
             clusters: [{{name: stowage, cluster: {{server: \"{url}\", certificate-authority: \"{}\"}}}}]\n\
             users: [{{name: admin, user: {{client-certificate: \"{}\", client-key: \"{}\"}}}}]\n\
             contexts: [{{name: stowage, context: {{cluster: stowage, user: admin, namespace: default}}}}]\n\
             current-context: stowage\n",
            pki.join("ca.crt").display(),
            pki.join("admin.crt").display(),
            pki.join("admin.key").display(),
        );
        std::fs::write(&path, config).unwrap();
        path
    }

    /// Prints the newest part of every replica's log (all runs), for a failing test.
    pub fn dump_logs(&self) {
        for r in &self.replicas {
            let log = r.log();
            let mut cut = log.len().saturating_sub(64 << 10);
            while !log.is_char_boundary(cut) {
                cut += 1;
            }
            eprintln!("======== replica {} log (newest 64 KiB) ========\n{}", r.index, &log[cut..]);
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let panicking = std::thread::panicking();
        if panicking {
            for r in &mut self.replicas {
                r.kill9();
            }
            self.dump_logs();
        }
    }
}

/// A client with the cluster's CA and the admin identity from `DATA/pki`.
pub fn admin_client(data_dir: &Path) -> Client {
    let read = |p: &str| std::fs::read(data_dir.join(p)).unwrap_or_else(|e| panic!("read {p}: {e}"));
    let roots = Certificate::from_pem_bundle(&read("pki/ca.crt")).expect("parse pki/ca.crt");
    let mut pem = read("pki/admin.crt");
    pem.push(b'\n');
    pem.extend(read("pki/admin.key"));
    Client::builder()
        .tls_certs_only(roots)
        .identity(Identity::from_pem(&pem).expect("admin identity"))
        .no_proxy()
        .connect_timeout(Duration::from_secs(5))
        .build()
        .expect("admin client")
}

/// Copies replica 0's certificates and kubeconfig (not its scratch) into another data directory.
fn copy_identity(from: &Path, to: &Path) {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(to.join("pki")).unwrap();
    for entry in std::fs::read_dir(from.join("pki")).expect("replica 0 has pki/") {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_file() {
            std::fs::copy(entry.path(), to.join("pki").join(entry.file_name())).unwrap();
        }
    }
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().to_string_lossy().into_owned();
        let wanted = [".pem", ".key", ".crt", "kubeconfig"].iter().any(|s| name.ends_with(s));
        if wanted && entry.file_type().unwrap().is_file() {
            std::fs::copy(entry.path(), to.join(&name)).unwrap();
        }
    }
}
