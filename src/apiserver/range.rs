//! HTTP conditional and range requests (RFC 9110): `If-None-Match`, `Range: bytes=…`, `If-Range`.

use axum::http::{header, HeaderMap};

use crate::storage::RangeSpec;

#[derive(Debug, PartialEq, Eq)]
pub enum RangeRequest {
    Full,
    Partial(RangeSpec),
    Unsatisfiable,
}

/// True when `If-None-Match` lists `etag` (or `*`): answer 304.
pub fn if_none_match(headers: &HeaderMap, etag: &str) -> bool {
    headers
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|t| t.trim().trim_start_matches("W/"))
        .any(|t| t == etag || t == "*")
}

/// Interprets `Range` for a representation of `size` bytes. Multiple ranges are answered with the
/// whole representation (allowed by RFC 9110), as is a `Range` whose `If-Range` is stale.
pub fn parse(headers: &HeaderMap, etag: &str, size: u64) -> RangeRequest {
    let Some(range) = headers.get(header::RANGE).and_then(|v| v.to_str().ok()) else {
        return RangeRequest::Full;
    };
    if let Some(if_range) = headers.get(header::IF_RANGE).and_then(|v| v.to_str().ok()) {
        if if_range.trim() != etag {
            return RangeRequest::Full;
        }
    }
    let Some(spec) = range.trim().strip_prefix("bytes=") else {
        return RangeRequest::Full;
    };
    if spec.contains(',') {
        return RangeRequest::Full;
    }
    let Some((first, last)) = spec.trim().split_once('-') else {
        return RangeRequest::Full;
    };
    let (first, last) = (first.trim(), last.trim());
    let parsed = match (first.is_empty(), last.is_empty()) {
        (true, true) => return RangeRequest::Full,
        (true, false) => match last.parse::<u64>() {
            Ok(0) => return RangeRequest::Unsatisfiable,
            Ok(n) => Some((size.saturating_sub(n), size)),
            Err(_) => return RangeRequest::Full,
        },
        (false, _) => {
            let Ok(start) = first.parse::<u64>() else {
                return RangeRequest::Full;
            };
            let end = if last.is_empty() {
                size
            } else {
                match last.parse::<u64>() {
                    // `last` is inclusive and may be u64::MAX ("to the end, whatever the size").
                    Ok(l) if l >= start => l.saturating_add(1).min(size),
                    _ => return RangeRequest::Full,
                }
            };
            Some((start, end))
        }
    };
    match parsed {
        Some((start, end)) if start < size && start < end => RangeRequest::Partial(RangeSpec { start, end }),
        _ => RangeRequest::Unsatisfiable,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(range: &str, if_range: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::RANGE, range.parse().unwrap());
        if let Some(v) = if_range {
            h.insert(header::IF_RANGE, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn ranges() {
        let p = |s: u64, e: u64| RangeRequest::Partial(RangeSpec { start: s, end: e });
        assert_eq!(parse(&req("bytes=0-9", None), "\"e\"", 100), p(0, 10));
        assert_eq!(parse(&req("bytes=90-", None), "\"e\"", 100), p(90, 100));
        assert_eq!(parse(&req("bytes=-5", None), "\"e\"", 100), p(95, 100));
        assert_eq!(parse(&req("bytes=95-200", None), "\"e\"", 100), p(95, 100));
        assert_eq!(parse(&req("bytes=100-", None), "\"e\"", 100), RangeRequest::Unsatisfiable);
        assert_eq!(parse(&req("bytes=0-1,5-6", None), "\"e\"", 100), RangeRequest::Full);
        assert_eq!(parse(&req("bytes=0-9", Some("\"old\"")), "\"e\"", 100), RangeRequest::Full);
        assert_eq!(parse(&req("bytes=0-9", Some("\"e\"")), "\"e\"", 100), p(0, 10));
    }

    #[test]
    fn a_last_byte_of_u64_max_means_to_the_end() {
        // Found by fuzzing (fuzz/regressions/range_headers): `last + 1` overflowed.
        let max = u64::MAX;
        assert_eq!(
            parse(&req(&format!("bytes=0-{max}"), None), "\"e\"", 100),
            RangeRequest::Partial(RangeSpec { start: 0, end: 100 })
        );
        assert_eq!(parse(&req(&format!("bytes={max}-{max}"), None), "\"e\"", 100), RangeRequest::Unsatisfiable);
    }
}
