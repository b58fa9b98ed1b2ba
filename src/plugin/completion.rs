//! Shell completion: `completion bash|zsh|fish` (clap_complete's script for `kubectl-stowage` run on
//! its own) and the `kubectl_complete-stowage` executable kubectl 1.26+ runs for `kubectl stowage
//! …<TAB>`. kubectl passes it the words typed after `stowage`, the last one the word being completed
//! (empty for a new word), and reads cobra's `__complete` answer: one candidate a line
//! (`candidate<TAB>description`), then `:DIRECTIVE`. Subcommands, flags and value choices come from
//! `PluginCli`'s clap Command, so they never drift from it; Bundle names, namespaces and kubeconfig
//! names from the server and kubeconfig the line's kubectl flags name. Failures print no candidates:
//! a shell shows whatever reaches it, so nothing but the answer is printed and the exit code is 0.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Arg, ArgAction, Command, CommandFactory, ValueHint};

use super::{KubeFlags, PluginCli};

/// cobra's ShellCompDirective bits kubectl passes on to the shell.
mod directive {
    /// The shell completes file names if there are no candidates.
    pub const DEFAULT: u32 = 0;
    /// No file names: the candidates are all there is.
    pub const NO_FILE_COMP: u32 = 4;
    /// The shell completes directory names.
    pub const FILTER_DIRS: u32 = 16;
}

/// What completion asks of the server when the line's flags set none: a shell waits for it.
const REQUEST_TIMEOUT: &str = "5s";
/// The whole server round (kubeconfig, connection, list), whatever the flags say.
const SERVER_DEADLINE: Duration = Duration::from_secs(10);

/// The name bash's script is made for: clap_complete's bash script spells a name with a `-` two
/// ways and then completes no subcommand's flags (clap-rs/clap#6421), so it is made for one
/// without and registered for `kubectl-stowage`.
const BASH_NAME: &str = "kubectl_stowage";

/// `completion SHELL`: the script for `kubectl-stowage` (kubectl's own completion covers `kubectl
/// stowage`, through `kubectl_complete-stowage`).
pub fn print_script(shell: clap_complete::Shell) -> anyhow::Result<()> {
    let mut command = PluginCli::command();
    let mut script = Vec::new();
    let script = match shell {
        clap_complete::Shell::Bash => {
            clap_complete::generate(shell, &mut command, BASH_NAME, &mut script);
            let text = String::from_utf8_lossy(&script);
            let lines = text.lines().map(|line| {
                let registration = line.trim_start().starts_with("complete ");
                match line.strip_suffix(&format!(" {BASH_NAME}")).filter(|_| registration) {
                    Some(rest) => format!("{rest} kubectl-stowage"),
                    None => line.to_owned(),
                }
            });
            lines.collect::<Vec<_>>().join("\n")
        }
        _ => {
            clap_complete::generate(shell, &mut command, "kubectl-stowage", &mut script);
            String::from_utf8_lossy(&script).trim_end().to_owned()
        }
    };
    super::print_lines([script])
}

/// The `kubectl_complete-stowage` program.
pub fn main() -> ExitCode {
    let mut args: Vec<String> = std::env::args_os().skip(1).map(|a| a.to_string_lossy().into_owned()).collect();
    // kubectl passes the words alone; a cobra program would be asked with `__complete` first.
    if args.first().is_some_and(|first| first == "__complete" || first == "__completeNoDesc") {
        args.remove(0);
    }
    let (current, words) = match args.split_last() {
        Some((current, words)) => (current.clone(), words),
        None => (String::new(), &[][..]),
    };
    let answer = answer(analyse(words, &current));
    let lines = answer
        .candidates
        .iter()
        .map(|(word, help)| match help {
            Some(help) => format!("{word}\t{help}"),
            None => word.clone(),
        })
        .chain([format!(":{}", answer.directive)]);
    // A closed pipe or a full disk: the shell gets nothing either way.
    let _ = super::print_lines(lines);
    ExitCode::SUCCESS
}

