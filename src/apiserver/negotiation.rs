//! Content negotiation and conditional GET for the documents served from memory (discovery,
//! OpenAPI): `Accept` media ranges with their parameters and q-values in preference order, and
//! bodies with an ETag that answer a matching `If-None-Match` with 304, as kube-apiserver does.

use axum::body::Bytes;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use sha2::{Digest, Sha512};

/// One media range of an `Accept` header, e.g. `application/json;g=apidiscovery.k8s.io;v=v2`.
#[derive(Debug)]
pub struct MediaRange {
    /// `type/subtype`, lowercased.
    essence: String,
    /// Parameters other than `q`, names lowercased, values as sent.
    params: Vec<(String, String)>,
    quality: f32,
}

impl MediaRange {
    pub fn param(&self, name: &str) -> Option<&str> {
        self.params.iter().find(|(key, _)| key == name).map(|(_, value)| value.as_str())
    }

    pub fn has_params(&self) -> bool {
        !self.params.is_empty()
    }

    /// Whether this range accepts `media_type` (`type/subtype`), wildcards included.
    pub fn accepts(&self, media_type: &str) -> bool {
        let (kind, _) = media_type.split_once('/').unwrap_or((media_type, ""));
        self.essence == "*/*"
            || self.essence.eq_ignore_ascii_case(media_type)
            || self.essence.strip_suffix("/*").is_some_and(|t| t.eq_ignore_ascii_case(kind))
    }
}

/// The media ranges of every `Accept` header, most preferred first (ties keep the client's order),
/// ranges with q=0 dropped. No (or an empty) `Accept` header means `*/*`.
pub fn accepted(headers: &HeaderMap) -> Vec<MediaRange> {
    let mut ranges = Vec::new();
    for value in headers.get_all(header::ACCEPT) {
        let Ok(text) = value.to_str() else { continue };
        ranges.extend(text.split(',').filter_map(parse_range));
    }
    if ranges.is_empty() {
        ranges.push(MediaRange { essence: "*/*".into(), params: Vec::new(), quality: 1.0 });
    }
    ranges.retain(|r| r.quality > 0.0);
    ranges.sort_by(|a, b| b.quality.total_cmp(&a.quality));
    ranges
}

fn parse_range(text: &str) -> Option<MediaRange> {
    let mut parts = text.split(';');
    let essence = parts.next()?.trim().to_ascii_lowercase();
    if essence.is_empty() {
        return None;
    }
    let mut range = MediaRange { essence, params: Vec::new(), quality: 1.0 };
    for param in parts {
        let Some((name, value)) = param.split_once('=') else { continue };
        let (name, value) = (name.trim().to_ascii_lowercase(), value.trim().trim_matches('"'));
        if name == "q" {
            range.quality = value.parse().unwrap_or(1.0);
        } else {
            range.params.push((name, value.to_string()));
        }
    }
    Some(range)
}

/// A document rendered once, with the ETag kube would give it: the SHA-512 of its bytes in
/// uppercase hex (quoted in the header).
pub struct Document {
    body: Bytes,
    hash: String,
}

impl Document {
    pub fn json(value: &Value) -> Document {
        let body = Bytes::from(value.to_string());
        let hash = hex::encode_upper(Sha512::digest(&body));
        Document { body, hash }
    }

    /// The unquoted hash (the `?hash=` of OpenAPI v3 URLs).
    pub fn hash(&self) -> &str {
        &self.hash
    }

    /// 200 with the body, or 304 when `If-None-Match` names this document; `Vary: Accept` always,
    /// since the same URL answers different documents to different `Accept` headers.
    pub fn respond(&self, request: &HeaderMap, content_type: &'static str, cache: Caching) -> Response {
        let etag = format!("\"{}\"", self.hash);
        let mut response = if if_none_match(request, &etag) {
            StatusCode::NOT_MODIFIED.into_response()
        } else {
            (StatusCode::OK, [(header::CONTENT_TYPE, content_type)], self.body.clone()).into_response()
        };
        let headers = response.headers_mut();
        if let Ok(value) = HeaderValue::from_str(&etag) {
            headers.insert(header::ETAG, value);
        }
        headers.insert(header::VARY, HeaderValue::from_static("Accept"));
        match cache {
            Caching::Revalidate => {
                headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("public"));
            }
            Caching::Immutable => {
                headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("public, immutable"));
                let a_year = chrono::Utc::now() + chrono::Duration::days(365);
                let expires = a_year.format("%a, %d %b %Y %H:%M:%S GMT").to_string();
                if let Ok(value) = HeaderValue::from_str(&expires) {
                    headers.insert(header::EXPIRES, value);
                }
            }
        }
        response
    }
}

/// How clients may cache a [`Document`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Caching {
    /// Cache, but revalidate with the ETag (the URL's content can change).
    Revalidate,
    /// Never changes (the URL names the content by its hash).
    Immutable,
}

fn if_none_match(request: &HeaderMap, etag: &str) -> bool {
    request
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|list| list.split(',').map(str::trim).any(|tag| tag == "*" || tag.trim_start_matches("W/") == etag))
}

/// 406 Not Acceptable as a `Status`, naming what we can serve.
pub fn not_acceptable(offered: &str) -> Response {
    super::status::ApiError::from_code(
        StatusCode::NOT_ACCEPTABLE,
        format!("only the following media types are accepted: {offered}"),
    )
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(accept: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::ACCEPT, HeaderValue::from_str(accept).unwrap());
        h
    }

    #[test]
    fn orders_by_quality_then_client_order() {
        let ranges = accepted(&headers("application/json;q=0.5, application/json;g=a;v=v2;as=X, text/plain;q=0"));
        assert_eq!(ranges.len(), 2);
        assert_eq!(ranges[0].param("g"), Some("a"));
        assert_eq!(ranges[0].param("as"), Some("X"));
        assert!(!ranges[1].has_params());
        assert!(ranges[1].accepts("application/json"));
        assert!(!ranges[1].accepts("application/yaml"));
    }

    #[test]
    fn wildcards_and_missing_header() {
        assert!(accepted(&HeaderMap::new())[0].accepts("application/json"));
        assert!(accepted(&headers(" "))[0].accepts("application/json"));
        assert!(accepted(&headers("text/plain;q=0")).is_empty());
        assert!(accepted(&headers("application/*"))[0].accepts("application/json"));
        assert!(!accepted(&headers("text/*"))[0].accepts("application/json"));
    }

    #[test]
    fn answers_304_for_its_etag() {
        let doc = Document::json(&serde_json::json!({"a": 1}));
        let mut request = HeaderMap::new();
        let first = doc.respond(&request, "application/json", Caching::Revalidate);
        assert_eq!(first.status(), StatusCode::OK);
        let etag = first.headers()[header::ETAG].clone();
        request.insert(header::IF_NONE_MATCH, etag);
        let again = doc.respond(&request, "application/json", Caching::Immutable);
        assert_eq!(again.status(), StatusCode::NOT_MODIFIED);
        assert_eq!(again.headers()[header::CACHE_CONTROL], "public, immutable");
    }
}
