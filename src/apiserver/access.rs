//! The gate every API request passes (health endpoints excepted): authentication, removal of
//! front-proxy headers, impersonation (`kubectl --as`), authorization of the request's Kubernetes
//! attributes. What it learns goes into request extensions: the [`Identity`] (handlers that act for
//! the user — the Secret check of a Bundle — extract it) and the [`RequestInfo`] (metrics reads
//! it).

use axum::extract::{FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use super::access_log;
use super::request_info::RequestInfo;
use super::status::{ApiError, ApiResult};
use super::{AppState, GROUP};
use crate::auth::attributes::{Attributes, Request as AuthzRequest, ResourceAttributes};
use crate::auth::authn::AuthnError;
use crate::auth::impersonation::{self, ImpersonationError};
use crate::auth::trust::PeerCertificate;
use crate::auth::UserInfo;
use crate::strategy::ResourceDef;

/// The authenticated user a request runs as.
#[derive(Clone, Debug)]
pub struct Identity(pub UserInfo);

impl<S: Send + Sync> FromRequestParts<S> for Identity {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        parts.extensions.get::<Identity>().cloned().ok_or_else(ApiError::unauthorized)
    }
}

/// The request as an authorization question.
pub fn attributes(user: &UserInfo, info: &RequestInfo) -> Attributes {
    if !info.is_resource_request {
        return Attributes::non_resource(user.clone(), info.verb.clone(), info.path.clone());
    }
    Attributes::resource(
        user.clone(),
        ResourceAttributes {
            namespace: info.namespace.clone(),
            verb: info.verb.clone(),
            group: info.api_group.clone(),
            version: info.api_version.clone(),
            resource: info.resource.clone(),
            subresource: info.subresource.clone(),
            name: info.name.clone(),
        },
    )
}

/// The 403 for a decision that did not allow `attributes`, in kube-apiserver's words.
pub fn forbidden(attributes: &Attributes, reason: &str) -> ApiError {
    let details = match &attributes.request {
        crate::auth::attributes::Request::Resource(r) => {
            Some(json!({"name": r.name, "group": r.group, "kind": r.resource}))
        }
        crate::auth::attributes::Request::NonResource(_) => None,
    };
    ApiError::forbidden(attributes.forbidden_status_message(reason), details)
}

/// Logs a denial at info: who (name and groups) was refused what, with the authorizer's reason.
/// The attributes hold no credential, so none can reach the line.
fn log_denial(attributes: &Attributes, reason: &str) {
    let user = &attributes.user;
    let groups = user.groups.join(",");
    match &attributes.request {
        AuthzRequest::Resource(r) => tracing::info!(
            user = %user.name,
            groups,
            verb = %r.verb,
            api_group = %r.group,
            api_version = %r.version,
            resource = %r.resource,
            subresource = %r.subresource,
            namespace = %r.namespace,
            name = %r.name,
            reason,
            "forbidden: {}",
            attributes.forbidden_message()
        ),
        AuthzRequest::NonResource(n) => tracing::info!(
            user = %user.name,
            groups,
            verb = %n.verb,
            path = %n.path,
            reason,
            "forbidden: {}",
            attributes.forbidden_message()
        ),
    }
}

/// An authorizer that cannot answer: 503, never an allow.
fn authorization_unavailable(err: crate::auth::delegated::DelegatedError) -> ApiError {
    tracing::warn!(error = %err, "authorization unavailable");
    ApiError::unavailable(format!("authorization is unavailable: {err}"))
}

pub async fn gate(State(app): State<AppState>, mut request: Request, next: Next) -> Response {
    let access = app.access.clone();
    let peer = request.extensions().get::<PeerCertificate>().cloned().unwrap_or_default();
    let user = match access.authenticator.authenticate(&peer, request.headers()).await {
        Ok(user) => user,
        Err(AuthnError::Unavailable(e)) => {
            tracing::warn!(error = %e, "authentication unavailable");
            return ApiError::unavailable(format!("authentication is unavailable: {e}")).into_response();
        }
        Err(e) => {
            // The reason only (AuthnError names no credential), never a header's value.
            tracing::info!(reason = %e, method = %request.method(), path = request.uri().path(), "authentication failed");
            return ApiError::unauthorized().into_response();
        }
    };
    access.authenticator.strip_request_headers(request.headers_mut());
    let user = match impersonation::impersonated(&user, request.headers(), &access.authorizer).await {
        Ok(Some(impersonated)) => impersonated,
        Ok(None) => user,
        Err(ImpersonationError::Invalid(message)) => return ApiError::bad_request(message).into_response(),
        Err(ImpersonationError::Forbidden(attributes, reason)) => {
            access_log::note_user(&request, &user.name);
            log_denial(&attributes, &reason);
            return forbidden(&attributes, &reason).into_response();
        }
        Err(ImpersonationError::Unavailable(e)) => return authorization_unavailable(e).into_response(),
    };
    access_log::note_user(&request, &user.name);
    impersonation::strip_headers(request.headers_mut());
    let info = RequestInfo::new(request.method(), request.uri().path(), request.uri().query());
    let attributes = attributes(&user, &info);
    let decision = match access.authorizer.authorize(&attributes).await {
        Ok(decision) => decision,
        Err(e) => return authorization_unavailable(e).into_response(),
    };
    if !decision.is_allowed() {
        log_denial(&attributes, decision.reason());
        return forbidden(&attributes, decision.reason()).into_response();
    }
    request.extensions_mut().insert(Identity(user));
    request.extensions_mut().insert(info);
    next.run(request).await
}

/// Refuses a write whose object names a Secret the user may not read (a Bundle's pull or auth
/// Secret would otherwise be read by the server on their behalf). Only Secrets the write adds are
/// checked: a controller updating other fields need not be able to read them.
pub async fn check_secret_access(
    app: &AppState,
    def: &ResourceDef,
    user: &UserInfo,
    old: Option<&Value>,
    new: &Value,
) -> ApiResult<()> {
    let before: Vec<String> =
        old.map(|o| (def.secret_refs)(o).into_iter().map(|(_, name)| name).collect()).unwrap_or_default();
    let namespace = new.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or("");
    for (field, secret) in (def.secret_refs)(new) {
        if before.contains(&secret) {
            continue;
        }
        let read = Attributes::resource(
            user.clone(),
            ResourceAttributes {
                namespace: namespace.to_string(),
                verb: "get".into(),
                version: "v1".into(),
                resource: "secrets".into(),
                name: secret.clone(),
                ..ResourceAttributes::default()
            },
        );
        let decision = app.access.authorizer.authorize(&read).await.map_err(authorization_unavailable)?;
        if !decision.is_allowed() {
            log_denial(&read, decision.reason());
            let name = new.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("");
            return Err(ApiError::forbidden(
                format!(
                    "{}.{GROUP} {name:?} is forbidden: {field} names Secret {secret:?}, but {}",
                    def.plural,
                    read.forbidden_message()
                ),
                Some(json!({"name": name, "group": GROUP, "kind": def.plural})),
            ));
        }
    }
    Ok(())
}
