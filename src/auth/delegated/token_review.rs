//! Bearer tokens authenticated by the kube-apiserver: `authentication.k8s.io/v1` TokenReview, as
//! k8s.io/apiserver's delegating authenticator (the token webhook plus its token cache) does it.
//!
//! - The review carries the configured audiences (none = the kube-apiserver's API audiences). When
//!   audiences were asked for, an answer is believed only if its `status.audiences` names one of them.
//! - Answers are cached by the token's SHA-256 (the token itself is never kept): an authenticated user
//!   for `success_ttl`, a refusal for `failure_ttl` (kube's defaults: 10 s each), in a cache of at most
//!   `cache_size` tokens. Errors (transport, timeout, an error status such as 403 because this server
//!   may not create TokenReviews) are returned and never cached.
//! - Concurrent first requests with the same token each ask (no single-flight).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, TokenReviewStatus};
use kube::api::{Api, PostParams};
use kube::Client;

use super::cache::TtlCache;
use super::metrics::{DelegatedMetrics, Review};
use super::{digest, DelegatedError};
use crate::auth::UserInfo;

/// kube's `--authentication-token-webhook-cache-ttl` default, for both answers.
pub const DEFAULT_TOKEN_CACHE_TTL: Duration = Duration::from_secs(10);
/// How many tokens are remembered by default.
pub const DEFAULT_TOKEN_CACHE_SIZE: usize = 4096;

/// How tokens are reviewed and their answers cached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenReviewConfig {
    /// Audiences the token must be for (`spec.audiences`); empty = the kube-apiserver's API audiences.
    pub audiences: Vec<String>,
    pub success_ttl: Duration,
    pub failure_ttl: Duration,
    /// At most this many cached answers; 0 disables the cache.
    pub cache_size: usize,
}

impl Default for TokenReviewConfig {
    fn default() -> Self {
        TokenReviewConfig {
            audiences: Vec::new(),
            success_ttl: DEFAULT_TOKEN_CACHE_TTL,
            failure_ttl: DEFAULT_TOKEN_CACHE_TTL,
            cache_size: DEFAULT_TOKEN_CACHE_SIZE,
        }
    }
}

/// Authenticates bearer tokens with TokenReview. Cheap to clone (the cache is shared).
#[derive(Clone)]
pub struct TokenReviewer {
    api: Api<TokenReview>,
    config: Arc<TokenReviewConfig>,
    cache: Arc<TtlCache<[u8; 32], Option<UserInfo>>>,
    metrics: DelegatedMetrics,
}

impl std::fmt::Debug for TokenReviewer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenReviewer").field("config", &self.config).finish_non_exhaustive()
    }
}

impl TokenReviewer {
    pub fn new(client: Client, config: TokenReviewConfig) -> Self {
        let cache = Arc::new(TtlCache::new(config.cache_size));
        TokenReviewer { api: Api::all(client), config: Arc::new(config), cache, metrics: DelegatedMetrics::default() }
    }

    /// Records reviews and cache lookups in `metrics` (registered ones, for `/metrics`).
    pub fn with_metrics(mut self, metrics: DelegatedMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    pub fn config(&self) -> &TokenReviewConfig {
        &self.config
    }

    /// How many answers are cached (expired ones not yet dropped included).
    pub fn cached(&self) -> usize {
        self.cache.len()
    }

    /// Who `token` is: `Ok(Some(user))` if the cluster authenticated it, `Ok(None)` if it refused it,
    /// `Err` if it could not be asked (not cached: the next request asks again).
    pub async fn authenticate(&self, token: &str) -> Result<Option<UserInfo>, DelegatedError> {
        let key = digest(token.as_bytes());
        let cached = self.cache.get(&key);
        self.metrics.cache_lookup(Review::Authn, cached.is_some());
        if let Some(answer) = cached {
            return Ok(answer);
        }
        let answer = self.review(token).await?;
        let ttl = if answer.is_some() { self.config.success_ttl } else { self.config.failure_ttl };
        self.cache.insert(key, answer.clone(), ttl);
        Ok(answer)
    }

    /// Asks, without the cache.
    async fn review(&self, token: &str) -> Result<Option<UserInfo>, DelegatedError> {
        let audiences = &self.config.audiences;
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_owned(),
                audiences: (!audiences.is_empty()).then(|| audiences.clone()),
            },
            ..TokenReview::default()
        };
        let started = std::time::Instant::now();
        let answer = self.api.create(&PostParams::default(), &review).await;
        self.metrics.request(Review::Authn, started, &answer);
        let answer = answer.map_err(|source| DelegatedError::Request { what: "TokenReview", source })?;
        let status = answer.status.ok_or_else(|| DelegatedError::Response {
            what: "TokenReview",
            detail: "the answer has no status".into(),
        })?;
        user_of(status, audiences)
    }
}

/// The user a TokenReview status authenticates, if it does (and for one of `audiences`, when any).
fn user_of(status: TokenReviewStatus, audiences: &[String]) -> Result<Option<UserInfo>, DelegatedError> {
    if status.authenticated != Some(true) {
        if let Some(error) = status.error.filter(|e| !e.is_empty()) {
            tracing::debug!(error = %error, "TokenReview: token not authenticated");
        }
        return Ok(None);
    }
    if !audiences.is_empty() {
        let granted = status.audiences.unwrap_or_default();
        if !granted.iter().any(|a| audiences.contains(a)) {
            tracing::debug!(?granted, wanted = ?audiences, "TokenReview: token authenticated for other audiences");
            return Ok(None);
        }
    }
    let user = status.user.ok_or_else(|| DelegatedError::Response {
        what: "TokenReview",
        detail: "authenticated without a user".into(),
    })?;
    let name = user.username.unwrap_or_default();
    if name.is_empty() {
        return Err(DelegatedError::Response {
            what: "TokenReview",
            detail: "authenticated an empty user name".into(),
        });
    }
    Ok(Some(UserInfo {
        name,
        uid: user.uid.unwrap_or_default(),
        groups: user.groups.unwrap_or_default(),
        extra: user.extra.unwrap_or_default(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::authentication::v1::UserInfo as KubeUser;

    fn status(authenticated: bool, audiences: Option<Vec<&str>>) -> TokenReviewStatus {
        TokenReviewStatus {
            authenticated: Some(authenticated),
            audiences: audiences.map(|a| a.into_iter().map(String::from).collect()),
            user: Some(KubeUser {
                username: Some("alice".into()),
                uid: Some("u1".into()),
                groups: Some(vec!["dev".into(), "system:authenticated".into()]),
                extra: Some([("scopes".to_owned(), vec!["a".to_owned()])].into()),
            }),
            error: None,
        }
    }

    #[test]
    fn statuses_map_to_users() {
        let user = user_of(status(true, None), &[]).ok().flatten();
        assert_eq!(user.as_ref().map(|u| u.name.as_str()), Some("alice"));
        assert_eq!(user.as_ref().map(|u| u.uid.as_str()), Some("u1"));
        assert_eq!(user.map(|u| u.extra.len()), Some(1));
        assert_eq!(user_of(status(false, None), &[]).ok(), Some(None));
        let wanted = vec!["stowage".to_owned()];
        assert!(user_of(status(true, Some(vec!["stowage", "x"])), &wanted).ok().flatten().is_some());
        assert_eq!(user_of(status(true, Some(vec!["x"])), &wanted).ok(), Some(None));
        assert_eq!(user_of(status(true, None), &wanted).ok(), Some(None));
        let mut nameless = status(true, None);
        nameless.user = None;
        assert!(user_of(nameless, &[]).is_err());
    }
}
