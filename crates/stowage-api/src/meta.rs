//! Object metadata rules shared by every resource: names, labels, timestamps, durations, and how
//! ages and sizes are printed.

use serde_json::Value;

use super::Cause;

/// RFC 1123 subdomain (`metadata.name` of most kinds): ≤ 253, lowercase alphanumerics, '-' and '.',
/// starting and ending with an alphanumeric.
pub fn dns1123_subdomain_errors(value: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if value.len() > 253 {
        errors.push("must be no more than 253 characters".to_string());
    }
    let ok_chars = value.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
    let ok_ends = value.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && value.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric());
    if value.is_empty() || !ok_chars || !ok_ends {
        errors.push(
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and \
             must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is \
             '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
                .to_string(),
        );
    }
    errors
}

/// RFC 1123 label (namespaces): ≤ 63, lowercase alphanumerics and '-'.
pub fn dns1123_label_errors(value: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if value.len() > 63 {
        errors.push("must be no more than 63 characters".to_string());
    }
    let ok_chars = value.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    let ok_ends = value.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && value.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric());
    if value.is_empty() || !ok_chars || !ok_ends {
        errors.push(
            "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start \
             and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is \
             '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
                .to_string(),
        );
    }
    errors
}

fn label_value_ok(value: &str) -> bool {
    label_value_errors(value).is_empty()
}

/// `[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?`: the name part of a label key, and a non-empty
/// label value.
fn label_chars_ok(value: &str) -> bool {
    value.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && value.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric())
        && value.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
}

const QUALIFIED_NAME_RULE: &str = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end \
     with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is \
     '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";

/// A label key (`[DNS subdomain prefix/]name`, the name at most 63 characters), in the words of
/// apimachinery's `validation.IsQualifiedName`; empty when valid.
pub fn qualified_name_errors(value: &str) -> Vec<String> {
    let mut errors = Vec::new();
    let mut parts = value.split('/');
    let (prefix, name) = match (parts.next(), parts.next(), parts.next()) {
        (Some(name), None, _) => (None, name),
        (Some(prefix), Some(name), None) => (Some(prefix), name),
        _ => {
            return vec![format!(
                "a qualified name {QUALIFIED_NAME_RULE} with an optional DNS subdomain prefix and '/' (e.g. \
                 'example.com/MyName')"
            )]
        }
    };
    match prefix {
        Some("") => errors.push("prefix part must be non-empty".to_string()),
        Some(prefix) => errors.extend(dns1123_subdomain_errors(prefix).into_iter().map(|e| format!("prefix part {e}"))),
        None => {}
    }
    if name.is_empty() {
        errors.push("name part must be non-empty".to_string());
    } else if name.len() > 63 {
        errors.push("name part must be no more than 63 characters".to_string());
    }
    if !label_chars_ok(name) {
        errors.push(format!("name part {QUALIFIED_NAME_RULE}"));
    }
    errors
}

/// A label value (at most 63 characters, may be empty), in the words of apimachinery's
/// `validation.IsValidLabelValue`; empty when valid.
pub fn label_value_errors(value: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if value.len() > 63 {
        errors.push("must be no more than 63 characters".to_string());
    }
    if !value.is_empty() && !label_chars_ok(value) {
        errors.push(
            "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and \
             must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex \
             used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
                .to_string(),
        );
    }
    errors
}

/// Label keys (`[prefix/]name`) and values, as Kubernetes validates them.
pub fn label_causes(labels: Option<&Value>) -> Vec<Cause> {
    let mut causes = Vec::new();
    let Some(map) = labels.and_then(Value::as_object) else {
        return causes;
    };
    for (key, value) in map {
        let (prefix, name) = match key.split_once('/') {
            Some((p, n)) => (Some(p), n),
            None => (None, key.as_str()),
        };
        let prefix_ok = prefix.is_none_or(|p| dns1123_subdomain_errors(p).is_empty());
        if !prefix_ok || name.is_empty() || !label_value_ok(name) {
            causes.push(Cause::invalid(
                "metadata.labels",
                &Value::String(key.clone()),
                "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with \
                 an alphanumeric character; an optional prefix must be a DNS subdomain",
            ));
        }
        match value.as_str() {
            Some(v) if label_value_ok(v) => {}
            _ => causes.push(Cause::invalid(
                format!("metadata.labels.{key}"),
                value,
                "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and \
                 must start and end with an alphanumeric character (at most 63 characters)",
            )),
        }
    }
    causes
}

