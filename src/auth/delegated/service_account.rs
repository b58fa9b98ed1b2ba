//! Service-account JWTs verified locally, against the keys the cluster's issuer publishes (`jwks.rs`),
//! mapped to the user the kube-apiserver would produce:
//! `system:serviceaccount:NS:NAME`, uid = the service account's uid, groups `system:serviceaccounts`
//! and `system:serviceaccounts:NS`, and for bound tokens the extras `authentication.kubernetes.io/`
//! `pod-name`, `pod-uid`, `node-name`, `node-uid` and `credential-id` (`JTI=<jti>`).
//!
//! Checked here: the signature (RS256, ES256, ES384; the header's `alg` must be the key's), `iss` (the
//! issuer of the discovery document), `aud` (one of the configured audiences; by default the issuer
//! — kube-apiserver's default API audience — or `https://kubernetes.default.svc`), `exp` and `nbf`
//! and `iat` (with kube's one-minute leeway), `sub` consistent with the `kubernetes.io` claims.
//!
//! Not checkable locally: that the service account, pod, secret or node a token is bound to still
//! exists. So a token is verified locally only within its original lifetime: past its `warnafter`
//! (kube extends projected tokens to a year and marks the requested expiry there), or bound to a
//! secret, or to a node without a pod, it is left to TokenReview, which checks the bound objects.
//! A locally verified pod token stays valid until its expiry after the pod is deleted.
//!
//! Tokens of another issuer, not JWTs, or signed with a key unknown even after a refresh are
//! [`Verdict::NotLocal`]: [`super::DelegatedTokenAuthenticator`] hands them to TokenReview. Keys are
//! fetched on first use, re-fetched when a token names an unknown `kid` (at most once per
//! `min_refresh_interval`) and in the background once older than `refresh_interval`; a failed fetch
//! keeps the previous keys. Verified tokens are remembered by SHA-256 for `verified_ttl` (10 s), never
//! past their `exp` or `warnafter`; refusals are not cached (checking costs no request).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{dangerous, decode, decode_header, Validation};
use kube::Client;
use serde::Deserialize;

use super::cache::TtlCache;
use super::jwks::{self, Key, KeySet};
use super::sa_claims::{user_of, Claims};
use super::{digest, DelegatedError};
use crate::auth::UserInfo;

pub use super::sa_claims::{CREDENTIAL_ID_KEY, NODE_NAME_KEY, NODE_UID_KEY, POD_NAME_KEY, POD_UID_KEY};

/// The API audience several distributions use (EKS); kubeadm and GKE use the issuer.
pub const DEFAULT_API_AUDIENCE: &str = "https://kubernetes.default.svc";
/// go-jose's `DefaultLeeway`, which kube-apiserver uses for `exp`, `nbf` and `iat`.
pub const DEFAULT_LEEWAY: Duration = Duration::from_secs(60);
pub const DEFAULT_REFRESH_INTERVAL: Duration = Duration::from_secs(60);
pub const DEFAULT_MIN_REFRESH_INTERVAL: Duration = Duration::from_secs(10);
/// How long a verified token is remembered (never past its `exp` or `warnafter`).
pub const DEFAULT_VERIFIED_TTL: Duration = Duration::from_secs(10);
pub const DEFAULT_VERIFIED_CACHE_SIZE: usize = 4096;

/// How service-account tokens are verified.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceAccountConfig {
    /// A token must be for one of these; empty = the issuer or [`DEFAULT_API_AUDIENCE`].
    pub audiences: Vec<String>,
    pub leeway: Duration,
    /// Keys older than this are re-fetched in the background.
    pub refresh_interval: Duration,
    /// Fetches (on an unknown `kid`, or while no keys are known) are at most this frequent.
    pub min_refresh_interval: Duration,
    /// Verified tokens are remembered (by SHA-256) this long, at most until their `exp`/`warnafter`:
    /// a key withdrawn from the JWKS stops working within this time after the next key fetch.
    pub verified_ttl: Duration,
    /// At most this many verified tokens are remembered; 0 disables the cache.
    pub verified_cache_size: usize,
}

