//! Impersonation, as kube-apiserver does it (`kubectl --as`, `--as-group`, `--as-uid`): the
//! `Impersonate-User`, `Impersonate-Group`, `Impersonate-Uid` and `Impersonate-Extra-KEY` headers
//! make the request run as the user they describe, once the authorizer allowed the caller the
//! `impersonate` verb on each part (`users` or `serviceaccounts`, `groups`, and in API group
//! `authentication.k8s.io` `uids` and `userextras/KEY`). Never ignored: a part the caller may not
//! impersonate is a 403 naming it, as in kube-apiserver. The same path serves both modes: the RBAC
//! policy decides standalone, a SubjectAccessReview in a cluster (through the aggregator the
//! kube-apiserver has already resolved the headers and removed them).

use std::collections::BTreeMap;

use http::HeaderMap;

use super::attributes::{Attributes, ResourceAttributes, ALL_UNAUTHENTICATED, ANONYMOUS};
use super::authz::Authorizer;
use super::delegated::DelegatedError;
use super::UserInfo;

const USER: &str = "impersonate-user";
const GROUP: &str = "impersonate-group";
const UID: &str = "impersonate-uid";
const EXTRA_PREFIX: &str = "impersonate-extra-";
const AUTHENTICATION_GROUP: &str = "authentication.k8s.io";
const SERVICE_ACCOUNT_PREFIX: &str = "system:serviceaccount:";

/// Why a request could not run as the user it asked to be.
#[derive(Debug, thiserror::Error)]
pub enum ImpersonationError {
    /// The headers do not describe a user (groups without a user, a header that is not text).
    #[error("{0}")]
    Invalid(String),
    /// The caller may not impersonate this part of the user.
    #[error("{}", .0.forbidden_status_message(.1))]
    Forbidden(Box<Attributes>, String),
    #[error("authorization is unavailable: {0}")]
    Unavailable(#[from] DelegatedError),
}

/// The user `headers` ask to run as, if they ask: `Ok(None)` without impersonation headers.
pub async fn impersonated(
    caller: &UserInfo,
    headers: &HeaderMap,
    authorizer: &Authorizer,
) -> Result<Option<UserInfo>, ImpersonationError> {
    let text = |value: &http::HeaderValue, name: &str| {
        value.to_str().map(str::to_owned).map_err(|_| ImpersonationError::Invalid(format!("header {name} is not text")))
    };
    let name = match headers.get(USER) {
        Some(value) => Some(text(value, USER)?),
        None => None,
    };
    let mut groups = headers.get_all(GROUP).iter().map(|v| text(v, GROUP)).collect::<Result<Vec<_>, _>>()?;
    let uid = match headers.get(UID) {
        Some(value) => Some(text(value, UID)?),
        None => None,
    };
    let mut extra: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (header, value) in headers {
        if let Some(key) = header.as_str().strip_prefix(EXTRA_PREFIX) {
            let key = percent_decode(key).to_lowercase();
            extra.entry(key).or_default().push(text(value, header.as_str())?);
        }
    }
    let Some(name) = name.filter(|n| !n.is_empty()) else {
        if groups.is_empty() && uid.is_none() && extra.is_empty() {
            return Ok(None);
        }
        return Err(ImpersonationError::Invalid(
            "impersonating groups, a uid or extra fields needs a user to impersonate (Impersonate-User)".into(),
        ));
    };

    // Each part the caller asks for must be allowed to them.
    let mut checks = Vec::new();
    match service_account(&name) {
        Some((namespace, account)) => {
            checks.push(attributes("", "serviceaccounts", "", namespace, account));
            if groups.is_empty() {
                groups = vec!["system:serviceaccounts".into(), format!("system:serviceaccounts:{namespace}")];
            }
        }
        None => checks.push(attributes("", "users", "", "", &name)),
    }
    for group in &groups {
        checks.push(attributes("", "groups", "", "", group));
    }
    if let Some(uid) = &uid {
        checks.push(attributes(AUTHENTICATION_GROUP, "uids", "", "", uid));
    }
    for (key, values) in &extra {
        for value in values {
            checks.push(attributes(AUTHENTICATION_GROUP, "userextras", key, "", value));
        }
    }
    for check in checks {
        let question = Attributes::resource(caller.clone(), check);
        let decision = authorizer.authorize(&question).await?;
        if !decision.is_allowed() {
            let reason = decision.reason().to_owned();
            return Err(ImpersonationError::Forbidden(Box::new(question), reason));
        }
    }
    let user = UserInfo { name, uid: uid.unwrap_or_default(), groups, extra };
    // As kube-apiserver: the anonymous user is unauthenticated, everyone else authenticated.
    Ok(Some(if user.name == ANONYMOUS && !user.groups.iter().any(|g| g == ALL_UNAUTHENTICATED) {
        UserInfo { groups: [user.groups, vec![ALL_UNAUTHENTICATED.into()]].concat(), ..user }
    } else {
        user.with_authenticated_group()
    }))
}

/// Removes the impersonation headers: what runs after sees only the user they made.
pub fn strip_headers(headers: &mut HeaderMap) {
    let names: Vec<http::HeaderName> = headers
        .keys()
        .filter(|h| [USER, GROUP, UID].contains(&h.as_str()) || h.as_str().starts_with(EXTRA_PREFIX))
        .cloned()
        .collect();
    for name in names {
        headers.remove(name);
    }
}

fn attributes(group: &str, resource: &str, subresource: &str, namespace: &str, name: &str) -> ResourceAttributes {
    ResourceAttributes {
        namespace: namespace.into(),
        verb: "impersonate".into(),
        group: group.into(),
        resource: resource.into(),
        subresource: subresource.into(),
        name: name.into(),
        ..ResourceAttributes::default()
    }
}

/// `system:serviceaccount:NS:NAME` → (NS, NAME).
fn service_account(name: &str) -> Option<(&str, &str)> {
    let (namespace, account) = name.strip_prefix(SERVICE_ACCOUNT_PREFIX)?.split_once(':')?;
    (!namespace.is_empty() && !account.is_empty() && !account.contains(':')).then_some((namespace, account))
}

/// Extra keys travel percent-encoded in header names (`Impersonate-Extra-scopes%2Fx`).
fn percent_decode(text: &str) -> String {
    percent_encoding::percent_decode_str(text).decode_utf8_lossy().into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_accounts_and_extra_keys() {
        assert_eq!(service_account("system:serviceaccount:team:builder"), Some(("team", "builder")));
        assert_eq!(service_account("system:serviceaccount:team"), None);
        assert_eq!(service_account("alice"), None);
        assert_eq!(percent_decode("scopes%2Fx"), "scopes/x");
        assert_eq!(percent_decode("plain%zz"), "plain%zz");
    }
}