/// `metav1.Time` format: RFC 3339, second precision, UTC.
pub fn now_timestamp() -> String {
    chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// The `metav1.Time` `after` from now.
pub fn timestamp_after(after: std::time::Duration) -> String {
    let after = chrono::Duration::from_std(after).unwrap_or(chrono::Duration::MAX);
    let at = chrono::Utc::now().checked_add_signed(after).unwrap_or(chrono::DateTime::<chrono::Utc>::MAX_UTC);
    at.format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// How long until `timestamp` (zero once it passed); `None` when it is not a timestamp.
pub fn time_until(timestamp: &str) -> Option<std::time::Duration> {
    let at = chrono::DateTime::parse_from_rfc3339(timestamp).ok()?;
    Some((at.with_timezone(&chrono::Utc) - chrono::Utc::now()).to_std().unwrap_or_default())
}

/// kubectl's AGE column (`duration.HumanDuration`).
pub fn human_age(timestamp: Option<&str>) -> String {
    let Some(then) = timestamp.and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok()) else {
        return "<unknown>".into();
    };
    let secs = (chrono::Utc::now() - then.with_timezone(&chrono::Utc)).num_seconds();
    human_duration(secs)
}

pub fn human_duration(secs: i64) -> String {
    if secs < -1 {
        return "<invalid>".into();
    }
    let secs = secs.max(0);
    let (m, h, d) = (secs / 60, secs / 3600, secs / 86400);
    match secs {
        s if s < 120 => format!("{s}s"),
        _ if m < 10 => match secs % 60 {
            0 => format!("{m}m"),
            s => format!("{m}m{s}s"),
        },
        _ if m < 180 => format!("{m}m"),
        _ if h < 8 => match m % 60 {
            0 => format!("{h}h"),
            mm => format!("{h}h{mm}m"),
        },
        _ if h < 48 => format!("{h}h"),
        _ if h < 192 => match h % 24 {
            0 => format!("{d}d"),
            hh => format!("{d}d{hh}h"),
        },
        _ if d < 365 * 2 => format!("{d}d"),
        _ if d < 365 * 8 => match d % 365 {
            0 => format!("{}y", d / 365),
            dd => format!("{}y{dd}d", d / 365),
        },
        _ => format!("{}y", d / 365),
    }
}

/// Sizes the way people read them in a table (`1.5Mi`).
pub fn human_bytes(n: u64) -> String {
    let mut value = n as f64;
    let mut unit = "";
    for next in ["Ki", "Mi", "Gi", "Ti", "Pi"] {
        if value < 1024.0 {
            break;
        }
        value /= 1024.0;
        unit = next;
    }
    if unit.is_empty() {
        format!("{n}")
    } else if value < 10.0 {
        format!("{value:.1}{unit}")
    } else {
        format!("{value:.0}{unit}")
    }
}

/// The longest duration [`parse_duration`] accepts: Go's `time.Duration` range (2^63-1 ns, about
/// 292 years), so the server takes exactly the durations a Go client (kubectl, `metav1.Duration`)
/// can write, and everything it takes fits a timer and an `Instant`.
pub const MAX_DURATION: std::time::Duration = std::time::Duration::new(9_223_372_036, 854_775_807);

/// Go durations as `time.ParseDuration` (and `metav1.Duration`) reads them, through
/// [`kube_core::Duration`]: `0`, `1h30m`, `1.5h`, `45s`, `300ms`, `2us`/`2µs`, `10ns`. `None` for
/// anything else, for a negative one (`-1s`; `-0` is 0) and for one beyond [`MAX_DURATION`].
pub fn parse_duration(text: &str) -> Option<std::time::Duration> {
    if !go_shaped(text) {
        return None;
    }
    let parsed: kube_core::Duration = text.parse().ok()?;
    let duration = std::time::Duration::from(parsed);
    if parsed.is_negative() && !duration.is_zero() {
        return None;
    }
    Some(duration).filter(|d| *d <= MAX_DURATION)
}

/// What kube-core's parser must not be given: it panics (in `Duration::mul_f64` or `+=`) on a
/// sign inside the text (`1h-5s`) and on a number past `Duration::MAX` (`1e30h` written out), and
/// it takes texts Go refuses (empty, a lone sign, a number without a unit after the first, `1h0`).
/// Refuses those; the sum checked here is in seconds, with the units kube-core knows, and only
/// keeps the parse far from overflowing (the exact bound is checked on the parsed value).
fn go_shaped(text: &str) -> bool {
    let body = text.strip_prefix(['-', '+']).unwrap_or(text);
    if body == "0" {
        return true;
    }
    if !body.ends_with(char::is_alphabetic) || body.contains(['-', '+']) {
        return false;
    }
    let mut seconds = 0f64;
    let mut rest = body;
    while let Some(unit_at) = rest.find(char::is_alphabetic) {
        let (number, tail) = rest.split_at(unit_at);
        let unit_len = tail.find(|c: char| !c.is_alphabetic()).unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let scale = match unit {
            "ns" => 1e-9,
            "us" | "\u{b5}s" | "\u{3bc}s" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => 0.0, // kube-core refuses the unit
        };
        seconds += number.parse::<f64>().unwrap_or(0.0) * scale;
        rest = tail;
    }
    seconds <= 2.0 * MAX_DURATION.as_secs_f64()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(dns1123_subdomain_errors("my-bundle.v1").is_empty());
        assert!(!dns1123_subdomain_errors("My_Bundle").is_empty());
        assert!(!dns1123_subdomain_errors("-x").is_empty());
        assert!(!dns1123_subdomain_errors(&"a".repeat(254)).is_empty());
        assert!(dns1123_label_errors("team-a").is_empty());
        assert!(!dns1123_label_errors("team.a").is_empty());
    }

    #[test]
    fn label_keys_and_values_as_apimachinery_checks_them() {
        for key in ["app", "a", "A_b.c-9", "example.com/app", &"k".repeat(63), &format!("{}/x", "a".repeat(253))] {
            assert!(qualified_name_errors(key).is_empty(), "{key}");
        }
        let first = |key: &str| qualified_name_errors(key).into_iter().next().unwrap_or_default();
        assert!(first("-app").starts_with("name part must consist of alphanumeric characters"));
        assert!(first("app_").starts_with("name part must consist of"));
        assert_eq!(first(&"k".repeat(64)), "name part must be no more than 63 characters");
        assert_eq!(first("/app"), "prefix part must be non-empty");
        assert_eq!(first("example.com/"), "name part must be non-empty");
        assert!(first("Example.com/app").starts_with("prefix part a lowercase RFC 1123 subdomain"));
        assert!(first("a/b/c").starts_with("a qualified name must consist of"));
        assert!(first("a/b/c").ends_with("with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"));
        for value in ["", "x", "MyValue", "my_value", "1.2-3", &"v".repeat(63)] {
            assert!(label_value_errors(value).is_empty(), "{value}");
        }
        for value in ["-x", "x-", "a b", "x/y", "\u{e9}t\u{e9}"] {
            let errors = label_value_errors(value);
            assert!(errors.len() == 1 && errors[0].starts_with("a valid label must be an empty string"), "{value}");
        }
        assert_eq!(label_value_errors(&"v".repeat(64)), ["must be no more than 63 characters"]);
    }

    #[test]
    fn durations_are_gos() {
        use std::time::Duration;
        for (text, want) in [
            // The serve flags' documented spellings.
            ("1h", Duration::from_secs(3600)),
            ("30m", Duration::from_secs(1800)),
            ("90s", Duration::from_secs(90)),
            ("500ms", Duration::from_millis(500)),
            ("0", Duration::ZERO),
            ("-0", Duration::ZERO),
            ("1.5h", Duration::from_secs(5400)),
            ("1h30m", Duration::from_secs(5400)),
            ("300ms", Duration::from_millis(300)),
            ("2us", Duration::from_micros(2)),
            ("2\u{b5}s", Duration::from_micros(2)),
            ("10ns", Duration::from_nanos(10)),
            ("+90s", Duration::from_secs(90)),
            ("2562047h", Duration::from_secs(2_562_047 * 3600)),
            ("2562047h47m16s", Duration::from_secs(9_223_372_036)),
            ("9223372036s", Duration::from_secs(9_223_372_036)),
        ] {
            assert_eq!(parse_duration(text), Some(want), "{text}");
        }
    }

    #[test]
    fn durations_go_refuses_are_refused_without_a_panic() {
        for text in [
            "",
            "-",
            "-1s",
            "10x",
            "1h0",
            "5",
            "00",
            "1h-5s",
            "1h+5s",
            "--1s",
            "1e3s",
            ".s",
            "1.2.3s",
            "2562048h",
            "9223372036854775808ns",
            "100000000000000000000h",
            &"9".repeat(400),
            &format!("{}h", "9".repeat(400)),
        ] {
            assert_eq!(parse_duration(text), None, "{text:?}");
        }
    }

    #[test]
    fn ages_match_kubectl() {
        assert_eq!(human_duration(5), "5s");
        assert_eq!(human_duration(150), "2m30s");
        assert_eq!(human_duration(3600 * 3 + 60 * 5), "3h5m");
        assert_eq!(human_duration(86400 * 3), "3d");
        assert_eq!(human_bytes(1536), "1.5Ki");
        assert_eq!(human_bytes(500), "500");
    }
}
