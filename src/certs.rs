//! `stowage certs`: the CA and serving certificate of an in-cluster deployment, written as the files
//! the `deploy/apiservice` kustomization reads (`deploy/apiservice/generated/` by default):
//!
//! - `ca.crt`, `ca.key` (0600): the CA that signs the serving certificate; the kube-apiserver trusts
//!   it through the APIService's `caBundle`.
//! - `tls.crt`, `tls.key` (0600): the serving certificate for `SERVICE.NAMESPACE.svc` (and
//!   `.svc.cluster.local`, `SERVICE.NAMESPACE`, `SERVICE`).
//! - `secret.yaml` (0600): the `stowage-tls` Secret (type `kubernetes.io/tls`) the pod mounts.
//! - `kustomization.yaml`: a kustomize Component adding the Secret to the server's kustomization.
//! - `registration/apiservice-cabundle.yaml`: a strategic-merge patch setting the APIService's
//!   `caBundle`, and `registration/kustomization.yaml`, the Component adding it to the APIService's
//!   own kustomization (applied once the server is ready, so it never names a server that cannot
//!   start).
//! - `ca-previous.crt`, only after a CA rotation: the replaced CA, still trusted by the caBundle so
//!   the pod's old serving certificate verifies until the kubelet delivers the new one.
//!
//! Existing files are kept while valid (CA and key match, the leaf was signed by this CA, names the
//! same hosts, and is not close to expiry); `--force` replaces both the CA and the serving
//! certificate.

use crate::auth::pki::{
    authority_key_id, create_private_dir, io_err, key_matches, pem_der, subject_key_id, write_atomic, PkiError,
};
use std::fs;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use x509_parser::certificate::X509Certificate;
use x509_parser::extensions::{GeneralName, ParsedExtension};

/// The name of the APIService the caBundle patch targets.
pub const APISERVICE_NAME: &str = "v1alpha1.content.stowage.dev";
/// The Secret the StatefulSet mounts its serving certificate from.
pub const SECRET_NAME: &str = "stowage-tls";

const CA_COMMON_NAME: &str = "stowage-deploy-ca";
/// The CA outlives its leaves by far: rotating it means touching the APIService as well.
const CA_VALIDITY_DAYS: u32 = 3650;
/// A leaf is reissued when it has less than this left (or a third of its validity, if shorter).
const RENEW_BEFORE_DAYS: u32 = 30;

/// Options of `stowage certs`.
#[derive(Clone, Debug, clap::Args)]
pub struct CertsOptions {
    /// Namespace the stowage Service runs in.
    #[arg(long, default_value = "stowage")]
    pub namespace: String,
    /// Name of the stowage Service (the APIService's service reference).
    #[arg(long, default_value = "stowage")]
    pub service: String,
    /// Directory the certificates and manifests are written to.
    #[arg(long, default_value = "deploy/apiservice/generated")]
    pub out: PathBuf,
    /// Validity of the serving certificate, in days.
    #[arg(long, default_value_t = 365, value_parser = clap::value_parser!(u32).range(1..=3650))]
    pub days: u32,
    /// Replace the CA and the serving certificate even when they are still valid.
    #[arg(long)]
    pub force: bool,
}

/// Why the certificates or manifests could not be written.
#[derive(Debug, thiserror::Error)]
pub enum CertsError {
    #[error("--{flag} {value:?} is not a DNS label (lowercase letters, digits and '-', at most 63)")]
    InvalidName { flag: &'static str, value: String },
    /// Reading, writing or generating key material, as for the standalone PKI.
    #[error(transparent)]
    Pki(#[from] PkiError),
}

/// What happened to the CA.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CaOutcome {
    /// The existing CA was valid and kept.
    Kept,
    /// There was no usable CA; a new one was created.
    Created,
    /// A valid CA was replaced (`--force`, or it would expire before a new serving certificate);
    /// the old one is kept in `ca-previous.crt` and still trusted by the caBundle.
    Rotated,
}

/// What `stowage certs` did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Summary {
    pub out: PathBuf,
    pub ca: CaOutcome,
    /// Whether a new serving certificate was issued (else the existing one was kept).
    pub serving_issued: bool,
    /// The host names the serving certificate is valid for.
    pub dns_names: Vec<String>,
    /// How many CA certificates the APIService caBundle holds (2 while a rotated CA is trusted).
    pub ca_bundle_certs: usize,
}

/// The files `stowage certs` manages inside `--out`.
struct Files {
    ca_cert: PathBuf,
    ca_key: PathBuf,
    ca_previous: PathBuf,
    tls_cert: PathBuf,
    tls_key: PathBuf,
    secret: PathBuf,
    kustomization: PathBuf,
    registration: PathBuf,
    patch: PathBuf,
    registration_kustomization: PathBuf,
}

