//! Which store `stowage serve` opens: the embedded one in the data directory (default), or the
//! replicated one on etcd and S3-compatible object storage when `--etcd-servers` is given, and how
//! singleton work (the reconcile loop, the API's garbage collector) runs only on the leader.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use tokio_util::sync::CancellationToken;

use crate::storage::remote::{Remote, RemoteMetrics, RemoteOptions};
use crate::storage::{Store, StoreOptions};

/// The replicated store's flags (etcd's as kube-apiserver names them).
#[derive(Clone, Debug, clap::Args)]
pub struct StoreFlags {
    /// etcd servers (comma-separated URLs). Given, API objects live in etcd and content in
    /// S3-compatible object storage (`--s3-*`), and several replicas may serve the same store.
    #[arg(long, value_delimiter = ',')]
    pub etcd_servers: Vec<String>,
    /// Prefix of every key stowage writes in etcd.
    #[arg(long, default_value = "/stowage")]
    pub etcd_prefix: String,
    /// CA bundle to verify the etcd servers' certificates.
    #[arg(long)]
    pub etcd_cafile: Option<PathBuf>,
    /// Client certificate for etcd (with --etcd-keyfile).
    #[arg(long)]
    pub etcd_certfile: Option<PathBuf>,
    /// Client key for etcd.
    #[arg(long)]
    pub etcd_keyfile: Option<PathBuf>,
    /// Operations etcd allows in one transaction (etcd's own `--max-txn-ops`).
    #[arg(long, default_value_t = crate::storage::remote::DEFAULT_MAX_TXN_OPS)]
    pub etcd_max_txn_ops: usize,
    /// S3 endpoint URL (AWS S3 when absent; MinIO, Ceph RGW, Garage: their URL).
    #[arg(long, env = "STOWAGE_S3_ENDPOINT")]
    pub s3_endpoint: Option<String>,
    /// Bucket holding the content.
    #[arg(long, env = "STOWAGE_S3_BUCKET")]
    pub s3_bucket: Option<String>,
    /// Region of the bucket.
    #[arg(long, default_value = "us-east-1", env = "AWS_REGION")]
    pub s3_region: String,
    /// Path-style requests (`ENDPOINT/BUCKET/KEY`), as MinIO, Ceph RGW and Garage need by default.
    #[arg(long)]
    pub s3_path_style: bool,
    /// Credentials in AWS's shared-credentials format (its `[default]` profile's
    /// `aws_access_key_id` and `aws_secret_access_key`); without it, `AWS_ACCESS_KEY_ID` and
    /// `AWS_SECRET_ACCESS_KEY` from the environment (or the instance's role).
    #[arg(long)]
    pub s3_credentials_file: Option<PathBuf>,
    /// This replica's name in etcd (pins, leadership); the host name and process id by default.
    #[arg(long, env = "POD_NAME")]
    pub replica_id: Option<String>,
    /// Bytes of API objects and change log each replica keeps in memory, fed by etcd's watch, so
    /// GET, LIST and watches are answered without an etcd round trip beyond one shared check of
    /// the newest resourceVersion. Past it, reads go to etcd. 0: no cache.
    #[arg(long, default_value_t = 256 << 20)]
    pub object_cache_bytes: u64,
    /// Bytes of content blocks each replica keeps on its disk (in --data-dir, emptied at start),
    /// so a Bundle many clients pull is read from object storage once per replica. 0: none.
    #[arg(long, default_value_t = 1 << 30)]
    pub block_cache_bytes: u64,
}

impl StoreFlags {
    pub fn replicated(&self) -> bool {
        !self.etcd_servers.is_empty()
    }

