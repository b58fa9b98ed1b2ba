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
        if let Some(rustls::Error::InvalidCertificate(problem)) = e.downcast_ref::<rustls::Error>() {
            return Some(plain(problem));
        }
        // The http clients' connectors box the TLS error in layers whose types are private (and
        // `io::Error::source` skips the error it wraps), so the error is not always reachable as
        // a type: its rustls wording, which says which check failed, is the fallback.
        if let Some((_, rest)) = e.to_string().split_once("invalid peer certificate: ") {
            return Some(plain_text(rest));
        }
        let wrapped = e.downcast_ref::<std::io::Error>().and_then(|io| io.get_ref());
        cause = wrapped.map(|inner| inner as &(dyn std::error::Error + 'static)).or_else(|| e.source());
    }
    None
}

fn plain(problem: &rustls::CertificateError) -> String {
    use rustls::CertificateError as E;
    match problem {
        E::UnknownIssuer => plain_text("UnknownIssuer"),
        E::NotValidForName | E::NotValidForNameContext { .. } => plain_text("NotValidForName"),
        E::Expired | E::ExpiredContext { .. } => plain_text("Expired"),
        E::NotValidYet | E::NotValidYetContext { .. } => plain_text("NotValidYet"),
        E::Revoked => plain_text("Revoked"),
        E::BadSignature => plain_text("BadSignature"),
        _ => plain_text(""),
    }
}

/// From rustls's wording of a certificate error: its variant name, or its message for the
/// variants that carry context (`certificate expired: …`).
fn plain_text(rustls_text: &str) -> String {
    let what = match rustls_text {
        t if t.starts_with("UnknownIssuer") => {
            return format!(
                "the server's TLS certificate is not trusted: it is not signed by a known certificate authority \
                 (to trust a private CA, pass its certificate with {FLAG})"
            )
        }
        t if t.starts_with("NotValidForName") || t.starts_with("certificate not valid for name") => {
            "is not valid for this host name"
        }
        t if t.starts_with("Expired") || t.starts_with("certificate expired") => "has expired",
        t if t.starts_with("NotValidYet") || t.starts_with("certificate not valid yet") => "is not valid yet",
        t if t.starts_with("Revoked") => "has been revoked",
        t if t.starts_with("BadSignature") => {
            "is not trusted: its signature does not match the trusted certificate authority of that name"
        }
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
        let boxed =
            std::io::Error::other(std::io::Error::other("client error (Connect): invalid peer certificate: Expired"));
        assert_eq!(certificate_problem(&boxed).as_deref(), Some("the server's TLS certificate has expired"));
    }
}
