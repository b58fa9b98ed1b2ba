//! What every Prometheus client library exports about its process, read from `/proc/self` at
//! scrape time (Linux; elsewhere the family is left out): `process_cpu_seconds_total`,
//! `process_resident_memory_bytes`, `process_virtual_memory_bytes`, `process_open_fds`,
//! `process_max_fds` and `process_start_time_seconds`, under the names and meanings of the Go
//! client's process collector; and `stowage_build_info{version,git_commit,rust_version} 1`, from
//! the build script (`git_commit="unknown"` outside a git checkout).
//!
//! A file that cannot be read leaves its series out of that scrape rather than failing it.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Unit;

/// The version, commit and compiler this binary was built with.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
pub const GIT_COMMIT: &str = env!("STOWAGE_GIT_COMMIT");
pub const RUST_VERSION: &str = env!("STOWAGE_RUST_VERSION");

/// The process families.
#[derive(Debug, Default)]
pub struct ProcessCollector;

/// What `/proc/self/stat` says, in the units the families use.
#[derive(Debug, Default, PartialEq)]
struct Stat {
    cpu_seconds: f64,
    start_ticks: u64,
    virtual_bytes: u64,
    resident_pages: u64,
}

/// The fields after the command (which may hold spaces and parentheses): `state` is the first.
fn parse_stat(text: &str) -> Option<Stat> {
    let (_, rest) = text.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // Field n of proc(5) is fields[n - 3].
    let field = |n: usize| -> Option<u64> { fields.get(n.checked_sub(3)?)?.parse().ok() };
    let ticks = clock_ticks();
    Some(Stat {
        cpu_seconds: (field(14)? + field(15)?) as f64 / ticks,
        start_ticks: field(22)?,
        virtual_bytes: field(23)?,
        resident_pages: field(24)?,
    })
}

/// `btime` of `/proc/stat`: when the system booted, in seconds since the epoch.
fn parse_boot_time(text: &str) -> Option<u64> {
    text.lines().find_map(|l| l.strip_prefix("btime")).and_then(|v| v.trim().parse().ok())
}

/// The soft limit of `Max open files` in `/proc/self/limits` (`None`: unlimited).
fn parse_max_fds(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    line.trim_start_matches("Max open files").split_whitespace().next()?.parse().ok()
}

fn clock_ticks() -> f64 {
    // SAFETY: sysconf only reads a system constant.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 {
        ticks as f64
    } else {
        100.0
    }
}

fn page_size() -> u64 {
    // SAFETY: sysconf only reads a system constant.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(size).ok().filter(|s| *s > 0).unwrap_or(4096)
}

fn gauge(encoder: &mut DescriptorEncoder, name: &str, help: &str, unit: Option<&Unit>, value: f64) -> std::fmt::Result {
    let metric = ConstGauge::new(value);
    metric.encode(encoder.encode_descriptor(name, help, unit, metric.metric_type())?)
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        if let Some(stat) = std::fs::read_to_string("/proc/self/stat").ok().as_deref().and_then(parse_stat) {
            // `process_cpu_seconds` + the `_total` the encoders add to counters.
            let cpu = ConstCounter::new(stat.cpu_seconds);
            cpu.encode(encoder.encode_descriptor(
                "process_cpu",
                "Total user and system CPU time spent in seconds",
                Some(&Unit::Seconds),
                cpu.metric_type(),
            )?)?;
            let resident = (stat.resident_pages * page_size()) as f64;
            gauge(
                &mut encoder,
                "process_resident_memory",
                "Resident memory size in bytes",
                Some(&Unit::Bytes),
                resident,
            )?;
            gauge(
                &mut encoder,
                "process_virtual_memory",
                "Virtual memory size in bytes",
                Some(&Unit::Bytes),
                stat.virtual_bytes as f64,
            )?;
            if let Some(boot) = std::fs::read_to_string("/proc/stat").ok().as_deref().and_then(parse_boot_time) {
                let start = boot as f64 + stat.start_ticks as f64 / clock_ticks();
                gauge(
                    &mut encoder,
                    "process_start_time",
                    "Start time of the process since unix epoch in seconds",
                    Some(&Unit::Seconds),
                    start,
                )?;
            }
        }
        if let Ok(entries) = std::fs::read_dir("/proc/self/fd") {
            let open = entries.filter(|e| e.is_ok()).count();
            gauge(&mut encoder, "process_open_fds", "Number of open file descriptors", None, open as f64)?;
        }
        if let Some(max) = std::fs::read_to_string("/proc/self/limits").ok().as_deref().and_then(parse_max_fds) {
            gauge(&mut encoder, "process_max_fds", "Maximum number of open file descriptors", None, max as f64)?;
        }
        let mut info = encoder.encode_descriptor(
            "stowage_build_info",
            "A metric with a constant '1' value labeled by the version, git commit and Rust compiler stowage was built with",
            None,
            MetricType::Gauge,
        )?;
        let labels = [("version", VERSION), ("git_commit", GIT_COMMIT), ("rust_version", RUST_VERSION)];
        ConstGauge::new(1).encode(info.encode_family(&labels)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_files() {
        // A command with spaces and a parenthesis, as proc(5) allows.
        let stat = "4242 (stow age) x) S 1 4242 4242 0 -1 4194560 900 0 0 0 250 50 0 0 20 0 9 0 12345 \
                    104857600 2560 18446744073709551615 1 1 0 0 0 0 0 4096 0 0 0 0 17 1 0 0 0 0 0";
        let parsed = parse_stat(stat).unwrap();
        assert_eq!(parsed.start_ticks, 12345);
        assert_eq!(parsed.virtual_bytes, 104857600);
        assert_eq!(parsed.resident_pages, 2560);
        assert!((parsed.cpu_seconds - 300.0 / clock_ticks()).abs() < 1e-9, "{parsed:?}");
        assert_eq!(parse_stat("garbage"), None);
        assert_eq!(parse_boot_time("cpu  1 2 3\nbtime 1700000000\nprocesses 5\n"), Some(1_700_000_000));
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max open files            1024                 524288               files\n";
        assert_eq!(parse_max_fds(limits), Some(1024));
        assert_eq!(parse_max_fds("Max open files  unlimited unlimited files\n"), None);
    }

    #[test]
    fn exposes_every_series() {
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(ProcessCollector));
        let mut text = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut text, &registry).unwrap();
        for name in [
            "process_cpu_seconds_total ",
            "process_resident_memory_bytes ",
            "process_virtual_memory_bytes ",
            "process_start_time_seconds ",
            "process_open_fds ",
            "process_max_fds ",
        ] {
            assert!(text.lines().any(|l| l.starts_with(name)), "no {name:?} in\n{text}");
        }
        let info = format!(
            "stowage_build_info{{version=\"{VERSION}\",git_commit=\"{GIT_COMMIT}\",rust_version=\"{RUST_VERSION}\"}} 1"
        );
        assert!(text.lines().any(|l| l == info), "no {info:?} in\n{text}");
        assert!(RUST_VERSION.starts_with("rustc "), "{RUST_VERSION}");
    }
}
