//! The git source against a real `git http-backend`: branches, annotated tags, pinned commits,
//! subdirectories, authentication, moved branches, plain-http policy and unsafe symlinks. Calls
//! `stowage::unpack::git::{resolve, fetch}` directly with a recording sink.

use std::io::Read;
use std::sync::Arc;

use stowage::unpack::error::UnpackError;
use stowage::unpack::git;
use stowage::unpack::source::{Budget, GitRef, GitSource};
use stowage::unpack::{Credentials, EntrySink, NetworkPolicy, ResolvedSource, SourceContext, UnpackLimits};
use tokio_util::sync::CancellationToken;

use crate::git_server::GitServer;
use crate::harness::corpus;
use crate::tarutil::{assert_trees_equal, file, tree_from_dir, Node, Tree};

/// Collects what a source writes: path → file bytes/exec bit or symlink target; the directories
/// named, every file's mode, and the order of the files and symlinks apart.
#[derive(Default)]
pub(crate) struct RecordingSink {
    pub tree: Tree,
    pub dirs: Vec<(String, u32)>,
    pub modes: Vec<u32>,
    pub order: Vec<String>,
}

impl EntrySink for RecordingSink {
    type Error = UnpackError;
    fn file(&mut self, path: &str, mode: u32, size: u64, data: &mut dyn Read) -> Result<(), UnpackError> {
        let mut bytes = Vec::new();
        data.read_to_end(&mut bytes).map_err(|e| UnpackError::from_io(path, e))?;
        assert_eq!(bytes.len() as u64, size, "{path}: the data is not the size announced");
        let exec = mode & 0o100 != 0;
        assert!(self.tree.insert(path.to_owned(), Node::File { data: bytes, exec }).is_none(), "{path} twice");
        self.modes.push(mode);
        self.order.push(path.to_owned());
        Ok(())
    }
    fn dir(&mut self, path: &str, mode: u32) -> Result<(), UnpackError> {
        self.dirs.push((path.to_owned(), mode));
        Ok(())
    }
    fn symlink(&mut self, path: &str, target: &str) -> Result<(), UnpackError> {
        assert!(self.tree.insert(path.to_owned(), Node::Symlink(target.to_owned())).is_none(), "{path} twice");
        self.order.push(path.to_owned());
        Ok(())
    }
    fn hardlink(&mut self, path: &str, target: &str) -> Result<(), UnpackError> {
        let node = self.tree.get(target).cloned().expect("hard link to an earlier file");
        self.tree.insert(path.to_owned(), node);
        Ok(())
    }
}

/// A context on the current runtime; `insecure` hosts may be reached over plain http.
pub(crate) fn context(insecure: &[String], credentials: Option<Credentials>) -> SourceContext {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    SourceContext {
        runtime: tokio::runtime::Handle::current(),
        cancel: CancellationToken::new(),
        network: Arc::new(NetworkPolicy {
            insecure_registries: vec![],
            insecure_hosts: insecure.to_vec(),
            ..Default::default()
        }),
        credentials,
        limits: UnpackLimits::default(),
        budget: Arc::new(Budget::default()),
        scratch: Default::default(),
        downloads: None,
    }
}

fn spec(url: &str, commit: &str, tag: &str, branch: &str) -> GitSource {
    GitSource {
        repository: url.to_owned(),
        reference: GitRef { commit: commit.into(), tag: tag.into(), branch: branch.into(), ..Default::default() },
        directory: String::new(),
        auth_secret: String::new(),
    }
}

async fn fetch(
    spec: &GitSource,
    ctx: &SourceContext,
    pinned: &ResolvedSource,
) -> Result<(ResolvedSource, Tree), UnpackError> {
    let (spec, ctx, pinned) = (spec.clone(), ctx.clone(), pinned.clone());
    tokio::task::spawn_blocking(move || {
        let mut sink = RecordingSink::default();
        let fetched = git::fetch(&spec, &ctx, &pinned, &mut sink);
        // git records no directory of its own (they hold files) and two modes.
        assert!(sink.dirs.is_empty(), "a git tree named directories: {:?}", sink.dirs);
        assert!(sink.modes.iter().all(|m| *m == 0o644 || *m == 0o755), "git modes: {:?}", sink.modes);
        // In path order, as the store serves them: it lays such a tree out as it arrives.
        assert!(sink.order.windows(2).all(|w| w[0] < w[1]), "not in path order: {:?}", sink.order);
        fetched.map(|r| (r, sink.tree))
    })
    .await
    .unwrap()
}

