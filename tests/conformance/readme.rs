//! The README as a test, the way doc tests keep docs honest: every ```` ```sh ```` block of
//! README.md runs, in order, in one bash session (`-e -o pipefail`) in a scratch directory, with
//! the binaries this build made first on `PATH` and the server on the README's address
//! (127.0.0.1:8443).
//!
//! Two lines are not run as pasted, because a user runs them differently from a script:
//! - `cargo install …`: the suite already built the binaries (installing would rebuild them);
//! - `stowage serve …`: a user leaves it running in a terminal of its own and presses Ctrl-C
//!   before starting it again; here it is started in the background, its ready line awaited, and
//!   the previous one stopped first.
//!
//! A block right after `<!-- readme-test: skip, REASON -->` is not run (it needs a cluster, the
//! internet or a container engine, or it is this suite); the reason must be given.

use std::path::Path;
use std::process::Command;

/// The README's server address.
const README_ADDRESS: &str = "127.0.0.1:8443";
const SKIP_MARKER: &str = "<!-- readme-test: skip, ";

/// One ```` ```sh ```` block: where it starts and, if it is not run, why.
#[derive(Debug)]
struct Block {
    line: usize,
    body: String,
    skip: Option<String>,
}

fn shell_blocks(readme: &str) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut lines = readme.lines().enumerate();
    let mut previous = "";
    while let Some((n, line)) = lines.next() {
        if line.trim_end() == "```sh" {
            let skip = previous
                .strip_prefix(SKIP_MARKER)
                .map(|rest| rest.trim_end().trim_end_matches("-->").trim().to_owned());
            let body: Vec<&str> = lines.by_ref().map(|(_, l)| l).take_while(|l| l.trim_end() != "```").collect();
            blocks.push(Block { line: n + 1, body: body.join("\n"), skip });
        } else if line.trim_start().starts_with("```") && line.trim() != "```" {
            // Another language's block: skip its body so a ``` inside does not confuse the scan.
            lines.by_ref().take_while(|(_, l)| l.trim_end() != "```").for_each(drop);
        }
        previous = line;
    }
    blocks
}

/// The block as the test runs it: `cargo install` and `stowage serve` lines rewritten (module doc).
fn as_script(block: &Block) -> String {
    let mut script = format!("echo '--- README.md line {}' >&2\n", block.line);
    for line in block.body.lines() {
        let command = line.split(" #").next().unwrap_or(line).trim();
        if command.starts_with("cargo install ") {
            script.push_str(&format!("echo 'already built: {command}' >&2\n"));
        } else if let Some(args) = command.strip_prefix("stowage serve") {
            script.push_str(&format!("readme_serve{args}\n"));
        } else {
            script.push_str(line);
            script.push('\n');
        }
    }
    script
}

/// Starts `stowage serve` in the background (stopping the previous one, as Ctrl-C would) and
/// waits for its ready line; every server is stopped when the script ends.
const PRELUDE: &str = r#"
readme_serve() {
  if [ -n "${SERVER_PID:-}" ]; then kill -INT "$SERVER_PID"; wait "$SERVER_PID" || true; fi
  : > serve.log
  stowage serve "$@" >> serve.log 2>&1 &
  SERVER_PID=$!
  for _ in $(seq 600); do
    grep -q 'stowage ready on' serve.log && return 0
    kill -0 "$SERVER_PID" 2>/dev/null || { echo 'stowage serve exited:' >&2; cat serve.log >&2; return 1; }
    sleep 0.1
  done
  echo 'stowage serve not ready after 60 s:' >&2; cat serve.log >&2; return 1
}
trap 'if [ -n "${SERVER_PID:-}" ]; then kill -INT "$SERVER_PID"; wait "$SERVER_PID"; fi' EXIT
"#;

/// A directory with this build's `stowage` and `kubectl-stowage`, as `cargo install` puts them on
/// PATH.
fn bin_dir(scratch: &Path) -> std::path::PathBuf {
    let bin = scratch.join(".bin");
    std::fs::create_dir_all(&bin).unwrap();
    for (name, built) in
        [("stowage", env!("CARGO_BIN_EXE_stowage")), ("kubectl-stowage", env!("CARGO_BIN_EXE_kubectl-stowage"))]
    {
        std::os::unix::fs::symlink(built, bin.join(name)).unwrap();
    }
    bin
}

#[test]
fn every_shell_block_of_the_readme_runs_as_pasted() {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let blocks = shell_blocks(&readme);
    for block in &blocks {
        if let Some(reason) = &block.skip {
            assert!(!reason.is_empty(), "README.md line {}: a skipped block must say why", block.line);
        }
    }
    let run: Vec<&Block> = blocks.iter().filter(|b| b.skip.is_none()).collect();
    // The README's main path: install and serve, kubectl, the HTTP API, another user.
    assert!(run.len() >= 6, "only {} shell blocks would run: {blocks:#?}", run.len());
    assert!(
        std::net::TcpListener::bind(README_ADDRESS).is_ok(),
        "{README_ADDRESS} is in use: the README's server cannot start there"
    );

    let scratch = tempfile::Builder::new().prefix("stowage-readme-").tempdir().unwrap();
    let bin = bin_dir(scratch.path());
    let mut script = String::from(PRELUDE);
    for block in &run {
        script.push_str(&as_script(block));
    }
    std::fs::write(scratch.path().join("readme.sh"), &script).unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let output = Command::new("bash")
        .args(["-e", "-o", "pipefail", "readme.sh"])
        .current_dir(scratch.path())
        .env("PATH", path)
        .env("HOME", scratch.path())
        .env_remove("KUBECONFIG")
        .env_remove("HTTPS_PROXY")
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    let failed_at = stderr.lines().rfind(|l| l.starts_with("--- README.md line")).unwrap_or("");
    assert!(
        output.status.success(),
        "the README's shell blocks failed ({}), in the block at {failed_at}\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        output.status
    );
    // What the blocks say a user sees.
    for expected in [
        "bundle.content.stowage.dev/my-chart created",
        "condition met",
        "Chart.yaml",
        "rolled back to my-chart-",
        "alice",
    ] {
        assert!(stdout.contains(expected), "README run printed no {expected:?}:\n{stdout}\n--- stderr\n{stderr}");
    }
}

#[test]
fn the_readme_scan_finds_blocks_and_skip_reasons() {
    let readme = "intro\n```sh\necho one\n```\n<!-- readme-test: skip, needs a cluster -->\n```sh\nkubectl apply -k x\n```\n```yaml\n```sh\n```\n";
    let blocks = shell_blocks(readme);
    assert_eq!(blocks.len(), 2, "{blocks:#?}");
    assert_eq!((blocks[0].line, blocks[0].body.as_str(), blocks[0].skip.as_deref()), (2, "echo one", None));
    assert_eq!(blocks[1].skip.as_deref(), Some("needs a cluster"));
    let served = as_script(&Block {
        line: 1,
        body: "cargo install --locked --path .\nstowage serve --x y  # c".into(),
        skip: None,
    });
    assert!(served.contains("readme_serve --x y\n") && !served.contains("\ncargo install"), "{served}");
}
