//! Which client certificates are trusted, and as what: certificates from the *client CA* name a
//! user (CN) and groups (O); certificates from the *request-header CA* (the front proxy — in a
//! cluster, the kube-apiserver's aggregator) whose CN is allowed may assert a user in
//! `X-Remote-*` headers. The two are verified separately: a client certificate can never pass as
//! the front proxy, nor the proxy's as a user.
//!
//! Both anchors can be replaced while serving (the kube-apiserver publishes them in the
//! `kube-system/extension-apiserver-authentication` ConfigMap, which changes on rotation); the
//! rustls verifier reads the current set on every handshake.

use std::sync::{Arc, RwLock};

use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::WebPkiClientVerifier;
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};

use super::tls::identity_from_certificate;
use super::UserInfo;

/// How a front proxy passes the user it authenticated (kube-apiserver's `--requestheader-*`).
#[derive(Clone, Debug)]
pub struct RequestHeaderConfig {
    /// CNs allowed to act as the front proxy; empty = any certificate from the request-header CA.
    pub allowed_names: Vec<String>,
    pub username_headers: Vec<String>,
    pub group_headers: Vec<String>,
    pub extra_headers_prefixes: Vec<String>,
}

impl Default for RequestHeaderConfig {
    fn default() -> Self {
        RequestHeaderConfig {
            allowed_names: Vec::new(),
            username_headers: vec!["X-Remote-User".into()],
            group_headers: vec!["X-Remote-Group".into()],
            extra_headers_prefixes: vec!["X-Remote-Extra-".into()],
        }
    }
}

/// One set of trust anchors (PEM bundles).
#[derive(Clone, Debug, Default)]
pub struct TrustAnchors {
    pub client_ca_pem: Option<Vec<u8>>,
    pub request_header_ca_pem: Option<Vec<u8>>,
    pub request_header: RequestHeaderConfig,
}

/// Why a set of anchors was refused (the previous set stays in force).
#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    #[error("{what}: no certificates in the PEM bundle")]
    Empty { what: &'static str },
    #[error("{what}: {source}")]
    Pem {
        what: &'static str,
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    #[error("{what}: {source}")]
    Certificate {
        what: &'static str,
        #[source]
        source: rustls::Error,
    },
    #[error("{what}: {source}")]
    Verifier {
        what: &'static str,
        #[source]
        source: rustls::server::VerifierBuilderError,
    },
}

/// What the certificate a connection presented makes of it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum PeerCertificate {
    /// No certificate, or none any anchor vouches for.
    #[default]
    None,
    /// A user certificate from the client CA.
    User(UserInfo),
    /// The front proxy (request-header CA, allowed CN): its `X-Remote-*` headers are believed.
    FrontProxy { common_name: String },
}

struct Verifiers {
    client: Option<Arc<dyn ClientCertVerifier>>,
    request_header: Option<Arc<dyn ClientCertVerifier>>,
    config: RequestHeaderConfig,
}

/// The current trust anchors, shared by the TLS layer and request authentication.
pub struct ClientTrust {
    provider: Arc<rustls::crypto::CryptoProvider>,
    current: RwLock<Arc<Verifiers>>,
}

impl std::fmt::Debug for ClientTrust {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClientTrust")
    }
}

impl ClientTrust {
    pub fn new(
        provider: Arc<rustls::crypto::CryptoProvider>,
        anchors: &TrustAnchors,
    ) -> Result<ClientTrust, TrustError> {
        let verifiers = build(&provider, anchors)?;
        Ok(ClientTrust { provider, current: RwLock::new(Arc::new(verifiers)) })
    }

    /// Replaces the anchors; on error the previous ones stay.
    pub fn replace(&self, anchors: &TrustAnchors) -> Result<(), TrustError> {
        let verifiers = Arc::new(build(&self.provider, anchors)?);
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = verifiers;
        Ok(())
    }

    fn current(&self) -> Arc<Verifiers> {
        self.current.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The request-header settings in force.
    pub fn request_header_config(&self) -> RequestHeaderConfig {
        self.current().config.clone()
    }

    /// Classifies a chain the handshake accepted (it chains to one of the anchors).
    pub fn classify(&self, chain: &[CertificateDer<'_>]) -> PeerCertificate {
        let Some((leaf, intermediates)) = chain.split_first() else { return PeerCertificate::None };
        let verifiers = self.current();
        let now = UnixTime::now();
        let verified_by = |v: &Option<Arc<dyn ClientCertVerifier>>| {
            v.as_ref().is_some_and(|v| v.verify_client_cert(leaf, intermediates, now).is_ok())
        };
        if verified_by(&verifiers.request_header) {
            if let Some(user) = identity_from_certificate(leaf) {
                let allowed = &verifiers.config.allowed_names;
                if allowed.is_empty() || allowed.contains(&user.name) {
                    return PeerCertificate::FrontProxy { common_name: user.name };
                }
            }
        }
        if verified_by(&verifiers.client) {
            if let Some(user) = identity_from_certificate(leaf) {
                return PeerCertificate::User(user);
            }
        }
        PeerCertificate::None
    }
}

fn verifier(
    provider: &Arc<rustls::crypto::CryptoProvider>,
    pem: &[u8],
    what: &'static str,
) -> Result<Arc<dyn ClientCertVerifier>, TrustError> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(pem) {
        let cert = cert.map_err(|source| TrustError::Pem { what, source })?;
        roots.add(cert).map_err(|source| TrustError::Certificate { what, source })?;
    }
    if roots.is_empty() {
        return Err(TrustError::Empty { what });
    }
    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .allow_unauthenticated()
        .build()
        .map_err(|source| TrustError::Verifier { what, source })
}

fn build(provider: &Arc<rustls::crypto::CryptoProvider>, anchors: &TrustAnchors) -> Result<Verifiers, TrustError> {
    let client = anchors.client_ca_pem.as_deref().map(|pem| verifier(provider, pem, "client CA")).transpose()?;
    let request_header =
        anchors.request_header_ca_pem.as_deref().map(|pem| verifier(provider, pem, "request-header CA")).transpose()?;
    Ok(Verifiers { client, request_header, config: anchors.request_header.clone() })
}

/// The rustls side: accept a certificate that either anchor vouches for (what it means is decided
/// per request by [`ClientTrust::classify`]); certificates stay optional.
#[derive(Debug)]
pub struct DynamicClientVerifier(pub Arc<ClientTrust>);

impl ClientCertVerifier for DynamicClientVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[] // the anchors change at run time; clients send the certificate they were given
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verifiers = self.0.current();
        let mut last = rustls::Error::General("no client certificate authority is configured".into());
        for v in [&verifiers.request_header, &verifiers.client].into_iter().flatten() {
            match v.verify_client_cert(end_entity, intermediates, now) {
                Ok(ok) => return Ok(ok),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.provider.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.provider.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.provider.signature_verification_algorithms.supported_schemes()
    }
}