impl Default for ServiceAccountConfig {
    fn default() -> Self {
        ServiceAccountConfig {
            audiences: Vec::new(),
            leeway: DEFAULT_LEEWAY,
            refresh_interval: DEFAULT_REFRESH_INTERVAL,
            min_refresh_interval: DEFAULT_MIN_REFRESH_INTERVAL,
            verified_ttl: DEFAULT_VERIFIED_TTL,
            verified_cache_size: DEFAULT_VERIFIED_CACHE_SIZE,
        }
    }
}

/// What local verification made of a token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// A valid service-account token of the cluster's issuer: this user.
    Verified(UserInfo),
    /// The cluster's issuer's, and invalid (expired, not yet valid, other audience, bad signature):
    /// the token is refused, no TokenReview needed.
    Rejected(String),
    /// Not for local verification: TokenReview decides.
    NotLocal(String),
}

/// Verifies service-account JWTs locally. Cheap to clone (keys are shared).
#[derive(Clone)]
pub struct ServiceAccountVerifier {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    config: ServiceAccountConfig,
    keys: RwLock<Option<Arc<KeySet>>>,
    last_attempt: Mutex<Option<Instant>>,
    fetching: tokio::sync::Mutex<()>,
    background: AtomicBool,
    verified: TtlCache<[u8; 32], UserInfo>,
}

impl std::fmt::Debug for ServiceAccountVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceAccountVerifier").field("config", &self.inner.config).finish_non_exhaustive()
    }
}

#[derive(Deserialize)]
struct Unverified {
    iss: Option<String>,
}

impl ServiceAccountVerifier {
    /// A verifier that fetches the keys on first use (or on [`Self::refresh_keys`]).
    pub fn new(client: Client, config: ServiceAccountConfig) -> Self {
        let inner = Inner {
            client,
            verified: TtlCache::new(config.verified_cache_size),
            config,
            keys: RwLock::new(None),
            last_attempt: Mutex::new(None),
            fetching: tokio::sync::Mutex::new(()),
            background: AtomicBool::new(false),
        };
        ServiceAccountVerifier { inner: Arc::new(inner) }
    }

    /// Fetches the issuer and keys now, whatever the rate limit; on error the previous keys stay.
    pub async fn refresh_keys(&self) -> Result<(), DelegatedError> {
        let _fetching = self.inner.fetching.lock().await;
        self.inner.fetch().await
    }

    /// The cluster's issuer, once known.
    pub fn issuer(&self) -> Option<String> {
        self.inner.current().map(|k| k.issuer.clone())
    }

    /// How many keys are known.
    pub fn key_count(&self) -> usize {
        self.inner.current().map_or(0, |k| k.len())
    }

    /// Verifies `token` locally.
    pub async fn verify(&self, token: &str) -> Verdict {
        if let Some(user) = self.inner.verified.get(&digest(token.as_bytes())) {
            return Verdict::Verified(user);
        }
        self.verify_uncached(token).await
    }

    async fn verify_uncached(&self, token: &str) -> Verdict {
        let Ok(header) = decode_header(token) else { return Verdict::NotLocal("not a JWT".into()) };
        let issuer = match dangerous::insecure_decode::<Unverified>(token) {
            Ok(data) => data.claims.iss.unwrap_or_default(),
            Err(_) => return Verdict::NotLocal("unreadable JWT claims".into()),
        };
        let Some(mut keys) = self.keys_for_use().await else {
            return Verdict::NotLocal("the issuer's keys are not available".into());
        };
        if issuer != keys.issuer {
            return Verdict::NotLocal(format!("issuer {issuer:?} is not the cluster's"));
        }
        let kid = header.kid.as_deref();
        if kid.is_some() && candidates(&keys, kid, header.alg).is_empty() {
            self.inner.fetch_rate_limited().await;
            keys = self.inner.current().unwrap_or(keys);
        }
        let candidates = candidates(&keys, kid, header.alg);
        if candidates.is_empty() {
            return Verdict::NotLocal(format!("no published key {kid:?} for {:?}", header.alg));
        }
        self.check(token, &keys, &candidates)
    }

