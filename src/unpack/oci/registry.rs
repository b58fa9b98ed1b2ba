//! The registry's HTTP API (OCI distribution spec) as unpacking needs it, with every response
//! read under a bound: the token (the realm is chosen by the registry), manifests (resolving a
//! tag and fetching by digest), error bodies, and blobs, which are streamed (from an offset,
//! with `Range`, to resume one).
//!
//! `oci-client` reads token responses, manifests and error bodies whole whatever their size
//! (oras-project/rust-oci-client#206), so a hostile or broken registry streaming an endless one
//! grew the server's memory until it died; it is used here only for references and credentials.
//!
//! Authentication as registries do it: `GET /v2/` answers 401 with a challenge; `Bearer` sends us
//! to a token service (`realm`, https or an `--insecure-registry` host) that is asked, with the
//! credentials if any, for a pull token for the repository; `Basic` takes the credentials on every
//! request. A 401 later (a token expired mid-pull) is answered the same way, once per request.

use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use futures_util::stream::BoxStream;
use futures_util::{StreamExt, TryStreamExt};
use oci_client::secrets::RegistryAuth;
use oci_client::Reference;
use reqwest::header::{HeaderMap, ACCEPT, CONTENT_LENGTH, RANGE, WWW_AUTHENTICATE};
use reqwest::{RequestBuilder, Response, StatusCode};
use sha2::{Digest, Sha256};

use super::manifest::ACCEPTED_MANIFESTS;
use crate::unpack::download_spool::content_range_start;
use crate::unpack::error::UnpackError;
use crate::unpack::source::NetworkPolicy;

/// The OCI distribution spec asks clients and registries to handle manifests of 4 MiB; real ones
/// are a few KiB (an index of every platform stays far below).
pub const MAX_MANIFEST_BYTES: usize = 4 << 20;
/// Token responses are a JSON object with a JWT or two, a few KiB.
pub const MAX_TOKEN_BYTES: usize = 1 << 20;
/// A page of a tag list: a thousand tags of at most 128 bytes each, JSON-quoted.
const MAX_TAG_PAGE_BYTES: usize = 1 << 20;
/// Tags listed at most, over all pages.
const MAX_TAGS: usize = crate::api::versions::MAX_TAGS;
/// Of an error response, only this much is read (for the registry's error code and message).
const MAX_ERROR_BYTES: usize = 16 << 10;

/// One repository of one registry, with the credentials to present.
pub struct Registry {
    http: reqwest::Client,
    network: NetworkPolicy,
    /// `scheme://host[:port]/v2/REPOSITORY`.
    base: String,
    /// `?ns=…` for a reference through a mirror, else empty.
    query: String,
    repository: String,
    auth: RegistryAuth,
    /// What requests carry, found by [`Registry::authorize`].
    presented: Mutex<Presented>,
}

#[derive(Clone)]
enum Presented {
    Nothing,
    Basic(String, String),
    /// A token: from the credentials (`fixed`), or from the registry's token service.
    Bearer {
        token: String,
        fixed: bool,
    },
}

impl Registry {
    /// A client for `reference`'s repository, authenticated as the registry asks.
    pub async fn connect(
        network: &NetworkPolicy,
        reference: &Reference,
        auth: &RegistryAuth,
        what: &str,
    ) -> Result<Registry, UnpackError> {
        let host = reference.resolve_registry();
        let scheme = if network.insecure_registries.iter().any(|h| h == host) { "http" } else { "https" };
        let registry = Registry {
            http: http_client(network)?,
            network: network.clone(),
            base: format!("{scheme}://{host}/v2/{}", reference.repository()),
            query: reference.namespace().map(|ns| format!("?ns={ns}")).unwrap_or_default(),
            repository: reference.repository().to_owned(),
            auth: auth.clone(),
            presented: Mutex::new(Presented::Nothing),
        };
        registry.authorize(what).await?;
        Ok(registry)
    }

