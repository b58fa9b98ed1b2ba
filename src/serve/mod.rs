//! `stowage serve`: open the store, prepare TLS identities, serve the API until SIGTERM/SIGINT.

mod admission;
mod auth;
mod lock;
pub mod logging;
mod store;
mod unpack;

pub use admission::AdmissionOptions;
pub use auth::AuthOptions;
pub use store::StoreFlags;
pub use unpack::UnpackOptions;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;

use crate::apiserver::listener::ListenerLimits;
use crate::apiserver::{self, AppState, Limits, SharedState};
use crate::auth::pki;
use crate::events::{EventLimits, EventRecorder, EventSink};
use crate::storage::sessions::{self, UploadSessions};
use crate::storage::StoreOptions;
use crate::unpack::metrics::UnpackMetrics;
use crate::unpack::reconcile;

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
    /// How long a chunked upload session (`POST bundles/NAME/content?uploads`) may sit idle
    /// before it and its spooled bytes are removed, e.g. `1h`, `30m`, `90s`, `500ms`.
    #[arg(long, default_value = "1h", value_parser = parse_duration)]
    pub upload_session_timeout: std::time::Duration,
    /// Open client connections at most; more are closed as soon as they are accepted. Capped by
    /// the open-file limit (raised to its hard limit at start).
    #[arg(long, default_value_t = ListenerLimits::default().max_connections)]
    pub max_connections: usize,
    /// How long a new connection may take to send its first request's headers after TLS (and to
    /// finish TLS, up to 10 s), and any HTTP/1 request its headers (which also ends idle HTTP/1
    /// keep-alive connections).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub request_header_timeout: std::time::Duration,
    /// How long a connection may stay open with no request in flight (watches and downloads are in
    /// flight while they stream).
    #[arg(long, default_value = "90s", value_parser = parse_duration)]
    pub idle_connection_timeout: std::time::Duration,
    /// A request body (an upload) that delivers less than 16 KiB within this much time spent
    /// waiting for it ends with 408: stalled and trickling uploads do not hold the server.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub request_body_timeout: std::time::Duration,
    /// Concurrent streams a client may open on one HTTP/2 connection.
    #[arg(long, default_value_t = ListenerLimits::default().http2_max_streams)]
    pub http2_max_streams_per_connection: u32,
    /// How many recent changes the store keeps for watches and paged lists: a watch or a list
    /// continuation from further back gets 410 Gone and re-lists.
    #[arg(long, default_value_t = StoreOptions::default().change_log_len)]
    pub change_log_length: u64,
    /// Bytes (compressed) the change log may hold, whatever its length: the oldest changes go
    /// first, and a watch or list continuation from before them gets 410 Gone and re-lists.
    #[arg(long, default_value_t = StoreOptions::default().change_log_bytes)]
    pub change_log_bytes: u64,
    /// Free bytes the data directory's filesystem must keep: below this, uploads, unpacks and
    /// creating or changing objects fail with 507 InsufficientStorage (reads and deletes still
    /// work); below a quarter of it every write stops, so the store never meets a full disk.
    /// Writes succeed again as soon as space is freed.
    #[arg(long, default_value_t = crate::storage::DEFAULT_MIN_FREE_BYTES)]
    pub min_free_bytes: u64,
    /// Memory for zstd download frames compressed afresh (the parts of a revision its stored
    /// blocks do not cover; in the replicated store also new revisions recompressed smaller in
    /// 8 MiB stretches), kept for the next download of the same revision.
    #[arg(long, default_value_t = StoreOptions::default().frame_cache_bytes)]
    pub frame_cache_bytes: u64,
    /// zstd level at which committed revisions are recompressed in the background, as blocks of
    /// up to 8 MiB of their tar (history in less space, fewer bytes per zstd download; about one
    /// core for a second per 5 MB, at a low priority); 0 turns it off. Embedded store only.
    #[arg(long, default_value_t = StoreOptions::default().repack_level, value_parser = clap::value_parser!(i32).range(0..=22))]
    pub repack_level: i32,
    /// How long stowage keeps an Event after it was last observed (standalone; in a cluster the
    /// cluster's API server keeps them, for its own --event-ttl).
    #[arg(long, default_value = "1h", value_parser = parse_duration)]
    pub event_ttl: std::time::Duration,
    /// Events kept at most (standalone): past this, the oldest are deleted.
    #[arg(long, default_value_t = 1000)]
    pub max_events: usize,
    #[command(flatten)]
    pub admission: AdmissionOptions,
    #[command(flatten)]
    pub auth: AuthOptions,
    #[command(flatten)]
    pub unpack: UnpackOptions,
    #[command(flatten)]
    pub store: StoreFlags,
    #[command(flatten)]
    pub log: logging::LogOptions,
}

