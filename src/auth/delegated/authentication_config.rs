//! The client CA and the front-proxy (request-header) settings the kube-apiserver publishes for
//! extension API servers in the `kube-system/extension-apiserver-authentication` ConfigMap, read into
//! [`TrustAnchors`] and kept current in a [`ClientTrust`].
//!
//! Keys, as the kube-apiserver writes them: `client-ca-file` and `requestheader-client-ca-file` (PEM
//! bundles), `requestheader-allowed-names`, `requestheader-username-headers`,
//! `requestheader-group-headers` and `requestheader-extra-headers-prefix` (JSON arrays of strings). As
//! in k8s.io/apiserver, a missing list is empty (no username headers: no front-proxy identity) and a
//! missing CA disables that kind of certificate. Reading it needs the
//! `extension-apiserver-authentication-reader` Role in `kube-system`.
//!
//! [`AuthenticationConfigWatcher`] polls the ConfigMap (every 10 s by default) and calls
//! [`ClientTrust::replace`] when its data changes; on an error (unreachable, deleted, malformed) the
//! anchors in force stay and the error is logged once per episode.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use kube::Client;

use super::DelegatedError;
use crate::auth::rbac::ReloadOutcome;
use crate::auth::trust::{ClientTrust, RequestHeaderConfig, TrustAnchors};

pub const NAMESPACE: &str = "kube-system";
pub const NAME: &str = "extension-apiserver-authentication";
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(10);

/// The anchors the ConfigMap's `data` describes.
pub fn trust_anchors_from(data: &BTreeMap<String, String>) -> Result<TrustAnchors, DelegatedError> {
    let pem = |key: &str| data.get(key).filter(|v| !v.trim().is_empty()).map(|v| v.as_bytes().to_vec());
    let list = |key: &str| -> Result<Vec<String>, DelegatedError> {
        match data.get(key).map(|v| v.trim()).filter(|v| !v.is_empty()) {
            None => Ok(Vec::new()),
            Some(json) => serde_json::from_str(json)
                .map_err(|e| DelegatedError::AuthenticationConfig(format!("{key}: not a JSON array of strings: {e}"))),
        }
    };
    Ok(TrustAnchors {
        client_ca_pem: pem("client-ca-file"),
        request_header_ca_pem: pem("requestheader-client-ca-file"),
        request_header: RequestHeaderConfig {
            allowed_names: list("requestheader-allowed-names")?,
            username_headers: list("requestheader-username-headers")?,
            group_headers: list("requestheader-group-headers")?,
            extra_headers_prefixes: list("requestheader-extra-headers-prefix")?,
        },
    })
}

async fn read_data(api: &Api<ConfigMap>) -> Result<BTreeMap<String, String>, DelegatedError> {
    let map = api.get(NAME).await.map_err(|source| DelegatedError::Request { what: "ConfigMap", source })?;
    Ok(map.data.unwrap_or_default())
}

/// Reads the ConfigMap once.
pub async fn read_trust_anchors(client: &Client) -> Result<TrustAnchors, DelegatedError> {
    trust_anchors_from(&read_data(&Api::namespaced(client.clone(), NAMESPACE)).await?)
}

struct Shared {
    api: Api<ConfigMap>,
    trust: Arc<ClientTrust>,
    /// The data last applied or refused (`None`: nothing yet), and whether the last read failed.
    state: tokio::sync::Mutex<(Option<BTreeMap<String, String>>, bool)>,
}

/// Keeps a [`ClientTrust`] in step with the ConfigMap. Dropping it stops its polling task.
pub struct AuthenticationConfigWatcher {
    inner: Arc<Shared>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl std::fmt::Debug for AuthenticationConfigWatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthenticationConfigWatcher").field("polling", &self.task.is_some()).finish()
    }
}

impl AuthenticationConfigWatcher {
    /// Reads the ConfigMap, builds the [`ClientTrust`] from it (an error here is final: there are no
    /// previous anchors to keep) and polls it every `interval`.
    pub async fn start(
        client: Client,
        provider: Arc<rustls::crypto::CryptoProvider>,
        interval: Duration,
    ) -> Result<(Arc<ClientTrust>, Self), DelegatedError> {
        let api: Api<ConfigMap> = Api::namespaced(client, NAMESPACE);
        let data = read_data(&api).await?;
        let trust = Arc::new(ClientTrust::new(provider, &trust_anchors_from(&data)?)?);
        let shared = Shared { api, trust: Arc::clone(&trust), state: tokio::sync::Mutex::new((Some(data), false)) };
        let mut watcher = AuthenticationConfigWatcher { inner: Arc::new(shared), task: None };
        watcher.poll_every(interval)?;
        Ok((trust, watcher))
    }