/// Candidates (with an optional description) and the directive that ends them.
#[derive(Debug)]
struct Answer {
    candidates: Vec<(String, Option<String>)>,
    directive: u32,
}

/// What the word being completed is, from the words before it.
#[derive(Debug)]
enum Want {
    /// Known without the server.
    Known(Answer),
    /// Names from the server or the kubeconfig, those starting with `partial`, each after `prefix`
    /// (`--namespace=` when the value is typed in the flag's word).
    Names { source: NameSource, prefix: String, partial: String, flags: Box<KubeFlags> },
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum NameSource {
    Bundles,
    Namespaces,
    Contexts,
    Clusters,
    Users,
}

/// Reads the words as clap would, leniently (an unknown flag is skipped, a missing argument is
/// what is being completed), to find what `current` is.
fn analyse(words: &[String], current: &str) -> Want {
    let mut root = PluginCli::command();
    // Materialises `--help` and the `help` subcommand, which completion offers too.
    root.build();
    let kube_ids = kube_ids();
    let mut command = &root;
    let mut kube_words = Vec::new();
    let mut used = Vec::new();
    let mut positionals = 0;
    let mut only_positionals = false;
    let mut pending: Option<&Arg> = None;
    let mut rest = words.iter();
    while let Some(word) = rest.next() {
        if only_positionals || word == "-" || !word.starts_with('-') {
            match command.find_subcommand(word).filter(|_| !only_positionals && positionals == 0) {
                Some(sub) => command = sub,
                None => positionals += 1,
            }
            continue;
        }
        if word == "--" {
            only_positionals = true;
            continue;
        }
        let Some((arg, inline)) = find_flag(command, word) else { continue };
        used.push(arg.get_id().clone());
        let value = match (takes_value(arg), inline) {
            (false, _) => None,
            (true, Some(value)) => Some(value),
            (true, None) => match rest.next() {
                Some(value) => Some(value.clone()),
                None => {
                    pending = Some(arg);
                    None
                }
            },
        };
        if kube_ids.iter().any(|id| id == arg.get_id().as_str()) {
            if let Some(long) = arg.get_long() {
                kube_words.push(match value {
                    Some(value) => format!("--{long}={value}"),
                    None if pending.is_none() => format!("--{long}"),
                    None => continue,
                });
            }
        }
    }
    let flags = Box::new(kube_flags(&kube_words));
    if let Some(arg) = pending {
        return value_of(arg, "", current, flags);
    }
    if !only_positionals && current.starts_with('-') {
        if let Some((flag, value)) = current.split_once('=') {
            return match find_flag(command, flag) {
                Some((arg, _)) if current.starts_with("--") => value_of(arg, &format!("{flag}="), value, flags),
                _ => Want::Known(Answer { candidates: Vec::new(), directive: directive::NO_FILE_COMP }),
            };
        }
        return Want::Known(flag_names(command, current, &used));
    }
    if !only_positionals && positionals == 0 && command.has_subcommands() {
        let candidates = command
            .get_subcommands()
            .filter(|sub| !sub.is_hide_set() && sub.get_name().starts_with(current))
            .map(|sub| (sub.get_name().to_owned(), sub.get_about().map(one_line)))
            .collect();
        return Want::Known(Answer { candidates, directive: directive::NO_FILE_COMP });
    }
    let positional = command.get_positionals().nth(positionals);
    match positional {
        // The first positional of push, pull, ls, … is the Bundle's name.
        Some(arg) if arg.get_id() == "name" => {
            Want::Names { source: NameSource::Bundles, prefix: String::new(), partial: current.to_owned(), flags }
        }
        Some(arg) => value_of(arg, "", current, flags),
        None => Want::Known(Answer { candidates: Vec::new(), directive: directive::NO_FILE_COMP }),
    }
}

/// The ids of kubectl's connection flags (`KubeFlags`), as they appear in every command.
fn kube_ids() -> Vec<String> {
    use clap::Args as _;
    KubeFlags::augment_args(Command::new("kube")).get_arguments().map(|arg| arg.get_id().to_string()).collect()
}

/// The connection flags typed on the line, parsed by `KubeFlags`' own clap definition; the last of
/// a repeated flag wins, as a flag after the subcommand wins over one before it.
fn kube_flags(words: &[String]) -> KubeFlags {
    use clap::{Args as _, FromArgMatches as _};
    let command = KubeFlags::augment_args(Command::new("kube").no_binary_name(true).args_override_self(true));
    command
        .try_get_matches_from(words)
        .ok()
        .and_then(|matches| KubeFlags::from_arg_matches(&matches).ok())
        .unwrap_or_default()
}

/// The flag `word` names (`--long`, `--long=VALUE`, `-s`, `-sVALUE`, a cluster `-ab`: its last
/// flag), with the value given in the same word.
fn find_flag<'a>(command: &'a Command, word: &str) -> Option<(&'a Arg, Option<String>)> {
    if let Some(long) = word.strip_prefix("--") {
        let (name, value) = match long.split_once('=') {
            Some((name, value)) => (name, Some(value.to_owned())),
            None => (long, None),
        };
        let arg = command.get_arguments().find(|arg| {
            arg.get_long() == Some(name) || arg.get_all_aliases().is_some_and(|aliases| aliases.contains(&name))
        })?;
        return Some((arg, value));
    }
    let shorts = word.strip_prefix('-')?;
    let mut found = None;
    for (at, short) in shorts.char_indices() {
        let arg = command.get_arguments().find(|arg| arg.get_short() == Some(short))?;
        if takes_value(arg) {
            let value = shorts.get(at + short.len_utf8()..).unwrap_or_default();
            let value = value.strip_prefix('=').unwrap_or(value);
            return Some((arg, (!value.is_empty()).then(|| value.to_owned())));
        }
        found = Some((arg, None));
    }
    found
}

