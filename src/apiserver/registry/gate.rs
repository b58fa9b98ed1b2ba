//! Who may read what through the registry view: the same identities as the API (client
//! certificates, the front proxy, bearer tokens) plus Basic auth whose password is a Kubernetes
//! token — what `podman login`, docker config files and image pull Secrets send — and the same
//! authorization as the content subresource: `get` on `bundles/content` for the repository's
//! Bundle, so `resourceNames` apply.
//!
//! A request that proves no identity, or an anonymous one that may not read, gets `401` with a
//! Basic challenge (registry clients send credentials only when challenged); an identified user
//! who may not read gets `DENIED`, whether or not the Bundle exists.

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine;

use super::error::RegistryError;
use crate::apiserver::access::Identity;
use crate::apiserver::request_info::RequestInfo;
use crate::apiserver::{access_log, AppState, GROUP, VERSION};
use crate::auth::attributes::{Attributes, ResourceAttributes};
use crate::auth::authn::AuthnError;
use crate::auth::trust::PeerCertificate;
use crate::auth::{impersonation, Access, UserInfo};

const ANONYMOUS: &str = "system:anonymous";

/// What a `/v2/` path asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// `/v2/`: the version check every client starts with.
    Root,
    Catalog,
    /// `/v2/<namespace>/<bundle>/{manifests,blobs,tags}/…`.
    Repository {
        namespace: String,
        name: String,
        what: Part,
    },
    /// Anything else under `/v2/`.
    Other,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    Manifests,
    Blobs,
    Tags,
}

impl Target {
    pub fn of(path: &str) -> Target {
        let rest = path.strip_prefix("/v2").unwrap_or(path);
        if rest.is_empty() || rest == "/" {
            return Target::Root;
        }
        if rest == "/_catalog" {
            return Target::Catalog;
        }
        let parts: Vec<&str> = rest.trim_start_matches('/').split('/').collect();
        let what = match parts.get(2).copied() {
            Some("manifests") => Part::Manifests,
            Some("blobs") => Part::Blobs,
            Some("tags") => Part::Tags,
            _ => return Target::Other,
        };
        match (parts.first(), parts.get(1)) {
            (Some(namespace), Some(name)) if !namespace.is_empty() && !name.is_empty() => {
                Target::Repository { namespace: namespace.to_string(), name: name.to_string(), what }
            }
            _ => Target::Other,
        }
    }
}

/// Basic credentials become the bearer token they carry (the user name is not checked: the token
/// names the user). `Err` for a Basic header that does not decode.
fn basic_as_bearer(headers: &mut HeaderMap) -> Result<(), RegistryError> {
    let Some(value) = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()) else { return Ok(()) };
    let Some((scheme, encoded)) = value.trim().split_once(' ') else { return Ok(()) };
    if !scheme.eq_ignore_ascii_case("basic") {
        return Ok(());
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()
        .and_then(|bytes| String::from_utf8(bytes).ok())
        .ok_or(RegistryError::Unauthorized)?;
    let (_user, token) = decoded.split_once(':').ok_or(RegistryError::Unauthorized)?;
    let bearer = HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| RegistryError::Unauthorized)?;
    headers.insert(header::AUTHORIZATION, bearer);
    Ok(())
}

/// Whether `user` may read the content of Bundle `namespace/name`.
pub async fn may_read(access: &Access, user: &UserInfo, namespace: &str, name: &str) -> Result<bool, RegistryError> {
    let attributes = Attributes::resource(user.clone(), content_attributes(namespace, name));
    match access.authorizer.authorize(&attributes).await {
        Ok(decision) => Ok(decision.is_allowed()),
        Err(e) => {
            tracing::warn!(error = %e, "authorization unavailable");
            Err(RegistryError::Unavailable(format!("authorization is unavailable: {e}")))
        }
    }
}

fn content_attributes(namespace: &str, name: &str) -> ResourceAttributes {
    ResourceAttributes {
        namespace: namespace.to_string(),
        verb: "get".into(),
        group: GROUP.into(),
        version: VERSION.into(),
        resource: "bundles".into(),
        subresource: "content".into(),
        name: name.to_string(),
    }
}