    /// The digest `tag` names now: the `Docker-Content-Digest` of a HEAD, or, when the registry
    /// sends none, the sha256 of the manifest read with the manifest bound.
    pub async fn resolve(&self, tag: &str, what: &str) -> Result<String, UnpackError> {
        let url = format!("{}/manifests/{tag}{}", self.base, self.query);
        let accept = ACCEPTED_MANIFESTS.join(", ");
        let head = self.send(what, |http| http.head(&url).header(ACCEPT, &accept)).await?;
        if head.status().is_success() {
            if let Some(digest) = header(head.headers(), "docker-content-digest") {
                return Ok(digest);
            }
        }
        drop(head);
        let bytes = self.manifest_at(&url, what).await?;
        Ok(format!("sha256:{}", hex::encode(Sha256::digest(&bytes))))
    }

    /// Every tag of the repository (`GET /v2/NAME/tags/list`), following the registry's `Link`
    /// pages; at most [`MAX_TAGS`], each page read under [`MAX_TAG_PAGE_BYTES`].
    pub async fn tags(&self, what: &str) -> Result<Vec<String>, UnpackError> {
        #[derive(serde::Deserialize)]
        struct TagList {
            #[serde(default)]
            tags: Option<Vec<String>>,
        }
        let root = self.base.rsplit_once("/v2/").map_or(self.base.as_str(), |(root, _)| root).to_owned();
        let separator = if self.query.is_empty() { '?' } else { '&' };
        let mut url = format!("{}/tags/list{}{separator}n=1000", self.base, self.query);
        let mut tags = Vec::new();
        loop {
            let response = success(self.send(what, |http| http.get(&url)).await?, what).await?;
            // Only the path and query of the next page are taken: it stays on this registry.
            let next = header(response.headers(), "link").and_then(|link| next_page(&link));
            let body = read_bounded(response, MAX_TAG_PAGE_BYTES, what).await?.ok_or_else(|| {
                UnpackError::TooLarge(format!(
                    "{what}: a page of the tag list is larger than {MAX_TAG_PAGE_BYTES} bytes"
                ))
            })?;
            let page: TagList = serde_json::from_slice(&body)
                .map_err(|_| UnpackError::Fetch(format!("{what}: the registry's tag list is not a tag list")))?;
            tags.extend(page.tags.unwrap_or_default());
            if tags.len() > MAX_TAGS {
                return Err(UnpackError::TooLarge(format!("{what}: the repository has more than {MAX_TAGS} tags")));
            }
            match next {
                Some(path) => url = format!("{root}{path}"),
                None => return Ok(tags),
            }
        }
    }

    /// The bytes of the manifest `digest` names; not yet verified.
    pub async fn manifest(&self, digest: &str, what: &str) -> Result<Vec<u8>, UnpackError> {
        self.manifest_at(&format!("{}/manifests/{digest}{}", self.base, self.query), what).await
    }

    async fn manifest_at(&self, url: &str, what: &str) -> Result<Vec<u8>, UnpackError> {
        let accept = ACCEPTED_MANIFESTS.join(", ");
        let response = self.send(what, |http| http.get(url).header(ACCEPT, &accept)).await?;
        let response = success(response, what).await?;
        read_bounded(response, MAX_MANIFEST_BYTES, what).await?.ok_or_else(|| {
            UnpackError::TooLarge(format!("{what}: a manifest larger than the limit of {MAX_MANIFEST_BYTES} bytes"))
        })
    }

