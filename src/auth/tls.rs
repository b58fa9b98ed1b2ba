//! TLS for the API listener: the rustls server configuration, and the user a verified client
//! certificate names.
//!
//! Client certificates are optional at the TLS layer (anonymous and token-bearing clients must still
//! connect), but one that is presented must chain to a trusted CA ([`super::trust`]), so a
//! certificate that reaches [`identity_from_certificate`] has already been verified.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::CertificateDer;

use super::serving::{ServingCertError, ServingCertificate};
use super::trust::{ClientTrust, DynamicClientVerifier, TrustAnchors, TrustError};
use super::UserInfo;

/// Why a TLS server configuration could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error(transparent)]
    Serving(#[from] ServingCertError),
    #[error(transparent)]
    Trust(#[from] TrustError),
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot build the TLS server configuration")]
    Config(#[source] rustls::Error),
}

/// The TLS side of the listener: the rustls configuration and the trust anchors it verifies client
/// certificates with (shared with request authentication, which classifies them).
#[derive(Clone)]
pub struct TlsSetup {
    pub config: Arc<rustls::ServerConfig>,
    pub trust: Arc<ClientTrust>,
    pub serving: Arc<ServingCertificate>,
}

/// Builds the listener's TLS: ALPN h2 then http/1.1; the serving certificate from files (reloaded
/// by [`ServingCertificate::watch`]); client certificates optional but, when presented, verified
/// against the client CA or the request-header CA in `anchors`.
pub fn setup(cert: &Path, key: &Path, anchors: &TrustAnchors) -> Result<TlsSetup, TlsError> {
    let trust = Arc::new(ClientTrust::new(provider(), anchors)?);
    setup_with_trust(cert, key, trust)
}

/// [`setup`] with trust anchors kept elsewhere (in a cluster, the authentication ConfigMap's).
pub fn setup_with_trust(cert: &Path, key: &Path, trust: Arc<ClientTrust>) -> Result<TlsSetup, TlsError> {
    let provider = provider();
    let serving = Arc::new(ServingCertificate::load(cert, key, provider.clone())?);
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Config)?
        .with_client_cert_verifier(Arc::new(DynamicClientVerifier(trust.clone())))
        .with_cert_resolver(serving.clone());
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsSetup { config: Arc::new(config), trust, serving })
}

/// An explicit crypto provider, so behaviour never depends on which process-wide default (if
/// any) some other dependency installed.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// Reads a PEM bundle (a CA file) for [`TrustAnchors`].
pub fn read_pem(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read { path: path.to_owned(), source })
}

/// The user a verified client certificate names: CN = user, each O = a group (kube-apiserver's x509
/// authenticator).
///
/// Returns `None` for an unparseable certificate or an empty CN, which kube-apiserver also treats as
/// no identity rather than as an empty user name.
pub fn identity_from_certificate(cert: &CertificateDer<'_>) -> Option<UserInfo> {
    let (_, cert) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    let subject = cert.subject();
    let name = subject.iter_common_name().next()?.as_str().ok()?;
    if name.is_empty() {
        return None;
    }
    let groups = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok())
        .filter(|o| !o.is_empty())
        .map(str::to_owned)
        .collect();
    Some(UserInfo { name: name.to_owned(), groups, ..UserInfo::default() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::pki;
    use rustls::pki_types::pem::PemObject;

    #[test]
    fn admin_certificate_names_the_admin() {
        let dir = tempfile::tempdir().unwrap();
        let pki = pki::ensure_standalone(dir.path()).unwrap();
        let cert = CertificateDer::from_pem_file(&pki.admin_cert).unwrap();
        let user = identity_from_certificate(&cert).unwrap();
        assert_eq!(user.name, "stowage-admin");
        assert_eq!(user.groups, vec!["system:masters".to_owned()]);
    }

    #[test]
    fn serving_certificate_has_no_groups() {
        let dir = tempfile::tempdir().unwrap();
        let pki = pki::ensure_standalone(dir.path()).unwrap();
        let cert = CertificateDer::from_pem_file(&pki.serving_cert).unwrap();
        let user = identity_from_certificate(&cert).unwrap();
        assert!(user.groups.is_empty());
    }

    #[test]
    fn garbage_is_no_identity() {
        assert_eq!(identity_from_certificate(&CertificateDer::from(vec![1, 2, 3])), None);
    }

    fn anchors(pki: &pki::StandalonePki) -> TrustAnchors {
        TrustAnchors { client_ca_pem: Some(std::fs::read(&pki.ca_cert).unwrap()), ..TrustAnchors::default() }
    }

    #[test]
    fn builds_server_config_from_standalone_pki() {
        let dir = tempfile::tempdir().unwrap();
        let pki = pki::ensure_standalone(dir.path()).unwrap();
        let tls = setup(&pki.serving_cert, &pki.serving_key, &anchors(&pki)).unwrap();
        assert_eq!(tls.config.alpn_protocols, vec![b"h2".to_vec(), b"http/1.1".to_vec()]);
    }

    #[test]
    fn missing_or_wrong_files_are_reported() {
        let dir = tempfile::tempdir().unwrap();
        let pki = pki::ensure_standalone(dir.path()).unwrap();
        let missing = dir.path().join("nope.crt");
        let err = setup(&missing, &pki.serving_key, &anchors(&pki)).err().unwrap();
        assert!(matches!(err, TlsError::Serving(ServingCertError::Pem { .. })), "{err:?}");
        let err = setup(&pki.serving_key, &pki.serving_key, &anchors(&pki)).err().unwrap();
        assert!(matches!(err, TlsError::Serving(ServingCertError::NoCertificates { .. })), "{err:?}");
        let err = setup(&pki.admin_cert, &pki.serving_key, &anchors(&pki)).err().unwrap();
        assert!(matches!(err, TlsError::Serving(ServingCertError::Mismatch { .. })), "{err:?}");
        let bad = TrustAnchors { client_ca_pem: Some(b"not pem".to_vec()), ..TrustAnchors::default() };
        let err = setup(&pki.serving_cert, &pki.serving_key, &bad).err().unwrap();
        assert!(matches!(err, TlsError::Trust(_)), "{err:?}");
    }
}