/// `reportingInstance`: the pod's name in a cluster (its hostname), else the machine's.
fn reporting_instance() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty());
    host.unwrap_or_else(|| "stowage".to_owned())
}

pub async fn run(options: ServeOptions) -> anyhow::Result<()> {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    std::fs::create_dir_all(&options.data_dir)
        .with_context(|| format!("creating data directory {}", options.data_dir.display()))?;
    // Before anything in the directory is touched: a second server on it stops here, saying why.
    let _lock = lock::DataDirLock::acquire(&options.data_dir)?;
    let pki = if auth::delegates(&options.auth) {
        pki::ensure_serving_only(&options.data_dir)
    } else {
        pki::ensure_standalone(&options.data_dir)
    }
    .context("preparing certificates")?;
    // One registry for everything `/metrics` shows: the replicated store's, delegated
    // authentication's and the unpacker's families, then the API's.
    let mut registry = prometheus_client::registry::Registry::default();
    // Registered only where they apply, so a standalone server shows no empty families of them.
    let remote_metrics = if options.store.replicated() {
        crate::storage::remote::RemoteMetrics::register(&mut registry)
    } else {
        Default::default()
    };
    let delegated_metrics = if auth::delegates(&options.auth) {
        crate::auth::delegated::DelegatedMetrics::register(&mut registry)
    } else {
        Default::default()
    };
    let store = {
        let dir = options.data_dir.join("store");
        let store_options = StoreOptions {
            change_log_len: options.change_log_length.max(1),
            change_log_bytes: options.change_log_bytes,
            min_free_bytes: options.min_free_bytes,
            frame_cache_bytes: options.frame_cache_bytes,
            repack_level: options.repack_level,
            ..StoreOptions::default()
        };
        options.store.open(&dir, store_options, remote_metrics).await?
    };
    let uploads = {
        let dir = options.data_dir.join("uploads");
        let timeout = options.upload_session_timeout;
        Arc::new(
            UploadSessions::open(&store, &dir, timeout)
                .with_context(|| format!("creating the upload spool {}", dir.display()))?,
        )
    };
    let (tls_setup, access, delegated) = auth::configure(&options.auth, &pki, &delegated_metrics).await?;
    let access = Arc::new(access);
    let listener = tokio::net::TcpListener::bind(options.listen)
        .await
        .with_context(|| format!("listening on {}", options.listen))?;
    let local = listener.local_addr()?;
    // The ready line names the address as bound; the admin kubeconfig needs one a client can dial,
    // so an unspecified address (0.0.0.0, ::) becomes the loopback of its family there.
    let listening = https_url(local);
    let reachable = if local.ip().is_unspecified() {
        let loopback = match local {
            std::net::SocketAddr::V4(_) => std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
            std::net::SocketAddr::V6(_) => std::net::IpAddr::V6(std::net::Ipv6Addr::LOCALHOST),
        };
        https_url(std::net::SocketAddr::new(loopback, local.port()))
    } else {
        listening.clone()
    };
    // In a cluster users come with their own credentials; standalone, the admin gets a kubeconfig.
    let kubeconfig = match delegated {
        Some(_) => None,
        None => Some(
            pki::write_admin_kubeconfig(&options.data_dir, &pki, &reachable).context("writing the admin kubeconfig")?,
        ),
    };
    let shutdown = tokio_util::sync::CancellationToken::new();
    // Singleton work runs on the leader only (every replica, with the embedded store: it is one).
    let collector = {
        let gc_store = store.clone();
        store::while_leading(store.clone(), shutdown.clone(), move |token| {
            apiserver::garbage_collector::spawn(gc_store.clone(), token)
        })
    };
    let cluster = delegated.as_ref().map(|d| d.client.clone());
    // Events go to the cluster's API server, or (standalone) into the store, which serves them.
    let events = {
        let sink = match &cluster {
            Some(client) => EventSink::Cluster(client.clone()),
            None => EventSink::store(
                store.clone(),
                EventLimits { max_events: options.max_events.max(1), ttl: options.event_ttl },
            ),
        };
        EventRecorder::spawn(sink, reporting_instance(), shutdown.clone())
    };
    let unpack_metrics = UnpackMetrics::register(&mut registry);
    let reconciler = {
        let config = options.unpack.reconciler(cluster, &options.data_dir, unpack_metrics, events.clone());
        let reconcile_store = store.clone();
        store::while_leading(store.clone(), shutdown.clone(), move |token| {
            reconcile::spawn(reconcile_store.clone(), config.clone(), token)
        })
    };
    tls_setup.serving.clone().watch(shutdown.clone());
    let sweeper = sessions::spawn_sweeper(uploads.clone(), shutdown.clone());
    let resigning = store.clone();
    let state = AppState::new(SharedState {
        store,
        access,
        shutdown: shutdown.clone(),
        events,
        uploads,
        early_ingests: Arc::default(),
        limits: Arc::new(Limits {
            max_body_bytes: options.max_body_bytes,
            upload_session_timeout: options.upload_session_timeout,
            request_body_timeout: options.request_body_timeout,
            unpack: options.unpack.limits(),
            fairness: options.admission.limits(),
            stream_stall_timeout: options.admission.stream_stall_timeout,
            ..Limits::default()
        }),
    });
    match &kubeconfig {
        Some(path) if reachable == listening => {
            tracing::info!("stowage ready on {listening} (kubectl --kubeconfig {})", path.display())
        }
        Some(path) => {
            tracing::info!("stowage ready on {listening} (kubectl --kubeconfig {}, for {reachable})", path.display())
        }
        None => {
            tracing::info!("stowage ready on {listening} (authentication and authorization delegated to the cluster)")
        }
    }
    let stopping = async move {
        shutdown_signal().await;
        tracing::info!("shutting down");
        shutdown.cancel();
    };
    let listener_limits = ListenerLimits {
        max_connections: connection_limit(options.max_connections),
        request_header_timeout: options.request_header_timeout,
        idle_timeout: options.idle_connection_timeout,
        http2_max_streams: options.http2_max_streams_per_connection,
    };
    apiserver::listener::serve_tls(listener, tls_setup, apiserver::router(state, registry), listener_limits, stopping)
        .await?;
    collector.abort();
    sweeper.abort();
    // Cancelled jobs release their half-written revisions; Bundles left `Unpacking` resume at the
    // next start.
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), reconciler).await;
    if resigning.elects_leader() {
        // Leadership passes on now rather than when the lease would expire.
        let _ = tokio::task::spawn_blocking(move || resigning.resign()).await;
    }
    drop(delegated);
    tracing::info!("stowage stopped");
    Ok(())
}

