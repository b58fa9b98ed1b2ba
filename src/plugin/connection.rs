//! kubectl's connection flags and the client they make. They are accepted before the subcommand
//! (`kubectl stowage -n NS ls NAME`, as kubectl users write them) and after it; a flag after the
//! subcommand wins. Their meaning is kubectl's: the kubeconfig and its context, cluster and user
//! are chosen first, then `--server`, `--token`, `--certificate-authority`,
//! `--insecure-skip-tls-verify`, `--as`/`--as-group`/`--as-uid` and `--request-timeout` override
//! what they name.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use kube::config::{KubeConfigOptions, Kubeconfig};

/// kubectl's connection flags.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct KubeFlags {
    /// Path to the kubeconfig file (default: $KUBECONFIG, then ~/.kube/config).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use.
    #[arg(long)]
    pub context: Option<String>,
    /// The kubeconfig cluster to use.
    #[arg(long)]
    pub cluster: Option<String>,
    /// The kubeconfig user to use.
    #[arg(long)]
    pub user: Option<String>,
    /// Namespace (default: the context's namespace, then "default").
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    /// The address of the API server.
    #[arg(short = 's', long)]
    pub server: Option<String>,
    /// A bearer token for authentication to the API server.
    #[arg(long)]
    pub token: Option<String>,
    /// A PEM file of the certificate authorities that verify the server.
    #[arg(long)]
    pub certificate_authority: Option<PathBuf>,
    /// Do not verify the server's certificate (insecure).
    #[arg(long)]
    pub insecure_skip_tls_verify: bool,
    /// The user to impersonate.
    #[arg(long = "as")]
    pub as_user: Option<String>,
    /// A group to impersonate (repeat for several).
    #[arg(long)]
    pub as_group: Vec<String>,
    /// The UID to impersonate.
    #[arg(long)]
    pub as_uid: Option<String>,
    /// How long to wait for each request before giving up (1s, 2m, 3h; 0 waits forever).
    #[arg(long)]
    pub request_timeout: Option<String>,
}

impl KubeFlags {
    /// These flags (given after the subcommand) over `outer` (given before it).
    pub fn over(self, outer: &KubeFlags) -> KubeFlags {
        let outer = outer.clone();
        KubeFlags {
            kubeconfig: self.kubeconfig.or(outer.kubeconfig),
            context: self.context.or(outer.context),
            cluster: self.cluster.or(outer.cluster),
            user: self.user.or(outer.user),
            namespace: self.namespace.or(outer.namespace),
            server: self.server.or(outer.server),
            token: self.token.or(outer.token),
            certificate_authority: self.certificate_authority.or(outer.certificate_authority),
            insecure_skip_tls_verify: self.insecure_skip_tls_verify || outer.insecure_skip_tls_verify,
            as_user: self.as_user.or(outer.as_user),
            as_group: if self.as_group.is_empty() { outer.as_group } else { self.as_group },
            as_uid: self.as_uid.or(outer.as_uid),
            request_timeout: self.request_timeout.or(outer.request_timeout),
        }
    }
}

/// A client for the chosen cluster and the namespace to work in.
pub(super) struct Connection {
    pub client: kube::Client,
    pub namespace: String,
    /// The cluster's URL (part of what identifies an upload to resume).
    pub server: String,
}

pub(super) async fn connect(flags: &KubeFlags) -> anyhow::Result<Connection> {
    let options =
        KubeConfigOptions { context: flags.context.clone(), cluster: flags.cluster.clone(), user: flags.user.clone() };
    let mut config = match &flags.kubeconfig {
        Some(path) => {
            let kubeconfig =
                Kubeconfig::read_from(path).with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &options).await?
        }
        None => kube::Config::from_kubeconfig(&options).await.context("loading the kubeconfig")?,
    };
    if let Some(server) = &flags.server {
        config.cluster_url = server.parse().with_context(|| format!("--server {server:?} is not a URL"))?;
    }
    if let Some(token) = &flags.token {
        config.auth_info.token = Some(token.clone().into());
        config.auth_info.token_file = None;
    }
    if let Some(path) = &flags.certificate_authority {
        let pem = std::fs::read(path).with_context(|| format!("reading --certificate-authority {}", path.display()))?;
        let certs: Vec<Vec<u8>> = pem_certs(&pem)
            .with_context(|| format!("--certificate-authority {}: no PEM certificate", path.display()))?;
        config.root_cert = Some(certs);
        // A CA file of the kubeconfig's own would be re-read and win over these.
        config.root_cert_file = None;
    }
    if flags.insecure_skip_tls_verify {
        config.accept_invalid_certs = true;
        config.root_cert = None;
    }
    if let Some(user) = &flags.as_user {
        config.auth_info.impersonate = Some(user.clone());
    }
    if !flags.as_group.is_empty() {
        config.auth_info.impersonate_groups = Some(flags.as_group.clone());
    }
    if let Some(uid) = &flags.as_uid {
        config.auth_info.impersonate_uid = Some(uid.clone());
    }
    if let Some(text) = &flags.request_timeout {
        let timeout = request_timeout(text)?;
        config.read_timeout = timeout;
        config.write_timeout = timeout;
        config.connect_timeout = timeout;
    }
    let namespace = flags.namespace.clone().unwrap_or_else(|| config.default_namespace.clone());
    let server = config.cluster_url.to_string();
    Ok(Connection { client: kube::Client::try_from(config)?, namespace, server })
}

/// kubectl's `--request-timeout`: a duration with a unit, or a bare number of seconds; 0 is none.
fn request_timeout(text: &str) -> anyhow::Result<Option<Duration>> {
    let parsed = match text.parse::<u64>() {
        Ok(seconds) => Some(Duration::from_secs(seconds)),
        Err(_) => crate::api::meta::parse_duration(text),
    };
    match parsed {
        Some(d) if d.is_zero() => Ok(None),
        Some(d) => Ok(Some(d)),
        None => anyhow::bail!("invalid --request-timeout {text:?}: expected e.g. 30s, 2m, or 0 for none"),
    }
}

/// The DER certificates of a PEM bundle; an error if it holds none.
fn pem_certs(pem: &[u8]) -> anyhow::Result<Vec<Vec<u8>>> {
    use rustls::pki_types::pem::PemObject as _;
    let certs = rustls::pki_types::CertificateDer::pem_slice_iter(pem)
        .map(|cert| cert.map(|c| c.to_vec()))
        .collect::<Result<Vec<_>, _>>()
        .context("not PEM")?;
    anyhow::ensure!(!certs.is_empty(), "no certificate");
    Ok(certs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_as_kubectl_reads_them() {
        assert_eq!(request_timeout("0").unwrap(), None);
        assert_eq!(request_timeout("5").unwrap(), Some(Duration::from_secs(5)));
        assert_eq!(request_timeout("2m").unwrap(), Some(Duration::from_secs(120)));
        assert!(request_timeout("soon").is_err());
    }

    #[test]
    fn flags_after_the_subcommand_win() {
        let outer = KubeFlags { namespace: Some("a".into()), context: Some("c".into()), ..KubeFlags::default() };
        let inner = KubeFlags { namespace: Some("b".into()), ..KubeFlags::default() };
        let merged = inner.over(&outer);
        assert_eq!(merged.namespace.as_deref(), Some("b"));
        assert_eq!(merged.context.as_deref(), Some("c"));
    }
}
