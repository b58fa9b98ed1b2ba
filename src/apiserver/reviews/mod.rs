//! The self reviews kube-apiserver serves every authenticated user, served by a standalone server
//! (in a cluster the kube-apiserver serves them itself and the aggregator never routes them here):
//! `SelfSubjectReview` (`kubectl auth whoami`: who the server thinks you are),
//! `SelfSubjectAccessReview` (`kubectl auth can-i VERB RESOURCE`) and `SelfSubjectRulesReview`
//! (`kubectl auth can-i --list`), answered by the authorizer in force exactly as it answers
//! requests. The bootstrap policy lets every authenticated user create them (kube's
//! `system:basic-user`). Bodies are k8s-openapi's types, sent as JSON, YAML or (as kubectl sends
//! them) Kubernetes protobuf (`protobuf.rs`); one that is not a review gets a 400 or 422 in plain
//! words that never repeat what was sent. Answers are JSON.

mod protobuf;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;
use k8s_openapi::api::authentication::v1 as authn;
use k8s_openapi::api::authorization::v1 as authz;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use super::access::Identity;
use super::discovery;
use super::handlers::json_response;
use super::status::{ApiError, ApiResult, Cause, UndecodableBody};
use super::AppState;
use crate::auth::attributes::{Attributes, Decision, NonResourceAttributes, Request, ResourceAttributes};
use crate::auth::rbac::PolicyRule;

pub const AUTHENTICATION: &str = "authentication.k8s.io";
pub const AUTHORIZATION: &str = "authorization.k8s.io";

/// A review resource, as discovery describes it: cluster-scoped, `create` only.
pub struct ReviewResource {
    pub group: &'static str,
    pub plural: &'static str,
    pub singular: &'static str,
    pub kind: &'static str,
}

/// Every review served, by group (the one list discovery renders).
pub const REVIEWS: &[ReviewResource] = &[
    ReviewResource {
        group: AUTHENTICATION,
        plural: "selfsubjectreviews",
        singular: "selfsubjectreview",
        kind: "SelfSubjectReview",
    },
    ReviewResource {
        group: AUTHORIZATION,
        plural: "selfsubjectaccessreviews",
        singular: "selfsubjectaccessreview",
        kind: "SelfSubjectAccessReview",
    },
    ReviewResource {
        group: AUTHORIZATION,
        plural: "selfsubjectrulesreviews",
        singular: "selfsubjectrulesreview",
        kind: "SelfSubjectRulesReview",
    },
];

/// The review groups' one version.
pub const VERSION: &str = "v1";

/// A review body is a few hundred bytes; a larger one is refused before it is read.
const MAX_REVIEW_BYTES: usize = 64 << 10;

/// The reviews and their groups' discovery documents, when the server is standalone; nothing when
/// it is delegated.
pub fn routes(standalone: bool) -> Router<AppState> {
    if !standalone {
        return Router::new();
    }
    let mut router = Router::new();
    for group in [AUTHENTICATION, AUTHORIZATION] {
        router = router
            .route(&format!("/apis/{group}"), get(move |h: HeaderMap| discovery::review_group(h, group)))
            .route(&format!("/apis/{group}/{VERSION}"), get(move |h: HeaderMap| discovery::review_resources(h, group)));
    }
    router
        .route("/apis/authentication.k8s.io/v1/selfsubjectreviews", post(self_subject_review))
        .route("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", post(self_subject_access_review))
        .route("/apis/authorization.k8s.io/v1/selfsubjectrulesreviews", post(self_subject_rules_review))
        .layer(DefaultBodyLimit::max(MAX_REVIEW_BYTES))
}

/// `kubectl auth whoami`: the user as authentication found them.
async fn self_subject_review(Identity(user): Identity, headers: HeaderMap, body: Bytes) -> ApiResult<Response> {
    let mut review: authn::SelfSubjectReview = decode(&headers, &body)?;
    review.metadata = Default::default();
    let user_info = authn::UserInfo {
        username: Some(user.name),
        uid: Some(user.uid).filter(|u| !u.is_empty()),
        groups: Some(user.groups).filter(|g| !g.is_empty()),
        extra: Some(user.extra).filter(|e| !e.is_empty()),
    };
    review.status = Some(authn::SelfSubjectReviewStatus { user_info: Some(user_info) });
    let mut body = to_json(&review);
    // As kube-apiserver stamps it (k8s-openapi's Time would need one more date crate).
    if let Some(meta) = body.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.insert("creationTimestamp".into(), crate::api::meta::now_timestamp().into());
    }
    Ok(json_response(StatusCode::CREATED, &body, &[]))
}