fn commit_of(r: &ResolvedSource) -> &str {
    match r {
        ResolvedSource::Git { commit, .. } => commit,
        other => panic!("not a git identity: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn git_branch_and_default_head_fetch_the_corpus_tree() {
    let server = GitServer::start().await;
    server.create("etcd");
    let dir = corpus().join("operator-registry/etcd");
    let c1 = server.commit_dir("etcd", "main", &dir);
    let ctx = context(&[server.host_port()], None);

    let by_branch = git::resolve(&spec(&server.url("etcd"), "", "", "main"), &ctx, None).await.unwrap();
    assert_eq!(by_branch, ResolvedSource::git(&server.url("etcd"), c1.clone()));
    let by_head = git::resolve(&spec(&server.url("etcd"), "", "", ""), &ctx, None).await.unwrap();
    assert_eq!(by_head, by_branch, "no ref = the remote's HEAD");

    let (pinned, tree) = fetch(&spec(&server.url("etcd"), "", "", "main"), &ctx, &by_branch).await.unwrap();
    assert_eq!(pinned, by_branch);
    assert_trees_equal(&tree_from_dir(&dir), &tree, "git fetch of operator-registry/etcd");
    assert!(ctx.budget.downloaded() > 0, "the pack counts as downloaded bytes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn git_annotated_tag_is_peeled_and_an_older_commit_fetched() {
    let server = GitServer::start().await;
    server.create("r");
    let old = tree_from([("a.yaml", "old"), ("bin/run.sh", "#!/bin/sh\n")]);
    let c1 = server.commit("r", "main", &old);
    server.tag("r", "v1", &c1, true);
    let c2 = server.commit("r", "main", &tree_from([("a.yaml", "new")]));
    assert_ne!(c1, c2);
    let ctx = context(&[server.host_port()], None);

    let s = spec(&server.url("r"), "", "v1", "");
    let resolved = git::resolve(&s, &ctx, None).await.unwrap();
    assert_eq!(commit_of(&resolved), c1, "an annotated tag resolves to the commit it points at");
    // c1 is no longer a branch tip: fetching it by id must still work.
    let (_, tree) = fetch(&s, &ctx, &resolved).await.unwrap();
    assert_trees_equal(&old, &tree, "tag v1");

    let missing = git::resolve(&spec(&server.url("r"), "", "v9", ""), &ctx, None).await.unwrap_err();
    assert!(matches!(missing, UnpackError::NotFound(ref m) if m.contains("v9")), "{missing:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn git_protocol_v0_server_still_serves_an_older_commit() {
    // Protocol v0 over http refuses wanting a commit that is no tip: the source falls back to
    // fetching every branch and tag.
    let server = GitServer::start_v0_only().await;
    server.create("r");
    let old = tree_from([("a.yaml", "old")]);
    let c1 = server.commit("r", "main", &old);
    server.commit("r", "main", &tree_from([("a.yaml", "new")]));
    let ctx = context(&[server.host_port()], None);
    let s = spec(&server.url("r"), &c1, "", "");
    let (pinned, tree) = fetch(&s, &ctx, &git::resolve(&s, &ctx, None).await.unwrap()).await.unwrap();
    assert_eq!(commit_of(&pinned), c1);
    assert_trees_equal(&old, &tree, "older commit over protocol v0");

    let gone = spec(&server.url("r"), &"1".repeat(40), "", "");
    let err = fetch(&gone, &ctx, &git::resolve(&gone, &ctx, None).await.unwrap()).await.unwrap_err();
    assert!(matches!(err, UnpackError::Fetch(ref m) if m.contains(&"1".repeat(40))), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn git_pinned_commit_and_subdirectory() {
    let server = GitServer::start().await;
    server.create("r");
    let plain = corpus().join("rukpak-testdata/plain-v0/valid");
    let mut tree = tree_from([("README.md", "top"), ("deploy/link", "")]);
    tree.insert("deploy/link".into(), Node::Symlink("manifests/crds.yaml".into()));
    for (path, node) in tree_from_dir(&plain) {
        tree.insert(format!("deploy/{path}"), node);
    }
    let c1 = server.commit("r", "main", &tree);
    let ctx = context(&[server.host_port()], None);

    let mut s = spec(&server.url("r"), &c1, "", "");
    s.directory = "deploy".into();
    let resolved = git::resolve(&s, &ctx, None).await.unwrap();
    assert_eq!(commit_of(&resolved), c1);
    let (_, got) = fetch(&s, &ctx, &resolved).await.unwrap();
    let mut expected = tree_from_dir(&plain);
    expected.insert("link".into(), Node::Symlink("manifests/crds.yaml".into()));
    assert_trees_equal(&expected, &got, "directory deploy becomes the root");

    s.directory = "nope/".into();
    let err = fetch(&s, &ctx, &resolved).await.unwrap_err();
    assert!(matches!(err, UnpackError::InvalidFormat { ref path, .. } if path == "nope/"), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn git_auth_is_required_and_used() {
    let server = GitServer::start_with_auth("alice", "s3cret-pw").await;
    server.create("r");
    let files = tree_from([("x", "1")]);
    let c1 = server.commit("r", "main", &files);
    let s = spec(&server.url("r"), "", "", "main");

    let anonymous = context(&[server.host_port()], None);
    let err = git::resolve(&s, &anonymous, None).await.unwrap_err();
    assert!(matches!(err, UnpackError::Fetch(_)), "{err:?}");
    assert!(err.to_string().contains(&server.url("r")), "names the URL: {err}");
    assert!(err.to_string().contains("credentials"), "says why: {err}");

    let wrong = Credentials::Basic { username: "alice".into(), password: "wrong-pw".into() };
    let err = git::resolve(&s, &context(&[server.host_port()], Some(wrong)), None).await.unwrap_err();
    assert!(matches!(err, UnpackError::Denied(_)) && !err.is_transient(), "{err:?}");
    assert!(!err.to_string().contains("wrong-pw"), "never the credentials: {err}");

    let right = Credentials::Basic { username: "alice".into(), password: "s3cret-pw".into() };
    let ctx = context(&[server.host_port()], Some(right));
    let resolved = git::resolve(&s, &ctx, None).await.unwrap();
    assert_eq!(commit_of(&resolved), c1);
    let (_, tree) = fetch(&s, &ctx, &resolved).await.unwrap();
    assert_trees_equal(&files, &tree, "authenticated fetch");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn git_token_is_sent_as_x_access_token() {
    let server = GitServer::start_with_auth("x-access-token", "ghp_token").await;
    server.create("r");
    let c1 = server.commit("r", "main", &tree_from([("x", "1")]));
    let ctx = context(&[server.host_port()], Some(Credentials::Bearer("ghp_token".into())));
    let resolved = git::resolve(&spec(&server.url("r"), "", "", "main"), &ctx, None).await.unwrap();
    assert_eq!(commit_of(&resolved), c1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn git_moved_branch_resolves_to_the_new_commit() {
    let server = GitServer::start().await;
    server.create("r");
    let c1 = server.commit("r", "main", &tree_from([("v", "1")]));
    let ctx = context(&[server.host_port()], None);
    let s = spec(&server.url("r"), "", "", "main");
    let first = git::resolve(&s, &ctx, None).await.unwrap();
    assert_eq!(git::resolve(&s, &ctx, Some(&first)).await.unwrap(), first, "unchanged");

    let c2 = server.commit("r", "main", &tree_from([("v", "2")]));
    let second = git::resolve(&s, &ctx, Some(&first)).await.unwrap();
    assert_eq!(commit_of(&second), c2);
    let (_, tree) = fetch(&s, &ctx, &second).await.unwrap();
    assert_trees_equal(&tree_from([("v", "2")]), &tree, "after the push");

    server.move_branch("r", "main", &c1);
    assert_eq!(git::resolve(&s, &ctx, Some(&second)).await.unwrap(), first, "force-pushed back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn git_pinned_commit_resolves_without_the_server() {
    let server = GitServer::start().await;
    let url = server.url("r");
    let host = server.host_port();
    server.stop();
    drop(server);
    let commit = "0123456789abcdef0123456789abcdef01234567";
    let ctx = context(&[host], None);
    let resolved = git::resolve(&spec(&url, commit, "", ""), &ctx, None).await.unwrap();
    assert_eq!(resolved, ResolvedSource::git(&url, commit.into()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn git_plain_http_needs_the_insecure_host_flag() {
    let server = GitServer::start().await;
    server.create("r");
    server.commit("r", "main", &tree_from([("x", "1")]));
    let err = git::resolve(&spec(&server.url("r"), "", "", "main"), &context(&[], None), None).await.unwrap_err();
    assert!(matches!(err, UnpackError::Unsupported(_)), "{err:?}");
    let expected = format!("--insecure-source-host {}", server.host_port());
    assert!(err.to_string().contains(&expected), "{err}");
}

/// A directory's files come where the directory sorts (as if its name ended in `/`): `a-b` before
/// `a/x`, and `b` after it, not a tree's own files before its subtrees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn git_files_come_in_path_order() {
    let server = GitServer::start().await;
    server.create("r");
    let tree = tree_from([("b", "1"), ("a/x", "2"), ("a-b", "3"), ("a/y/z", "4"), ("a.d/w", "5")]);
    let c1 = server.commit("r", "main", &tree);
    let ctx = context(&[server.host_port()], None);
    let s = spec(&server.url("r"), &c1, "", "");
    let pinned = git::resolve(&s, &ctx, None).await.unwrap();
    let (spec, ctx2) = (s.clone(), ctx.clone());
    let order = tokio::task::spawn_blocking(move || {
        let mut sink = RecordingSink::default();
        git::fetch(&spec, &ctx2, &pinned, &mut sink).unwrap();
        sink.order
    })
    .await
    .unwrap();
    assert_eq!(order, ["a-b", "a.d/w", "a/x", "a/y/z", "b"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn git_symlink_escaping_the_tree_is_refused() {
    let server = GitServer::start().await;
    server.create("r");
    let mut tree = tree_from([("ok", "1")]);
    tree.insert("dir/evil".into(), Node::Symlink("../../etc/passwd".into()));
    let c1 = server.commit("r", "main", &tree);
    let ctx = context(&[server.host_port()], None);
    let s = spec(&server.url("r"), &c1, "", "");
    let pinned = git::resolve(&s, &ctx, None).await.unwrap();
    let err = fetch(&s, &ctx, &pinned).await.unwrap_err();
    assert!(matches!(err, UnpackError::InvalidEntry { ref path, .. } if path == "dir/evil"), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn git_limits_and_cancellation() {
    let server = GitServer::start().await;
    server.create("r");
    let c1 = server.commit("r", "main", &tree_from([("a", "1"), ("b", "22"), ("c/d", "333")]));
    let s = spec(&server.url("r"), &c1, "", "");
    let pinned = git::resolve(&s, &context(&[server.host_port()], None), None).await.unwrap();

    let limited = |f: fn(&mut UnpackLimits)| {
        let mut ctx = context(&[server.host_port()], None);
        f(&mut ctx.limits);
        ctx
    };
    for (what, ctx) in [
        ("files", limited(|l| l.max_files = 2)),
        ("file bytes", limited(|l| l.max_file_bytes = 2)),
        ("total bytes", limited(|l| l.max_total_bytes = 5)),
        ("path bytes", limited(|l| l.max_path_bytes = 2)),
    ] {
        let err = fetch(&s, &ctx, &pinned).await.unwrap_err();
        assert!(matches!(err, UnpackError::TooLarge(_)), "{what}: {err:?}");
    }

    let ctx = context(&[server.host_port()], None);
    ctx.cancel.cancel();
    let err = fetch(&s, &ctx, &pinned).await.unwrap_err();
    assert!(matches!(err, UnpackError::Cancelled), "{err:?}");
    let err = git::resolve(&spec(&server.url("r"), "", "", "main"), &ctx, None).await.unwrap_err();
    assert!(matches!(err, UnpackError::Cancelled), "{err:?}");
}

pub(crate) fn tree_from<const N: usize>(files: [(&str, &str); N]) -> Tree {
    files
        .into_iter()
        .map(|(path, data)| {
            let exec = path.ends_with(".sh");
            let node = if exec { Node::File { data: data.as_bytes().to_vec(), exec } } else { file(data) };
            (path.to_owned(), node)
        })
        .collect()
}
