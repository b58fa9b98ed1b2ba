//! The service-account issuer's published keys: `/.well-known/openid-configuration` (for the issuer)
//! and `/openid/v1/jwks` (the public keys), both read from the kube-apiserver through the kube client
//! (the `system:service-account-issuer-discovery` ClusterRole, bound to all service accounts by
//! default, allows it).
//!
//! The JWKS is always read at the kube-apiserver's own `/openid/v1/jwks`, not at the document's
//! `jwks_uri`, which may name an external host. Keys are kept if they are RSA (RS256) or EC P-256
//! (ES256) / P-384 (ES384) signing keys; others (and malformed ones) are skipped with a log line, so
//! one odd key does not hide the rest.

use std::collections::HashMap;
use std::time::Instant;

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, KeyAlgorithm, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey};
use kube::Client;
use serde::Deserialize;

use super::DelegatedError;

pub(crate) const DISCOVERY_PATH: &str = "/.well-known/openid-configuration";
pub(crate) const JWKS_PATH: &str = "/openid/v1/jwks";

/// One verification key.
pub(crate) struct Key {
    pub(crate) algorithm: Algorithm,
    pub(crate) decoding: DecodingKey,
}

/// The issuer and its keys, as fetched at one moment.
pub(crate) struct KeySet {
    pub(crate) issuer: String,
    pub(crate) by_kid: HashMap<String, Key>,
    /// Keys published without a `kid` (tried for tokens without one).
    pub(crate) unnamed: Vec<Key>,
    pub(crate) fetched_at: Instant,
}

impl KeySet {
    pub(crate) fn len(&self) -> usize {
        self.by_kid.len() + self.unnamed.len()
    }
}

#[derive(Deserialize)]
struct Discovery {
    issuer: String,
}

#[derive(Deserialize)]
struct RawJwks {
    keys: Vec<serde_json::Value>,
}

async fn get(client: &Client, path: &'static str) -> Result<String, DelegatedError> {
    let request = http::Request::get(path)
        .header(http::header::ACCEPT, "application/json, application/jwk-set+json")
        .body(Vec::new())
        .map_err(|e| DelegatedError::Response { what: path, detail: e.to_string() })?;
    client.request_text(request).await.map_err(|source| DelegatedError::Request { what: path, source })
}

/// Fetches the issuer and its keys.
pub(crate) async fn fetch(client: &Client) -> Result<KeySet, DelegatedError> {
    let discovery: Discovery = serde_json::from_str(&get(client, DISCOVERY_PATH).await?)
        .map_err(|e| DelegatedError::Response { what: DISCOVERY_PATH, detail: e.to_string() })?;
    if discovery.issuer.is_empty() {
        return Err(DelegatedError::Response { what: DISCOVERY_PATH, detail: "empty issuer".into() });
    }
    let jwks: RawJwks = serde_json::from_str(&get(client, JWKS_PATH).await?)
        .map_err(|e| DelegatedError::Response { what: JWKS_PATH, detail: e.to_string() })?;
    let mut set =
        KeySet { issuer: discovery.issuer, by_kid: HashMap::new(), unnamed: Vec::new(), fetched_at: Instant::now() };
    for (index, raw) in jwks.keys.into_iter().enumerate() {
        let jwk: Jwk = match serde_json::from_value(raw) {
            Ok(jwk) => jwk,
            Err(e) => {
                tracing::warn!(index, error = %e, "service-account issuer JWKS: skipping a malformed key");
                continue;
            }
        };
        match key_of(&jwk) {
            Ok(key) => match jwk.common.key_id.filter(|k| !k.is_empty()) {
                Some(kid) => {
                    set.by_kid.insert(kid, key);
                }
                None => set.unnamed.push(key),
            },
            Err(reason) => {
                tracing::warn!(index, kid = ?jwk.common.key_id, reason, "service-account issuer JWKS: skipping a key");
            }
        }
    }
    Ok(set)
}

/// The verification key of a JWK, if it is a supported signing key.
fn key_of(jwk: &Jwk) -> Result<Key, &'static str> {
    if matches!(jwk.common.public_key_use, Some(ref u) if *u != PublicKeyUse::Signature) {
        return Err("not a signing key");
    }
    let algorithm = match (&jwk.algorithm, &jwk.common.key_algorithm) {
        (AlgorithmParameters::RSA(_), None | Some(KeyAlgorithm::RS256)) => Algorithm::RS256,
        (AlgorithmParameters::EllipticCurve(ec), alg) => match (&ec.curve, alg) {
            (EllipticCurve::P256, None | Some(KeyAlgorithm::ES256)) => Algorithm::ES256,
            (EllipticCurve::P384, None | Some(KeyAlgorithm::ES384)) => Algorithm::ES384,
            _ => return Err("unsupported curve or algorithm"),
        },
        _ => return Err("unsupported key type or algorithm"),
    };
    let decoding = DecodingKey::from_jwk(jwk).map_err(|_| "invalid key parameters")?;
    Ok(Key { algorithm, decoding })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jwk(value: serde_json::Value) -> Jwk {
        serde_json::from_value(value).unwrap_or_else(|e| panic!("jwk: {e}"))
    }

    #[test]
    fn supported_keys_are_kept() {
        let rsa = jwk(serde_json::json!({"kty": "RSA", "use": "sig", "alg": "RS256", "kid": "a",
            "n": "sXch", "e": "AQAB"}));
        assert!(matches!(key_of(&rsa), Ok(Key { algorithm: Algorithm::RS256, .. })));
        let enc = jwk(serde_json::json!({"kty": "RSA", "use": "enc", "n": "sXch", "e": "AQAB"}));
        assert!(key_of(&enc).is_err());
        let rs512 = jwk(serde_json::json!({"kty": "RSA", "alg": "RS512", "n": "sXch", "e": "AQAB"}));
        assert!(key_of(&rs512).is_err());
    }
}
