//! A real static file server for the http source tests: `nginx` (Debian package `nginx`) started
//! as the current user with its own config, pid, logs and temp paths in a temp dir, serving a
//! directory on 127.0.0.1 with its own `ETag`/`Last-Modified` (and 304s on conditional requests),
//! optionally behind basic auth (an htpasswd made with `openssl passwd -apr1`) or a bearer token.
//! [`HttpServer::start_tls`] serves https with a given certificate instead, optionally as a
//! reverse proxy in front of another local server (the git server, which speaks plain http).
//!
//! ```ignore
//! let server = HttpServer::start(HttpAuth::None);      // or Basic{..} / Bearer(..)
//! server.put("bundle.tar.gz", &gzip(&tar));            // atomically (re)placed
//! let url = server.url("bundle.tar.gz");               // http://127.0.0.1:PORT/bundle.tar.gz
//! let host = server.host_port();                       // for NetworkPolicy.insecure_hosts
//! drop(server);                                        // nginx is stopped
//! ```

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::harness::wait_until;

pub(crate) enum HttpAuth {
    None,
    Basic { user: String, pass: String },
    Bearer(String),
}

pub(crate) struct HttpServer {
    dir: tempfile::TempDir,
    port: u16,
    tls: bool,
    child: Child,
}

fn nginx_binary() -> PathBuf {
    for candidate in ["/usr/sbin/nginx", "/usr/bin/nginx"] {
        if Path::new(candidate).exists() {
            return PathBuf::from(candidate);
        }
    }
    PathBuf::from("nginx") // from PATH; fails loudly below when missing
}

impl HttpServer {
    pub fn start(auth: HttpAuth) -> HttpServer {
        HttpServer::launch(auth, None, None)
    }

    /// Serves https with this PEM certificate (chain) and key; with `proxy_to` (`HOST:PORT`),
    /// forwards every request there over plain http instead of serving files.
    pub fn start_tls(cert_pem: &str, key_pem: &str, proxy_to: Option<&str>) -> HttpServer {
        HttpServer::launch(HttpAuth::None, Some((cert_pem, key_pem)), proxy_to)
    }

    fn launch(auth: HttpAuth, tls: Option<(&str, &str)>, proxy_to: Option<&str>) -> HttpServer {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("www");
        for sub in ["www", "tmp", "logs"] {
            std::fs::create_dir(dir.path().join(sub)).unwrap();
        }
        // A free port: bind, read it, release it for nginx.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let d = dir.path().display();
        let access = match &auth {
            HttpAuth::None => String::new(),
            HttpAuth::Basic { user, pass } => {
                let out = Command::new("openssl")
                    .args(["passwd", "-apr1", pass])
                    .output()
                    .expect("running openssl (Debian package openssl)");
                assert!(out.status.success(), "openssl passwd failed");
                let hash = String::from_utf8(out.stdout).unwrap();
                std::fs::write(dir.path().join("htpasswd"), format!("{user}:{}\n", hash.trim())).unwrap();
                format!("auth_basic \"files\"; auth_basic_user_file {d}/htpasswd;")
            }
            HttpAuth::Bearer(token) => {
                format!("if ($http_authorization != \"Bearer {token}\") {{ return 401; }}")
            }
        };
        let ssl = match tls {
            None => String::new(),
            Some((cert, key)) => {
                std::fs::write(dir.path().join("tls.crt"), cert).unwrap();
                std::fs::write(dir.path().join("tls.key"), key).unwrap();
                format!("ssl; ssl_certificate {d}/tls.crt; ssl_certificate_key {d}/tls.key")
            }
        };
        let proxy = match proxy_to {
            None => String::new(),
            Some(to) => format!("proxy_pass http://{to}; proxy_http_version 1.1; proxy_buffering off;"),
        };
        let server = format!(
            "listen 127.0.0.1:{port} {ssl};
        root {root};
        location / {{ {access} {proxy} }}",
            root = root.display()
        );
        let child = run_nginx(dir.path(), port, None, &server);
        HttpServer { dir, port, tls: tls.is_some(), child }
    }

    pub fn host_port(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn url(&self, name: &str) -> String {
        format!("{}://127.0.0.1:{}/{name}", if self.tls { "https" } else { "http" }, self.port)
    }

    /// How many requests for `/name` nginx has logged so far (any method, any status).
    pub fn requests_for(&self, name: &str) -> usize {
        let log = std::fs::read_to_string(self.dir.path().join("logs/access.log")).unwrap_or_default();
        let target = format!(" /{name} HTTP/");
        log.lines().filter(|line| line.contains(&target)).count()
    }

    /// Writes `name` atomically (rename), so a concurrent GET sees the old or the new file.
    pub fn put(&self, name: &str, data: &[u8]) {
        let path = self.dir.path().join("www").join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let tmp = self.dir.path().join("tmp").join(format!("put-{}", uuid::Uuid::new_v4()));
        std::fs::write(&tmp, data).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
    }
}

/// Runs nginx as the current user with its config, pid, logs and temp paths in `dir` (which
/// holds `www`, `tmp` and `logs`), with one `server` block of `server_body`; each request is
/// logged to `dir/logs/access.log` (in `log_format` when given). Returns once it listens on
/// `port`.
pub(crate) fn run_nginx(dir: &Path, port: u16, log_format: Option<&str>, server_body: &str) -> Child {
    let d = dir.display();
    let access_log = match log_format {
        None => format!("access_log {d}/logs/access.log;"),
        Some(format) => format!("log_format custom '{format}';\n    access_log {d}/logs/access.log custom;"),
    };
    // nginx started by root would drop its workers to `nobody`, who cannot read a 0700 temp
    // dir: keep them as root then.
    let user = if unsafe { libc::geteuid() } == 0 { "user root;" } else { "" };
    let config = format!(
        "{user}
worker_processes 1;
daemon off;
pid {d}/nginx.pid;
error_log {d}/logs/error.log;
events {{ worker_connections 64; }}
http {{
    {access_log}
    client_body_temp_path {d}/tmp/body;
    proxy_temp_path {d}/tmp/proxy;
    fastcgi_temp_path {d}/tmp/fastcgi;
    uwsgi_temp_path {d}/tmp/uwsgi;
    scgi_temp_path {d}/tmp/scgi;
    default_type application/octet-stream;
    server {{
        {server_body}
    }}
}}
"
    );
    let conf = dir.join("nginx.conf");
    std::fs::write(&conf, config).unwrap();
    let mut child = Command::new(nginx_binary())
        .arg("-p")
        .arg(dir)
        .arg("-c")
        .arg(&conf)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting nginx (Debian package nginx); a missing nginx fails the test");
    let what = format!("nginx listening on port {port}");
    wait_until(Duration::from_secs(10), Duration::from_millis(20), &what, || {
        if let Ok(Some(status)) = child.try_wait() {
            let log = std::fs::read_to_string(dir.join("logs/error.log")).unwrap_or_default();
            panic!("nginx exited ({status}): {log}");
        }
        std::net::TcpStream::connect(("127.0.0.1", port)).map(drop).map_err(|e| e.to_string())
    });
    child
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        // SIGTERM, not SIGKILL: the master must take its worker down with it.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}
