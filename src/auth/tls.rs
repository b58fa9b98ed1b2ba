//! TLS for the API listener: the rustls server configuration, and the user a verified client
//! certificate names.
//!
//! Client certificates are optional at the TLS layer (anonymous and token-bearing clients must still
//! connect), but one that is presented must chain to the client CA, so a certificate that reaches
//! [`identity_from_certificate`] has already been verified.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;

use super::UserInfo;

/// Why a TLS server configuration could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {what} from {}", path.display())]
    Pem {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    #[error("no certificates found in {}", path.display())]
    NoCertificates { path: PathBuf },
    #[error("invalid client CA certificate in {}", path.display())]
    ClientCa {
        path: PathBuf,
        #[source]
        source: rustls::Error,
    },
    #[error("cannot build the client certificate verifier")]
    Verifier(#[source] rustls::server::VerifierBuilderError),
    #[error("cannot build the TLS server configuration")]
    Config(#[source] rustls::Error),
}

/// TLS server config: ALPN h2 then http/1.1; client certificates are optional but, when presented,
/// must chain to `client_ca` (WebPkiClientVerifier with allow_unauthenticated()).
pub fn server_config(cert: &Path, key: &Path, client_ca: &Path) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    // An explicit provider, so behaviour never depends on which process-wide default (if any) some
    // other dependency installed.
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());

    let chain = read_certs(cert, "certificate chain")?;
    let key = PrivateKeyDer::from_pem_file(key).map_err(|source| TlsError::Pem {
        what: "private key",
        path: key.to_owned(),
        source,
    })?;

    let mut roots = rustls::RootCertStore::empty();
    for ca in read_certs(client_ca, "client CA")? {
        roots.add(ca).map_err(|source| TlsError::ClientCa { path: client_ca.to_owned(), source })?;
    }
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .allow_unauthenticated()
        .build()
        .map_err(TlsError::Verifier)?;

    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Config)?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .map_err(TlsError::Config)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
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

fn read_certs(path: &Path, what: &'static str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem_err = |source| TlsError::Pem { what, path: path.to_owned(), source };
    let certs =
        CertificateDer::pem_file_iter(path).map_err(pem_err)?.collect::<Result<Vec<_>, _>>().map_err(pem_err)?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificates { path: path.to_owned() });
    }
    Ok(certs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::pki;

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

    #[test]
    fn builds_server_config_from_standalone_pki() {
        let dir = tempfile::tempdir().unwrap();
        let pki = pki::ensure_standalone(dir.path()).unwrap();
        let config = server_config(&pki.serving_cert, &pki.serving_key, &pki.ca_cert).unwrap();
        assert_eq!(config.alpn_protocols, vec![b"h2".to_vec(), b"http/1.1".to_vec()]);
    }

    #[test]
    fn missing_files_are_reported() {
        let dir = tempfile::tempdir().unwrap();
        let pki = pki::ensure_standalone(dir.path()).unwrap();
        let missing = dir.path().join("nope.crt");
        let err = server_config(&missing, &pki.serving_key, &pki.ca_cert).unwrap_err();
        assert!(matches!(err, TlsError::Pem { .. }), "{err:?}");
        let err = server_config(&pki.serving_cert, &pki.serving_key, &pki.serving_key).unwrap_err();
        assert!(matches!(err, TlsError::NoCertificates { .. }), "{err:?}");
    }
}