/// File descriptors kept for everything but client connections: the store, packs, spool files,
/// outgoing connections to registries and the cluster.
const RESERVED_FILES: u64 = 256;

/// `requested`, capped so that connections alone cannot exhaust the open-file limit (an accept
/// failing with EMFILE would refuse everyone, and the store could not open its files). The soft
/// limit is raised to the hard one first, as Go programs do at start.
/// `https://HOST:PORT`, IPv6 hosts in brackets.
fn https_url(addr: std::net::SocketAddr) -> String {
    match addr {
        std::net::SocketAddr::V4(v4) => format!("https://{}:{}", v4.ip(), v4.port()),
        std::net::SocketAddr::V6(v6) => format!("https://[{}]:{}", v6.ip(), v6.port()),
    }
}

fn connection_limit(requested: usize) -> usize {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit only read and write the struct passed.
    let files = unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return requested;
        }
        if limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit { rlim_cur: limit.rlim_max, rlim_max: limit.rlim_max };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                limit = raised;
            }
        }
        limit.rlim_cur
    };
    let allowed = usize::try_from(files.saturating_sub(RESERVED_FILES).max(1)).unwrap_or(usize::MAX);
    if allowed < requested {
        tracing::warn!(requested, allowed, open_files = files, "--max-connections capped by the open-file limit");
    }
    requested.min(allowed)
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

/// Go durations, as `spec.pollInterval` takes them: `1h`, `30m`, `90s`, `1h30m`, `500ms`, `1.5h`.
fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    crate::api::meta::parse_duration(text)
        .ok_or_else(|| format!("invalid duration {text:?}: expected e.g. 1h, 30m, 90s, 500ms"))
}
