//! How `stowage serve` authenticates and authorizes, from its flags: standalone (the server's CA,
//! static tokens, an RBAC policy file) or delegated to the cluster (in-cluster config or
//! `--kubeconfig`: the authentication ConfigMap's CAs, TokenReview and local service-account JWT
//! checks, SubjectAccessReview).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;

use crate::auth::authn::{Authenticator, TokenAuthenticator};
use crate::auth::authz::Authorizer;
use crate::auth::delegated::{
    delegation_client, AuthenticationConfigWatcher, ClientSource, DelegatedMetrics, DelegatedTokenAuthenticator,
    SarAuthorizer, SarConfig,
};
use crate::auth::pki::StandalonePki;
use crate::auth::rbac::{self, PolicyWatcher};
use crate::auth::tls::{self, TlsSetup};
use crate::auth::token_file::TokenFile;
use crate::auth::trust::{RequestHeaderConfig, TrustAnchors};
use crate::auth::Access;

/// How often the authentication ConfigMap is re-read.
const AUTHENTICATION_CONFIG_POLL: Duration = Duration::from_secs(10);

/// Authentication and authorization flags, named as kube-apiserver's.
#[derive(Clone, Debug, clap::Args)]
pub struct AuthOptions {
    /// Delegate authentication and authorization to the cluster this kubeconfig names (in a pod,
    /// the in-cluster configuration is used without it).
    #[arg(long, conflicts_with = "standalone")]
    pub kubeconfig: Option<PathBuf>,
    /// Never delegate, even in a pod.
    #[arg(long)]
    pub standalone: bool,
    /// Audiences a service-account token must carry (default: the issuer's).
    #[arg(long, value_delimiter = ',')]
    pub api_audiences: Vec<String>,
    /// Serving certificate (PEM); default: the standalone one in DATA/pki. Reloaded when it changes.
    #[arg(long, requires = "tls_private_key_file")]
    pub tls_cert_file: Option<PathBuf>,
    /// Serving key (PEM) for --tls-cert-file.
    #[arg(long, requires = "tls_cert_file")]
    pub tls_private_key_file: Option<PathBuf>,
    /// CA bundle that client certificates (CN = user, O = groups) must chain to; default: the
    /// standalone CA in DATA/pki.
    #[arg(long)]
    pub client_ca_file: Option<PathBuf>,
    /// CA bundle of the front proxy allowed to assert users in request headers.
    #[arg(long)]
    pub requestheader_client_ca_file: Option<PathBuf>,
    /// Common names allowed as the front proxy (empty: any certificate from its CA).
    #[arg(long, value_delimiter = ',')]
    pub requestheader_allowed_names: Vec<String>,
    #[arg(long, value_delimiter = ',', default_value = "X-Remote-User")]
    pub requestheader_username_headers: Vec<String>,
    #[arg(long, value_delimiter = ',', default_value = "X-Remote-Group")]
    pub requestheader_group_headers: Vec<String>,
    #[arg(long, value_delimiter = ',', default_value = "X-Remote-Extra-")]
    pub requestheader_extra_headers_prefix: Vec<String>,
    /// Static bearer tokens: CSV lines `token,user,uid,"group1,group2"`.
    #[arg(long)]
    pub token_auth_file: Option<PathBuf>,
    /// Kubernetes RBAC objects (Roles, ClusterRoles and their bindings; multi-document YAML) that
    /// authorize requests; re-read when it changes. Without it only system:masters is allowed.
    #[arg(long)]
    pub authorization_policy_file: Option<PathBuf>,
    /// Whether requests without credentials run as system:anonymous (else 401).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub anonymous_auth: bool,
}

/// In a cluster: the client the server talks to the kube-apiserver with, and the watcher that
/// keeps the client CAs current (keep it alive while serving).
pub struct Delegation {
    _watcher: AuthenticationConfigWatcher,
    pub client: kube::Client,
}

