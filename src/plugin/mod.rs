//! `kubectl stowage …`: the `kubectl-stowage` binary (src/bin), also `stowage push|pull|ls|diff`.
//! `push NAME DIR|FILE` (resumable pieces, resumed across runs), `pull NAME DIR` (Range pieces,
//! resumed, digest-checked; `--revision REV`, `--path SUBTREE`: `client/subtree.rs`), `ls NAME`
//! (file listing), `diff NAME REV1 REV2` (file-level differences between two stored revisions),
//! `cat NAME PATH` (one file, verified), `status`, `refresh`, `suspend`, `resume`, `rollback`
//! (`control.rs`), `completion SHELL` and the `kubectl_complete-stowage` answers
//! (`completion.rs`), `version`. Connection flags are kubectl's, before or after the subcommand
//! (`connection.rs`); errors are printed as kubectl prints them.

pub mod completion;
mod connection;
mod control;
mod diff;
mod output;
mod progress;
mod push;
mod resume;

use std::path::PathBuf;
use std::process::ExitCode;

use crate::client::{ClientError, ContentClient, FetchOptions, Fetched};
pub use connection::KubeFlags;
use connection::{connect, Connection};
pub use output::print_lines;
use output::Hinted;

/// `kubectl stowage`, as the `kubectl-stowage` binary parses it.
#[derive(Debug, clap::Parser)]
#[command(
    name = "kubectl-stowage",
    bin_name = "kubectl stowage",
    version,
    about = "Push, pull and list Bundle content through the Kubernetes API (stowage's kubectl plugin)"
)]
pub struct PluginCli {
    /// kubectl's flags may come before the subcommand too (`kubectl stowage -n NS ls NAME`).
    #[command(flatten)]
    pub kube: KubeFlags,
    #[command(subcommand)]
    pub command: PluginCommand,
}

