//! Authorization by the kube-apiserver: `authorization.k8s.io/v1` SubjectAccessReview, as
//! k8s.io/apiserver's delegating authorizer (the authorization webhook) does it.
//!
//! - The review's spec is the [`Attributes`]: `user`, `uid`, `groups`, `extra` and exactly one of
//!   `resourceAttributes` / `nonResourceAttributes` (empty fields left out).
//! - `allowed` → [`Decision::Allow`], `denied` → [`Decision::Deny`], neither → [`Decision::NoOpinion`]
//!   (the caller refuses with 403), each with the review's `reason` and `evaluationError`; an answer
//!   both allowed and denied is a `Deny`.
//! - Answers are cached by the SHA-256 of the whole spec's JSON (kube keys its cache on the same
//!   JSON): allows for `allow_ttl`, denials and no-opinions for `deny_ttl` (kube's defaults: 10 s
//!   each), each in a cache of at most `cache_size` entries. Errors are returned, never cached: the
//!   caller answers them with a 5xx, never an allow.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::authorization::v1 as authz;
use kube::api::{Api, PostParams};
use kube::Client;

use super::cache::TtlCache;
use super::metrics::{DelegatedMetrics, Review};
use super::{digest, extra_or_none, non_empty, DelegatedError};
use crate::auth::attributes::{Attributes, Decision, Request, ResourceAttributes};
use crate::auth::UserInfo;

/// kube's `--authorization-webhook-cache-authorized-ttl` default.
pub const DEFAULT_ALLOW_TTL: Duration = Duration::from_secs(10);
/// kube's `--authorization-webhook-cache-unauthorized-ttl` default.
pub const DEFAULT_DENY_TTL: Duration = Duration::from_secs(10);
/// Entries per cache by default (kube's webhook authorizer keeps 8192).
pub const DEFAULT_SAR_CACHE_SIZE: usize = 8192;

/// How answers are cached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SarConfig {
    pub allow_ttl: Duration,
    /// For `Deny` and `NoOpinion` answers.
    pub deny_ttl: Duration,
    /// At most this many entries in each of the allow and deny caches; 0 disables caching.
    pub cache_size: usize,
}

impl Default for SarConfig {
    fn default() -> Self {
        SarConfig { allow_ttl: DEFAULT_ALLOW_TTL, deny_ttl: DEFAULT_DENY_TTL, cache_size: DEFAULT_SAR_CACHE_SIZE }
    }
}

/// Authorizes with SubjectAccessReview. Cheap to clone (the caches are shared).
#[derive(Clone)]
pub struct SarAuthorizer {
    api: Api<authz::SubjectAccessReview>,
    config: Arc<SarConfig>,
    allowed: Arc<TtlCache<[u8; 32], Decision>>,
    denied: Arc<TtlCache<[u8; 32], Decision>>,
    metrics: DelegatedMetrics,
}

impl std::fmt::Debug for SarAuthorizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SarAuthorizer").field("config", &self.config).finish_non_exhaustive()
    }
}

impl SarAuthorizer {
    pub fn new(client: Client, config: SarConfig) -> Self {
        SarAuthorizer {
            api: Api::all(client),
            allowed: Arc::new(TtlCache::new(config.cache_size)),
            denied: Arc::new(TtlCache::new(config.cache_size)),
            config: Arc::new(config),
            metrics: DelegatedMetrics::default(),
        }
    }

