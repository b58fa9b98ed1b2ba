//! Fetching a manifest with a size bound. `oci-client` reads a manifest response whole whatever its
//! size (oras-project/rust-oci-client#206), so a hostile or broken registry streaming an endless
//! "manifest" would grow the server's memory until it died. This asks `oci-client` only for the
//! registry's token and reads the manifest itself, refusing it past [`MAX_MANIFEST_BYTES`].

use std::time::Duration;

use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference, RegistryOperation};
use reqwest::header::{ACCEPT, CONTENT_LENGTH};

use super::client::map_error;
use super::manifest::ACCEPTED_MANIFESTS;
use crate::unpack::error::UnpackError;
use crate::unpack::source::{NetworkPolicy, SourceContext};

/// The OCI distribution spec asks clients and registries to handle manifests of 4 MiB; real ones
/// are a few KiB (an index of every platform stays far below).
pub const MAX_MANIFEST_BYTES: usize = 4 << 20;

/// The bytes of the manifest `reference` (pinned by digest) names; not yet verified.
pub async fn pull_bounded(
    ctx: &SourceContext,
    client: &Client,
    reference: &Reference,
    auth: &RegistryAuth,
    what: &str,
) -> Result<Vec<u8>, UnpackError> {
    let registry = reference.resolve_registry();
    let network = &ctx.network;
    let scheme = if network.insecure_registries.iter().any(|h| h == registry) { "http" } else { "https" };
    let target = reference.digest().or(reference.tag()).unwrap_or("latest");
    let ns = reference.namespace().map(|ns| format!("?ns={ns}")).unwrap_or_default();
    let url = format!("{scheme}://{registry}/v2/{}/manifests/{target}{ns}", reference.repository());
    // oci-client finds out how the registry authenticates (and fetches a token when it wants one).
    let token = client.auth(reference, auth, RegistryOperation::Pull).await.map_err(|e| map_error(what, e))?;
    let request = http_client(network)?.get(&url).header(ACCEPT, ACCEPTED_MANIFESTS.join(", "));
    let request = match (token, auth) {
        (Some(token), _) => request.bearer_auth(token),
        (None, RegistryAuth::Bearer(token)) => request.bearer_auth(token),
        (None, RegistryAuth::Basic(username, password)) => request.basic_auth(username, Some(password)),
        (None, _) => request,
    };
    let failed = |e: reqwest::Error| UnpackError::Fetch(format!("{what}: {}", e.without_url()));
    let mut response = request.send().await.map_err(failed)?;
    if !response.status().is_success() {
        return Err(UnpackError::Fetch(format!("{what}: the registry answered {}", response.status())));
    }
    let too_large = || UnpackError::TooLarge(format!("{what}: a manifest larger than {MAX_MANIFEST_BYTES} bytes"));
    let declared = response.headers().get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|len| len > MAX_MANIFEST_BYTES as u64) {
        return Err(too_large());
    }
    let mut body = Vec::with_capacity(declared.unwrap_or(0) as usize);
    while let Some(chunk) = response.chunk().await.map_err(failed)? {
        if body.len() + chunk.len() > MAX_MANIFEST_BYTES {
            return Err(too_large());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// Verified TLS; a redirect only to https or to a registry allowed plain http.
fn http_client(network: &NetworkPolicy) -> Result<reqwest::Client, UnpackError> {
    let insecure = network.insecure_registries.clone();
    let redirects = reqwest::redirect::Policy::custom(move |attempt| {
        let url = attempt.url();
        let host_port = format!("{}:{}", url.host_str().unwrap_or_default(), url.port_or_known_default().unwrap_or(0));
        let allowed = url.scheme() == "https" || (url.scheme() == "http" && insecure.contains(&host_port));
        if attempt.previous().len() >= 5 || !allowed {
            attempt.error("redirect to a URL that is not allowed (plain http, another scheme, or too many)")
        } else {
            attempt.follow()
        }
    });
    reqwest::Client::builder()
        .redirect(redirects)
        .connect_timeout(Duration::from_secs(15))
        .read_timeout(Duration::from_secs(60))
        .user_agent(concat!("stowage/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| UnpackError::Fetch(format!("building the registry client: {e}")))
}