fn takes_value(arg: &Arg) -> bool {
    arg.get_action().takes_values()
}

/// The flags of `command` starting with `current` (`-` alone: short ones too), but those given
/// already unless they may be repeated.
fn flag_names(command: &Command, current: &str, used: &[clap::Id]) -> Answer {
    let mut candidates = Vec::new();
    for arg in command.get_arguments().filter(|arg| !arg.is_positional() && !arg.is_hide_set()) {
        let repeatable = matches!(arg.get_action(), ArgAction::Append | ArgAction::Count);
        if !repeatable && used.contains(arg.get_id()) {
            continue;
        }
        let help = arg.get_help().map(one_line);
        let longs = arg.get_long_and_visible_aliases().unwrap_or_default().into_iter().map(|long| format!("--{long}"));
        let shorts = match current == "-" {
            true => arg.get_short_and_visible_aliases().unwrap_or_default(),
            false => Vec::new(),
        };
        for name in longs.chain(shorts.into_iter().map(|short| format!("-{short}"))) {
            if name.starts_with(current) {
                candidates.push((name, help.clone()));
            }
        }
    }
    Answer { candidates, directive: directive::NO_FILE_COMP }
}

/// The value of `arg`, typed so far as `partial`.
fn value_of(arg: &Arg, prefix: &str, partial: &str, flags: Box<KubeFlags>) -> Want {
    let source = match arg.get_id().as_str() {
        "namespace" => Some(NameSource::Namespaces),
        "context" => Some(NameSource::Contexts),
        "cluster" => Some(NameSource::Clusters),
        "user" => Some(NameSource::Users),
        _ => None,
    };
    if let Some(source) = source {
        return Want::Names { source, prefix: prefix.to_owned(), partial: partial.to_owned(), flags };
    }
    let choices: Vec<_> = arg.get_possible_values().into_iter().filter(|value| !value.is_hide_set()).collect();
    if !choices.is_empty() {
        let candidates = choices
            .iter()
            .filter(|value| value.get_name().starts_with(partial))
            .map(|value| (format!("{prefix}{}", value.get_name()), value.get_help().map(one_line)))
            .collect();
        return Want::Known(Answer { candidates, directive: directive::NO_FILE_COMP });
    }
    let dir_named = arg.get_value_names().and_then(|names| names.first()).is_some_and(|name| name == "DIR");
    let directive = match arg.get_value_hint() {
        ValueHint::DirPath => directive::FILTER_DIRS,
        ValueHint::AnyPath | ValueHint::FilePath | ValueHint::ExecutablePath if dir_named => directive::FILTER_DIRS,
        ValueHint::AnyPath | ValueHint::FilePath | ValueHint::ExecutablePath => directive::DEFAULT,
        _ => directive::NO_FILE_COMP,
    };
    Want::Known(Answer { candidates: Vec::new(), directive })
}

