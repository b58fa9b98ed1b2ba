//! The kube client delegation talks through: from the pod's service account (in-cluster) or from a
//! kubeconfig file (`--kubeconfig PATH`, its current context), with kube's webhook timeout.
//!
//! kube-apiserver's delegating options give TokenReview and SubjectAccessReview calls 10 seconds; the
//! same bound applies here to connecting, writing and reading, so a kube-apiserver that stopped
//! answering turns into an error (and a 5xx for the request that waited), not a hung request.

use std::path::{Path, PathBuf};
use std::time::Duration;

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use super::DelegatedError;

/// kube-apiserver's timeout for its delegated authentication and authorization calls.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the client's cluster, credentials and CA come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClientSource {
    /// The pod's service account: `KUBERNETES_SERVICE_HOST`/`_PORT` and
    /// `/var/run/secrets/kubernetes.io/serviceaccount/{token,ca.crt}` (the token file is re-read as
    /// the kubelet rotates it).
    InCluster,
    /// A kubeconfig file and its current context.
    Kubeconfig(PathBuf),
}

impl ClientSource {
    /// `--kubeconfig PATH` if given, else in-cluster.
    pub fn from_flag(kubeconfig: Option<&Path>) -> Self {
        kubeconfig.map_or(ClientSource::InCluster, |p| ClientSource::Kubeconfig(p.to_owned()))
    }
}

/// The kube configuration of `source`, with [`REQUEST_TIMEOUT`] on connect, write and read.
pub async fn delegation_config(source: &ClientSource) -> Result<Config, DelegatedError> {
    let mut config = match source {
        ClientSource::InCluster => Config::incluster()?,
        ClientSource::Kubeconfig(path) => {
            let kubeconfig = Kubeconfig::read_from(path)
                .map_err(|source| DelegatedError::Kubeconfig { path: path.clone(), source })?;
            Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .map_err(|source| DelegatedError::Kubeconfig { path: path.clone(), source })?
        }
    };
    config.connect_timeout = Some(REQUEST_TIMEOUT);
    config.write_timeout = Some(REQUEST_TIMEOUT);
    config.read_timeout = Some(REQUEST_TIMEOUT);
    Ok(config)
}

/// A client for [`delegation_config`]. Cheap to clone; share one between the authenticators, the
/// authorizer and the ConfigMap watcher.
pub async fn delegation_client(source: &ClientSource) -> Result<Client, DelegatedError> {
    let config = delegation_config(source).await?;
    Client::try_from(config).map_err(DelegatedError::Client)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flag_selects_the_source() {
        assert_eq!(ClientSource::from_flag(None), ClientSource::InCluster);
        let path = Path::new("/etc/kube/config");
        assert_eq!(ClientSource::from_flag(Some(path)), ClientSource::Kubeconfig(path.to_owned()));
    }

    #[tokio::test]
    async fn a_missing_kubeconfig_names_the_file() {
        let source = ClientSource::Kubeconfig(PathBuf::from("/nonexistent/stowage/kubeconfig"));
        let message = delegation_client(&source).await.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(message.contains("/nonexistent/stowage/kubeconfig"), "{message}");
    }
}