/// `kubectl auth can-i VERB RESOURCE` (or a path): the authorizer's decision for the caller.
async fn self_subject_access_review(
    State(app): State<AppState>,
    Identity(user): Identity,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    let mut review: authz::SelfSubjectAccessReview = decode(&headers, &body)?;
    let spec = &review.spec;
    let request = match (&spec.resource_attributes, &spec.non_resource_attributes) {
        (Some(r), None) => Request::Resource(ResourceAttributes {
            namespace: r.namespace.clone().unwrap_or_default(),
            verb: r.verb.clone().unwrap_or_default(),
            group: r.group.clone().unwrap_or_default(),
            version: r.version.clone().unwrap_or_default(),
            resource: r.resource.clone().unwrap_or_default(),
            subresource: r.subresource.clone().unwrap_or_default(),
            name: r.name.clone().unwrap_or_default(),
        }),
        (None, Some(n)) => Request::NonResource(NonResourceAttributes {
            path: n.path.clone().unwrap_or_default(),
            verb: n.verb.clone().unwrap_or_default(),
        }),
        (Some(_), Some(_)) => {
            let cause =
                Cause::forbidden("spec.nonResourceAttributes", "cannot be given together with resourceAttributes");
            return Err(invalid::<authz::SelfSubjectAccessReview>(vec![cause]));
        }
        (None, None) => {
            let cause = Cause::required(
                "spec.resourceAttributes",
                "exactly one of resourceAttributes or nonResourceAttributes must be given",
            );
            return Err(invalid::<authz::SelfSubjectAccessReview>(vec![cause]));
        }
    };
    if review.metadata != Default::default() {
        let cause = Cause::forbidden("metadata", "must be empty: a review is answered, not stored");
        return Err(invalid::<authz::SelfSubjectAccessReview>(vec![cause]));
    }
    let status = match app.access.authorizer.authorize(&Attributes { user, request }).await {
        Ok(decision) => authz::SubjectAccessReviewStatus {
            allowed: decision.is_allowed(),
            denied: matches!(decision, Decision::Deny(_)).then_some(true),
            reason: Some(decision.reason().to_owned()).filter(|r| !r.is_empty()),
            evaluation_error: None,
        },
        Err(e) => authz::SubjectAccessReviewStatus { evaluation_error: Some(e.to_string()), ..Default::default() },
    };
    review.status = Some(status);
    Ok(json_response(StatusCode::CREATED, &to_json(&review), &[]))
}

/// `kubectl auth can-i --list [-n NAMESPACE]`: every rule that applies to the caller there.
async fn self_subject_rules_review(
    State(app): State<AppState>,
    Identity(user): Identity,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    let mut review: authz::SelfSubjectRulesReview = decode(&headers, &body)?;
    let namespace = review.spec.namespace.clone().unwrap_or_default();
    if namespace.is_empty() {
        return Err(ApiError::bad_request(
            "spec.namespace is required: rules are listed for one namespace (kubectl auth can-i --list -n NAMESPACE)",
        ));
    }
    let Some(rules) = app.access.authorizer.rules_for(&user, &namespace) else {
        return Err(ApiError::not_found_message("rules reviews are answered by the cluster"));
    };
    let list = |values: &[String]| Some(values.to_vec()).filter(|v| !v.is_empty());
    let resource_rule = |rule: &PolicyRule| authz::ResourceRule {
        verbs: rule.verbs.clone(),
        api_groups: list(&rule.api_groups),
        resources: list(&rule.resources),
        resource_names: list(&rule.resource_names),
    };
    let non_resource_rule = |rule: &PolicyRule| authz::NonResourceRule {
        verbs: rule.verbs.clone(),
        non_resource_urls: list(&rule.non_resource_urls),
    };
    review.status = Some(authz::SubjectRulesReviewStatus {
        resource_rules: rules.rules.iter().filter(|r| !r.resources.is_empty()).map(resource_rule).collect(),
        non_resource_rules: rules
            .rules
            .iter()
            .filter(|r| !r.non_resource_urls.is_empty())
            .map(non_resource_rule)
            .collect(),
        incomplete: false,
        evaluation_error: rules.evaluation_error(),
    });
    Ok(json_response(StatusCode::CREATED, &to_json(&review), &[]))
}

