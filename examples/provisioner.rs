//! A minimal provisioner: keeps `OUT/NAMESPACE/NAME/` equal to the content of every unpacked
//! Bundle, fetching only Bundles whose digest changed. See docs/provisioners.md.
//!
//! Usage: provisioner OUT_DIR [--namespace NS] [--piece-bytes N] [--every SECONDS]
//! (credentials: `KUBECONFIG`, `~/.kube/config` or in-cluster, as kubectl finds them; without
//! `--every` it syncs once and exits)

use std::path::{Path, PathBuf};
use std::time::Duration;

use stowage::client::{ContentClient, FetchOptions, Fetched};

struct Args {
    out: PathBuf,
    namespace: Option<String>,
    piece_bytes: u64,
    every: Option<Duration>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = std::env::args().skip(1);
    let mut parsed = Args { out: PathBuf::new(), namespace: None, piece_bytes: 64 << 20, every: None };
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--namespace" | "-n" => parsed.namespace = Some(value()?),
            "--piece-bytes" => parsed.piece_bytes = value()?.parse().map_err(|e| format!("--piece-bytes: {e}"))?,
            "--every" => {
                let seconds: u64 = value()?.parse().map_err(|e| format!("--every: {e}"))?;
                parsed.every = Some(Duration::from_secs(seconds.max(1)));
            }
            _ if parsed.out.as_os_str().is_empty() => parsed.out = PathBuf::from(arg),
            other => return Err(format!("unexpected argument {other:?}")),
        }
    }
    if parsed.out.as_os_str().is_empty() {
        return Err("usage: provisioner OUT_DIR [--namespace NS] [--piece-bytes N] [--every SECONDS]".into());
    }
    Ok(parsed)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let args = parse_args()?;
    let client = kube::Client::try_default().await?;
    let content = ContentClient::with_options(client, FetchOptions { piece_bytes: args.piece_bytes, attempts: 5 });
    loop {
        sync(&content, &args).await?;
        match args.every {
            Some(every) => tokio::time::sleep(every).await,
            None => return Ok(()),
        }
    }
}

async fn sync(content: &ContentClient, args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    for bundle in content.unpacked(args.namespace.as_deref()).await? {
        let dir = args.out.join(&bundle.namespace).join(&bundle.name);
        let marker = dir.with_extension("digest");
        let held = std::fs::read_to_string(&marker).ok();
        std::fs::create_dir_all(dir.parent().unwrap_or(Path::new(".")))?;
        match content.fetch_into(&bundle.namespace, &bundle.name, &dir, held.as_deref()).await? {
            Fetched::Unchanged => println!("{}/{} unchanged {}", bundle.namespace, bundle.name, bundle.digest),
            Fetched::Updated { digest } => {
                std::fs::write(&marker, &digest)?;
                println!("{}/{} updated {digest} ({})", bundle.namespace, bundle.name, bundle.format);
            }
        }
    }
    Ok(())
}
