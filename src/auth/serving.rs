//! The serving certificate, reloaded when its files change (cert-manager and kubelet rotate
//! mounted Secrets in place): every TLS handshake takes the current one; a replacement that does
//! not parse or does not match its key is refused and the old one keeps serving.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

/// How often the files are checked for changes.
const CHECK_EVERY: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum ServingCertError {
    #[error("cannot read {}: {source}", path.display())]
    Pem {
        path: PathBuf,
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    #[error("no certificates in {}", path.display())]
    NoCertificates { path: PathBuf },
    #[error("the private key in {}: {source}", path.display())]
    Key {
        path: PathBuf,
        #[source]
        source: rustls::Error,
    },
    #[error("the certificate in {} does not match its key: {source}", path.display())]
    Mismatch {
        path: PathBuf,
        #[source]
        source: rustls::Error,
    },
}

/// What identifies a version of the files.
type Stamp = Option<(SystemTime, u64, SystemTime, u64)>;

/// The serving certificate and key files and what was last loaded from them.
#[derive(Debug)]
pub struct ServingCertificate {
    cert_path: PathBuf,
    key_path: PathBuf,
    provider: Arc<rustls::crypto::CryptoProvider>,
    current: RwLock<Arc<CertifiedKey>>,
    loaded: Mutex<Stamp>,
}

impl ServingCertificate {
    pub fn load(
        cert_path: &Path,
        key_path: &Path,
        provider: Arc<rustls::crypto::CryptoProvider>,
    ) -> Result<ServingCertificate, ServingCertError> {
        let stamp = stamp(cert_path, key_path);
        let key = certified_key(cert_path, key_path, &provider)?;
        Ok(ServingCertificate {
            cert_path: cert_path.to_owned(),
            key_path: key_path.to_owned(),
            provider,
            current: RwLock::new(Arc::new(key)),
            loaded: Mutex::new(stamp),
        })
    }

    /// Reloads if the files changed since the last load; returns whether a new certificate is in
    /// force.
    pub fn reload_if_changed(&self) -> Result<bool, ServingCertError> {
        let now = stamp(&self.cert_path, &self.key_path);
        let mut loaded = self.loaded.lock().unwrap_or_else(|e| e.into_inner());
        if now == *loaded {
            return Ok(false);
        }
        // Remember the attempt even if it fails: a half-written pair is retried once it changes.
        *loaded = now;
        let key = certified_key(&self.cert_path, &self.key_path, &self.provider)?;
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(key);
        Ok(true)
    }

    /// Checks the files every few seconds until `shutdown`.
    pub fn watch(self: Arc<Self>, shutdown: tokio_util::sync::CancellationToken) {
        tokio::spawn(async move {
            let mut timer = tokio::time::interval(CHECK_EVERY);
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = timer.tick() => {}
                }
                let this = self.clone();
                match tokio::task::spawn_blocking(move || this.reload_if_changed()).await {
                    Ok(Ok(true)) => tracing::info!(cert = %self.cert_path.display(), "serving certificate reloaded"),
                    Ok(Ok(false)) => {}
                    Ok(Err(e)) => {
                        tracing::error!(error = %e, "serving certificate not reloaded; keeping the current one")
                    }
                    Err(e) => tracing::error!(error = %e, "serving certificate check failed"),
                }
            }
        });
    }
}

impl ResolvesServerCert for ServingCertificate {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.read().unwrap_or_else(|e| e.into_inner()).clone())
    }
}

fn stamp(cert: &Path, key: &Path) -> Stamp {
    let one = |p: &Path| std::fs::metadata(p).ok().and_then(|m| Some((m.modified().ok()?, m.len())));
    let (c, k) = (one(cert)?, one(key)?);
    Some((c.0, c.1, k.0, k.1))
}

fn certified_key(
    cert_path: &Path,
    key_path: &Path,
    provider: &rustls::crypto::CryptoProvider,
) -> Result<CertifiedKey, ServingCertError> {
    let pem = |path: &Path, source| ServingCertError::Pem { path: path.to_owned(), source };
    let chain = CertificateDer::pem_file_iter(cert_path)
        .map_err(|e| pem(cert_path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem(cert_path, e))?;
    if chain.is_empty() {
        return Err(ServingCertError::NoCertificates { path: cert_path.to_owned() });
    }
    let key = PrivateKeyDer::from_pem_file(key_path).map_err(|e| pem(key_path, e))?;
    let signing_key = provider
        .key_provider
        .load_private_key(key)
        .map_err(|source| ServingCertError::Key { path: key_path.to_owned(), source })?;
    let certified = CertifiedKey::new(chain, signing_key);
    certified.keys_match().map_err(|source| ServingCertError::Mismatch { path: cert_path.to_owned(), source })?;
    Ok(certified)
}
