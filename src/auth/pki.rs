//! Standalone-mode certificates: a private CA, the serving certificate it signs, and an admin client
//! certificate plus kubeconfig, so `stowage` can run (and be reached with kubectl) without a cluster.
//!
//! Files live under `DATA_DIR/pki/` and are created on first start and reused afterwards. Anything
//! missing, unreadable, mismatched or close to expiry is regenerated; a new CA forces new leaves,
//! since certificates signed by the old CA would no longer verify.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use x509_parser::extensions::ParsedExtension;

/// Common name of the standalone CA.
const CA_COMMON_NAME: &str = "stowage-ca";
/// Client identity of the admin certificate: kube-apiserver treats `system:masters` as all-powerful,
/// and stowage's standalone authorizer follows the same convention.
const ADMIN_USER: &str = "stowage-admin";
const ADMIN_GROUP: &str = "system:masters";

const CA_VALIDITY_DAYS: i64 = 3650;
const LEAF_VALIDITY_DAYS: i64 = 365;
/// Regenerate a certificate this long before it expires, so a restart renews it rather than a
/// client discovering the expiry.
const RENEW_BEFORE_DAYS: i64 = 30;

/// Why the standalone PKI could not be created or written.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("cannot {action} {}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot generate the {what}")]
    Generate {
        what: &'static str,
        #[source]
        source: rcgen::Error,
    },
}

/// Paths of the standalone PKI files (all PEM).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StandalonePki {
    pub dir: PathBuf,
    pub ca_cert: PathBuf,
    pub serving_cert: PathBuf,
    pub serving_key: PathBuf,
    pub admin_cert: PathBuf,
    pub admin_key: PathBuf,
}

impl StandalonePki {
    fn at(dir: PathBuf) -> Self {
        Self {
            ca_cert: dir.join("ca.crt"),
            serving_cert: dir.join("serving.crt"),
            serving_key: dir.join("serving.key"),
            admin_cert: dir.join("admin.crt"),
            admin_key: dir.join("admin.key"),
            dir,
        }
    }

    fn ca_key(&self) -> PathBuf {
        self.dir.join("ca.key")
    }
}

/// Creates DATA_DIR/pki/{ca.crt,ca.key,serving.crt,serving.key,admin.crt,admin.key} on first start,
/// reuses them after.
pub fn ensure_standalone(data_dir: &Path) -> Result<StandalonePki, PkiError> {
    ensure(data_dir, true)
}

/// In a cluster: the CA and the default serving certificate only. Users bring the cluster's
/// credentials, so an admin certificate would only be a credential lying on the volume.
pub fn ensure_serving_only(data_dir: &Path) -> Result<StandalonePki, PkiError> {
    let pki = ensure(data_dir, false)?;
    if pki.admin_key.exists() {
        tracing::warn!(
            "{} and {} hold a standalone admin credential that this server does not use in a cluster; \
             delete them",
            pki.admin_cert.display(),
            pki.admin_key.display()
        );
    }
    Ok(pki)
}

fn ensure(data_dir: &Path, with_admin: bool) -> Result<StandalonePki, PkiError> {
    let pki = StandalonePki::at(data_dir.join("pki"));
    create_private_dir(&pki.dir)?;

    let (ca, ca_is_new) = match load_ca(&pki.ca_cert, &pki.ca_key()) {
        Some(ca) => (ca, false),
        None => (generate_ca(&pki)?, true),
    };

    let serving = LeafSpec {
        what: "serving certificate",
        cert: &pki.serving_cert,
        key: &pki.serving_key,
        params: serving_params,
    };
    let admin =
        LeafSpec { what: "admin client certificate", cert: &pki.admin_cert, key: &pki.admin_key, params: admin_params };
    let leaves = if with_admin { vec![serving, admin] } else { vec![serving] };
    for leaf in leaves {
        if ca_is_new || !leaf_is_usable(&leaf, &ca.key_id) {
            issue_leaf(&leaf, &ca)?;
            tracing::info!(path = %leaf.cert.display(), "generated standalone {}", leaf.what);
        }
    }
    Ok(pki)
}