/// The request as the API would see it (for seats, metrics and the access log): a content read
/// for manifests and blobs, a get for tags, a list for the catalog.
fn request_info(target: &Target, path: &str) -> RequestInfo {
    let mut info = RequestInfo {
        is_resource_request: true,
        verb: "get".into(),
        path: path.to_string(),
        api_group: GROUP.into(),
        api_version: VERSION.into(),
        resource: "bundles".into(),
        ..RequestInfo::default()
    };
    match target {
        Target::Repository { namespace, name, what } => {
            info.namespace = namespace.clone();
            info.name = name.clone();
            if *what != Part::Tags {
                info.subresource = "content".into();
            }
        }
        Target::Catalog => info.verb = "list".into(),
        Target::Root | Target::Other => {
            info.is_resource_request = false;
            info.resource.clear();
        }
    }
    info
}

pub async fn gate(State(app): State<AppState>, mut request: Request, next: Next) -> Response {
    match admit(&app, &mut request).await {
        Ok(()) => next.run(request).await,
        Err(e) => e.into_response(),
    }
}

async fn admit(app: &AppState, request: &mut Request) -> Result<(), RegistryError> {
    let access = &app.access;
    basic_as_bearer(request.headers_mut())?;
    let peer = request.extensions().get::<PeerCertificate>().cloned().unwrap_or_default();
    let user = match access.authenticator.authenticate(&peer, request.headers()).await {
        Ok(user) => user,
        Err(AuthnError::Unavailable(e)) => {
            tracing::warn!(error = %e, "authentication unavailable");
            return Err(RegistryError::Unavailable(format!("authentication is unavailable: {e}")));
        }
        Err(e) => {
            tracing::info!(reason = %e, path = request.uri().path(), "registry authentication failed");
            return Err(RegistryError::Unauthorized);
        }
    };
    // Neither the front proxy's headers nor impersonation apply here: the caller is who it proved.
    access.authenticator.strip_request_headers(request.headers_mut());
    impersonation::strip_headers(request.headers_mut());
    request.headers_mut().remove(header::AUTHORIZATION);
    access_log::note_user(request, &user.name);
    let anonymous = user.name == ANONYMOUS;
    let target = Target::of(request.uri().path());
    match &target {
        // Clients probe `/v2/` first and send credentials only if challenged.
        Target::Root | Target::Catalog | Target::Other if anonymous => return Err(RegistryError::Unauthorized),
        Target::Repository { namespace, name, .. } if !may_read(access, &user, namespace, name).await? => {
            if anonymous {
                return Err(RegistryError::Unauthorized);
            }
            tracing::info!(user = %user.name, namespace, name, "registry read forbidden");
            return Err(RegistryError::Denied(format!(
                "user {:?} may not get bundles/content of {namespace}/{name} (repository {namespace}/{name})",
                user.name
            )));
        }
        _ => {}
    }
    let info = request_info(&target, request.uri().path());
    request.extensions_mut().insert(Identity(user));
    request.extensions_mut().insert(info);
    request.extensions_mut().insert(target);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets() {
        assert_eq!(Target::of("/v2/"), Target::Root);
        assert_eq!(Target::of("/v2"), Target::Root);
        assert_eq!(Target::of("/v2/_catalog"), Target::Catalog);
        assert_eq!(
            Target::of("/v2/ns/app/manifests/latest"),
            Target::Repository { namespace: "ns".into(), name: "app".into(), what: Part::Manifests }
        );
        assert_eq!(
            Target::of("/v2/ns/app/blobs/uploads/"),
            Target::Repository { namespace: "ns".into(), name: "app".into(), what: Part::Blobs }
        );
        assert_eq!(Target::of("/v2/a/b/c/manifests/x"), Target::Other);
        assert_eq!(Target::of("/v2/ns/manifests/x"), Target::Other);
    }

    #[test]
    fn basic_credentials_carry_the_token() {
        let mut headers = HeaderMap::new();
        let encoded = base64::engine::general_purpose::STANDARD.encode("anyone:the-token");
        headers.insert(header::AUTHORIZATION, format!("Basic {encoded}").parse().unwrap());
        basic_as_bearer(&mut headers).unwrap();
        assert_eq!(headers[header::AUTHORIZATION], "Bearer the-token");
        headers.insert(header::AUTHORIZATION, "Basic !!!".parse().unwrap());
        assert!(basic_as_bearer(&mut headers).is_err());
        headers.insert(header::AUTHORIZATION, "Bearer x".parse().unwrap());
        basic_as_bearer(&mut headers).unwrap();
        assert_eq!(headers[header::AUTHORIZATION], "Bearer x");
    }
}