    fn check(&self, token: &str, keys: &KeySet, candidates: &[&Key]) -> Verdict {
        let config = &self.inner.config;
        let audiences = if config.audiences.is_empty() {
            vec![keys.issuer.clone(), DEFAULT_API_AUDIENCE.to_owned()]
        } else {
            config.audiences.clone()
        };
        let mut last = ErrorKind::InvalidSignature;
        for key in candidates {
            let mut validation = Validation::new(key.algorithm);
            validation.leeway = config.leeway.as_secs();
            validation.validate_nbf = true;
            validation.set_issuer(&[&keys.issuer]);
            validation.set_audience(&audiences);
            validation.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
            match decode::<Claims>(token, &key.decoding, &validation) {
                Ok(data) => {
                    let remaining = data.claims.remaining_lifetime();
                    let verdict = user_of(data.claims, config.leeway);
                    if let (Verdict::Verified(user), Some(remaining)) = (&verdict, remaining) {
                        let ttl = config.verified_ttl.min(remaining);
                        self.inner.verified.insert(digest(token.as_bytes()), user.clone(), ttl);
                    }
                    return verdict;
                }
                Err(e) => last = e.into_kind(),
            }
            if !matches!(last, ErrorKind::InvalidSignature) {
                break;
            }
        }
        Verdict::Rejected(match last {
            ErrorKind::ExpiredSignature => "service account token has expired".into(),
            ErrorKind::ImmatureSignature => "service account token is not valid yet".into(),
            ErrorKind::InvalidAudience => "token audiences are not accepted".into(),
            other => format!("invalid service account token: {other:?}"),
        })
    }

    /// The keys to verify with: fetched inline if none are known yet, refreshed in the background if
    /// old.
    async fn keys_for_use(&self) -> Option<Arc<KeySet>> {
        match self.inner.current() {
            None => {
                self.inner.fetch_rate_limited().await;
                self.inner.current()
            }
            Some(keys) => {
                if keys.fetched_at.elapsed() >= self.inner.config.refresh_interval {
                    self.refresh_in_background();
                }
                Some(keys)
            }
        }
    }

    fn refresh_in_background(&self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        if self.inner.background.swap(true, Ordering::AcqRel) {
            return;
        }
        let inner = Arc::clone(&self.inner);
        runtime.spawn(async move {
            inner.fetch_rate_limited().await;
            inner.background.store(false, Ordering::Release);
        });
    }
}

impl Inner {
    fn current(&self) -> Option<Arc<KeySet>> {
        self.keys.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Fetches unless a fetch was attempted less than `min_refresh_interval` ago.
    async fn fetch_rate_limited(&self) {
        let _fetching = self.fetching.lock().await;
        {
            let mut last = self.last_attempt.lock().unwrap_or_else(PoisonError::into_inner);
            if last.is_some_and(|t| t.elapsed() < self.config.min_refresh_interval) {
                return;
            }
            *last = Some(Instant::now());
        }
        if let Err(e) = self.fetch().await {
            tracing::warn!(error = %e, "service-account issuer keys not fetched; tokens go to TokenReview");
        }
    }

    /// Fetches now; the caller holds `fetching`.
    async fn fetch(&self) -> Result<(), DelegatedError> {
        *self.last_attempt.lock().unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
        let set = jwks::fetch(&self.client).await?;
        let mut kids: Vec<&String> = set.by_kid.keys().collect();
        kids.sort();
        tracing::debug!(issuer = %set.issuer, ?kids, unnamed = set.unnamed.len(), "service-account issuer keys fetched");
        *self.keys.write().unwrap_or_else(PoisonError::into_inner) = Some(Arc::new(set));
        Ok(())
    }
}

/// The keys a token with this `kid` and `alg` may be signed with: the named key, or every key of the
/// algorithm when the token names none.
fn candidates<'k>(keys: &'k KeySet, kid: Option<&str>, alg: jsonwebtoken::Algorithm) -> Vec<&'k Key> {
    match kid {
        Some(kid) => keys.by_kid.get(kid).into_iter().collect(),
        None => keys.unnamed.iter().chain(keys.by_kid.values()).filter(|k| k.algorithm == alg).collect(),
    }
}
