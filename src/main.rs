//! The `stowage` command line.

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(version, about = "Bundle content served through the Kubernetes API")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the API server (standalone: creates its data dir, certificates and an admin kubeconfig).
    Serve(Box<stowage::serve::ServeOptions>),
    /// Create (or keep, while valid) the CA and serving certificate of an in-cluster deployment,
    /// with the Secret and APIService caBundle manifests `deploy/apiservice` reads.
    Certs(stowage::certs::CertsOptions),
    /// Client commands, the same as `kubectl stowage …` (the `kubectl-stowage` binary).
    #[command(flatten)]
    Plugin(Box<stowage::plugin::PluginCommand>),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let command = match cli.command {
        // Its own runtime, quiet logs and kubectl's way of printing errors.
        Command::Plugin(command) => return stowage::plugin::execute(*command),
        other => other,
    };
    limit_malloc_arenas();
    // `serve` has --log-format and -v; `certs` logs as `serve` does by default.
    let log = match &command {
        Command::Serve(options) => options.log.clone(),
        _ => stowage::serve::logging::LogOptions::default(),
    };
    stowage::serve::logging::init(&log);
    // One TLS provider for every client and server in the process (kube, reqwest, the listener).
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("stowage: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = match command {
        Command::Serve(options) => runtime.block_on(stowage::serve::run(*options)),
        Command::Certs(options) => certs(&options),
        Command::Plugin(_) => Ok(()), // ran above
    };
    // Blocking work of connections the shutdown abandoned (an upload's commit, a read waiting on
    // etcd) gets a few seconds more, then the process exits as a kill would leave it, which the
    // store is built to survive; dropping the runtime would wait for it without end.
    runtime.shutdown_timeout(std::time::Duration::from_secs(5));
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("stowage: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn certs(options: &stowage::certs::CertsOptions) -> anyhow::Result<()> {
    use stowage::certs::CaOutcome;
    let summary = stowage::certs::run(options)?;
    let dir = summary.out.display();
    let ca = match summary.ca {
        CaOutcome::Kept => "kept the existing CA",
        CaOutcome::Created => "created a new CA",
        CaOutcome::Rotated => "rotated the CA (the previous one stays in the caBundle: ca-previous.crt)",
    };
    let serving = match summary.serving_issued {
        true => "issued a serving certificate for",
        false => "kept the serving certificate for",
    };
    // Through print_lines: `stowage certs | head -1` must not panic on the closed pipe.
    stowage::plugin::print_lines([
        format!("{dir}: {ca}"),
        format!("{dir}: {serving} {}", summary.dns_names.join(", ")),
        format!(
            "{dir}: wrote secret.yaml (Secret {}), kustomization.yaml, registration/apiservice-cabundle.yaml ({} CA \
             certificate(s)), registration/kustomization.yaml",
            stowage::certs::SECRET_NAME,
            summary.ca_bundle_certs
        ),
    ])
}

/// glibc gives every thread that allocates its own arena and keeps each arena's high-water mark:
/// lists and uploads run on the blocking pool's many threads, so memory freed after a burst of
/// large lists was never returned (234 MiB retained vs 45 MiB with two arenas). Two arenas per
/// core: with two in all, creates spent a fifth of their time waiting on the arena locks (both in
/// the benchmarks journal, `git show 15314ef:docs/benchmarks.md`). `MALLOC_ARENA_MAX` still overrides.
fn limit_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
        let arenas = i32::try_from(cores.saturating_mul(2)).unwrap_or(i32::MAX).max(2);
        // SAFETY: mallopt only sets an allocator tunable; called first thing in main, before any
        // other thread exists.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, arenas);
        }
    }
}
