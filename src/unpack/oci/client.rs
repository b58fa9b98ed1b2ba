//! Talking to a registry with `oci-client`: the client for a [`SourceContext`] (https with
//! verified TLS except for `--insecure-registry` hosts), the credentials for a reference, and what
//! registry failures mean for a Bundle.

use std::time::Duration;

use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::errors::OciDistributionError;
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};

use super::docker_config;
use crate::unpack::error::UnpackError;
use crate::unpack::source::{Credentials, SourceContext};

/// A client for one resolve or fetch.
pub fn client(ctx: &SourceContext) -> Result<Client, UnpackError> {
    let config = ClientConfig {
        protocol: ClientProtocol::HttpsExcept(ctx.network.insecure_registries.clone()),
        // We pick platforms ourselves from the raw index.
        platform_resolver: None,
        // A registry that stops answering is a transient failure, not a reconcile stuck forever.
        connect_timeout: Some(Duration::from_secs(15)),
        read_timeout: Some(Duration::from_secs(60)),
        user_agent: concat!("stowage/", env!("CARGO_PKG_VERSION")),
        ..ClientConfig::default()
    };
    Client::try_from(config).map_err(|e| UnpackError::Fetch(format!("creating the registry client: {e}")))
}

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

/// What a registry failure while reading `what` (a reference or a blob) means: a digest check
/// failing is final; everything else (network, TLS, 401, 404, 5xx, garbage) may heal and is
/// retried.
pub fn map_error(what: &str, err: OciDistributionError) -> UnpackError {
    match err {
        OciDistributionError::DigestError(oci_client::errors::DigestError::VerificationError { expected, actual }) => {
            UnpackError::DigestMismatch { what: what.to_owned(), expected, actual }
        }
        OciDistributionError::DigestError(e) => UnpackError::Unsupported(format!("{what}: {e}")),
        OciDistributionError::IoError(e) => UnpackError::from_io(what, e),
        // reqwest's Display hides the cause ("error sending request"): include the chain.
        OciDistributionError::RequestError(e) => UnpackError::Fetch(format!("{what}: {}", error_chain(&e))),
        other => UnpackError::Fetch(format!("{what}: {other}")),
    }
}

fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
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
