//! A minimal provisioner: keeps `OUT/NAMESPACE/NAME/` equal to the content of every unpacked
//! Bundle, fetching only Bundles whose digest changed. See docs/provisioners.md.
//!
//! Usage: provisioner OUT_DIR [--namespace NS | --all-namespaces] [--piece-bytes N] [--every SECONDS]
//! (credentials: `KUBECONFIG`, `~/.kube/config` or in-cluster, as kubectl finds them; like kubectl
//! it works in the kubeconfig's namespace unless told otherwise; without `--every` it syncs once
//! and exits)

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use stowage_client::{ContentClient, FetchOptions, Fetched};

const USAGE: &str =
    "usage: provisioner OUT_DIR [--namespace NS | --all-namespaces] [--piece-bytes N] [--every SECONDS]";

/// Where to look for Bundles.
enum Scope {
    /// The kubeconfig's (or the pod's) namespace.
    Default,
    Namespace(String),
    /// Every namespace (needs `list` on Bundles cluster-wide).
    All,
}

struct Args {
    out: PathBuf,
    scope: Scope,
    piece_bytes: u64,
    every: Option<Duration>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = std::env::args().skip(1);
    let mut parsed = Args { out: PathBuf::new(), scope: Scope::Default, piece_bytes: 64 << 20, every: None };
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--namespace" | "-n" => parsed.scope = Scope::Namespace(value()?),
            "--all-namespaces" | "-A" => parsed.scope = Scope::All,
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
        return Err(USAGE.into());
    }
    Ok(parsed)
}

/// Failures are printed with their message (a server's refusal as kubectl prints it), not as
/// debug structures.
#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("provisioner: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let args = parse_args()?;
    let client = kube::Client::try_default().await?;
    let namespace = match &args.scope {
        Scope::Default => Some(client.default_namespace().to_string()),
        Scope::Namespace(ns) => Some(ns.clone()),
        Scope::All => None,
    };
    let content = ContentClient::with_options(
        client,
        FetchOptions { piece_bytes: args.piece_bytes, attempts: 5, ..FetchOptions::default() },
    );
    loop {
        sync(&content, &args.out, namespace.as_deref()).await?;
        match args.every {
            Some(every) => tokio::time::sleep(every).await,
            None => return Ok(()),
        }
    }
}

async fn sync(content: &ContentClient, out: &Path, namespace: Option<&str>) -> Result<(), Box<dyn std::error::Error>> {
    for bundle in content.unpacked(namespace).await? {
        let dir = out.join(&bundle.namespace).join(&bundle.name);
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