/// A help text's first line: a shell shows one line per candidate.
fn one_line(help: &clap::builder::StyledStr) -> String {
    help.to_string().lines().next().unwrap_or_default().trim().to_owned()
}

/// The answer, asking the server or the kubeconfig when the word is a name they hold.
fn answer(want: Want) -> Answer {
    let (source, prefix, partial, flags) = match want {
        Want::Known(answer) => return answer,
        Want::Names { source, prefix, partial, flags } => (source, prefix, partial, flags),
    };
    let names = match source {
        NameSource::Contexts | NameSource::Clusters | NameSource::Users => kubeconfig_names(source, &flags),
        NameSource::Bundles | NameSource::Namespaces => server_names(source, &flags),
    };
    let mut names: Vec<String> = names.into_iter().filter(|name| name.starts_with(partial.as_str())).collect();
    names.sort();
    names.dedup();
    Answer {
        candidates: names.into_iter().map(|name| (format!("{prefix}{name}"), None)).collect(),
        directive: directive::NO_FILE_COMP,
    }
}

/// The kubeconfig's contexts, clusters or users (`--kubeconfig`, else $KUBECONFIG or ~/.kube/config).
fn kubeconfig_names(source: NameSource, flags: &KubeFlags) -> Vec<String> {
    use kube::config::Kubeconfig;
    let config = match &flags.kubeconfig {
        Some(path) => Kubeconfig::read_from(path),
        None => Kubeconfig::read(),
    };
    let Ok(config) = config else { return Vec::new() };
    match source {
        NameSource::Contexts => config.contexts.into_iter().map(|c| c.name).collect(),
        NameSource::Clusters => config.clusters.into_iter().map(|c| c.name).collect(),
        NameSource::Users => config.auth_infos.into_iter().map(|u| u.name).collect(),
        NameSource::Bundles | NameSource::Namespaces => Vec::new(),
    }
}

/// Bundle names of the line's namespace, or namespaces, from the server; none if it cannot say.
fn server_names(source: NameSource, flags: &KubeFlags) -> Vec<String> {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let mut flags = flags.clone();
    flags.request_timeout.get_or_insert_with(|| REQUEST_TIMEOUT.to_owned());
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
        return Vec::new();
    };
    let listed = runtime.block_on(async { tokio::time::timeout(SERVER_DEADLINE, list(source, &flags)).await });
    match listed {
        Ok(Ok(names)) => names,
        _ => Vec::new(),
    }
}