#[derive(Clone, Debug, clap::Subcommand)]
pub enum PluginCommand {
    /// Upload DIR or a tar FILE (compressed with zstd as it is sent), or a tar.gz or tar.zst FILE
    /// (as it is), as Bundle NAME's content, in pieces; an interrupted push resumes when run again.
    Push {
        /// The Bundle (it must take uploads: `spec.sources: [{upload: {}}]`, or use --create).
        name: String,
        /// A directory, or an archive file.
        #[arg(value_name = "DIR|FILE")]
        path: PathBuf,
        /// Create the Bundle with an upload source if it does not exist.
        #[arg(long)]
        create: bool,
        /// With --create: the Bundle's spec.format (plain, registry-v1, helm).
        #[arg(long, requires = "create", value_parser = parse_format)]
        format: Option<crate::api::Format>,
        /// With --create: content without files is intended (spec.allowEmpty).
        #[arg(long, requires = "create")]
        allow_empty: bool,
        /// With --create: a label of the Bundle, KEY=VALUE (repeat for several).
        #[arg(long = "label", short = 'l', requires = "create", value_parser = push::parse_label)]
        labels: Vec<(String, String)>,
        /// Bytes per piece (each must finish well within the aggregator's 60 s).
        #[arg(long, default_value_t = 16 << 20)]
        piece_bytes: u64,
        #[command(flatten)]
        kube: KubeFlags,
    },
    /// Fetch a Bundle's content into DIR, once verified: DIR must be missing, empty, or an earlier
    /// pull of this Bundle left unchanged.
    Pull {
        name: String,
        dir: PathBuf,
        /// Bytes per Range request.
        #[arg(long, default_value_t = FetchOptions::default().piece_bytes)]
        piece_bytes: u64,
        /// Replace DIR whatever it holds (its files are deleted), not only an earlier pull's output.
        #[arg(long)]
        force: bool,
        /// A BundleContent name or digest prefix instead of the served content.
        #[arg(long)]
        revision: Option<String>,
        /// Only this directory of the content, its own path left out (DIR/x for SUBTREE/x); each
        /// file is checked against the listing's sha256.
        #[arg(long = "path", value_name = "SUBTREE")]
        subtree: Option<String>,
        #[command(flatten)]
        kube: KubeFlags,
    },
    /// List the files of a Bundle's served content (or of one revision).
    Ls {
        name: String,
        /// A BundleContent name or digest prefix instead of the served content.
        #[arg(long)]
        revision: Option<String>,
        /// Output format: json (the listing object) or name (one path per line).
        #[arg(short = 'o', long, value_enum)]
        output: Option<output::Format>,
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
    /// Write one file of a Bundle's served content (or of --revision) to stdout, verified.
    Cat {
        name: String,
        path: String,
        /// A BundleContent name or digest prefix instead of the served content.
        #[arg(long)]
        revision: Option<String>,
        #[command(flatten)]
        kube: KubeFlags,
    },
    /// What a Bundle serves and how its work stands: phase, conditions, pins, next poll.
    Status {
        name: String,
        /// Output format: json or yaml (the Bundle's status object).
        #[arg(short = 'o', long, value_enum)]
        output: Option<control::StatusFormat>,
        #[command(flatten)]
        kube: KubeFlags,
    },
    /// Resolve a Bundle's sources again now (sets the content.stowage.dev/refresh annotation).
    Refresh {
        name: String,
        #[command(flatten)]
        kube: KubeFlags,
    },
    /// Serve an earlier revision: REV (a BundleContent name or digest prefix), by default the one
    /// stored before the revision served now. Sets spec.revision: new content is still fetched
    /// and stored, but not served until `rollback NAME --latest`.
    Rollback {
        name: String,
        #[arg(conflicts_with = "latest")]
        revision: Option<String>,
        /// Serve the newest content again (clears spec.revision).
        #[arg(long)]
        latest: bool,
        #[command(flatten)]
        kube: KubeFlags,
    },
    /// Stop fetching a Bundle's sources (spec.paused); what it serves stays served.
    Suspend {
        name: String,
        #[command(flatten)]
        kube: KubeFlags,
    },
    /// Fetch a suspended Bundle's sources again.
    Resume {
        name: String,
        #[command(flatten)]
        kube: KubeFlags,
    },
    /// Print the plugin's version.
    Version,
    /// Print a shell completion script (bash, zsh, fish)
    Completion { shell: clap_complete::Shell },
}

/// The whole `kubectl-stowage` program: parses the arguments, runs the command, prints a failure
/// the way kubectl does (`Error from server (Reason): message` or `error: …`), once; exit code 1.
pub fn main() -> ExitCode {
    use clap::Parser;
    match PluginCli::try_parse() {
        Ok(cli) => execute(cli.command.with_outer_flags(&cli.kube)),
        Err(e) => {
            // Help and --version go to stdout with success; usage errors exit 1 like kubectl's.
            let _ = e.print();
            match e.use_stderr() {
                true => ExitCode::FAILURE,
                false => ExitCode::SUCCESS,
            }
        }
    }
}

/// `--format`: one of the formats' names.
fn parse_format(text: &str) -> Result<crate::api::Format, String> {
    serde_json::from_value(serde_json::Value::from(text))
        .map_err(|_| format!("{text:?} is not a format ({})", crate::api::FORMATS.join(", ")))
}

impl PluginCommand {
    /// The command with kubectl's flags given before it filled in where it has none of its own.
    pub fn with_outer_flags(mut self, outer: &KubeFlags) -> PluginCommand {
        if let Some(kube) = self.kube_flags_mut() {
            *kube = std::mem::take(kube).over(outer);
        }
        self
    }

    /// Its connection flags (`version` and `completion` have none).
    fn kube_flags_mut(&mut self) -> Option<&mut KubeFlags> {
        match self {
            PluginCommand::Version | PluginCommand::Completion { .. } => None,
            PluginCommand::Push { kube, .. }
            | PluginCommand::Pull { kube, .. }
            | PluginCommand::Ls { kube, .. }
            | PluginCommand::Diff { kube, .. }
            | PluginCommand::Cat { kube, .. }
            | PluginCommand::Status { kube, .. }
            | PluginCommand::Refresh { kube, .. }
            | PluginCommand::Rollback { kube, .. }
            | PluginCommand::Suspend { kube, .. }
            | PluginCommand::Resume { kube, .. } => Some(kube),
        }
    }
}

/// Runs one plugin command as a program: its own runtime, output and exit code.
pub fn execute(command: PluginCommand) -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "off".into()))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init()
        .ok();
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let result = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime.block_on(run(command)),
        Err(e) => Err(anyhow::Error::new(e).context("cannot start the runtime")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            output::print_error(&e);
            ExitCode::FAILURE
        }
    }
}

