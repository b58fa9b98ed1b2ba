//! A real git server for the git source tests: repositories made with the `git` CLI in a temp
//! dir, served over smart HTTP (protocol v2 and v0) by `git http-backend` run as a CGI program
//! behind a small axum server on 127.0.0.1, optionally behind HTTP basic auth.
//!
//! ```ignore
//! let server = GitServer::start().await;               // or start_with_auth("u", "p")
//! server.create("repo");                               // bare repo, default branch main
//! let c1 = server.commit_dir("repo", "main", &corpus().join("operator-registry/etcd"));
//! server.tag("repo", "v1", &c1, true);                 // annotated tag
//! let url = server.url("repo");                        // http://127.0.0.1:PORT/repo.git
//! ```

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use base64::Engine;

use crate::tarutil::{Node, Tree};

const HTTP_BACKEND: &str = "/usr/lib/git-core/git-http-backend";

pub(crate) struct GitServer {
    dir: tempfile::TempDir,
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
    shared: Arc<Shared>,
}

struct Shared {
    project_root: PathBuf,
    /// `Authorization` header value required on every request, if any.
    auth: Option<String>,
    /// Ignore the client's `Git-Protocol` header: the server speaks protocol v0 only, where a
    /// commit that is no branch or tag tip cannot be asked for by id.
    v0_only: bool,
    /// The path of every request so far, in order.
    requests: std::sync::Mutex<Vec<String>>,
}

impl GitServer {
    pub async fn start() -> GitServer {
        Self::start_inner(None, false).await
    }

    /// A server that speaks git protocol v0 only (like older servers).
    pub async fn start_v0_only() -> GitServer {
        Self::start_inner(None, true).await
    }

    /// Every request must carry HTTP basic auth `user:pass` (else 401 with a Basic challenge).
    pub async fn start_with_auth(user: &str, pass: &str) -> GitServer {
        let token = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"));
        Self::start_inner(Some(format!("Basic {token}")), false).await
    }

    async fn start_inner(auth: Option<String>, v0_only: bool) -> GitServer {
        assert!(Path::new(HTTP_BACKEND).exists(), "{HTTP_BACKEND} missing: install the Debian package git");
        let dir = tempfile::tempdir().unwrap();
        let project_root = dir.path().join("repos");
        std::fs::create_dir(&project_root).unwrap();
        let shared = Arc::new(Shared { project_root, auth, v0_only, requests: Default::default() });
        let app = axum::Router::new().fallback(cgi).with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        GitServer { dir, addr, task, shared }
    }

    /// How many times repository `repo` was asked for its refs so far: once per resolve or fetch
    /// (each starts with `GET /REPO.git/info/refs`).
    pub fn ref_requests(&self, repo: &str) -> usize {
        let path = format!("/{repo}.git/info/refs");
        self.shared.requests.lock().unwrap().iter().filter(|p| **p == path).count()
    }

    /// Stops accepting connections.
    pub fn stop(&self) {
        self.task.abort();
    }

    /// `HOST:PORT`, as `--insecure-source-host` takes it.
    pub fn host_port(&self) -> String {
        self.addr.to_string()
    }

    pub fn url(&self, repo: &str) -> String {
        format!("http://{}/{repo}.git", self.addr)
    }

    fn repo_dir(&self, repo: &str) -> PathBuf {
        self.dir.path().join("repos").join(format!("{repo}.git"))
    }

    /// A new, empty bare repository whose `HEAD` is `main`.
    pub fn create(&self, repo: &str) {
        let dir = self.repo_dir(repo);
        git(self.dir.path(), &["init", "-q", "--bare", "-b", "main", dir.to_str().unwrap()]);
    }

    /// Commits exactly the files of `tree` on `branch` (on top of its current commit, if any);
    /// returns the new commit id.
    pub fn commit(&self, repo: &str, branch: &str, tree: &Tree) -> String {
        let work = tempfile::tempdir().unwrap();
        write_tree(work.path(), tree);
        self.commit_dir(repo, branch, work.path())
    }

    /// Commits exactly the content of `dir` (files, exec bits, symlinks) on `branch`.
    pub fn commit_dir(&self, repo: &str, branch: &str, dir: &Path) -> String {
        let git_dir = self.repo_dir(repo);
        let index = self.dir.path().join(format!("index-{}", uuid::Uuid::new_v4()));
        let run = |args: &[&str]| {
            let mut cmd = git_cmd(&git_dir);
            cmd.arg("--work-tree").arg(dir).args(args).env("GIT_INDEX_FILE", &index);
            output(cmd, args)
        };
        run(&["add", "-A", "--force", "."]);
        let tree = run(&["write-tree"]);
        let _ = std::fs::remove_file(&index);
        let reference = format!("refs/heads/{branch}");
        let parent = {
            let mut cmd = git_cmd(&git_dir);
            cmd.args(["rev-parse", "--verify", "-q", &reference]);
            cmd.output()
                .ok()
                .filter(|o| o.status.success())
                .map(|o| String::from_utf8(o.stdout).unwrap().trim().to_owned())
        };
        let mut args = vec!["commit-tree", tree.as_str(), "-m", "a commit"];
        if let Some(p) = &parent {
            args.extend(["-p", p.as_str()]);
        }
        let commit = run(&args);
        run(&["update-ref", &reference, &commit]);
        commit
    }

    /// Tags `commit` as `name`: an annotated tag object, or a lightweight ref.
    pub fn tag(&self, repo: &str, name: &str, commit: &str, annotated: bool) {
        let mut cmd = git_cmd(&self.repo_dir(repo));
        if annotated {
            cmd.args(["tag", "-a", "-m", "a release", name, commit]);
        } else {
            cmd.args(["tag", name, commit]);
        }
        output(cmd, &["tag"]);
    }