/// Writes DATA_DIR/admin.kubeconfig (mode 0600), rewritten on every start so it names the current
/// address.
pub fn write_admin_kubeconfig(data_dir: &Path, pki: &StandalonePki, server_url: &str) -> Result<PathBuf, PkiError> {
    let b64 = |path: &Path| -> Result<String, PkiError> {
        let bytes = fs::read(path).map_err(|source| io_err("read", path, source))?;
        Ok(base64::engine::general_purpose::STANDARD.encode(bytes))
    };
    let ca = b64(&pki.ca_cert)?;
    let cert = b64(&pki.admin_cert)?;
    let key = b64(&pki.admin_key)?;
    // A JSON string is a valid YAML double-quoted scalar, so any URL is quoted safely.
    let server = serde_json::Value::from(server_url).to_string();
    let kubeconfig = format!(
        "apiVersion: v1
kind: Config
clusters:
- name: stowage
  cluster:
    server: {server}
    certificate-authority-data: {ca}
users:
- name: {ADMIN_USER}
  user:
    client-certificate-data: {cert}
    client-key-data: {key}
contexts:
- name: stowage
  context:
    cluster: stowage
    user: {ADMIN_USER}
    namespace: default
current-context: stowage
preferences: {{}}
"
    );
    let path = data_dir.join("admin.kubeconfig");
    write_atomic(&path, kubeconfig.as_bytes(), 0o600)?;
    Ok(path)
}

/// A loaded or freshly generated CA, ready to sign.
struct Ca {
    issuer: Issuer<'static, KeyPair>,
    /// Subject key identifier; leaves carry it as their authority key identifier, which is how a
    /// leaf signed by an older CA with the same name is told apart.
    key_id: Vec<u8>,
}

struct LeafSpec<'a> {
    what: &'static str,
    cert: &'a Path,
    key: &'a Path,
    params: fn() -> Result<CertificateParams, rcgen::Error>,
}

fn load_ca(cert_path: &Path, key_path: &Path) -> Option<Ca> {
    let cert_pem = fs::read_to_string(cert_path).ok()?;
    let key_pem = fs::read_to_string(key_path).ok()?;
    let key = KeyPair::from_pem(&key_pem).ok()?;
    let key_id = {
        let der = pem_der(&cert_pem)?;
        let (_, cert) = x509_parser::parse_x509_certificate(&der).ok()?;
        if !cert.is_ca() || !key_matches(&cert, &key) || expires_soon(&cert) {
            return None;
        }
        subject_key_id(&cert)?
    };
    let issuer = Issuer::from_ca_cert_pem(&cert_pem, key).ok()?;
    Some(Ca { issuer, key_id })
}

fn generate_ca(pki: &StandalonePki) -> Result<Ca, PkiError> {
    let what = "standalone CA";
    let gen = |source| PkiError::Generate { what, source };
    let key = KeyPair::generate().map_err(gen)?;
    let mut params = CertificateParams::default();
    params.distinguished_name = dn(CA_COMMON_NAME, None);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    set_validity(&mut params, CA_VALIDITY_DAYS);
    let cert = params.self_signed(&key).map_err(gen)?;
    let key_id = params.key_identifier(&key);

    // Key first: a crash between the two writes leaves a cert/key mismatch, which load_ca rejects.
    write_atomic(&pki.ca_key(), key.serialize_pem().as_bytes(), 0o600)?;
    write_atomic(&pki.ca_cert, cert.pem().as_bytes(), 0o644)?;
    tracing::info!(path = %pki.ca_cert.display(), "generated standalone CA");
    Ok(Ca { issuer: Issuer::new(params, key), key_id })
}

