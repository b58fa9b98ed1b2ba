//! The claims of a kube service-account JWT (`kubernetes.io`: namespace, service account, bound pod,
//! node or secret, `warnafter`) and the user the kube-apiserver makes of them
//! (`pkg/serviceaccount`: `ServiceAccountInfo.UserInfo`), once the signature and the registered claims
//! have been verified.

use std::time::Duration;

use serde::Deserialize;

use super::service_account::Verdict;
use crate::auth::UserInfo;

pub const POD_NAME_KEY: &str = "authentication.kubernetes.io/pod-name";
pub const POD_UID_KEY: &str = "authentication.kubernetes.io/pod-uid";
pub const NODE_NAME_KEY: &str = "authentication.kubernetes.io/node-name";
pub const NODE_UID_KEY: &str = "authentication.kubernetes.io/node-uid";
pub const CREDENTIAL_ID_KEY: &str = "authentication.kubernetes.io/credential-id";

#[derive(Deserialize)]
pub(crate) struct Claims {
    sub: String,
    exp: Option<f64>,
    jti: Option<String>,
    iat: Option<f64>,
    #[serde(rename = "kubernetes.io")]
    kubernetes: Option<KubeClaims>,
}

impl Claims {
    /// How long the token may still be verified locally: until `exp` or a `warnafter` (if any),
    /// whichever is first; `None` if that is past or unknown.
    pub(crate) fn remaining_lifetime(&self) -> Option<Duration> {
        let warnafter = self.kubernetes.as_ref().and_then(|k| k.warnafter).filter(|w| *w > 0.0);
        let until = match (self.exp, warnafter) {
            (Some(exp), Some(warnafter)) => exp.min(warnafter),
            (Some(exp), None) => exp,
            (None, _) => return None,
        };
        let left = until - jsonwebtoken::get_current_timestamp() as f64;
        (left > 0.0).then(|| Duration::from_secs_f64(left.min(u32::MAX as f64)))
    }
}

#[derive(Deserialize)]
pub(crate) struct KubeClaims {
    #[serde(default)]
    namespace: String,
    serviceaccount: Option<Ref>,
    pod: Option<Ref>,
    secret: Option<Ref>,
    node: Option<Ref>,
    warnafter: Option<f64>,
}

#[derive(Deserialize)]
struct Ref {
    #[serde(default)]
    name: String,
    #[serde(default)]
    uid: String,
}

