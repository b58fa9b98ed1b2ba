//! `kubectl stowage …`: the same binary installed as `kubectl-stowage` (or run as `stowage …`).
//! `push DIR --name NAME` (resumable pieces, with a progress bar), `pull NAME DIR` (Range pieces, resumed, digest-checked), `ls NAME` (file listing), `diff NAME
//! REV1 REV2` (file-level differences between two stored revisions). Connection flags are
//! kubectl's: `--kubeconfig`, `--context`, `-n/--namespace`.

mod diff;

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::client::{ContentClient, FetchOptions, Fetched};

/// kubectl's connection flags.
#[derive(Clone, Debug, clap::Args)]
pub struct KubeFlags {
    /// Path to the kubeconfig file (default: $KUBECONFIG, then ~/.kube/config).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use.
    #[arg(long)]
    pub context: Option<String>,
    /// Namespace (default: the context's namespace, then "default").
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
}

#[derive(Clone, Debug, clap::Subcommand)]
pub enum PluginCommand {
    /// Upload DIR as Bundle NAME's content (created with an upload source if missing), in
    /// resumable pieces.
    Push {
        dir: PathBuf,
        /// The Bundle.
        #[arg(long)]
        name: String,
        /// Bytes per piece (each must finish well within the aggregator's 60 s).
        #[arg(long, default_value_t = 16 << 20)]
        piece_bytes: u64,
        #[command(flatten)]
        kube: KubeFlags,
    },
    /// Fetch a Bundle's content into DIR (replaced once verified).
    Pull {
        name: String,
        dir: PathBuf,
        /// Bytes per Range request.
        #[arg(long, default_value_t = FetchOptions::default().piece_bytes)]
        piece_bytes: u64,
        #[command(flatten)]
        kube: KubeFlags,
    },
    /// List the files of a Bundle's served content (or of one revision).
    Ls {
        name: String,
        /// A BundleContent name or digest prefix instead of the served content.
        #[arg(long)]
        revision: Option<String>,
        #[command(flatten)]
        kube: KubeFlags,
    },
    /// File-level differences between two revisions (BundleContent names or digest prefixes).
    Diff {
        name: String,
        from: String,
        to: String,
        #[command(flatten)]
        kube: KubeFlags,
    },
}

/// Runs one plugin command; prints to stdout. A reader that stops reading (`| head`) ends the
/// output quietly, as with other command-line tools.
pub async fn run(command: PluginCommand) -> anyhow::Result<()> {
    let flags = match &command {
        PluginCommand::Push { kube, .. }
        | PluginCommand::Pull { kube, .. }
        | PluginCommand::Ls { kube, .. }
        | PluginCommand::Diff { kube, .. } => kube,
    };
    let (client, namespace) = connect(flags).await?;
    let content = ContentClient::new(client.clone());
    match command {
        PluginCommand::Push { dir, name, piece_bytes, .. } => {
            let mut bar = progress_bar();
            let bundle = content.push(&namespace, &name, &dir, piece_bytes, &mut bar).await?;
            let _ = writeln!(std::io::stderr());
            let status = bundle.status.unwrap_or_default();
            let (digest, content) = (status.digest.unwrap_or_default(), status.content_name.unwrap_or_default());
            print_lines([format!("{namespace}/{name}: {digest} ({content})")])?;
        }
        PluginCommand::Pull { name, dir, piece_bytes, .. } => {
            let content = ContentClient::with_options(client, FetchOptions { piece_bytes, attempts: 5 });
            let line = match content.fetch_into(&namespace, &name, &dir, None).await? {
                Fetched::Updated { digest } => format!("{namespace}/{name}: {digest} -> {}", dir.display()),
                Fetched::Unchanged => format!("{namespace}/{name}: unchanged"),
            };
            print_lines([line])?;
        }
        PluginCommand::Ls { name, revision, .. } => {
            let revision = match revision {
                Some(r) => Some(diff::find_revision(&content, &namespace, &name, &r).await?),
                None => None,
            };
            let files = content.files(&namespace, &name, revision.as_deref()).await?;
            print_lines(files.into_iter().map(|f| {
                let link = f.target.map(|t| format!(" -> {t}")).unwrap_or_default();
                // A directory has no content to hash.
                let short: String = match f.kind.as_str() {
                    "directory" => "-".into(),
                    _ => f.sha256.chars().take(12).collect(),
                };
                format!("{:o} {:>12} {short} {}{link}", f.mode, f.size, f.path)
            }))?;
        }
        PluginCommand::Diff { name, from, to, .. } => {
            let from = diff::find_revision(&content, &namespace, &name, &from).await?;
            let to = diff::find_revision(&content, &namespace, &name, &to).await?;
            let before = content.files(&namespace, &name, Some(&from)).await?;
            let after = content.files(&namespace, &name, Some(&to)).await?;
            print_lines(diff::compare(&before, &after))?;
        }
    }
    Ok(())
}

/// Writes `lines` to stdout. A closed pipe ends the output without an error: the reader has all
/// it wanted (`println!` would panic).
pub fn print_lines(lines: impl IntoIterator<Item = String>) -> anyhow::Result<()> {
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let written = lines.into_iter().try_for_each(|line| writeln!(out, "{line}")).and_then(|()| out.flush());
    match written {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(anyhow::Error::new(e).context("writing the output"))
        }
        _ => Ok(()),
    }
}

/// `[#####     ]  42%  12.0/28.5 MiB` on stderr, redrawn in place.
fn progress_bar() -> impl FnMut(u64, u64) {
    |sent, total| {
        let share = if total == 0 { 1.0 } else { sent as f64 / total as f64 };
        let filled = (share * 30.0).round() as usize;
        // Progress is best effort: a closed stderr does not stop the upload.
        let _ = write!(
            std::io::stderr(),
            "\r[{}{}] {:3.0}%  {:.1}/{:.1} MiB",
            "#".repeat(filled),
            " ".repeat(30 - filled.min(30)),
            share * 100.0,
            sent as f64 / 1048576.0,
            total as f64 / 1048576.0
        );
    }
}

async fn connect(flags: &KubeFlags) -> anyhow::Result<(kube::Client, String)> {
    let options = KubeConfigOptions { context: flags.context.clone(), ..KubeConfigOptions::default() };
    let config = match &flags.kubeconfig {
        Some(path) => {
            let kubeconfig =
                Kubeconfig::read_from(path).with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &options).await?
        }
        None => kube::Config::from_kubeconfig(&options).await.context("loading the kubeconfig")?,
    };
    let namespace = flags.namespace.clone().unwrap_or_else(|| config.default_namespace.clone());
    Ok((kube::Client::try_from(config)?, namespace))
}