fn issue_leaf(leaf: &LeafSpec<'_>, ca: &Ca) -> Result<(), PkiError> {
    let gen = |source| PkiError::Generate { what: leaf.what, source };
    let key = KeyPair::generate().map_err(gen)?;
    let mut params = (leaf.params)().map_err(gen)?;
    params.use_authority_key_identifier_extension = true;
    set_validity(&mut params, LEAF_VALIDITY_DAYS);
    let cert = params.signed_by(&key, &ca.issuer).map_err(gen)?;
    write_atomic(leaf.key, key.serialize_pem().as_bytes(), 0o600)?;
    write_atomic(leaf.cert, cert.pem().as_bytes(), 0o644)?;
    Ok(())
}

fn serving_params() -> Result<CertificateParams, rcgen::Error> {
    let mut names = vec!["localhost".to_owned(), "127.0.0.1".to_owned(), "::1".to_owned()];
    names.extend(hostname());
    let mut params = CertificateParams::new(names)?;
    params.distinguished_name = dn("stowage", None);
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    Ok(params)
}

fn admin_params() -> Result<CertificateParams, rcgen::Error> {
    let mut params = CertificateParams::default();
    params.distinguished_name = dn(ADMIN_USER, Some(ADMIN_GROUP));
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    Ok(params)
}

fn dn(common_name: &str, organization: Option<&str>) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    if let Some(org) = organization {
        dn.push(DnType::OrganizationName, org);
    }
    dn.push(DnType::CommonName, common_name);
    dn
}

/// Valid from yesterday (tolerates clients whose clocks lag) for `days` days.
fn set_validity(params: &mut CertificateParams, days: i64) {
    let today = chrono::Utc::now().date_naive();
    let ymd = |d: chrono::NaiveDate| {
        use chrono::Datelike as _;
        // chrono dates are always valid calendar dates, so date_time_ymd cannot panic here.
        rcgen::date_time_ymd(d.year(), d.month() as u8, d.day() as u8)
    };
    params.not_before = ymd(today - chrono::Duration::days(1));
    params.not_after = ymd(today + chrono::Duration::days(days));
}

/// The machine's host name, when it is a plain DNS name worth adding as a SAN.
fn hostname() -> Option<String> {
    let name = fs::read_to_string("/proc/sys/kernel/hostname").ok()?;
    let name = name.trim().to_ascii_lowercase();
    let valid = !name.is_empty()
        && name.len() <= 253
        && name != "localhost"
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
        && !name.starts_with(['-', '.']);
    valid.then_some(name)
}

/// Whether an existing leaf can be kept: readable, key matches, signed by `ca_key_id`, not expiring.
fn leaf_is_usable(leaf: &LeafSpec<'_>, ca_key_id: &[u8]) -> bool {
    let (Ok(cert_pem), Ok(key_pem)) = (fs::read_to_string(leaf.cert), fs::read_to_string(leaf.key)) else {
        return false;
    };
    let (Some(der), Ok(key)) = (pem_der(&cert_pem), KeyPair::from_pem(&key_pem)) else {
        return false;
    };
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(&der) else {
        return false;
    };
    key_matches(&cert, &key) && !expires_soon(&cert) && authority_key_id(&cert).is_some_and(|id| id == ca_key_id)
}

pub(crate) fn pem_der(pem: &str) -> Option<Vec<u8>> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).ok()?;
    (pem.label == "CERTIFICATE").then_some(pem.contents)
}

pub(crate) fn key_matches(cert: &x509_parser::certificate::X509Certificate<'_>, key: &KeyPair) -> bool {
    cert.public_key().subject_public_key.data.as_ref() == key.public_key_raw()
}

fn expires_soon(cert: &x509_parser::certificate::X509Certificate<'_>) -> bool {
    let renew_at = chrono::Utc::now() + chrono::Duration::days(RENEW_BEFORE_DAYS);
    cert.validity().not_after.timestamp() < renew_at.timestamp()
}

pub(crate) fn subject_key_id(cert: &x509_parser::certificate::X509Certificate<'_>) -> Option<Vec<u8>> {
    cert.extensions().iter().find_map(|ext| match ext.parsed_extension() {
        ParsedExtension::SubjectKeyIdentifier(id) => Some(id.0.to_vec()),
        _ => None,
    })
}