/// The user of verified claims, or why they are not for local verification.
pub(crate) fn user_of(claims: Claims, leeway: Duration) -> Verdict {
    let now = jsonwebtoken::get_current_timestamp() as f64;
    if claims.iat.is_some_and(|iat| iat > now + leeway.as_secs_f64()) {
        return Verdict::Rejected("service account token is issued in the future".into());
    }
    let Some(k) = claims.kubernetes else {
        return Verdict::Rejected("not a service account token: no kubernetes.io claims".into());
    };
    let sa = k.serviceaccount.unwrap_or(Ref { name: String::new(), uid: String::new() });
    if k.namespace.is_empty() || sa.name.is_empty() {
        return Verdict::Rejected("service account token without namespace or service account".into());
    }
    let name = format!("system:serviceaccount:{}:{}", k.namespace, sa.name);
    if claims.sub != name {
        return Verdict::Rejected(format!("subject {:?} does not match the kubernetes.io claims", claims.sub));
    }
    if k.warnafter.is_some_and(|w| w > 0.0 && now > w) {
        return Verdict::NotLocal("past warnafter: the bound objects must be checked".into());
    }
    if k.secret.is_some() || (k.node.is_some() && k.pod.is_none()) {
        return Verdict::NotLocal("bound to a secret or node: the bound object must be checked".into());
    }
    let mut user = UserInfo {
        name,
        uid: sa.uid,
        groups: vec!["system:serviceaccounts".into(), format!("system:serviceaccounts:{}", k.namespace)],
        ..UserInfo::default()
    };
    if let Some(pod) = k.pod.filter(|p| !p.name.is_empty() && !p.uid.is_empty()) {
        user.extra.insert(POD_NAME_KEY.into(), vec![pod.name]);
        user.extra.insert(POD_UID_KEY.into(), vec![pod.uid]);
    }
    if let Some(jti) = claims.jti.filter(|j| !j.is_empty()) {
        user.extra.insert(CREDENTIAL_ID_KEY.into(), vec![format!("JTI={jti}")]);
    }
    if let Some(node) = k.node.filter(|n| !n.name.is_empty()) {
        user.extra.insert(NODE_NAME_KEY.into(), vec![node.name]);
        if !node.uid.is_empty() {
            user.extra.insert(NODE_UID_KEY.into(), vec![node.uid]);
        }
    }
    Verdict::Verified(user)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claims(value: serde_json::Value) -> Claims {
        serde_json::from_value(value).unwrap_or_else(|e| panic!("claims: {e}"))
    }

    fn verified(verdict: Verdict) -> UserInfo {
        match verdict {
            Verdict::Verified(user) => user,
            other => panic!("not verified: {other:?}"),
        }
    }

    const LEEWAY: Duration = Duration::from_secs(60);

    #[test]
    fn bound_tokens_map_to_kube_users() {
        let user = verified(user_of(
            claims(serde_json::json!({"sub": "system:serviceaccount:ns:sa", "jti": "j1", "iat": 1,
                "kubernetes.io": {"namespace": "ns", "serviceaccount": {"name": "sa", "uid": "sa-uid"},
                    "pod": {"name": "p", "uid": "p-uid"}, "node": {"name": "n", "uid": "n-uid"}}})),
            LEEWAY,
        ));
        assert_eq!(user.name, "system:serviceaccount:ns:sa");
        assert_eq!(user.uid, "sa-uid");
        assert_eq!(user.groups, ["system:serviceaccounts", "system:serviceaccounts:ns"]);
        let extra: Vec<(&str, &str)> =
            user.extra.iter().map(|(k, v)| (k.as_str(), v.first().map_or("", String::as_str))).collect();
        assert_eq!(
            extra,
            [
                (CREDENTIAL_ID_KEY, "JTI=j1"),
                (NODE_NAME_KEY, "n"),
                (NODE_UID_KEY, "n-uid"),
                (POD_NAME_KEY, "p"),
                (POD_UID_KEY, "p-uid")
            ]
        );
        let plain = verified(user_of(
            claims(serde_json::json!({"sub": "system:serviceaccount:ns:sa",
                "kubernetes.io": {"namespace": "ns", "serviceaccount": {"name": "sa", "uid": "u"}}})),
            LEEWAY,
        ));
        assert!(plain.extra.is_empty());
    }

    #[test]
    fn remaining_lifetime_ends_at_exp_or_warnafter() {
        let now = jsonwebtoken::get_current_timestamp() as f64;
        let k = |warnafter: f64| serde_json::json!({"namespace": "ns", "warnafter": warnafter});
        let left = |v: serde_json::Value| claims(v).remaining_lifetime().map(|d| d.as_secs());
        assert!(left(serde_json::json!({"sub": "s", "exp": now + 100.0})).is_some_and(|s| (98..=100).contains(&s)));
        let early = serde_json::json!({"sub": "s", "exp": now + 100.0, "kubernetes.io": k(now + 30.0)});
        assert!(left(early).is_some_and(|s| (28..=30).contains(&s)));
        assert_eq!(left(serde_json::json!({"sub": "s", "exp": now - 1.0})), None);
        assert_eq!(left(serde_json::json!({"sub": "s"})), None);
    }

    #[test]
    fn what_cannot_be_checked_locally_is_not_local() {
        let sa = serde_json::json!({"name": "sa", "uid": "u"});
        let not_local = |k: serde_json::Value| {
            let c = claims(serde_json::json!({"sub": "system:serviceaccount:ns:sa", "kubernetes.io": k}));
            matches!(user_of(c, LEEWAY), Verdict::NotLocal(_))
        };
        assert!(not_local(serde_json::json!({"namespace": "ns", "serviceaccount": sa, "warnafter": 1})));
        assert!(not_local(serde_json::json!({"namespace": "ns", "serviceaccount": sa, "secret": {"name": "s"}})));
        assert!(not_local(serde_json::json!({"namespace": "ns", "serviceaccount": sa, "node": {"name": "n"}})));
    }

    #[test]
    fn inconsistent_claims_are_rejected() {
        let rejected = |v: serde_json::Value| matches!(user_of(claims(v), LEEWAY), Verdict::Rejected(_));
        let k = serde_json::json!({"namespace": "ns", "serviceaccount": {"name": "sa", "uid": "u"}});
        assert!(rejected(serde_json::json!({"sub": "system:serviceaccount:ns:other", "kubernetes.io": k})));
        assert!(rejected(serde_json::json!({"sub": "system:serviceaccount:ns:sa"})));
        assert!(rejected(serde_json::json!({"sub": "system:serviceaccount:ns:sa", "iat": 4e10, "kubernetes.io": k})));
        let no_sa = serde_json::json!({"namespace": "ns"});
        assert!(rejected(serde_json::json!({"sub": "system:serviceaccount:ns:", "kubernetes.io": no_sa})));
    }
}