async fn list(source: NameSource, flags: &KubeFlags) -> anyhow::Result<Vec<String>> {
    use k8s_openapi::api::core::v1::Namespace;
    use kube::api::{Api, ListParams};
    let connection = super::connection::connect(flags).await?;
    let params = ListParams::default();
    let client = connection.client;
    let names = match source {
        NameSource::Bundles => {
            let bundles = Api::<crate::api::Bundle>::namespaced(client, &connection.namespace);
            bundles.list_metadata(&params).await?.items.into_iter().filter_map(|b| b.metadata.name).collect()
        }
        NameSource::Namespaces => match Api::<Namespace>::all(client.clone()).list_metadata(&params).await {
            Ok(list) => list.items.into_iter().filter_map(|n| n.metadata.name).collect(),
            // A server without namespaces to list (stowage standalone) or a user who may not: the
            // namespaces that hold Bundles.
            Err(_) => {
                let bundles = Api::<crate::api::Bundle>::all(client).list_metadata(&params).await?;
                bundles.items.into_iter().filter_map(|b| b.metadata.namespace).collect()
            }
        },
        NameSource::Contexts | NameSource::Clusters | NameSource::Users => Vec::new(),
    };
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn want(line: &[&str]) -> Want {
        let (current, words) = line.split_last().unwrap();
        let words: Vec<String> = words.iter().map(|w| w.to_string()).collect();
        analyse(&words, current)
    }

    fn known(line: &[&str]) -> (Vec<String>, u32) {
        match want(line) {
            Want::Known(answer) => (answer.candidates.into_iter().map(|(c, _)| c).collect(), answer.directive),
            other => panic!("{line:?}: {other:?}"),
        }
    }

    #[test]
    fn subcommands_with_their_descriptions() {
        let Want::Known(answer) = want(&["-n", "x", ""]) else { panic!() };
        let names: Vec<&str> = answer.candidates.iter().map(|(c, _)| c.as_str()).collect();
        for expected in ["push", "pull", "ls", "diff", "cat", "status", "completion", "version"] {
            assert!(names.contains(&expected), "{expected} in {names:?}");
        }
        let pull = answer.candidates.iter().find(|(c, _)| c == "pull").unwrap();
        assert!(pull.1.as_deref().unwrap().starts_with("Fetch a Bundle's content"), "{pull:?}");
        assert_eq!(known(&["pu"]), (vec!["push".into(), "pull".into()], directive::NO_FILE_COMP));
    }

    #[test]
    fn flags_of_the_subcommand_not_given_twice() {
        assert_eq!(known(&["pull", "--f"]).0, ["--force"]);
        assert!(known(&["pull", "--force", "--f"]).0.is_empty());
        assert_eq!(known(&["push", "--as-g"]).0, ["--as-group"]);
        assert_eq!(known(&["push", "--as-group", "a", "--as-g"]).0, ["--as-group"], "repeatable");
        assert!(known(&["ls", "-"]).0.contains(&"-o".to_owned()));
    }

    #[test]
    fn values_and_paths() {
        assert_eq!(known(&["ls", "x", "-o", ""]), (vec!["json".into(), "name".into()], directive::NO_FILE_COMP));
        assert_eq!(known(&["ls", "x", "--output=j"]).0, ["--output=json"]);
        assert_eq!(known(&["completion", "z"]).0, ["zsh"]);
        assert_eq!(known(&["pull", "x", ""]).1, directive::FILTER_DIRS);
        assert_eq!(known(&["push", "x", ""]).1, directive::DEFAULT);
        assert_eq!(known(&["--kubeconfig", ""]).1, directive::DEFAULT);
        assert_eq!(known(&["diff", "x", ""]).1, directive::NO_FILE_COMP);
    }

    #[test]
    fn bundle_names_with_the_lines_connection_flags() {
        let Want::Names { source, partial, flags, .. } =
            want(&["-n", "before", "--context=c", "ls", "--piece-bytes-is-unknown", "-nafter", "al"])
        else {
            panic!()
        };
        assert_eq!((source, partial.as_str()), (NameSource::Bundles, "al"));
        assert_eq!((flags.namespace.as_deref(), flags.context.as_deref()), (Some("after"), Some("c")));
        let Want::Names { source, prefix, .. } = want(&["ls", "--namespace=de"]) else { panic!() };
        assert_eq!((source, prefix.as_str()), (NameSource::Namespaces, "--namespace="));
        let Want::Names { source, flags, .. } = want(&["--kubeconfig", "k", "--context", ""]) else { panic!() };
        assert_eq!((source, flags.kubeconfig), (NameSource::Contexts, Some("k".into())));
        // Past the last positional, or a flag's name after `--`: nothing.
        assert_eq!(known(&["ls", "x", ""]), (vec![], directive::NO_FILE_COMP));
        assert_eq!(known(&["ls", "--", "x", "--f"]), (vec![], directive::NO_FILE_COMP));
    }
}
