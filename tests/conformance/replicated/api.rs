//! Requests of the replicated tests against any base URL (one replica, or haproxy), asserting
//! their status: the harness's `Server` methods, for a server that is several processes.

use std::time::Duration;

use reqwest::{Client, StatusCode};
use serde_json::Value;

use crate::harness::*;

const TIMEOUT: Duration = Duration::from_secs(120);

/// One base URL and the admin client.
#[derive(Clone)]
pub struct At<'a> {
    pub client: &'a Client,
    pub base: String,
}

impl<'a> At<'a> {
    pub fn new(client: &'a Client, base: impl Into<String>) -> At<'a> {
        At { client, base: base.into() }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// The body of a request that must answer `status`.
    pub async fn expect(&self, request: reqwest::RequestBuilder, status: StatusCode, what: &str) -> bytes::Bytes {
        let resp = request.timeout(TIMEOUT).send().await.unwrap_or_else(|e| panic!("{what} on {}: {e:?}", self.base));
        let got = resp.status();
        let body = resp.bytes().await.unwrap_or_else(|e| panic!("{what} on {}: reading the body: {e:?}", self.base));
        assert_eq!(got, status, "{what} on {}: {}", self.base, String::from_utf8_lossy(&body[..body.len().min(2000)]));
        body
    }

    pub async fn get_json(&self, path: &str) -> Value {
        let body = self.expect(self.client.get(self.url(path)), StatusCode::OK, &format!("GET {path}")).await;
        parse_json(&body, &format!("GET {path}"))
    }

    pub async fn download(&self, path: &str) -> Vec<u8> {
        self.expect(self.client.get(self.url(path)), StatusCode::OK, &format!("GET {path}")).await.to_vec()
    }

    /// `/metrics` of this base, parsed.
    pub async fn metrics(&self) -> std::collections::HashMap<String, f64> {
        parse_metrics(&String::from_utf8_lossy(&self.download("/metrics").await))
    }

    /// `Range: bytes=START-END` (inclusive) of `path`; asserts 206.
    pub async fn range(&self, path: &str, start: u64, end: u64) -> Vec<u8> {
        let request = self.client.get(self.url(path)).header("Range", format!("bytes={start}-{end}"));
        self.expect(request, StatusCode::PARTIAL_CONTENT, &format!("GET {path} bytes={start}-{end}")).await.to_vec()
    }

    pub async fn create_bundle(&self, ns: &str, name: &str) -> Value {
        let request = self
            .client
            .post(self.url(&bundles(ns)))
            .header("Content-Type", "application/json")
            .body(upload_bundle(ns, name).to_string());
        parse_json(&self.expect(request, StatusCode::CREATED, &format!("create {ns}/{name}")).await, "created")
    }

    /// PUTs a tar into a Bundle's content; the updated Bundle, asserted unpacked.
    pub async fn upload(&self, ns: &str, name: &str, tar: Vec<u8>) -> Value {
        let request =
            self.client.put(self.url(&bundle_content(ns, name))).header("Content-Type", "application/x-tar").body(tar);
        let b = parse_json(&self.expect(request, StatusCode::OK, &format!("upload {ns}/{name}")).await, "upload");
        assert_unpacked(&b);
        b
    }

    pub async fn delete(&self, path: &str) {
        let resp = self.client.delete(self.url(path)).timeout(TIMEOUT).send().await.expect("DELETE");
        let status = resp.status();
        assert!(
            status.is_success(),
            "DELETE {path} on {}: {status} {}",
            self.base,
            resp.text().await.unwrap_or_default()
        );
    }
}
