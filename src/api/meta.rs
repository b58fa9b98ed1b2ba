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
    value.is_empty()
        || (value.len() <= 63
            && value.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
            && value.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric())
            && value.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.'))
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

/// Go-style durations: `1h30m`, `10m`, `45s`, `500ms`; `None` for anything else, also for one
/// beyond [`MAX_DURATION`] (Go's `time.ParseDuration` refuses those too).
pub fn parse_duration(text: &str) -> Option<std::time::Duration> {
    let mut total = 0f64;
    let mut number = String::new();
    let mut chars = text.chars().peekable();
    let mut any = false;
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() || c == '.' {
            number.push(c);
            continue;
        }
        let value: f64 = number.parse().ok()?;
        number.clear();
        let unit = match c {
            'h' => 3600.0,
            's' => 1.0,
            'm' if chars.peek() == Some(&'s') => {
                chars.next();
                0.001
            }
            'm' => 60.0,
            _ => return None,
        };
        total += value * unit;
        any = true;
    }
    if !number.is_empty() || !any {
        return None;
    }
    // Not finite or out of range: refused, never a panic (`Duration::from_secs_f64` would).
    std::time::Duration::try_from_secs_f64(total).ok().filter(|d| *d <= MAX_DURATION)
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
    fn ages_match_kubectl() {
        assert_eq!(human_duration(5), "5s");
        assert_eq!(human_duration(150), "2m30s");
        assert_eq!(human_duration(3600 * 3 + 60 * 5), "3h5m");
        assert_eq!(human_duration(86400 * 3), "3d");
        assert_eq!(human_bytes(1536), "1.5Ki");
        assert_eq!(human_bytes(500), "500");
    }
}