    /// The blob `digest` from byte `offset` on, as a stream of its bytes (checked by the caller
    /// as they flow), and the offset the stream really starts at: `offset` when the registry
    /// answered the `Range` request, `0` when it sent the whole blob instead.
    pub async fn blob(
        &self,
        digest: &str,
        offset: u64,
        what: &str,
    ) -> Result<(u64, BoxStream<'static, Result<Bytes, std::io::Error>>), UnpackError> {
        let url = format!("{}/blobs/{digest}{}", self.base, self.query);
        let range = format!("bytes={offset}-");
        let response = self
            .send(what, |http| match offset {
                0 => http.get(&url),
                _ => http.get(&url).header(RANGE, &range),
            })
            .await?;
        let response = success(response, what).await?;
        let start = match response.status() {
            StatusCode::PARTIAL_CONTENT => {
                content_range_start(response.headers()).filter(|s| *s == offset).ok_or_else(|| {
                    UnpackError::Fetch(format!(
                        "{what}: the registry sent another part of the blob than the one asked for"
                    ))
                })?
            }
            _ => 0,
        };
        Ok((start, response.bytes_stream().map_err(std::io::Error::other).boxed()))
    }

    /// Sends a request with the current credentials; on a 401 (a token expired, or a repository
    /// that asks for credentials where `/v2/` did not), answers the response's challenge and sends
    /// it once more.
    async fn send(
        &self,
        what: &str,
        build: impl Fn(&reqwest::Client) -> RequestBuilder,
    ) -> Result<Response, UnpackError> {
        let presented = self.presented();
        let response = present(build(&self.http), &presented).send().await.map_err(|e| failed(what, &e))?;
        if response.status() != StatusCode::UNAUTHORIZED || matches!(presented, Presented::Bearer { fixed: true, .. }) {
            return Ok(response);
        }
        let challenge = challenge(response.headers());
        drop(response);
        self.answer(challenge.as_deref(), what).await?;
        present(build(&self.http), &self.presented()).send().await.map_err(|e| failed(what, &e))
    }

    fn presented(&self) -> Presented {
        self.presented.lock().map(|p| p.clone()).unwrap_or(Presented::Nothing)
    }

    /// Asks `GET /v2/` how to authenticate, and does.
    async fn authorize(&self, what: &str) -> Result<(), UnpackError> {
        if let RegistryAuth::Bearer(token) = &self.auth {
            return self.set(Presented::Bearer { token: token.clone(), fixed: true });
        }
        let root = self.base.rsplit_once("/v2/").map_or(self.base.as_str(), |(root, _)| root);
        let probe = self.http.get(format!("{root}/v2/")).send().await.map_err(|e| failed(what, &e))?;
        let challenge = challenge(probe.headers());
        // The body (of a 200 or a 401) is never read.
        drop(probe);
        self.answer(challenge.as_deref(), what).await
    }

    /// What to present after a `WWW-Authenticate` challenge: a token for `Bearer`, else the
    /// credentials as basic auth, if any.
    async fn answer(&self, challenge: Option<&str>, what: &str) -> Result<(), UnpackError> {
        let presented = match (challenge.and_then(bearer_challenge), &self.auth) {
            (Some((realm, service)), auth) => self.token(&realm, service.as_deref(), auth, what).await?,
            (None, RegistryAuth::Basic(user, password)) => Presented::Basic(user.clone(), password.clone()),
            (None, _) => Presented::Nothing,
        };
        self.set(presented)
    }

    fn set(&self, presented: Presented) -> Result<(), UnpackError> {
        if let Ok(mut current) = self.presented.lock() {
            *current = presented;
        }
        Ok(())
    }