    /// A watcher of an existing `trust` that does not poll (see [`Self::reload`]); its first reload
    /// applies whatever the ConfigMap holds.
    pub fn new(client: Client, trust: Arc<ClientTrust>) -> Self {
        let shared =
            Shared { api: Api::namespaced(client, NAMESPACE), trust, state: tokio::sync::Mutex::new((None, false)) };
        AuthenticationConfigWatcher { inner: Arc::new(shared), task: None }
    }

    /// Starts (or restarts) polling every `interval` on the current tokio runtime.
    pub fn poll_every(&mut self, interval: Duration) -> Result<(), DelegatedError> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| DelegatedError::NoRuntime)?;
        let weak = Arc::downgrade(&self.inner);
        if let Some(old) = self.task.take() {
            old.abort();
        }
        self.task = Some(runtime.spawn(async move {
            let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                let Some(shared) = weak.upgrade() else { break };
                shared.reload().await;
            }
        }));
        Ok(())
    }

    /// The trust being kept current.
    pub fn trust(&self) -> &Arc<ClientTrust> {
        &self.inner.trust
    }

    /// Reads the ConfigMap now and applies it if its data changed.
    pub async fn reload(&self) -> ReloadOutcome {
        self.inner.reload().await
    }
}

impl Drop for AuthenticationConfigWatcher {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

impl Shared {
    async fn reload(&self) -> ReloadOutcome {
        let mut state = self.state.lock().await;
        let (seen, failing) = &mut *state;
        let data = match read_data(&self.api).await {
            Ok(data) => data,
            Err(e) => {
                if !*failing {
                    tracing::error!(error = %e, "cannot read the authentication ConfigMap; keeping the trust anchors in force");
                }
                *failing = true;
                return ReloadOutcome::Failed;
            }
        };
        if *failing {
            tracing::info!("the authentication ConfigMap is readable again");
            *failing = false;
        }
        if seen.as_ref() == Some(&data) {
            return ReloadOutcome::Unchanged;
        }
        let applied = trust_anchors_from(&data).and_then(|anchors| Ok(self.trust.replace(&anchors)?));
        *seen = Some(data);
        match applied {
            Ok(()) => {
                tracing::info!("trust anchors reloaded from the authentication ConfigMap");
                ReloadOutcome::Reloaded
            }
            Err(e) => {
                tracing::error!(error = %e, "authentication ConfigMap refused; keeping the trust anchors in force");
                ReloadOutcome::Failed
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_maps_to_anchors() {
        let data: BTreeMap<String, String> = [
            ("client-ca-file", "PEM1"),
            ("requestheader-client-ca-file", "PEM2"),
            ("requestheader-allowed-names", r#"["front-proxy-client"]"#),
            ("requestheader-username-headers", r#"["X-Remote-User"]"#),
            ("requestheader-group-headers", r#"["X-Remote-Group"]"#),
            ("requestheader-extra-headers-prefix", r#"["X-Remote-Extra-"]"#),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let anchors = trust_anchors_from(&data).unwrap_or_default();
        assert_eq!(anchors.client_ca_pem.as_deref(), Some(&b"PEM1"[..]));
        assert_eq!(anchors.request_header_ca_pem.as_deref(), Some(&b"PEM2"[..]));
        assert_eq!(anchors.request_header.allowed_names, vec!["front-proxy-client".to_owned()]);
        assert_eq!(anchors.request_header.extra_headers_prefixes, vec!["X-Remote-Extra-".to_owned()]);

        let sparse: BTreeMap<String, String> = [("client-ca-file".to_owned(), "PEM1".to_owned())].into();
        let anchors = trust_anchors_from(&sparse).unwrap_or_default();
        assert!(anchors.request_header_ca_pem.is_none());
        assert!(anchors.request_header.username_headers.is_empty());

        let bad: BTreeMap<String, String> =
            [("requestheader-group-headers".to_owned(), "X-Remote-Group".to_owned())].into();
        let message = trust_anchors_from(&bad).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(message.contains("requestheader-group-headers"), "{message}");
    }
}