/// The TLS setup and access rules the flags ask for, and (in a cluster) the watcher that keeps the
/// client CAs current (keep it alive while serving). Delegated reviews are recorded in `metrics`.
pub async fn configure(
    auth: &AuthOptions,
    pki: &StandalonePki,
    metrics: &DelegatedMetrics,
) -> anyhow::Result<(TlsSetup, Access, Option<Delegation>)> {
    let (cert, key) = match (&auth.tls_cert_file, &auth.tls_private_key_file) {
        (Some(cert), Some(key)) => (cert.clone(), key.clone()),
        _ => (pki.serving_cert.clone(), pki.serving_key.clone()),
    };
    let mut tokens = Vec::new();
    if let Some(path) = &auth.token_auth_file {
        let file = TokenFile::load(path).with_context(|| format!("reading --token-auth-file {}", path.display()))?;
        tracing::info!(tokens = file.len(), "static tokens loaded from {}", path.display());
        tokens.push(TokenAuthenticator::File(file));
    }
    let Some(source) = delegation(auth) else {
        let anchors = TrustAnchors {
            client_ca_pem: Some(tls::read_pem(auth.client_ca_file.as_ref().unwrap_or(&pki.ca_cert))?),
            request_header_ca_pem: auth.requestheader_client_ca_file.as_deref().map(tls::read_pem).transpose()?,
            request_header: RequestHeaderConfig {
                allowed_names: auth.requestheader_allowed_names.clone(),
                username_headers: auth.requestheader_username_headers.clone(),
                group_headers: auth.requestheader_group_headers.clone(),
                extra_headers_prefixes: auth.requestheader_extra_headers_prefix.clone(),
            },
        };
        let tls = tls::setup(&cert, &key, &anchors).context("TLS configuration")?;
        let authorizer = match &auth.authorization_policy_file {
            Some(path) => Authorizer::Policy(
                PolicyWatcher::spawn(path.clone(), rbac::POLL_INTERVAL)
                    .with_context(|| format!("reading --authorization-policy-file {}", path.display()))?,
            ),
            None => Authorizer::MastersOnly,
        };
        let authenticator = Authenticator { trust: tls.trust.clone(), tokens, anonymous: auth.anonymous_auth };
        return Ok((tls, Access { authenticator, authorizer }, None));
    };
    tracing::info!(?source, "delegating authentication and authorization to the cluster");
    let client = delegation_client(&source).await.context("connecting to the kube-apiserver")?;
    let (trust, watcher) =
        AuthenticationConfigWatcher::start(client.clone(), tls::provider(), AUTHENTICATION_CONFIG_POLL)
            .await
            .context("reading kube-system/extension-apiserver-authentication")?;
    let tls = tls::setup_with_trust(&cert, &key, trust).context("TLS configuration")?;
    tokens.push(TokenAuthenticator::Delegated(Box::new(
        DelegatedTokenAuthenticator::from_client(client.clone(), auth.api_audiences.clone())
            .with_metrics(metrics.clone()),
    )));
    let authenticator = Authenticator { trust: tls.trust.clone(), tokens, anonymous: auth.anonymous_auth };
    let authorizer = Authorizer::Delegated(Box::new(
        SarAuthorizer::new(client.clone(), SarConfig::default()).with_metrics(metrics.clone()),
    ));
    Ok((tls, Access { authenticator, authorizer }, Some(Delegation { _watcher: watcher, client })))
}

/// Whether authentication and authorization go to a cluster (see `delegation`).
pub fn delegates(auth: &AuthOptions) -> bool {
    delegation(auth).is_some()
}

/// Delegated when `--kubeconfig` is given or when running in a pod (unless `--standalone`).
fn delegation(auth: &AuthOptions) -> Option<ClientSource> {
    match (&auth.kubeconfig, auth.standalone) {
        (Some(path), _) => Some(ClientSource::Kubeconfig(path.clone())),
        (None, false) if std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() => Some(ClientSource::InCluster),
        _ => None,
    }
}
