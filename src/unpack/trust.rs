//! Extra certificate authorities for every source (`--source-ca-file`), and TLS failures in
//! plain words.
//!
//! The file is read again each time a source builds its http client (once per resolve or
//! fetch), so replacing it takes effect at the next attempt without a restart; it is small, and
//! reading it is cheaper than the TLS handshake it serves. Its certificates are trusted in
//! addition to the system's roots (reqwest's `tls_certs_merge`), by the registry, http and git
//! clients alike.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;

use super::error::UnpackError;
use super::source::NetworkPolicy;

/// The flag, as messages name it.
const FLAG: &str = "--source-ca-file";

/// The extra roots the policy names, read now; none without `--source-ca-file`. A missing or
/// unreadable file is a transient failure: fixing it is picked up by the next retry.
pub fn extra_roots(network: &NetworkPolicy) -> Result<Vec<reqwest::Certificate>, UnpackError> {
    let Some(path) = &network.source_ca_file else { return Ok(Vec::new()) };
    let bytes = std::fs::read(path)
        .map_err(|e| UnpackError::Fetch(format!("{FLAG} {}: cannot be read: {}", path.display(), io_problem(&e))))?;
    parse(&bytes).map_err(|problem| UnpackError::Fetch(format!("{FLAG} {}: {problem}", path.display())))
}

/// The certificates of a PEM bundle, each checked to be usable as a trust anchor.
fn parse(pem: &[u8]) -> Result<Vec<reqwest::Certificate>, String> {
    let mut store = rustls::RootCertStore::empty();
    let mut roots = Vec::new();
    for (n, cert) in CertificateDer::pem_slice_iter(pem).enumerate() {
        let cert = cert.map_err(|_| format!("is not a valid PEM file (at certificate {})", n + 1))?;
        store.add(cert.clone()).map_err(|_| format!("certificate {} is not a valid X.509 CA certificate", n + 1))?;
        roots.push(
            reqwest::Certificate::from_der(&cert)
                .map_err(|_| format!("certificate {} is not a valid X.509 CA certificate", n + 1))?,
        );
    }
    if roots.is_empty() {
        return Err("holds no PEM certificate (-----BEGIN CERTIFICATE-----)".to_owned());
    }
    Ok(roots)
}

/// An io error without its `(os error N)` suffix.
pub(crate) fn io_problem(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::NotFound => "no such file".to_owned(),
        std::io::ErrorKind::PermissionDenied => "permission denied".to_owned(),
        _ => e.to_string(),
    }
}

/// A rejected server certificate somewhere in `err`'s causes, in plain words; `None` for any
/// other failure. The TLS stack's own text (`invalid peer certificate: UnknownIssuer`, wrapped
/// in several layers of client errors) does not tell a user what to do.
pub(crate) fn certificate_problem(err: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut cause = Some(err);
    while let Some(e) = cause {
        // `io::Error::source` skips the error it wraps: look inside explicitly.
        let inner = e.downcast_ref::<std::io::Error>().and_then(|io| io.get_ref()).map(|i| i as &dyn std::error::Error);
        for candidate in [Some(e), inner].into_iter().flatten() {
            if let Some(rustls::Error::InvalidCertificate(problem)) = candidate.downcast_ref::<rustls::Error>() {
                return Some(plain(problem));
            }
        }
        cause = e.source();
    }
    None
}

fn plain(problem: &rustls::CertificateError) -> String {
    use rustls::CertificateError as E;
    let what = match problem {
        E::UnknownIssuer => {
            return format!(
                "the server's TLS certificate is not trusted: it is not signed by a known certificate authority \
                 (to trust a private CA, pass its certificate with {FLAG})"
            )
        }
        E::NotValidForName | E::NotValidForNameContext { .. } => "is not valid for this host name",
        E::Expired | E::ExpiredContext { .. } => "has expired",
        E::NotValidYet | E::NotValidYetContext { .. } => "is not valid yet",
        E::Revoked => "has been revoked",
        E::BadSignature => "has a bad signature",
        E::BadEncoding => "is malformed",
        _ => "was rejected",
    };
    format!("the server's TLS certificate {what}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ca_pem() -> String {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.self_signed(&key).unwrap().pem()
    }

    #[test]
    fn a_bundle_of_pem_certificates() {
        let bundle = format!("# two CAs\n{}\n{}", ca_pem(), ca_pem());
        assert_eq!(parse(bundle.as_bytes()).unwrap().len(), 2);
        assert!(parse(b"").unwrap_err().contains("no PEM certificate"));
        let key_only = rcgen::KeyPair::generate().unwrap().serialize_pem();
        assert!(parse(key_only.as_bytes()).unwrap_err().contains("no PEM certificate"), "keys are not roots");
        let garbage = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        assert!(parse(garbage.as_bytes()).unwrap_err().contains("certificate 1 is not a valid"));
        let cut = ca_pem().replace("-----END CERTIFICATE-----", "");
        assert!(parse(cut.as_bytes()).unwrap_err().contains("not a valid PEM file"));
    }

    #[test]
    fn a_missing_file_is_transient_and_names_the_flag() {
        let network = NetworkPolicy { source_ca_file: Some("/nonexistent/ca.pem".into()), ..Default::default() };
        let err = extra_roots(&network).unwrap_err();
        assert!(err.is_transient(), "{err:?}");
        assert_eq!(err.to_string(), "--source-ca-file /nonexistent/ca.pem: cannot be read: no such file");
        assert!(extra_roots(&NetworkPolicy::default()).unwrap().is_empty());
    }

    #[test]
    fn certificate_errors_in_plain_words() {
        let tls = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        let wrapped = std::io::Error::new(std::io::ErrorKind::InvalidData, tls);
        let text = certificate_problem(&wrapped).unwrap();
        assert!(text.contains("not trusted") && text.contains(FLAG) && !text.contains("UnknownIssuer"), "{text}");
        assert_eq!(certificate_problem(&std::io::Error::other("refused")), None);
    }
}