/// Runs one plugin command; prints to stdout. A reader that stops reading (`| head`) ends the
/// output quietly, as with other command-line tools.
pub async fn run(mut command: PluginCommand) -> anyhow::Result<()> {
    let Some(flags) = command.kube_flags_mut().map(|flags| flags.clone()) else {
        return match command {
            PluginCommand::Completion { shell } => completion::print_script(shell),
            _ => print_lines([format!("kubectl-stowage {}", env!("CARGO_PKG_VERSION"))]),
        };
    };
    if let PluginCommand::Push { path, .. } = &command {
        // Before the kubeconfig is even read: a mistyped path touches nothing.
        push::check_path(path)?;
    }
    let connection = connect(&flags).await?;
    let (client, namespace) = (connection.client.clone(), connection.namespace.clone());
    let content = ContentClient::new(client.clone());
    match command {
        PluginCommand::Version | PluginCommand::Completion { .. } => {}
        PluginCommand::Push { name, path, create, format, allow_empty, labels, piece_bytes, .. } => {
            let creation = create.then_some(push::Creation { format, allow_empty, labels });
            let line = push::run(&content, &connection, &name, &path, creation.as_ref(), piece_bytes).await?;
            print_lines([line])?;
        }
        PluginCommand::Pull { name, dir, piece_bytes, force, revision, subtree, .. } => {
            let options = FetchOptions { piece_bytes, attempts: 5, replace: force };
            let content = ContentClient::with_options(client, options);
            let revision = diff::find_optional_revision(&content, &namespace, &name, revision.as_deref()).await?;
            let fetched = match &subtree {
                Some(subtree) => {
                    content.fetch_subtree_into(&namespace, &name, revision.as_deref(), subtree, &dir).await
                }
                None => {
                    let bar = progress::Bar::new(&format!("pulling {name}"), None);
                    let fetched = content
                        .fetch_revision_into(&namespace, &name, revision.as_deref(), &dir, None, &mut |moved| {
                            bar.update(moved)
                        })
                        .await;
                    bar.finish(fetched.is_ok());
                    fetched
                }
            };
            let fetched = fetched.map_err(|error| match error {
                ClientError::TargetInUse { .. } => {
                    let hint = "pull into a new or empty directory, or pass --force to replace it (what it holds is \
                                deleted)";
                    anyhow::Error::new(Hinted { error, hint: hint.into() })
                }
                other => other.into(),
            });
            let what = match (&revision, &subtree) {
                (Some(revision), Some(subtree)) => format!("{namespace}/{name} ({revision}) {subtree}"),
                (Some(revision), None) => format!("{namespace}/{name} ({revision})"),
                (None, Some(subtree)) => format!("{namespace}/{name} {subtree}"),
                (None, None) => format!("{namespace}/{name}"),
            };
            let line = match fetched? {
                Fetched::Updated { digest } => format!("{what}: {digest} -> {}", dir.display()),
                Fetched::Unchanged => format!("{what}: unchanged"),
            };
            print_lines([line])?;
        }
        PluginCommand::Ls { name, revision, output, .. } => {
            let revision = diff::find_optional_revision(&content, &namespace, &name, revision.as_deref()).await?;
            let list = content.file_list(&namespace, &name, revision.as_deref()).await?;
            output::print_listing(&list, output)?;
        }
        PluginCommand::Diff { name, from, to, .. } => {
            let from = diff::find_revision(&content, &namespace, &name, &from).await?;
            let to = diff::find_revision(&content, &namespace, &name, &to).await?;
            let before = content.files(&namespace, &name, Some(&from)).await?;
            let after = content.files(&namespace, &name, Some(&to)).await?;
            print_lines(diff::compare(&before, &after))?;
        }
        PluginCommand::Cat { name, path, revision, .. } => {
            let revision = diff::find_optional_revision(&content, &namespace, &name, revision.as_deref()).await?;
            let mut out = std::io::BufWriter::new(std::io::stdout());
            match content.read_file(&namespace, &name, revision.as_deref(), &path, &mut out).await {
                // `| head`: the reader has what it wanted.
                Err(ClientError::Io { source, .. }) if source.kind() == std::io::ErrorKind::BrokenPipe => {}
                other => {
                    other?;
                }
            }
            let _ = std::io::Write::flush(&mut out);
        }
        PluginCommand::Status { name, output, .. } => {
            print_lines(control::status(&client, &namespace, &name, output).await?)?;
        }
        PluginCommand::Refresh { name, .. } => {
            print_lines([control::switch(&client, &namespace, &name, control::Switch::Refresh).await?])?;
        }
        PluginCommand::Rollback { name, revision, latest, .. } => {
            let to = match latest {
                true => control::Target::Latest,
                false => match revision {
                    Some(wanted) => {
                        control::Target::Revision(diff::find_revision(&content, &namespace, &name, &wanted).await?)
                    }
                    None => control::Target::Previous,
                },
            };
            print_lines([control::rollback(&content, &client, &namespace, &name, to).await?])?;
        }
        PluginCommand::Suspend { name, .. } => {
            print_lines([control::switch(&client, &namespace, &name, control::Switch::Suspend).await?])?;
        }
        PluginCommand::Resume { name, .. } => {
            print_lines([control::switch(&client, &namespace, &name, control::Switch::Resume).await?])?;
        }
    }
    Ok(())
}