    /// Records reviews and cache lookups in `metrics` (registered ones, for `/metrics`).
    pub fn with_metrics(mut self, metrics: DelegatedMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    pub fn config(&self) -> &SarConfig {
        &self.config
    }

    /// How many allow and deny answers are cached (expired ones not yet dropped included).
    pub fn cached(&self) -> (usize, usize) {
        (self.allowed.len(), self.denied.len())
    }

    /// The cluster's decision on `attributes`; `Err` when it could not be asked.
    pub async fn authorize(&self, attributes: &Attributes) -> Result<Decision, DelegatedError> {
        let spec = review_spec(attributes);
        let key = serde_json::to_vec(&spec).ok().map(|json| digest(&json));
        let cached = key.as_ref().and_then(|key| self.allowed.get(key).or_else(|| self.denied.get(key)));
        self.metrics.cache_lookup(Review::Authz, cached.is_some());
        if let Some(decision) = cached {
            return Ok(decision);
        }
        let review = authz::SubjectAccessReview { spec, ..Default::default() };
        let started = std::time::Instant::now();
        let answer = self.api.create(&PostParams::default(), &review).await;
        self.metrics.request(Review::Authz, started, &answer);
        let answer = answer.map_err(|source| DelegatedError::Request { what: "SubjectAccessReview", source })?;
        let status = answer.status.ok_or_else(|| DelegatedError::Response {
            what: "SubjectAccessReview",
            detail: "the answer has no status".into(),
        })?;
        let decision = decision_of(&status);
        if let Some(key) = key {
            match decision {
                Decision::Allow(_) => self.allowed.insert(key, decision.clone(), self.config.allow_ttl),
                _ => self.denied.insert(key, decision.clone(), self.config.deny_ttl),
            }
        }
        Ok(decision)
    }

    /// Whether `user` may `verb` the `resource` in API `group` (empty = core) in `namespace` (empty =
    /// cluster scope), named `name` (empty = any): e.g. `can(user, "get", "", "secrets", "team-a",
    /// "pull-secret")`. `NoOpinion` is `false`.
    pub async fn can(
        &self,
        user: &UserInfo,
        verb: &str,
        group: &str,
        resource: &str,
        namespace: &str,
        name: &str,
    ) -> Result<bool, DelegatedError> {
        let request = ResourceAttributes {
            verb: verb.to_owned(),
            group: group.to_owned(),
            resource: resource.to_owned(),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            ..ResourceAttributes::default()
        };
        Ok(self.authorize(&Attributes::resource(user.clone(), request)).await?.is_allowed())
    }
}

/// The SubjectAccessReview spec asking about `attributes`.
pub fn review_spec(attributes: &Attributes) -> authz::SubjectAccessReviewSpec {
    let user = &attributes.user;
    let (resource_attributes, non_resource_attributes) = match &attributes.request {
        Request::Resource(r) => {
            let r = authz::ResourceAttributes {
                namespace: non_empty(&r.namespace),
                verb: non_empty(&r.verb),
                group: non_empty(&r.group),
                version: non_empty(&r.version),
                resource: non_empty(&r.resource),
                subresource: non_empty(&r.subresource),
                name: non_empty(&r.name),
                ..Default::default()
            };
            (Some(r), None)
        }
        Request::NonResource(n) => {
            (None, Some(authz::NonResourceAttributes { path: non_empty(&n.path), verb: non_empty(&n.verb) }))
        }
    };
    authz::SubjectAccessReviewSpec {
        user: non_empty(&user.name),
        uid: non_empty(&user.uid),
        groups: (!user.groups.is_empty()).then(|| user.groups.clone()),
        extra: extra_or_none(&user.extra),
        resource_attributes,
        non_resource_attributes,
    }
}

/// kube's webhook authorizer's reading of a status; the reason carries `evaluationError` too.
fn decision_of(status: &authz::SubjectAccessReviewStatus) -> Decision {
    let reason = status.reason.as_deref().unwrap_or_default();
    let reason = match status.evaluation_error.as_deref().filter(|e| !e.is_empty()) {
        Some(error) if reason.is_empty() => error.to_owned(),
        Some(error) => format!("{reason}: {error}"),
        None => reason.to_owned(),
    };
    let denied = status.denied == Some(true);
    match (status.allowed, denied) {
        (true, true) => {
            tracing::warn!(reason = %reason, "SubjectAccessReview answered both allowed and denied; denying");
            Decision::Deny(reason)
        }
        (_, true) => Decision::Deny(reason),
        (true, false) => Decision::Allow(reason),
        (false, false) => Decision::NoOpinion(reason),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(allowed: bool, denied: Option<bool>, reason: &str, error: &str) -> authz::SubjectAccessReviewStatus {
        authz::SubjectAccessReviewStatus {
            allowed,
            denied,
            reason: non_empty(reason),
            evaluation_error: non_empty(error),
        }
    }

    #[test]
    fn statuses_map_to_decisions() {
        assert_eq!(decision_of(&status(true, None, "ok", "")), Decision::Allow("ok".into()));
        assert_eq!(decision_of(&status(false, Some(true), "no", "")), Decision::Deny("no".into()));
        assert_eq!(decision_of(&status(true, Some(true), "both", "")), Decision::Deny("both".into()));
        assert_eq!(decision_of(&status(false, Some(false), "", "")), Decision::NoOpinion(String::new()));
        assert_eq!(decision_of(&status(false, None, "", "boom")), Decision::NoOpinion("boom".into()));
        assert_eq!(decision_of(&status(false, None, "r", "e")), Decision::NoOpinion("r: e".into()));
    }

    #[test]
    fn specs_carry_the_user_and_one_kind_of_attributes() {
        let user = UserInfo {
            name: "alice".into(),
            uid: "u1".into(),
            groups: vec!["dev".into()],
            extra: [("k".to_owned(), vec!["v".to_owned()])].into(),
        };
        let spec = review_spec(&Attributes::non_resource(user.clone(), "get", "/metrics"));
        let json = serde_json::to_value(&spec).unwrap_or_default();
        assert_eq!(
            json,
            serde_json::json!({"user": "alice", "uid": "u1", "groups": ["dev"], "extra": {"k": ["v"]},
                "nonResourceAttributes": {"path": "/metrics", "verb": "get"}})
        );
        let r = ResourceAttributes { verb: "get".into(), resource: "secrets".into(), ..Default::default() };
        let spec = review_spec(&Attributes::resource(UserInfo { name: "bob".into(), ..Default::default() }, r));
        let json = serde_json::to_value(&spec).unwrap_or_default();
        assert_eq!(
            json,
            serde_json::json!({"user": "bob", "resourceAttributes": {"verb": "get", "resource": "secrets"}})
        );
    }
}