impl Files {
    fn at(dir: &Path) -> Self {
        Self {
            ca_cert: dir.join("ca.crt"),
            ca_key: dir.join("ca.key"),
            ca_previous: dir.join("ca-previous.crt"),
            tls_cert: dir.join("tls.crt"),
            tls_key: dir.join("tls.key"),
            secret: dir.join("secret.yaml"),
            kustomization: dir.join("kustomization.yaml"),
            registration: dir.join("registration"),
            patch: dir.join("registration/apiservice-cabundle.yaml"),
            registration_kustomization: dir.join("registration/kustomization.yaml"),
        }
    }
}

/// A loaded or freshly generated CA, ready to sign.
struct Ca {
    issuer: Issuer<'static, KeyPair>,
    key_id: Vec<u8>,
    pem: String,
}

/// Creates or refreshes the files in `options.out`.
pub fn run(options: &CertsOptions) -> Result<Summary, CertsError> {
    check_label("namespace", &options.namespace)?;
    check_label("service", &options.service)?;
    create_private_dir(&options.out)?;
    let files = Files::at(&options.out);
    let dns_names = dns_names(&options.service, &options.namespace);
    let leaf_days = options.days;

    let existing = load_ca(&files.ca_cert, &files.ca_key);
    let outlives_leaf = |ca: &Ca| ca_outlives(&ca.pem, leaf_days);
    let (ca, outcome) = match existing {
        Some(ca) if !options.force && outlives_leaf(&ca) => (ca, CaOutcome::Kept),
        Some(old) => {
            // Trust the old CA a while longer: the running pod still presents a leaf it signed.
            write_atomic(&files.ca_previous, old.pem.as_bytes(), 0o644)?;
            (generate_ca(&files, leaf_days)?, CaOutcome::Rotated)
        }
        None => (generate_ca(&files, leaf_days)?, CaOutcome::Created),
    };
    if outcome == CaOutcome::Created {
        // A previous CA from another, now unusable, CA generation means nothing for this one.
        remove_if_present(&files.ca_previous)?;
    }

    let keep_leaf = !options.force
        && outcome == CaOutcome::Kept
        && leaf_is_usable(&files.tls_cert, &files.tls_key, &ca.key_id, &dns_names, leaf_days);
    if !keep_leaf {
        issue_serving(&files, &ca, &dns_names, leaf_days)?;
    }

    // The caBundle: the current CA, then the previous one while it is still valid.
    let mut bundle = ca.pem.clone();
    let mut ca_bundle_certs = 1;
    if let Some(previous) = fs::read_to_string(&files.ca_previous).ok().filter(|pem| ca_outlives(pem, 0)) {
        if previous.trim() != ca.pem.trim() {
            if !bundle.ends_with('\n') {
                bundle.push('\n');
            }
            bundle.push_str(&previous);
            ca_bundle_certs += 1;
        }
    }
    write_manifests(&files, &options.namespace, &bundle)?;
    Ok(Summary { out: options.out.clone(), ca: outcome, serving_issued: !keep_leaf, dns_names, ca_bundle_certs })
}

/// `SERVICE`, `SERVICE.NS`, `SERVICE.NS.svc`, `SERVICE.NS.svc.cluster.local`.
pub fn dns_names(service: &str, namespace: &str) -> Vec<String> {
    vec![
        format!("{service}.{namespace}.svc"),
        format!("{service}.{namespace}.svc.cluster.local"),
        format!("{service}.{namespace}"),
        service.to_owned(),
    ]
}

fn check_label(flag: &'static str, value: &str) -> Result<(), CertsError> {
    let ok = !value.is_empty()
        && value.len() <= 63
        && value.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !value.starts_with('-')
        && !value.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(CertsError::InvalidName { flag, value: value.to_owned() })
    }
}

