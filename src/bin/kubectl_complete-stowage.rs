//! `kubectl_complete-stowage`: what kubectl (1.26+) runs, found on PATH by this name, to complete
//! `kubectl stowage …<TAB>`; `cargo install --path .` puts it beside `kubectl-stowage`.

fn main() -> std::process::ExitCode {
    stowage::plugin::completion::main()
}