    fn remote_options(&self, metrics: RemoteMetrics) -> anyhow::Result<RemoteOptions> {
        let Some(bucket) = self.s3_bucket.clone() else {
            bail!("--etcd-servers needs --s3-bucket: content goes to object storage");
        };
        let (access_key, secret) = match &self.s3_credentials_file {
            Some(path) => {
                let (id, secret) = read_credentials(path)?;
                (Some(id), Some(secret))
            }
            None => (None, None),
        };
        let replica_id = self.replica_id.clone().unwrap_or_else(|| {
            let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
            format!("{}-{}", host.trim(), std::process::id())
        });
        Ok(RemoteOptions {
            etcd_servers: self.etcd_servers.clone(),
            etcd_prefix: self.etcd_prefix.clone(),
            etcd_ca_file: self.etcd_cafile.clone(),
            etcd_cert_file: self.etcd_certfile.clone(),
            etcd_key_file: self.etcd_keyfile.clone(),
            etcd_max_txn_ops: self.etcd_max_txn_ops,
            s3_endpoint: self.s3_endpoint.clone(),
            s3_bucket: bucket,
            s3_region: self.s3_region.clone(),
            s3_path_style: self.s3_path_style,
            s3_access_key_id: access_key,
            s3_secret_access_key: secret,
            replica_id,
            block_grace: Duration::from_secs(600),
            collect_every: Duration::from_secs(60),
            object_cache_bytes: self.object_cache_bytes,
            block_cache_bytes: self.block_cache_bytes,
            metrics,
        })
    }

    /// Opens the store these flags name; `dir` is the embedded store's directory, or the
    /// replica's scratch. A replicated store records its etcd and object storage requests in
    /// `metrics`.
    pub async fn open(&self, dir: &Path, options: StoreOptions, metrics: RemoteMetrics) -> anyhow::Result<Store> {
        let dir = dir.to_path_buf();
        if !self.replicated() {
            return tokio::task::spawn_blocking(move || Store::open(&dir, options))
                .await
                .context("opening the store")?
                .context("opening the store");
        }
        let remote_options = self.remote_options(metrics)?;
        let servers = remote_options.etcd_servers.join(",");
        tokio::task::spawn_blocking(move || {
            let remote = Remote::connect(remote_options)?;
            Store::open_replicated(&dir, options, remote)
        })
        .await
        .context("opening the store")?
        .with_context(|| format!("opening the replicated store (etcd {servers})"))
    }
}

/// `aws_access_key_id` and `aws_secret_access_key` of the `[default]` profile.
fn read_credentials(path: &Path) -> anyhow::Result<(String, String)> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let (mut id, mut secret, mut section) = (None, None, String::new());
    for line in text.lines().map(str::trim) {
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.trim().to_string();
        } else if let Some((key, value)) = line.split_once('=') {
            if section == "default" {
                match key.trim() {
                    "aws_access_key_id" => id = Some(value.trim().to_string()),
                    "aws_secret_access_key" => secret = Some(value.trim().to_string()),
                    _ => {}
                }
            }
        }
    }
    match (id, secret) {
        (Some(id), Some(secret)) => Ok((id, secret)),
        _ => bail!("{}: no aws_access_key_id and aws_secret_access_key in its [default] section", path.display()),
    }
}

/// Runs `start`'s task while this replica leads (always, with the embedded store); cancels it
/// when leadership goes, starts it again when it comes back. Ends with `shutdown`.
pub fn while_leading<F>(store: Store, shutdown: CancellationToken, start: F) -> tokio::task::JoinHandle<()>
where
    F: Fn(CancellationToken) -> tokio::task::JoinHandle<()> + Send + 'static,
{
    tokio::spawn(async move {
        if !store.elects_leader() {
            let _ = start(shutdown).await;
            return;
        }
        let mut tick = tokio::time::interval(Duration::from_millis(500));
        let mut running: Option<(CancellationToken, tokio::task::JoinHandle<()>)> = None;
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tick.tick() => {}
            }
            match (store.is_leader(), running.is_some()) {
                (true, false) => {
                    let token = shutdown.child_token();
                    running = Some((token.clone(), start(token)));
                }
                (false, true) => {
                    if let Some((token, task)) = running.take() {
                        token.cancel();
                        let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
                    }
                }
                _ => {}
            }
        }
        if let Some((token, task)) = running.take() {
            token.cancel();
            let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_come_from_the_default_profile() {
        let dir = std::env::temp_dir().join(format!("stowage-creds-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("credentials");
        std::fs::write(
            &file,
            "[other]\naws_access_key_id = X\n[default]\naws_access_key_id = GK1\naws_secret_access_key = s3cr3t\n",
        )
        .unwrap();
        assert_eq!(read_credentials(&file).unwrap(), ("GK1".to_string(), "s3cr3t".to_string()));
        std::fs::write(&file, "[other]\naws_access_key_id = X\n").unwrap();
        let err = read_credentials(&file).unwrap_err().to_string();
        assert!(err.contains("[default]"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