fn write_manifests(files: &Files, namespace: &str, ca_bundle_pem: &str) -> Result<(), CertsError> {
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
    let read = |path: &Path| fs::read(path).map_err(|source| io_err("read", path, source));
    let tls_crt = b64(&read(&files.tls_cert)?);
    let tls_key = b64(&read(&files.tls_key)?);
    let ca_crt = b64(&read(&files.ca_cert)?);
    let ca_bundle = b64(ca_bundle_pem.as_bytes());

    let secret = format!(
        "# Generated by `stowage certs`; do not edit, do not commit (it holds the serving key).
apiVersion: v1
kind: Secret
metadata:
  name: {SECRET_NAME}
  namespace: {namespace}
  labels:
    app.kubernetes.io/name: stowage
    app.kubernetes.io/component: serving-certificate
type: kubernetes.io/tls
data:
  tls.crt: {tls_crt}
  tls.key: {tls_key}
  ca.crt: {ca_crt}
"
    );
    let patch = format!(
        "# Generated by `stowage certs`: the CA(s) the kube-apiserver trusts for stowage's serving certificate.
apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata:
  name: {APISERVICE_NAME}
spec:
  caBundle: {ca_bundle}
"
    );
    let kustomization = "# Generated by `stowage certs`: the serving-certificate Secret (registration/: the caBundle).
apiVersion: kustomize.config.k8s.io/v1alpha1
kind: Component
resources:
- secret.yaml
";
    let registration = "# Generated by `stowage certs`: the APIService's caBundle.
apiVersion: kustomize.config.k8s.io/v1alpha1
kind: Component
patches:
- path: apiservice-cabundle.yaml
";
    write_atomic(&files.secret, secret.as_bytes(), 0o600)?;
    write_atomic(&files.kustomization, kustomization.as_bytes(), 0o644)?;
    fs::create_dir_all(&files.registration)
        .map_err(|source| io_err("create directory", &files.registration, source))?;
    write_atomic(&files.patch, patch.as_bytes(), 0o644)?;
    Ok(write_atomic(&files.registration_kustomization, registration.as_bytes(), 0o644)?)
}

fn load_ca(cert_path: &Path, key_path: &Path) -> Option<Ca> {
    let cert_pem = fs::read_to_string(cert_path).ok()?;
    let key_pem = fs::read_to_string(key_path).ok()?;
    let key = KeyPair::from_pem(&key_pem).ok()?;
    let key_id = {
        let der = pem_der(&cert_pem)?;
        let (_, cert) = x509_parser::parse_x509_certificate(&der).ok()?;
        if !cert.is_ca() || !key_matches(&cert, &key) || !cert.validity().is_valid() {
            return None;
        }
        subject_key_id(&cert)?
    };
    let issuer = Issuer::from_ca_cert_pem(&cert_pem, key).ok()?;
    Some(Ca { issuer, key_id, pem: cert_pem })
}

/// Whether the (first) certificate in `pem` is still valid `days` days from now.
fn ca_outlives(pem: &str, days: u32) -> bool {
    let Some(der) = pem_der(pem) else { return false };
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(&der) else { return false };
    let until = chrono::Utc::now() + chrono::Duration::days(i64::from(days));
    cert.validity().is_valid() && cert.validity().not_after.timestamp() > until.timestamp()
}

fn generate_ca(files: &Files, leaf_days: u32) -> Result<Ca, CertsError> {
    let what = "CA";
    let gen = |source| PkiError::Generate { what, source };
    let key = KeyPair::generate().map_err(gen)?;
    let mut params = CertificateParams::default();
    params.distinguished_name = dn(CA_COMMON_NAME);
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    set_validity(&mut params, CA_VALIDITY_DAYS.max(leaf_days.saturating_add(RENEW_BEFORE_DAYS)));
    let cert = params.self_signed(&key).map_err(gen)?;
    let key_id = params.key_identifier(&key);
    let pem = cert.pem();
    // Key first: a crash between the two writes leaves a mismatch, which load_ca rejects.
    write_atomic(&files.ca_key, key.serialize_pem().as_bytes(), 0o600)?;
    write_atomic(&files.ca_cert, pem.as_bytes(), 0o644)?;
    Ok(Ca { issuer: Issuer::new(params, key), key_id, pem })
}

fn issue_serving(files: &Files, ca: &Ca, dns_names: &[String], days: u32) -> Result<(), CertsError> {
    let gen = |source| PkiError::Generate { what: "serving certificate", source };
    let key = KeyPair::generate().map_err(gen)?;
    let mut params = CertificateParams::new(dns_names.to_vec()).map_err(gen)?;
    params.distinguished_name = dn(dns_names.first().map(String::as_str).unwrap_or("stowage"));
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    set_validity(&mut params, days);
    let cert = params.signed_by(&key, &ca.issuer).map_err(gen)?;
    write_atomic(&files.tls_key, key.serialize_pem().as_bytes(), 0o600)?;
    Ok(write_atomic(&files.tls_cert, cert.pem().as_bytes(), 0o644)?)
}