    /// Points `branch` at `commit` (force-push semantics).
    pub fn move_branch(&self, repo: &str, branch: &str, commit: &str) {
        let mut cmd = git_cmd(&self.repo_dir(repo));
        cmd.args(["update-ref", &format!("refs/heads/{branch}"), commit]);
        output(cmd, &["update-ref"]);
    }
}

impl Drop for GitServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Files and symlinks of `tree` written below `dir`.
pub(crate) fn write_tree(dir: &Path, tree: &Tree) {
    use std::os::unix::fs::PermissionsExt;
    for (path, node) in tree {
        let full = dir.join(path);
        std::fs::create_dir_all(full.parent().unwrap()).unwrap();
        match node {
            Node::File { data, exec } => {
                std::fs::write(&full, data).unwrap();
                let mode = if *exec { 0o755 } else { 0o644 };
                std::fs::set_permissions(&full, std::fs::Permissions::from_mode(mode)).unwrap();
            }
            Node::Symlink(target) => std::os::unix::fs::symlink(target, &full).unwrap(),
        }
    }
}

/// `git` isolated from the machine's and user's configuration, with a fixed identity.
fn git_cmd(git_dir: &Path) -> Command {
    let mut cmd = Command::new("git");
    cmd.arg("--git-dir").arg(git_dir);
    isolate(&mut cmd);
    cmd
}

fn isolate(cmd: &mut Command) {
    cmd.env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_AUTHOR_NAME", "Test")
        .env("GIT_AUTHOR_EMAIL", "test@example.com")
        .env("GIT_COMMITTER_NAME", "Test")
        .env("GIT_COMMITTER_EMAIL", "test@example.com");
}

fn git(cwd: &Path, args: &[&str]) -> String {
    let mut cmd = Command::new("git");
    cmd.current_dir(cwd).args(args);
    isolate(&mut cmd);
    output(cmd, args)
}

fn output(mut cmd: Command, what: &[&str]) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("running git {what:?}: {e} (is git installed?)"));
    assert!(out.status.success(), "git {what:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// One request through `git http-backend` (CGI/1.1): request metadata in the environment, the body
/// on stdin, headers then body on stdout.
async fn cgi(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    // Owned copies of everything needed: the request (its body is not Sync) must not be
    // borrowed across an await.
    let (parts, body) = request.into_parts();
    shared.requests.lock().unwrap().push(parts.uri.path().to_owned());
    let header = |name: &str| parts.headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
    if let Some(expected) = &shared.auth {
        if header("authorization") != *expected {
            return Response::builder()
                .status(401)
                .header("WWW-Authenticate", "Basic realm=\"git\"")
                .body(Body::from("authentication required"))
                .unwrap();
        }
    }
    let method = parts.method.to_string();
    let path = parts.uri.path().to_owned();
    let query = parts.uri.query().unwrap_or("").to_owned();
    let (content_type, git_protocol, encoding) =
        (header("content-type"), header("git-protocol"), header("content-encoding"));
    let body = axum::body::to_bytes(body, usize::MAX).await.unwrap();
    let root = shared.project_root.clone();
    let authed = shared.auth.is_some();
    let git_protocol = if shared.v0_only { String::new() } else { git_protocol };
    let out = tokio::task::spawn_blocking(move || {
        let mut cmd = Command::new(HTTP_BACKEND);
        cmd.env("GIT_PROJECT_ROOT", &root)
            .env("GIT_HTTP_EXPORT_ALL", "1")
            .env("REQUEST_METHOD", &method)
            .env("PATH_INFO", &path)
            .env("QUERY_STRING", &query)
            .env("CONTENT_TYPE", &content_type)
            .env("CONTENT_LENGTH", body.len().to_string())
            .env("REMOTE_ADDR", "127.0.0.1")
            .env("SERVER_PROTOCOL", "HTTP/1.1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        isolate(&mut cmd);
        if !git_protocol.is_empty() {
            cmd.env("GIT_PROTOCOL", &git_protocol);
        }
        if !encoding.is_empty() {
            cmd.env("HTTP_CONTENT_ENCODING", &encoding);
        }
        if authed {
            cmd.env("REMOTE_USER", "user");
        }
        let mut child = cmd.spawn().expect("spawning git http-backend");
        let mut stdin = child.stdin.take().unwrap();
        // Feed stdin from another thread so a large response cannot deadlock on full pipes.
        let writer = std::thread::spawn(move || {
            let _ = stdin.write_all(&body);
        });
        let out = child.wait_with_output().expect("waiting for git http-backend");
        let _ = writer.join();
        out
    })
    .await
    .unwrap();
    parse_cgi(&out.stdout).unwrap_or_else(|| {
        Response::builder()
            .status(500)
            .body(Body::from(format!("bad CGI output; stderr: {}", String::from_utf8_lossy(&out.stderr))))
            .unwrap()
    })
}

fn parse_cgi(out: &[u8]) -> Option<Response> {
    let (head_len, sep) = match out.windows(4).position(|w| w == b"\r\n\r\n") {
        Some(i) => (i, 4),
        None => (out.windows(2).position(|w| w == b"\n\n")?, 2),
    };
    let head = std::str::from_utf8(&out[..head_len]).ok()?;
    let mut builder = Response::builder().status(200);
    for line in head.lines() {
        let (name, value) = line.split_once(':')?;
        let value = value.trim();
        if name.eq_ignore_ascii_case("status") {
            let code: u16 = value.split_whitespace().next()?.parse().ok()?;
            builder = builder.status(code);
        } else {
            builder = builder.header(name.trim(), value);
        }
    }
    builder.body(Body::from(out[head_len + sep..].to_vec())).ok()
}
