//! What talking to a registry needs besides HTTP ([`super::registry`]): parsing references,
//! the credentials to present for one, and running registry futures under cancellation.

use oci_client::secrets::RegistryAuth;
use oci_client::Reference;

use super::docker_config;
use crate::unpack::error::UnpackError;
use crate::unpack::source::{Credentials, SourceContext};

/// Parses an image reference (`registry/repo:tag`, `…@sha256:…`); a malformed one never works.
pub fn parse_reference(reference: &str) -> Result<Reference, UnpackError> {
    reference
        .parse::<Reference>()
        .map_err(|e| UnpackError::Unsupported(format!("invalid image reference {reference:?}: {e}")))
}

/// The credentials to present to `reference`'s registry. A docker config without an entry for
/// that registry means anonymous access; one that cannot be parsed is a (transient) failure,
/// since fixing the Secret must be picked up by the next attempt.
pub fn auth_for(reference: &Reference, credentials: Option<&Credentials>) -> Result<RegistryAuth, UnpackError> {
    Ok(match credentials {
        None => RegistryAuth::Anonymous,
        Some(Credentials::Basic { username, password }) => RegistryAuth::Basic(username.clone(), password.clone()),
        Some(Credentials::Bearer(token)) => RegistryAuth::Bearer(token.clone()),
        Some(Credentials::DockerConfig(bytes)) => {
            match docker_config::credentials_for(bytes, reference.registry())
                .map_err(|e| UnpackError::Fetch(format!("pull secret for {reference}: {e}")))?
            {
                Some(c) => RegistryAuth::Basic(c.username, c.password),
                None => RegistryAuth::Anonymous,
            }
        }
    })
}

/// Runs `future` on the context's runtime from a blocking thread, giving up with
/// [`UnpackError::Cancelled`] as soon as the context is cancelled.
pub fn block_on<T>(
    ctx: &SourceContext,
    future: impl std::future::Future<Output = Result<T, UnpackError>>,
) -> Result<T, UnpackError> {
    ctx.runtime.block_on(until_cancelled(ctx, future))
}

/// `future`, or [`UnpackError::Cancelled`] once the context is cancelled.
pub async fn until_cancelled<T>(
    ctx: &SourceContext,
    future: impl std::future::Future<Output = Result<T, UnpackError>>,
) -> Result<T, UnpackError> {
    tokio::select! {
        biased;
        _ = ctx.cancel.cancelled() => Err(UnpackError::Cancelled),
        result = future => result,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_become_registry_auth() {
        let r = parse_reference("registry.example:5000/team/app:v1").unwrap();
        let config = br#"{"auths": {"registry.example:5000": {"auth": "dTpw"}}}"#.to_vec();
        let auth = auth_for(&r, Some(&Credentials::DockerConfig(config))).unwrap();
        assert!(matches!(auth, RegistryAuth::Basic(ref u, ref p) if u == "u" && p == "p"));
        let other = br#"{"auths": {"elsewhere": {"auth": "dTpw"}}}"#.to_vec();
        assert!(matches!(auth_for(&r, Some(&Credentials::DockerConfig(other))).unwrap(), RegistryAuth::Anonymous));
        let bad = auth_for(&r, Some(&Credentials::DockerConfig(b"{".to_vec()))).unwrap_err();
        assert!(matches!(bad, UnpackError::Fetch(_)) && !bad.to_string().contains("dTpw"), "{bad}");
        assert!(matches!(auth_for(&r, None).unwrap(), RegistryAuth::Anonymous));
        assert!(matches!(parse_reference("UPPER/Case:tag"), Err(UnpackError::Unsupported(_))));
    }
}
