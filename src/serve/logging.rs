//! The log of `stowage serve`: `--log-format text|json` and kube's `-v`/`--v` verbosity, mapped onto
//! tracing levels and the access log's target. `RUST_LOG` still overrides the levels.
//!
//! JSON is tracing-subscriber's own format with the event's fields flattened beside `timestamp`
//! (RFC 3339), `level`, `message` and `target`, rather than klog's `ts`/`v`/`msg`: klog's `ts` is
//! float epoch seconds and `v` a verbosity tracing's levels do not carry, and a hand-written
//! formatter would be ours to keep correct.

use crate::apiserver::access_log;

/// `--log-format`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines (colour on a terminal only).
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// The verbosity from which every request gets an access line (kube-apiserver's httplog is V(3)).
pub const ACCESS_LOG_VERBOSITY: u8 = 3;

/// Log flags of `stowage serve`.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct LogOptions {
    /// Log line format: `text`, or `json` (one object per line: timestamp (RFC 3339), level,
    /// message, target and the event's fields).
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Log verbosity, as kube's `-v`/`--v` (`-v 3`, `-v=3`, `--v=3`): 0-2 info (kube's usual
    /// `--v=2` adds nothing here); 3-4 also one access line per request (target stowage::access,
    /// at info); 5 stowage's debug; 6 debug of every library too; 7 and more trace. `RUST_LOG`, when
    /// set, replaces these levels; the access line still follows `-v` unless `RUST_LOG` names
    /// stowage::access.
    #[arg(short = 'v', long = "v", value_name = "N", default_value_t = 0)]
    pub verbosity: u8,
}

/// Installs the process's subscriber, writing to stderr. Called once, first thing in `main`.
pub fn init(options: &LogOptions) {
    let rust_log = std::env::var("RUST_LOG").ok();
    let filter = tracing_subscriber::EnvFilter::try_new(directives(options.verbosity, rust_log.as_deref()))
        // A RUST_LOG that does not parse: the levels of `-v` alone, as an unset one.
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(directives(options.verbosity, None)));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match options.log_format {
        // Colour only on a terminal: `kubectl logs` and files get plain text.
        LogFormat::Text => builder.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())).init(),
        LogFormat::Json => builder.json().flatten_event(true).with_ansi(false).init(),
    }
}

/// The `EnvFilter` directives for verbosity `v`, or `rust_log`'s. The access log's own directive
/// comes last, so it follows `-v` whatever level the rest is at (`RUST_LOG=info` must not flood a
/// load test with access lines), unless `rust_log` decides it itself.
fn directives(v: u8, rust_log: Option<&str>) -> String {
    let target = access_log::TARGET;
    let access = if v >= ACCESS_LOG_VERBOSITY { "info" } else { "off" };
    let levels = match v {
        0..=4 => "info",
        5 => "info,stowage=debug",
        6 => "debug",
        _ => "trace",
    };
    match rust_log.map(str::trim).filter(|r| !r.is_empty()) {
        Some(r) if r.contains(target) => r.to_string(),
        Some(r) => format!("{r},{target}={access}"),
        None => format!("{levels},{target}={access}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        log: LogOptions,
    }

    fn parse(args: &[&str]) -> Result<LogOptions, clap::Error> {
        Cli::try_parse_from(std::iter::once("serve").chain(args.iter().copied())).map(|c| c.log)
    }

    #[test]
    fn v_takes_a_value_as_kubes_does() {
        for args in [&["-v", "4"][..], &["-v=4"], &["--v=4"], &["--v", "4"], &["-v4"]] {
            assert_eq!(parse(args).unwrap().verbosity, 4, "{args:?}");
        }
        assert_eq!(parse(&[]).unwrap().verbosity, 0);
        assert!(parse(&["-v"]).is_err(), "-v without a value");
        assert_eq!(parse(&["--log-format", "json"]).unwrap().log_format, LogFormat::Json);
        assert_eq!(parse(&[]).unwrap().log_format, LogFormat::Text);
        assert!(parse(&["--log-format", "xml"]).is_err());
    }

    #[test]
    fn verbosity_maps_onto_levels_and_the_access_log() {
        assert_eq!(directives(0, None), "info,stowage::access=off");
        assert_eq!(directives(2, None), "info,stowage::access=off");
        assert_eq!(directives(3, None), "info,stowage::access=info");
        assert_eq!(directives(5, None), "info,stowage=debug,stowage::access=info");
        assert_eq!(directives(6, None), "debug,stowage::access=info");
        assert_eq!(directives(9, None), "trace,stowage::access=info");
        assert_eq!(directives(0, Some("debug")), "debug,stowage::access=off");
        assert_eq!(directives(0, Some(" ")), "info,stowage::access=off");
        assert_eq!(directives(0, Some("warn,stowage::access=info")), "warn,stowage::access=info");
    }
}
