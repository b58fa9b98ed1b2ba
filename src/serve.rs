//! `stowage serve`: open the store, prepare TLS identities, serve the API until SIGTERM/SIGINT.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;

use crate::apiserver::{self, AppState, Limits};
use crate::auth::authn::{Authenticator, TokenAuthenticator};
use crate::auth::authz::Authorizer;
use crate::auth::rbac::{self, PolicyWatcher};
use crate::auth::token_file::TokenFile;
use crate::auth::trust::{RequestHeaderConfig, TrustAnchors};
use crate::auth::{pki, tls, Access};
use crate::storage::{Store, StoreOptions};

/// Options of `stowage serve`.
#[derive(Clone, Debug, clap::Args)]
pub struct ServeOptions {
    /// Where the store, certificates and admin kubeconfig live.
    #[arg(long, default_value = "./stowage-data", env = "STOWAGE_DATA_DIR")]
    pub data_dir: PathBuf,
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:8443")]
    pub listen: SocketAddr,
    /// Largest content upload body in bytes.
    #[arg(long, default_value_t = Limits::default().max_body_bytes)]
    pub max_body_bytes: u64,
    /// Largest unpacked size of one upload in bytes (compression-bomb limit).
    #[arg(long, default_value_t = Limits::default().max_unpacked_bytes)]
    pub max_unpacked_bytes: u64,
    /// How many recent changes the store keeps for watches and paged lists: a watch or a list
    /// continuation from further back gets 410 Gone and re-lists.
    #[arg(long, default_value_t = StoreOptions::default().change_log_len)]
    pub change_log_length: u64,
    #[command(flatten)]
    pub auth: AuthOptions,
}

/// Authentication and authorization flags, named as kube-apiserver's.
#[derive(Clone, Debug, clap::Args)]
pub struct AuthOptions {
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

pub async fn run(options: ServeOptions) -> anyhow::Result<()> {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    std::fs::create_dir_all(&options.data_dir)
        .with_context(|| format!("creating data directory {}", options.data_dir.display()))?;
    let pki = pki::ensure_standalone(&options.data_dir).context("preparing certificates")?;
    let store = {
        let dir = options.data_dir.join("store");
        let store_options =
            StoreOptions { change_log_len: options.change_log_length.max(1), ..StoreOptions::default() };
        tokio::task::spawn_blocking(move || Store::open(&dir, store_options)).await.context("opening the store")??
    };
    let auth = &options.auth;
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
    let (cert, key) = match (&auth.tls_cert_file, &auth.tls_private_key_file) {
        (Some(cert), Some(key)) => (cert.clone(), key.clone()),
        _ => (pki.serving_cert.clone(), pki.serving_key.clone()),
    };
    let tls_setup = tls::setup(&cert, &key, &anchors).context("TLS configuration")?;
    let access = Arc::new(access(auth, &tls_setup)?);
    let listener = tokio::net::TcpListener::bind(options.listen)
        .await
        .with_context(|| format!("listening on {}", options.listen))?;
    let local = listener.local_addr()?;
    let host = if local.ip().is_unspecified() { "127.0.0.1".to_string() } else { local.ip().to_string() };
    let url = if local.is_ipv6() {
        format!("https://[{host}]:{}", local.port())
    } else {
        format!("https://{host}:{}", local.port())
    };
    let kubeconfig =
        pki::write_admin_kubeconfig(&options.data_dir, &pki, &url).context("writing the admin kubeconfig")?;
    let shutdown = tokio_util::sync::CancellationToken::new();
    let collector = apiserver::garbage_collector::spawn(store.clone(), shutdown.clone());
    tls_setup.serving.clone().watch(shutdown.clone());
    let state = AppState {
        store,
        access,
        shutdown: shutdown.clone(),
        limits: Arc::new(Limits {
            max_body_bytes: options.max_body_bytes,
            max_unpacked_bytes: options.max_unpacked_bytes,
            ..Limits::default()
        }),
    };
    tracing::info!("stowage ready on {url} (kubectl --kubeconfig {})", kubeconfig.display());
    let stopping = async move {
        shutdown_signal().await;
        tracing::info!("shutting down");
        shutdown.cancel();
    };
    apiserver::listener::serve_tls(listener, tls_setup, apiserver::router(state), stopping).await?;
    collector.abort();
    tracing::info!("stowage stopped");
    Ok(())
}

/// The authentication chain and authorizer the flags ask for.
fn access(auth: &AuthOptions, tls: &tls::TlsSetup) -> anyhow::Result<Access> {
    let mut tokens = Vec::new();
    if let Some(path) = &auth.token_auth_file {
        let file = TokenFile::load(path).with_context(|| format!("reading --token-auth-file {}", path.display()))?;
        tracing::info!(tokens = file.len(), "static tokens loaded from {}", path.display());
        tokens.push(TokenAuthenticator::File(file));
    }
    let authorizer = match &auth.authorization_policy_file {
        Some(path) => Authorizer::Policy(
            PolicyWatcher::spawn(path.clone(), rbac::POLL_INTERVAL)
                .with_context(|| format!("reading --authorization-policy-file {}", path.display()))?,
        ),
        None => Authorizer::MastersOnly,
    };
    let authenticator = Authenticator { trust: tls.trust.clone(), tokens, anonymous: auth.anonymous_auth };
    Ok(Access { authenticator, authorizer })
}

async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
}
