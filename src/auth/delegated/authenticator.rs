//! Bearer tokens in a cluster: service-account JWTs verified locally when possible, everything else
//! (and whatever local verification cannot decide) by TokenReview.
//!
//! [`DelegatedTokenAuthenticator::authenticate`]: a [`Verdict::Verified`] token is that user, a
//! [`Verdict::Rejected`] one is refused without asking the cluster, a [`Verdict::NotLocal`] one goes to
//! the [`TokenReviewer`] (and its cache). Use the same audiences for both (as [`DelegatedTokenAuthenticator::from_client`]
//! does), or the two halves accept different tokens.

use kube::Client;

use super::service_account::{ServiceAccountConfig, ServiceAccountVerifier, Verdict};
use super::token_review::{TokenReviewConfig, TokenReviewer};
use super::DelegatedError;
use crate::auth::UserInfo;

/// Local-then-TokenReview bearer-token authentication. Cheap to clone.
#[derive(Clone, Debug)]
pub struct DelegatedTokenAuthenticator {
    local: Option<ServiceAccountVerifier>,
    review: TokenReviewer,
}

impl DelegatedTokenAuthenticator {
    /// `local: None` sends every token to TokenReview.
    pub fn new(local: Option<ServiceAccountVerifier>, review: TokenReviewer) -> Self {
        DelegatedTokenAuthenticator { local, review }
    }

    /// Both halves with their defaults and these audiences (empty = the cluster's API audiences).
    pub fn from_client(client: Client, audiences: Vec<String>) -> Self {
        let local = ServiceAccountConfig { audiences: audiences.clone(), ..ServiceAccountConfig::default() };
        let review = TokenReviewConfig { audiences, ..TokenReviewConfig::default() };
        Self::new(Some(ServiceAccountVerifier::new(client.clone(), local)), TokenReviewer::new(client, review))
    }

    /// Records the TokenReview half's requests and cache lookups in `metrics`.
    pub fn with_metrics(mut self, metrics: super::DelegatedMetrics) -> Self {
        self.review = self.review.with_metrics(metrics);
        self
    }

    pub fn service_accounts(&self) -> Option<&ServiceAccountVerifier> {
        self.local.as_ref()
    }

    pub fn token_reviewer(&self) -> &TokenReviewer {
        &self.review
    }

    /// Who `token` is: `Ok(None)` if refused, `Err` if TokenReview was needed and could not be asked.
    pub async fn authenticate(&self, token: &str) -> Result<Option<UserInfo>, DelegatedError> {
        if let Some(local) = &self.local {
            match local.verify(token).await {
                Verdict::Verified(user) => return Ok(Some(user)),
                Verdict::Rejected(reason) => {
                    tracing::debug!(reason = %reason, "service account token refused");
                    return Ok(None);
                }
                Verdict::NotLocal(reason) => tracing::trace!(reason = %reason, "token goes to TokenReview"),
            }
        }
        self.review.authenticate(token).await
    }
}