/// The body as a `T`, in the encoding its Content-Type names (JSON when it names none).
/// `apiVersion` and `kind` may be left out (the URL says what is meant), as kube-apiserver's
/// decoder allows.
fn decode<T: k8s_openapi::Resource + DeserializeOwned>(headers: &HeaderMap, body: &[u8]) -> ApiResult<T> {
    let (kind, api_version) = (T::KIND, T::API_VERSION);
    let cannot = |problem: String| ApiError::from(UndecodableBody { kind, version: "v1", problem: &problem });
    let media_type = headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(|v| v.trim().to_ascii_lowercase())
        .unwrap_or_default();
    let mut value: Value = match media_type.as_str() {
        "" | "application/json" => {
            serde_json::from_slice(body).map_err(|e| cannot(format!("the body is not JSON ({e})")))?
        }
        "application/yaml" => serde_yaml_ng::from_slice(body).map_err(|_| cannot("the body is not YAML".into()))?,
        protobuf::CONTENT_TYPE => protobuf::to_json(body, kind)
            .map_err(|error| ApiError::from(UndecodableBody { kind, version: "v1", problem: &error }))?,
        _ => {
            return Err(ApiError::unsupported_media_type(format!(
                "a {kind} is sent as application/json, application/yaml or {}",
                protobuf::CONTENT_TYPE
            )))
        }
    };
    let Some(object) = value.as_object_mut() else {
        return Err(cannot("the body is not an object".into()));
    };
    for (field, expected) in [("apiVersion", api_version), ("kind", kind)] {
        match object.get(field) {
            None | Some(Value::Null) => {
                object.insert(field.into(), expected.into());
            }
            Some(Value::String(given)) if given == expected => {}
            Some(_) => {
                return Err(ApiError::bad_request(format!(
                    "this URL takes a {kind} of {api_version}, and the body's apiVersion and kind say otherwise"
                )))
            }
        }
    }
    serde_json::from_value(value).map_err(|e| cannot(without_values(&e.to_string())))
}

/// serde's message without the offending value it quotes (`invalid type: string "…", expected a
/// boolean` → `invalid type: string, expected a boolean`): what was sent is never echoed.
fn without_values(message: &str) -> String {
    for prefix in ["invalid type: ", "invalid value: "] {
        if let Some((unexpected, expected)) = message.strip_prefix(prefix).and_then(|m| m.rsplit_once(", expected ")) {
            let what = unexpected.split(['"', '`']).next().unwrap_or("").trim();
            return format!("{prefix}{what}, expected {expected}");
        }
    }
    if message.starts_with("unknown variant") {
        return "a value is not one of those allowed".into();
    }
    message.to_owned()
}

/// 422 in kube-apiserver's form for a review of kind `T`.
fn invalid<T: k8s_openapi::Resource>(causes: Vec<Cause>) -> ApiError {
    let list: Vec<String> = causes.iter().map(|c| format!("{}: {}", c.field, c.message)).collect();
    let message = format!("{}.{} \"\" is invalid: {}", T::KIND, T::GROUP, list.join(", "));
    ApiError::new_unprocessable(message).with_causes(causes)
}

/// The review as JSON. k8s-openapi's types have string keys and no floats, so this cannot fail;
/// were it to, the body would be `null`, not a panic.
fn to_json(review: &impl Serialize) -> Value {
    serde_json::to_value(review).unwrap_or(Value::Null)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_never_echo_the_body() {
        let mut json = HeaderMap::new();
        json.insert(axum::http::header::CONTENT_TYPE, axum::http::HeaderValue::from_static("application/json"));
        let secret = "hunter2, expected nothing";
        let body =
            format!(r#"{{"spec": {{"resourceAttributes": {{"verb": 5, "name": "x"}}, "namespace": "{secret}"}}}}"#);
        let err = decode::<authz::SelfSubjectAccessReview>(&json, body.as_bytes()).map(drop).unwrap_err();
        assert_eq!(err.code, StatusCode::BAD_REQUEST);
        assert!(!err.message.contains("hunter2"), "{}", err.message);
        let body = r#"{"spec": {"resourceAttributes": {"verb": "hunter2 is not a bool", "name": "x"}}, "status": {"allowed": "hunter2"}}"#;
        let err = decode::<authz::SelfSubjectAccessReview>(&json, body.as_bytes()).map(drop).unwrap_err();
        assert_eq!(
            err.message,
            "SelfSubjectAccessReview in version \"v1\" cannot be handled as a SelfSubjectAccessReview: invalid type: \
             string, expected a boolean"
        );
        let err = decode::<authz::SelfSubjectRulesReview>(&json, b"hunter2").map(drop).unwrap_err();
        assert!(err.message.contains("the body is not JSON") && !err.message.contains("hunter2"), "{}", err.message);
        let other = br#"{"apiVersion": "hunter2/v1", "kind": "SelfSubjectRulesReview", "spec": {}}"#;
        let err = decode::<authz::SelfSubjectRulesReview>(&json, other).map(drop).unwrap_err();
        assert!(!err.message.contains("hunter2"), "{}", err.message);
        let bare =
            decode::<authz::SelfSubjectRulesReview>(&HeaderMap::new(), br#"{"spec": {"namespace": "a"}}"#).unwrap();
        assert_eq!(bare.spec.namespace.as_deref(), Some("a"));
        let mut xml = HeaderMap::new();
        xml.insert(axum::http::header::CONTENT_TYPE, axum::http::HeaderValue::from_static("text/xml"));
        let err = decode::<authz::SelfSubjectRulesReview>(&xml, b"<a/>").map(drop).unwrap_err();
        assert_eq!(err.code, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    }
}
