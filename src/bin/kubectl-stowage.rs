//! `kubectl-stowage`: stowage's kubectl plugin (`kubectl stowage push|pull|ls|diff|version`), the
//! client commands only; `cargo install --path .` puts it on PATH beside `stowage`.

fn main() -> std::process::ExitCode {
    stowage::plugin::main()
}
