//! The stub's certificates: the CA its serving certificate chains to (what the kubeconfig trusts),
//! and two more CAs a test publishes in the authentication ConfigMap: the client CA (user
//! certificates: CN = user, O = groups) and the request-header CA (the front proxy's certificates).

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// A certificate and its private key, both PEM.
#[derive(Clone, Debug)]
pub struct CertifiedKey {
    pub cert_pem: String,
    pub key_pem: String,
}

/// A CA that signs leaves on demand.
pub struct TestCa {
    pub cert_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for TestCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCa").finish_non_exhaustive()
    }
}

fn dn(common_name: &str, organizations: &[&str]) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    for org in organizations {
        dn.push(DnType::OrganizationName, *org);
    }
    dn.push(DnType::CommonName, common_name);
    dn
}

impl TestCa {
    pub fn new(common_name: &str) -> TestCa {
        let key = KeyPair::generate().expect("CA key");
        let mut params = CertificateParams::default();
        params.distinguished_name = dn(common_name, &[]);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
        let cert = params.self_signed(&key).expect("CA certificate");
        TestCa { cert_pem: cert.pem(), issuer: Issuer::new(params, key) }
    }

    fn sign(&self, mut params: CertificateParams) -> CertifiedKey {
        let key = KeyPair::generate().expect("leaf key");
        params.use_authority_key_identifier_extension = true;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let cert = params.signed_by(&key, &self.issuer).expect("leaf certificate");
        CertifiedKey { cert_pem: cert.pem(), key_pem: key.serialize_pem() }
    }

    /// A serving certificate for these DNS names / IP addresses.
    pub fn server_cert(&self, names: &[&str]) -> CertifiedKey {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = CertificateParams::new(names).expect("serving names");
        params.distinguished_name = dn("stub-kube-apiserver", &[]);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.sign(params)
    }

    /// A client certificate: CN = `user`, O = `groups` (or, from the request-header CA, the front
    /// proxy's name).
    pub fn client_cert(&self, user: &str, groups: &[&str]) -> CertifiedKey {
        let mut params = CertificateParams::default();
        params.distinguished_name = dn(user, groups);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.sign(params)
    }
}
