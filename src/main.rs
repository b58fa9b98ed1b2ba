//! The `stowage` command line.

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "stowage", version, about = "Bundle content served through the Kubernetes API")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the API server (standalone: creates its data dir, certificates and an admin kubeconfig).
    Serve(stowage::serve::ServeOptions),
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        // Colour only on a terminal: `kubectl logs` and files get plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("stowage: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = match cli.command {
        Command::Serve(options) => runtime.block_on(stowage::serve::run(options)),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("stowage: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