    /// A pull token for the repository from the token service at `realm`.
    async fn token(
        &self,
        realm: &str,
        service: Option<&str>,
        auth: &RegistryAuth,
        what: &str,
    ) -> Result<Presented, UnpackError> {
        let url = reqwest::Url::parse(realm)
            .map_err(|_| UnpackError::Fetch(format!("{what}: the registry's token service URL is invalid")))?;
        let host_port = format!("{}:{}", url.host_str().unwrap_or_default(), url.port_or_known_default().unwrap_or(0));
        let allowed = url.scheme() == "https"
            || (url.scheme() == "http" && self.network.insecure_registries.contains(&host_port));
        if !allowed {
            return Err(UnpackError::Fetch(format!(
                "{what}: the registry's token service {host_port} is not https (and not an --insecure-registry)"
            )));
        }
        let scope = format!("repository:{}:pull", self.repository);
        let mut query = vec![("scope", scope.as_str())];
        query.extend(service.map(|s| ("service", s)));
        let mut request = self.http.get(url).query(&query);
        if let RegistryAuth::Basic(user, password) = auth {
            request = request.basic_auth(user, Some(password));
        }
        let response = request.send().await.map_err(|e| failed(what, &e))?;
        let status = response.status();
        if !status.is_success() {
            return Err(UnpackError::Fetch(format!("{what}: the registry's token service answered {status}")));
        }
        let body = read_bounded(response, MAX_TOKEN_BYTES, what).await?.ok_or_else(|| {
            UnpackError::Fetch(format!("{what}: the registry's token response is larger than {MAX_TOKEN_BYTES} bytes"))
        })?;
        #[derive(serde::Deserialize)]
        struct TokenResponse {
            #[serde(default)]
            token: String,
            #[serde(default)]
            access_token: String,
        }
        let parsed: TokenResponse = serde_json::from_slice(&body)
            .map_err(|_| UnpackError::Fetch(format!("{what}: the registry's token response is not a token")))?;
        let token = if parsed.token.is_empty() { parsed.access_token } else { parsed.token };
        if token.is_empty() {
            return Err(UnpackError::Fetch(format!("{what}: the registry's token response holds no token")));
        }
        Ok(Presented::Bearer { token, fixed: false })
    }
}

/// The path and query of the `rel="next"` target of a `Link` header, when it is a path on the
/// registry (`</v2/NAME/tags/list?last=x&n=1000>; rel="next"`).
fn next_page(link: &str) -> Option<String> {
    link.split(',').find_map(|entry| {
        let (target, params) = entry.split_once(';')?;
        let is_next = params.split(';').any(|p| p.trim().trim_start_matches("rel=").trim_matches('"') == "next");
        let path = target.trim().strip_prefix('<')?.strip_suffix('>')?;
        (is_next && path.starts_with("/v2/")).then(|| path.to_owned())
    })
}

/// The `WWW-Authenticate` value of a response (the first readable one).
fn challenge(headers: &HeaderMap) -> Option<String> {
    headers.get_all(WWW_AUTHENTICATE).iter().find_map(|v| v.to_str().ok()).map(str::to_owned)
}

fn present(request: RequestBuilder, presented: &Presented) -> RequestBuilder {
    match presented {
        Presented::Nothing => request,
        Presented::Basic(user, password) => request.basic_auth(user, Some(password)),
        Presented::Bearer { token, .. } => request.bearer_auth(token),
    }
}

/// `realm` and `service` of the first `Bearer` challenge in a `WWW-Authenticate` value.
fn bearer_challenge(value: &str) -> Option<(String, Option<String>)> {
    http_auth::parser::ChallengeParser::new(value).filter_map(Result::ok).find_map(|challenge| {
        if !challenge.scheme.eq_ignore_ascii_case("bearer") {
            return None;
        }
        let param = |name: &str| {
            challenge.params.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.to_unescaped())
        };
        Some((param("realm")?, param("service")))
    })
}

/// `response` if it succeeded; else its status, with the registry's error code and message when
/// it sent them in the first [`MAX_ERROR_BYTES`].
async fn success(response: Response, what: &str) -> Result<Response, UnpackError> {
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    let detail = match read_bounded(response, MAX_ERROR_BYTES, what).await {
        Ok(Some(body)) => registry_error(&body).map(|e| format!(" ({e})")).unwrap_or_default(),
        _ => String::new(),
    };
    Err(crate::unpack::error::for_status(status, format!("{what}: the registry answered {status}{detail}")))
}

/// `CODE: message` of the first error of an OCI error body.
fn registry_error(body: &[u8]) -> Option<String> {
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    let first = value.get("errors")?.get(0)?;
    let code = first.get("code")?.as_str()?;
    let message = first.get("message").and_then(|m| m.as_str()).unwrap_or_default();
    let text = format!("{code}: {message}");
    Some(text.chars().filter(|c| !c.is_control()).take(200).collect())
}