pub(crate) fn authority_key_id(cert: &x509_parser::certificate::X509Certificate<'_>) -> Option<Vec<u8>> {
    cert.extensions().iter().find_map(|ext| match ext.parsed_extension() {
        ParsedExtension::AuthorityKeyIdentifier(aki) => aki.key_identifier.as_ref().map(|id| id.0.to_vec()),
        _ => None,
    })
}

/// Creates `dir` (and missing parents), its entry durable: without it a power cut could take the
/// directory, and every file written into it, away.
pub(crate) fn create_private_dir(dir: &Path) -> Result<(), PkiError> {
    let mut builder = fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir).map_err(|source| io_err("create directory", dir, source))?;
    sync_parent(dir).map_err(|(path, source)| io_err("sync directory", &path, source))
}

/// Fsyncs the directory holding `path`: a file created or renamed there is durable only then.
fn sync_parent(path: &Path) -> Result<(), (PathBuf, std::io::Error)> {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    fs::File::open(parent).and_then(|d| d.sync_all()).map_err(|source| (parent.to_owned(), source))
}

pub(crate) fn write_atomic(path: &Path, contents: &[u8], mode: u32) -> Result<(), PkiError> {
    write_file_atomic(path, contents, mode).map_err(|(action, path, source)| PkiError::Io { action, path, source })
}

/// Writes through a temporary file and a rename, so readers (and a crash) never see a partial file,
/// and the final file has `mode` from the moment it appears; then syncs the directory, so a power cut
/// cannot bring back the old file or none (the certificates were already handed out). On failure:
/// what failed, on which path.
fn write_file_atomic(path: &Path, contents: &[u8], mode: u32) -> Result<(), (&'static str, PathBuf, std::io::Error)> {
    let file_name = path.file_name().map(|n| n.to_string_lossy()).unwrap_or_default();
    let tmp = path.with_file_name(format!(".{file_name}.tmp.{}", std::process::id()));
    let result = (|| {
        let mut options = fs::OpenOptions::new();
        options.write(true).create(true).truncate(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, mode);
        #[cfg(not(unix))]
        let _ = mode;
        let mut file = options.open(&tmp)?;
        // A stale temp file from a crashed run keeps its old mode; reset it before writing secrets.
        #[cfg(unix)]
        file.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(mode))?;
        file.write_all(contents)?;
        file.sync_all()
    })();
    if let Err(source) = result {
        let _ = fs::remove_file(&tmp);
        return Err(("write", tmp, source));
    }
    fs::rename(&tmp, path).map_err(|source| {
        let _ = fs::remove_file(&tmp);
        ("rename into place", path.to_owned(), source)
    })?;
    sync_parent(path).map_err(|(dir, source)| ("sync directory", dir, source))
}

