//! A real S3-compatible object store for the replicated tests: a single-node Garage on loopback
//! ports (the recipe in `../shared/RECIPES.md`), with one bucket and one key allowed on it.
//! The binary is `$STOWAGE_GARAGE`, else the copy `scripts/test.sh` builds and caches.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use super::process::{free_port, run, Proc};
use crate::harness::wait_until;

const START_TIMEOUT: Duration = Duration::from_secs(30);
pub const REGION: &str = "garage";

/// Where the S3 API is and the credentials of a key that may read and write the bucket.
#[derive(Clone, Debug)]
pub struct S3 {
    /// `http://127.0.0.1:PORT`
    pub endpoint: String,
    pub bucket: String,
    pub region: String,
    pub key_id: String,
    pub secret: String,
}

impl S3 {
    /// An `object_store` client of the bucket (path-style, plain http), as the server builds one.
    pub fn object_store(&self) -> object_store::aws::AmazonS3 {
        object_store::aws::AmazonS3Builder::new()
            .with_endpoint(&self.endpoint)
            .with_allow_http(true)
            .with_virtual_hosted_style_request(false)
            .with_region(&self.region)
            .with_bucket_name(&self.bucket)
            .with_access_key_id(&self.key_id)
            .with_secret_access_key(&self.secret)
            .build()
            .expect("object_store client for Garage")
    }
}

pub struct Garage {
    pub s3: S3,
    _proc: Proc,
    _dir: tempfile::TempDir,
}

impl Garage {
    /// The Garage process (to pause and resume it).
    pub fn process(&self) -> &Proc {
        &self._proc
    }
}

/// The Garage binary; a missing one is a failure (the test script builds it), never a skip.
pub fn binary() -> PathBuf {
    let path = match std::env::var_os("STOWAGE_GARAGE") {
        Some(p) => PathBuf::from(p),
        None => {
            let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| "/root".into());
            home.join(".cache/stowage-tools/garage-2.5.0/bin/garage")
        }
    };
    assert!(path.is_file(), "Garage not found at {} (set STOWAGE_GARAGE; scripts/test.sh builds it)", path.display());
    path
}

impl Garage {
    /// Starts Garage, lays out its one node and creates `bucket` and a key for it.
    pub fn start(bucket: &str) -> Garage {
        let dir = tempfile::Builder::new().prefix("stowage-garage-").tempdir().expect("garage tempdir");
        let (rpc, s3, admin) = (free_port(), free_port(), free_port());
        let config = dir.path().join("garage.toml");
        let secret: String = (0..4).map(|_| uuid::Uuid::new_v4().simple().to_string()).collect::<String>()[..64].into();
        let token = uuid::Uuid::new_v4().simple().to_string();
        let d = dir.path().display();
        std::fs::write(
            &config,
            format!(
                "metadata_dir = \"{d}/meta\"\ndata_dir = \"{d}/data\"\ndb_engine = \"sqlite\"\n\
                 replication_factor = 1\nrpc_bind_addr = \"127.0.0.1:{rpc}\"\n\
                 rpc_public_addr = \"127.0.0.1:{rpc}\"\nrpc_secret = \"{secret}\"\n\n\
                 [s3_api]\ns3_region = \"{REGION}\"\napi_bind_addr = \"127.0.0.1:{s3}\"\n\
                 root_domain = \".s3.garage.localhost\"\n\n\
                 [admin]\napi_bind_addr = \"127.0.0.1:{admin}\"\nadmin_token = \"{token}\"\n"
            ),
        )
        .unwrap();
        let mut server = Command::new(binary());
        server.arg("-c").arg(&config).arg("server").env("RUST_LOG", "garage=warn");
        let mut proc = Proc::spawn("garage", server);
        proc.wait_listening(format!("127.0.0.1:{s3}").parse().unwrap(), START_TIMEOUT);
        let cli = |args: &[&str]| {
            let mut cmd = Command::new(binary());
            cmd.arg("-c").arg(&config).args(args).env("RUST_LOG", "warn");
            cmd
        };
        // The CLI talks to the server over RPC, which answers a moment after the S3 port opens.
        let node = wait_until(START_TIMEOUT, Duration::from_millis(200), "garage node id", || {
            let out = cli(&["node", "id", "-q"]).output().expect("run garage node id");
            match out.status.success() {
                true => Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned()),
                false => Err(format!("{}\nlog:\n{}", String::from_utf8_lossy(&out.stderr), proc.tail())),
            }
        });
        let node = node.split('@').next().unwrap_or(&node).to_owned();
        run(&mut cli(&["layout", "assign", "-z", "dc1", "-c", "1G", &node]));
        run(&mut cli(&["layout", "apply", "--version", "1"]));
        run(&mut cli(&["bucket", "create", bucket]));
        let created = run(&mut cli(&["key", "create", "stowage-test"]));
        let field = |name: &str| {
            created
                .lines()
                .find_map(|l| l.trim().strip_prefix(name).map(|v| v.trim_start_matches(':').trim().to_owned()))
                .unwrap_or_else(|| panic!("no {name:?} in `garage key create` output:\n{created}"))
        };
        let (key_id, secret) = (field("Key ID"), field("Secret key"));
        run(&mut cli(&["bucket", "allow", "--read", "--write", "--owner", bucket, "--key", "stowage-test"]));
        let s3 = S3 {
            endpoint: format!("http://127.0.0.1:{s3}"),
            bucket: bucket.to_owned(),
            region: REGION.to_owned(),
            key_id,
            secret,
        };
        Garage { s3, _proc: proc, _dir: dir }
    }
}
