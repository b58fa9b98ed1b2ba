//! Shell completion of the plugin, driven as shells drive it: `kubectl __complete stowage …` (what
//! kubectl's own completion scripts run for `kubectl stowage <TAB>`), which runs
//! `kubectl_complete-stowage` found on PATH beside `kubectl-stowage`; that executable on its own
//! without a server; and the scripts of `completion bash|zsh|fish` in those shells (a missing shell
//! is a failure: scripts/test.sh installs them).

use std::path::Path;
use std::process::{Command, Output};

use crate::harness::*;

const NS: &str = "completion";
const OTHER_NS: &str = "completion-other";

/// A PATH with this build's `kubectl-stowage` and `kubectl_complete-stowage` first, as
/// `cargo install` puts them side by side.
struct BinDir {
    _dir: tempfile::TempDir,
    path: String,
}

impl BinDir {
    fn new() -> BinDir {
        let dir = tempfile::tempdir().unwrap();
        for (name, built) in [
            ("kubectl-stowage", env!("CARGO_BIN_EXE_kubectl-stowage")),
            ("kubectl_complete-stowage", env!("CARGO_BIN_EXE_kubectl_complete-stowage")),
        ] {
            std::os::unix::fs::symlink(built, dir.path().join(name)).unwrap();
        }
        let path = format!("{}:{}", dir.path().display(), std::env::var("PATH").unwrap_or_default());
        BinDir { _dir: dir, path }
    }

    /// `program ARGS` with this PATH and `KUBECONFIG` (unset when None).
    fn run(&self, program: &str, args: &[&str], kubeconfig: Option<&Path>) -> Output {
        let mut command = Command::new(program);
        command.args(args).env("PATH", &self.path).env_remove("KUBECONFIG");
        if let Some(kubeconfig) = kubeconfig {
            command.env("KUBECONFIG", kubeconfig);
        }
        command.output().unwrap_or_else(|e| panic!("run {program} (a missing one is a failure): {e}"))
    }
}

/// A completion answer: `candidate[\tdescription]` lines, then `:DIRECTIVE`.
#[derive(Debug)]
struct Answer {
    lines: Vec<String>,
    directive: u32,
}

impl Answer {
    fn parse(output: &Output, what: &str) -> Answer {
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "{what}: {output:?}");
        let mut lines: Vec<String> = stdout.lines().map(str::to_owned).collect();
        let last = lines.pop().unwrap_or_default();
        let directive = last.strip_prefix(':').and_then(|d| d.parse().ok());
        let directive = directive.unwrap_or_else(|| panic!("{what}: no :DIRECTIVE line last: {stdout:?}"));
        Answer { lines, directive }
    }

    /// The candidates without their descriptions, sorted.
    fn names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.lines.iter().map(|l| l.split('\t').next().unwrap()).collect();
        names.sort();
        names
    }
}

/// `kubectl __complete stowage ARGS`: what kubectl's completion script asks for `kubectl stowage
/// ARGS<TAB>`, the last argument the word being completed.
fn kubectl_complete(bin: &BinDir, kubeconfig: Option<&Path>, args: &[&str]) -> Answer {
    let line: Vec<&str> = ["__complete", "stowage"].iter().chain(args).copied().collect();
    Answer::parse(&bin.run("kubectl", &line, kubeconfig), &format!("kubectl {line:?}"))
}

const NO_FILE_COMP: u32 = 4;
const FILTER_DIRS: u32 = 16;

/// Through kubectl: subcommands with their descriptions, the subcommand's flags, Bundle names of
/// the namespace the line's flags name (before or after the subcommand, from `KUBECONFIG` or
/// `--kubeconfig`), namespaces, and directories for `pull`'s DIR.
#[tokio::test(flavor = "multi_thread")]
async fn kubectl_completes_subcommands_flags_and_bundle_names() {
    let server = Server::start_temp(&[]);
    for name in ["alpha", "alpine", "beta"] {
        server.create_bundle(NS, name).await;
    }
    server.create_bundle(OTHER_NS, "gamma").await;
    let bin = BinDir::new();
    let kubeconfig = server.kubeconfig();
    let config = Some(kubeconfig.as_path());

    let subcommands = kubectl_complete(&bin, config, &[""]);
    for expected in ["push", "pull", "ls", "diff", "cat", "status", "refresh", "suspend", "resume", "completion"] {
        assert!(subcommands.names().contains(&expected), "{expected}: {subcommands:?}");
    }
    assert!(subcommands.lines.iter().any(|l| l.starts_with("pull\tFetch a Bundle's content")), "{subcommands:?}");
    assert_eq!(subcommands.directive, NO_FILE_COMP);
    assert_eq!(kubectl_complete(&bin, config, &["pu"]).names(), ["pull", "push"]);

    let flags = kubectl_complete(&bin, config, &["pull", "--f"]);
    assert_eq!(flags.names(), ["--force"], "{flags:?}");
    assert_eq!(kubectl_complete(&bin, config, &["ls", "x", "-o", ""]).names(), ["json", "name"]);

    // Every command whose first argument is a Bundle: names from the line's namespace, filtered.
    for sub in ["push", "pull", "ls", "diff", "cat", "status", "refresh", "suspend", "resume"] {
        let names = kubectl_complete(&bin, config, &[sub, "-n", NS, "al"]);
        assert_eq!((names.names(), names.directive), (vec!["alpha", "alpine"], NO_FILE_COMP), "{sub}");
    }
    assert_eq!(kubectl_complete(&bin, config, &["-n", OTHER_NS, "ls", ""]).names(), ["gamma"]);
    assert_eq!(kubectl_complete(&bin, config, &["ls", "--namespace", NS, ""]).names(), ["alpha", "alpine", "beta"]);
    let on_the_line = ["status", "--kubeconfig", kubeconfig.to_str().unwrap(), "-n", NS, "b"];
    assert_eq!(kubectl_complete(&bin, None, &on_the_line).names(), ["beta"]);
    // The admin kubeconfig's own namespace holds none.
    assert_eq!(kubectl_complete(&bin, config, &["ls", ""]).names(), Vec::<&str>::new());

    let namespaces = kubectl_complete(&bin, config, &["ls", "-n", "completion"]);
    assert_eq!(namespaces.names(), [NS, OTHER_NS], "{namespaces:?}");
    let inline = kubectl_complete(&bin, config, &["ls", "--namespace=completion-o"]);
    assert_eq!(inline.names(), ["--namespace=completion-other"]);

    let dir = kubectl_complete(&bin, config, &["pull", "-n", NS, "alpha", ""]);
    assert_eq!((dir.names(), dir.directive), (vec![], FILTER_DIRS));
}