pub(crate) fn io_err(action: &'static str, path: &Path, source: std::io::Error) -> PkiError {
    PkiError::Io { action, path: path.to_owned(), source }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generates_then_reuses() {
        let dir = tempfile::tempdir().unwrap();
        let pki = ensure_standalone(dir.path()).unwrap();
        for path in [&pki.ca_cert, &pki.ca_key(), &pki.serving_cert, &pki.serving_key, &pki.admin_cert, &pki.admin_key]
        {
            assert!(path.is_file(), "{} missing", path.display());
        }
        let ca_before = fs::read(&pki.ca_cert).unwrap();
        let serving_before = fs::read(&pki.serving_cert).unwrap();

        let again = ensure_standalone(dir.path()).unwrap();
        assert_eq!(again, pki);
        assert_eq!(fs::read(&pki.ca_cert).unwrap(), ca_before);
        assert_eq!(fs::read(&pki.serving_cert).unwrap(), serving_before);
    }

    #[test]
    fn serving_only_writes_no_admin_credential() {
        let dir = tempfile::tempdir().unwrap();
        let pki = ensure_serving_only(dir.path()).unwrap();
        assert!(pki.serving_cert.is_file() && pki.serving_key.is_file() && pki.ca_cert.is_file());
        assert!(!pki.admin_cert.exists() && !pki.admin_key.exists(), "admin credential written");
        // The same CA and serving certificate serve a later standalone start.
        let serving = fs::read(&pki.serving_cert).unwrap();
        let standalone = ensure_standalone(dir.path()).unwrap();
        assert_eq!(fs::read(&standalone.serving_cert).unwrap(), serving);
        assert!(standalone.admin_cert.is_file());
    }

    #[test]
    fn missing_leaf_is_reissued_by_the_same_ca() {
        let dir = tempfile::tempdir().unwrap();
        let pki = ensure_standalone(dir.path()).unwrap();
        let ca_before = fs::read(&pki.ca_cert).unwrap();
        fs::remove_file(&pki.admin_key).unwrap();

        ensure_standalone(dir.path()).unwrap();
        assert_eq!(fs::read(&pki.ca_cert).unwrap(), ca_before);
        assert!(pki.admin_key.is_file());
    }

    #[test]
    fn missing_ca_regenerates_everything() {
        let dir = tempfile::tempdir().unwrap();
        let pki = ensure_standalone(dir.path()).unwrap();
        let ca_before = fs::read(&pki.ca_cert).unwrap();
        let serving_before = fs::read(&pki.serving_cert).unwrap();
        fs::remove_file(pki.ca_key()).unwrap();

        ensure_standalone(dir.path()).unwrap();
        assert_ne!(fs::read(&pki.ca_cert).unwrap(), ca_before);
        assert_ne!(fs::read(&pki.serving_cert).unwrap(), serving_before);
    }

    #[test]
    fn leaf_from_another_ca_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let pki = ensure_standalone(dir.path()).unwrap();
        // Same CA name, different key: only the key identifiers tell them apart.
        let other = tempfile::tempdir().unwrap();
        let other_pki = ensure_standalone(other.path()).unwrap();
        fs::copy(&other_pki.serving_cert, &pki.serving_cert).unwrap();
        fs::copy(&other_pki.serving_key, &pki.serving_key).unwrap();

        ensure_standalone(dir.path()).unwrap();
        assert_ne!(fs::read(&pki.serving_cert).unwrap(), fs::read(&other_pki.serving_cert).unwrap());
    }

    #[cfg(unix)]
    #[test]
    fn keys_and_kubeconfig_are_private() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let pki = ensure_standalone(dir.path()).unwrap();
        let kubeconfig = write_admin_kubeconfig(dir.path(), &pki, "https://127.0.0.1:8443").unwrap();
        for path in [&pki.ca_key(), &pki.serving_key, &pki.admin_key, &kubeconfig] {
            let mode = fs::metadata(path).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{}", path.display());
        }
    }

    #[test]
    fn kubeconfig_embeds_the_pki() {
        let dir = tempfile::tempdir().unwrap();
        let pki = ensure_standalone(dir.path()).unwrap();
        let path = write_admin_kubeconfig(dir.path(), &pki, "https://127.0.0.1:8443").unwrap();
        assert_eq!(path, dir.path().join("admin.kubeconfig"));
        let text = fs::read_to_string(&path).unwrap();
        assert!(text.contains("server: \"https://127.0.0.1:8443\""));
        assert!(text.contains("current-context: stowage"));
        assert!(text.contains("namespace: default"));
        let b64 = base64::engine::general_purpose::STANDARD;
        let ca_line = text.lines().find_map(|l| l.trim().strip_prefix("certificate-authority-data: ")).unwrap();
        assert_eq!(b64.decode(ca_line).unwrap(), fs::read(&pki.ca_cert).unwrap());

        // Rewritten, not appended, when the address changes.
        write_admin_kubeconfig(dir.path(), &pki, "https://[::1]:9443").unwrap();
        let text = fs::read_to_string(&path).unwrap();
        assert!(text.contains("server: \"https://[::1]:9443\""));
        assert!(!text.contains("8443"));
    }
}