/// The whole body, or `None` once it passes `limit` bytes (declared or sent): the rest is never
/// read.
async fn read_bounded(mut response: Response, limit: usize, what: &str) -> Result<Option<Vec<u8>>, UnpackError> {
    let declared = response.headers().get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        return Ok(None);
    }
    let mut body = Vec::with_capacity(declared.unwrap_or(0) as usize);
    while let Some(chunk) = response.chunk().await.map_err(|e| failed(what, &e))? {
        if body.len() + chunk.len() > limit {
            return Ok(None);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Some(body))
}

fn header(headers: &HeaderMap, name: &str) -> Option<String> {
    headers.get(name).and_then(|v| v.to_str().ok()).map(|v| v.trim().to_owned()).filter(|v| !v.is_empty())
}

/// A request that failed below HTTP (connection, TLS, timeout), with its causes (reqwest's own
/// message alone says little) and without the URL.
fn failed(what: &str, err: &reqwest::Error) -> UnpackError {
    UnpackError::Fetch(format!("{what}: {}", crate::unpack::error::describe(err)))
}

/// Verified TLS (the system's roots and `--source-ca-file`); a redirect only to https or to a
/// registry allowed plain http. reqwest drops the `Authorization` header when a redirect leaves
/// the host (blobs are often served by a CDN).
fn http_client(network: &NetworkPolicy) -> Result<reqwest::Client, UnpackError> {
    let roots = crate::unpack::trust::extra_roots(network)?;
    let insecure = network.insecure_registries.clone();
    let redirects = reqwest::redirect::Policy::custom(move |attempt| {
        let url = attempt.url();
        let host_port = format!("{}:{}", url.host_str().unwrap_or_default(), url.port_or_known_default().unwrap_or(0));
        let allowed = url.scheme() == "https" || (url.scheme() == "http" && insecure.contains(&host_port));
        if attempt.previous().len() >= 5 || !allowed {
            attempt.error("redirect to a URL that is not allowed (plain http, another scheme, or too many)")
        } else {
            attempt.follow()
        }
    });
    reqwest::Client::builder()
        .redirect(redirects)
        .connect_timeout(Duration::from_secs(15))
        .read_timeout(Duration::from_secs(60))
        .user_agent(concat!("stowage/", env!("CARGO_PKG_VERSION")))
        .tls_certs_merge(roots)
        .build()
        .map_err(|e| UnpackError::Fetch(format!("building the registry client: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_challenges() {
        let (realm, service) =
            bearer_challenge(r#"Bearer realm="https://auth.example/token",service="registry.example",scope="x""#)
                .unwrap();
        assert_eq!((realm.as_str(), service.as_deref()), ("https://auth.example/token", Some("registry.example")));
        assert!(bearer_challenge(r#"Basic realm="registry""#).is_none());
        assert!(bearer_challenge("Bearer service=x").is_none());
    }

    #[test]
    fn tag_list_pages_stay_on_the_registry() {
        let link = r#"</v2/charts/kps/tags/list?last=88.5.3&n=1000>; rel="next""#;
        assert_eq!(next_page(link).as_deref(), Some("/v2/charts/kps/tags/list?last=88.5.3&n=1000"));
        assert_eq!(next_page(r#"<https://evil.example/v2/x>; rel="next""#), None);
        assert_eq!(next_page(r#"</v2/x/tags/list?last=a>; rel="prev""#), None);
    }

    #[test]
    fn registry_errors() {
        let body = br#"{"errors":[{"code":"MANIFEST_UNKNOWN","message":"manifest unknown","detail":{}}]}"#;
        assert_eq!(registry_error(body).as_deref(), Some("MANIFEST_UNKNOWN: manifest unknown"));
        assert_eq!(registry_error(b"<html>"), None);
    }
}