/// Whether the existing serving certificate can be kept: key matches, signed by `ca_key_id`, names
/// exactly `dns_names`, and has more than its renewal margin left.
fn leaf_is_usable(cert: &Path, key: &Path, ca_key_id: &[u8], dns_names: &[String], days: u32) -> bool {
    let (Ok(cert_pem), Ok(key_pem)) = (fs::read_to_string(cert), fs::read_to_string(key)) else {
        return false;
    };
    let (Some(der), Ok(key)) = (pem_der(&cert_pem), KeyPair::from_pem(&key_pem)) else {
        return false;
    };
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(&der) else {
        return false;
    };
    let margin = RENEW_BEFORE_DAYS.min(days / 3);
    let renew_at = chrono::Utc::now() + chrono::Duration::days(i64::from(margin));
    let mut have = san_dns_names(&cert);
    let mut want = dns_names.to_vec();
    have.sort();
    want.sort();
    key_matches(&cert, &key)
        && cert.validity().is_valid()
        && cert.validity().not_after.timestamp() > renew_at.timestamp()
        && authority_key_id(&cert).is_some_and(|id| id == ca_key_id)
        && have == want
}

fn san_dns_names(cert: &X509Certificate<'_>) -> Vec<String> {
    cert.extensions()
        .iter()
        .filter_map(|ext| match ext.parsed_extension() {
            ParsedExtension::SubjectAlternativeName(san) => Some(san),
            _ => None,
        })
        .flat_map(|san| san.general_names.iter())
        .filter_map(|name| match name {
            GeneralName::DNSName(dns) => Some((*dns).to_owned()),
            _ => None,
        })
        .collect()
}

fn dn(common_name: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    dn
}

/// Valid from yesterday (tolerates clocks that lag) for `days` days.
fn set_validity(params: &mut CertificateParams, days: u32) {
    let today = chrono::Utc::now().date_naive();
    let ymd = |d: chrono::NaiveDate| {
        use chrono::Datelike as _;
        rcgen::date_time_ymd(d.year(), d.month() as u8, d.day() as u8)
    };
    params.not_before = ymd(today - chrono::Duration::days(1));
    params.not_after = ymd(today + chrono::Duration::days(i64::from(days)));
}

fn remove_if_present(path: &Path) -> Result<(), CertsError> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io_err("remove", path, e).into()),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(out: &Path) -> CertsOptions {
        CertsOptions {
            namespace: "stowage".into(),
            service: "stowage".into(),
            out: out.to_owned(),
            days: 365,
            force: false,
        }
    }

    #[test]
    fn creates_keeps_and_rotates() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("generated");
        let first = run(&options(&out)).unwrap();
        assert_eq!(first.ca, CaOutcome::Created);
        assert!(first.serving_issued);
        assert_eq!(first.ca_bundle_certs, 1);
        let ca = fs::read(out.join("ca.crt")).unwrap();
        let tls = fs::read(out.join("tls.crt")).unwrap();

        let second = run(&options(&out)).unwrap();
        assert_eq!(second.ca, CaOutcome::Kept);
        assert!(!second.serving_issued);
        assert_eq!(fs::read(out.join("ca.crt")).unwrap(), ca);
        assert_eq!(fs::read(out.join("tls.crt")).unwrap(), tls);

        let forced = run(&CertsOptions { force: true, ..options(&out) }).unwrap();
        assert_eq!(forced.ca, CaOutcome::Rotated);
        assert!(forced.serving_issued);
        assert_eq!(forced.ca_bundle_certs, 2);
        assert_ne!(fs::read(out.join("ca.crt")).unwrap(), ca);
        assert_eq!(fs::read(out.join("ca-previous.crt")).unwrap(), ca);
    }

    #[test]
    fn other_names_reissue_the_leaf_only() {
        let dir = tempfile::tempdir().unwrap();
        run(&options(dir.path())).unwrap();
        let again = run(&CertsOptions { namespace: "other".into(), ..options(dir.path()) }).unwrap();
        assert_eq!(again.ca, CaOutcome::Kept);
        assert!(again.serving_issued);
        assert!(again.dns_names.contains(&"stowage.other.svc".to_string()));
    }

    #[test]
    fn rejects_names_that_are_not_labels() {
        let dir = tempfile::tempdir().unwrap();
        for bad in ["", "Upper", "a.b", "-x", "x y"] {
            let err = run(&CertsOptions { namespace: bad.into(), ..options(dir.path()) }).unwrap_err();
            assert!(matches!(err, CertsError::InvalidName { .. }), "{bad}: {err}");
        }
    }

    #[cfg(unix)]
    #[test]
    fn keys_and_secret_are_private() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        run(&options(dir.path())).unwrap();
        for name in ["ca.key", "tls.key", "secret.yaml"] {
            let mode = fs::metadata(dir.path().join(name)).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{name}");
        }
    }
}