/// The executable alone, as kubectl runs it (the words, the last one being completed): the same
/// answers; and with no server to ask, no names, nothing on stderr, success, still a directive.
#[test]
fn the_completion_executable_answers_quietly_without_a_server() {
    let bin = BinDir::new();
    let scratch = tempfile::tempdir().unwrap();
    let unreachable = scratch.path().join("unreachable.kubeconfig");
    std::fs::write(
        &unreachable,
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: \"https://127.0.0.1:1\"}}]\n\
         users: [{name: u, user: {token: t}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\n\
         current-context: x\n",
    )
    .unwrap();
    let missing = scratch.path().join("missing.kubeconfig");
    let direct = |args: &[&str], kubeconfig: &Path| {
        let output = bin.run("kubectl_complete-stowage", args, Some(kubeconfig));
        assert_eq!(String::from_utf8_lossy(&output.stderr), "", "{args:?}: nothing for the terminal");
        Answer::parse(&output, &format!("kubectl_complete-stowage {args:?}"))
    };
    for kubeconfig in [&unreachable, &missing] {
        for args in [&["ls", ""][..], &["-n", "x", "pull", "a"], &["ls", "-n", ""]] {
            let answer = direct(args, kubeconfig);
            assert_eq!((answer.lines.len(), answer.directive), (0, NO_FILE_COMP), "{args:?}: {answer:?}");
        }
    }
    let contexts = direct(&["--context", ""], &unreachable);
    assert_eq!(contexts.names(), ["x"]);
    assert!(direct(&[""], &missing).names().contains(&"completion"));
    assert_eq!(direct(&["pull", "--f"], &missing).names(), ["--force"]);
    assert_eq!(direct(&["pull", "a", ""], &missing).directive, FILTER_DIRS);
}

/// `completion bash|zsh|fish`: scripts each shell takes, registered for `kubectl-stowage`; bash's
/// and fish's completing subcommands and a subcommand's flags.
#[test]
fn completion_scripts_complete_in_their_shells() {
    let bin = BinDir::new();
    let bash = r#"
        source <(kubectl stowage completion bash)
        complete -p kubectl-stowage
        complete_line() {
            COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1))
            "$(complete -p kubectl-stowage | sed 's/.* -F \([^ ]*\) .*/\1/')" kubectl-stowage "${!#}" "${COMP_WORDS[COMP_CWORD-1]}"
            echo "${COMPREPLY[*]}"
        }
        complete_line kubectl-stowage pu
        complete_line kubectl-stowage pull --f
    "#;
    let output = bin.run("bash", &["-e", "-c", bash], None);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{output:?}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(lines.first().is_some_and(|l| l.starts_with("complete ") && l.ends_with(" kubectl-stowage")), "{stdout}");
    assert_eq!(lines.get(1..), Some(&["push pull", "--force"][..]), "{stdout}");

    let fish = "kubectl-stowage completion fish | source; complete -C 'kubectl-stowage pu'; \
                complete -C 'kubectl-stowage pull --f'";
    let output = bin.run("fish", &["-c", fish], None);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{output:?}");
    let names: Vec<&str> = stdout.lines().map(|l| l.split('\t').next().unwrap()).collect();
    assert_eq!(names, ["pull", "push", "--force"], "{stdout}");

    // zsh completes only on a terminal: the script loads and registers its function.
    let zsh = "autoload -Uz compinit && compinit -u -D && source <(kubectl-stowage completion zsh) && \
               print -r -- ${_comps[kubectl-stowage]} && whence -w _kubectl-stowage";
    let output = bin.run("zsh", &["-f", "-c", zsh], None);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{output:?}");
    assert_eq!(stdout, "_kubectl-stowage\n_kubectl-stowage: function\n");
}
