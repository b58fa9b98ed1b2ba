//! Authentication: who sent a request, in kube-apiserver's order — the front proxy's
//! `X-Remote-*` headers (only on a connection whose certificate is the front proxy's), a client
//! certificate from the client CA, a bearer token, else anonymous (if allowed). Every user but
//! the anonymous one gets `system:authenticated`.
//!
//! The request-header headers are believed only from the front proxy and are removed from every
//! request before anything else reads it: a forged header never becomes an identity.

use std::sync::Arc;

use axum::http::{header, HeaderMap, HeaderName};

use super::delegated::DelegatedTokenAuthenticator;
use super::token_file::TokenFile;
use super::trust::{ClientTrust, PeerCertificate, RequestHeaderConfig};
use super::UserInfo;

/// Why a request has no identity (401).
#[derive(Debug, thiserror::Error)]
pub enum AuthnError {
    #[error("invalid bearer token")]
    InvalidToken,
    /// The cluster could not be asked (a 5xx: the token may be fine).
    #[error("token review failed: {0}")]
    Unavailable(String),
    #[error("no credentials and anonymous requests are not allowed")]
    Anonymous,
}

/// Where bearer tokens are checked, in order.
pub enum TokenAuthenticator {
    /// `--token-auth-file`.
    File(TokenFile),
    /// In a cluster: service-account JWTs verified locally, else a TokenReview (boxed: it holds kube
    /// clients, ~300 bytes).
    Delegated(Box<DelegatedTokenAuthenticator>),
}

/// The authentication chain.
pub struct Authenticator {
    pub trust: Arc<ClientTrust>,
    pub tokens: Vec<TokenAuthenticator>,
    pub anonymous: bool,
}

impl Authenticator {
    /// The user behind a request, from what its connection proved and its headers.
    pub async fn authenticate(&self, peer: &PeerCertificate, headers: &HeaderMap) -> Result<UserInfo, AuthnError> {
        if let PeerCertificate::FrontProxy { .. } = peer {
            if let Some(user) = from_request_headers(&self.trust.request_header_config(), headers) {
                return Ok(user.with_authenticated_group());
            }
        }
        if let PeerCertificate::User(user) = peer {
            return Ok(user.clone().with_authenticated_group());
        }
        if let Some(token) = bearer_token(headers) {
            for authenticator in &self.tokens {
                let found = match authenticator {
                    TokenAuthenticator::File(file) => file.authenticate(token),
                    TokenAuthenticator::Delegated(delegated) => {
                        delegated.authenticate(token).await.map_err(|e| AuthnError::Unavailable(e.to_string()))?
                    }
                };
                if let Some(user) = found {
                    return Ok(user.with_authenticated_group());
                }
            }
            // A presented token that no authenticator accepts is a 401, never anonymous.
            return Err(AuthnError::InvalidToken);
        }
        if self.anonymous {
            Ok(UserInfo::anonymous())
        } else {
            Err(AuthnError::Anonymous)
        }
    }

    /// Removes every header a front proxy could use to assert an identity (after authentication,
    /// on every request, as kube-apiserver does).
    pub fn strip_request_headers(&self, headers: &mut HeaderMap) {
        let config = self.trust.request_header_config();
        let names: Vec<HeaderName> =
            headers.keys().filter(|name| is_request_header(&config, name.as_str())).cloned().collect();
        for name in names {
            headers.remove(name);
        }
    }
}

fn is_request_header(config: &RequestHeaderConfig, name: &str) -> bool {
    let eq = |h: &String| h.eq_ignore_ascii_case(name);
    config.username_headers.iter().any(eq)
        || config.group_headers.iter().any(eq)
        || config
            .extra_headers_prefixes
            .iter()
            .any(|p| name.len() >= p.len() && name[..p.len()].eq_ignore_ascii_case(p))
        || RequestHeaderConfig::default().username_headers.iter().any(eq)
        || RequestHeaderConfig::default().group_headers.iter().any(eq)
        || name.to_ascii_lowercase().starts_with("x-remote-extra-")
}

/// The user a front proxy asserts: the first non-empty username header; every value of the group
/// headers; extras from prefixed headers (key lower-cased and unescaped, kube's rule).
fn from_request_headers(config: &RequestHeaderConfig, headers: &HeaderMap) -> Option<UserInfo> {
    let values = |name: &str| {
        headers.get_all(name).iter().filter_map(|v| v.to_str().ok()).map(str::to_owned).collect::<Vec<String>>()
    };
    let name = config.username_headers.iter().flat_map(|h| values(h)).find(|v| !v.is_empty())?;
    let groups = config.group_headers.iter().flat_map(|h| values(h)).filter(|g| !g.is_empty()).collect();
    let mut user = UserInfo { name, groups, ..UserInfo::default() };
    for (header_name, value) in headers {
        let lower = header_name.as_str();
        let Some(prefix) = config
            .extra_headers_prefixes
            .iter()
            .find(|p| lower.len() > p.len() && lower[..p.len()].eq_ignore_ascii_case(p))
        else {
            continue;
        };
        let key = percent_decode(&lower[prefix.len()..].to_ascii_lowercase());
        if let Ok(value) = value.to_str() {
            user.extra.entry(key).or_default().push(value.to_owned());
        }
    }
    Some(user)
}

fn percent_decode(text: &str) -> String {
    percent_encoding::percent_decode_str(text).decode_utf8_lossy().into_owned()
}

/// `Authorization: Bearer TOKEN` (scheme case-insensitive); other schemes are not ours.
fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?.trim();
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (k, v) in pairs {
            map.append(HeaderName::from_bytes(k.as_bytes()).unwrap(), v.parse().unwrap());
        }
        map
    }

    #[test]
    fn request_headers_name_user_groups_and_extras() {
        let config = RequestHeaderConfig::default();
        let h = headers(&[
            ("x-remote-user", "bob"),
            ("x-remote-group", "team-a"),
            ("x-remote-group", "team-b"),
            ("x-remote-extra-scopes", "read"),
            ("x-remote-extra-acme.com%2Fproject", "p1"),
        ]);
        let user = from_request_headers(&config, &h).unwrap();
        assert_eq!(user.name, "bob");
        assert_eq!(user.groups, ["team-a", "team-b"]);
        assert_eq!(user.extra.get("scopes").unwrap(), &vec!["read".to_owned()]);
        assert_eq!(user.extra.get("acme.com/project").unwrap(), &vec!["p1".to_owned()]);
        assert!(from_request_headers(&config, &headers(&[("x-remote-group", "g")])).is_none());
    }

    #[test]
    fn bearer_tokens() {
        assert_eq!(bearer_token(&headers(&[("authorization", "Bearer abc")])), Some("abc"));
        assert_eq!(bearer_token(&headers(&[("authorization", "bearer  abc ")])), Some("abc"));
        assert_eq!(bearer_token(&headers(&[("authorization", "Basic abc")])), None);
        assert_eq!(bearer_token(&headers(&[("authorization", "Bearer ")])), None);
    }
}
