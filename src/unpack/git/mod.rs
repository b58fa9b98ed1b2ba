//! Source: a git repository at a commit, tag or branch, over smart HTTP(S), with gix (pure Rust).
//!
//! * [`resolve`] lists the remote's refs (like `git ls-remote`, no objects) to learn which commit a
//!   branch, tag (annotated tags peeled) or the remote `HEAD` names now; a pinned `ref.commit` is
//!   returned without any network I/O. [`tags`] lists the tags, for a version range.
//! * [`fetch`] fetches exactly the pinned commit into a temporary bare repository (depth 1 by id
//!   when the server allows wanting a commit by id, else a full fetch of branches and tags), and
//!   streams its tree (or `spec.directory` of it) into the sink ([`tree`]).
//!
//! What a fetch may cost: the temporary repositories live under the context's scratch directory
//! (`DATA_DIR/tmp/git`, emptied at start by [`clean_scratch`]), where the pack being received is
//! checked against the data directory's free-space reserve and `--max-git-fetch-bytes` as it
//! arrives ([`meter`]). gix holds one object whole in memory while it checks a received pack (it
//! hashes each object's full content) and while it reads one back; `--max-git-file-bytes` is gix's
//! allocation limit (`gitoxide.objects.allocLimit`), so a larger file is refused instead of read,
//! and that is the memory one git unpack needs per object.
//!
//! Credentials (the `authSecret`, else the `--source-credentials` entry for the host): `Basic`
//! is sent as HTTP basic auth; a `Bearer` token is sent as basic auth with
//! the username `x-access-token` and the token as password — the convention GitHub documents for
//! app and personal access tokens and that GitLab accepts for personal/project access tokens (any
//! non-blank username). Nothing is read from the process's git configuration or credential
//! helpers: repositories are opened isolated.
//!
//! Transport: gix's blocking reqwest client (rustls, verified certificates against the system's
//! roots and `--source-ca-file`; 20 s connect timeout,
//! reqwest's 30 s per read/write operation; gix refuses https→http redirects), every response
//! counted ([`transport`]: refs and negotiation at most 32 MiB, the pack metered). Cancellation
//! stops `resolve` from waiting at once and `fetch` at the next pack chunk or file.

mod failure;
mod meter;
mod scratch;
mod transport;
mod tree;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use gix::remote::Direction;

use crate::api::versions::MAX_TAGS;

use self::failure::GitFailure;
use self::meter::Meter;
pub use self::scratch::clean_scratch;
use self::scratch::{Interrupt, TempDir};
use self::transport::Listing;
use super::error::UnpackError;
use super::source::{
    Credentials, GitSource, NetworkPolicy, ResolvedSource, Scratch, Sink, SourceContext, UnpackLimits,
};

/// What `spec` points at now, fetching metadata only. Returns a value equal to `previous` when
/// nothing changed; performs no network I/O for a source pinned by digest/commit/sha256.
pub async fn resolve(
    spec: &GitSource,
    ctx: &SourceContext,
    previous: Option<&ResolvedSource>,
) -> Result<ResolvedSource, UnpackError> {
    // The identity is the (repository, commit) pair alone: an equal value *is* "unchanged", so
    // `previous` needs no special treatment.
    let _ = previous;
    let url = check_url(&spec.repository, &ctx.network)?;
    let r = &spec.reference;
    let set = [&r.commit, &r.tag, &r.branch].iter().filter(|s| !s.is_empty()).count();
    if set > 1 {
        return Err(UnpackError::Unsupported(format!(
            "git source {}: set at most one of ref.commit, ref.tag and ref.branch",
            redact(&url)
        )));
    }
    if !r.commit.is_empty() {
        let commit = parse_commit(&r.commit)?;
        return Ok(ResolvedSource::git(&spec.repository, commit.to_string()));
    }
    let wanted = if !r.tag.is_empty() {
        format!("refs/tags/{}", r.tag)
    } else if !r.branch.is_empty() {
        format!("refs/heads/{}", r.branch)
    } else {
        "HEAD".to_owned()
    };
    let refs = list_refs(&url, &wanted, ctx).await?;
    let Some((_, commit)) = refs.into_iter().find(|(name, _)| *name == wanted) else {
        return Err(UnpackError::NotFound(format!("git source {}: {wanted} not found on the remote", redact(&url))));
    };
    Ok(ResolvedSource::git(&spec.repository, commit))
}

/// The tags of `repository` (names without `refs/tags/`), each with the commit it points at
/// (annotated tags peeled), for a version range to choose from.
pub async fn tags(repository: &str, ctx: &SourceContext) -> Result<Vec<(String, String)>, UnpackError> {
    let url = check_url(repository, &ctx.network)?;
    let refs = list_refs(&url, "refs/tags/*:refs/tags/*", ctx).await?;
    Ok(refs
        .into_iter()
        .filter_map(|(name, commit)| Some((name.strip_prefix("refs/tags/")?.to_owned(), commit)))
        .collect())
}

/// `git ls-remote URL PATTERN` on a blocking thread, given up on cancellation.
async fn list_refs(
    url: &reqwest::Url,
    pattern: &str,
    ctx: &SourceContext,
) -> Result<Vec<(String, String)>, UnpackError> {
    ctx.check_cancelled()?;
    let (url, pattern) = (url.clone(), pattern.to_owned());
    let (credentials, scratch) = (ctx.credentials.clone(), ctx.scratch.clone());
    let roots = super::trust::extra_roots(&ctx.network)?;
    let task = tokio::task::spawn_blocking(move || ls_remote(&url, &pattern, credentials, roots, &scratch));
    // gix's transport is blocking: stop waiting on cancellation and let the thread finish alone.
    tokio::select! {
        joined = task => joined.map_err(|e| UnpackError::Fetch(format!("listing git refs: {e}")))?,
        _ = ctx.cancel.cancelled() => Err(UnpackError::Cancelled),
    }
}

/// Streams exactly the content `pinned` names into `sink`, verifying every digest; returns the
/// final pinned identity (e.g. with the downloaded sha256 filled in). Blocking: run on a blocking
/// thread.
pub fn fetch(
    spec: &GitSource,
    ctx: &SourceContext,
    pinned: &ResolvedSource,
    sink: &mut Sink<'_>,
) -> Result<ResolvedSource, UnpackError> {
    let ResolvedSource::Git { repository, commit, .. } = pinned else {
        return Err(UnpackError::Unsupported("git source: the pinned identity is not a git commit".into()));
    };
    let url = check_url(repository, &ctx.network)?;
    let id = parse_commit(commit)?;
    ctx.check_cancelled()?;

    // Listing refs (resolve) writes next to nothing; a fetch needs room for its pack.
    ctx.scratch.check_space()?;
    let tmp = TempDir::new(&ctx.scratch)?;
    let interrupt = Interrupt::watch(ctx);
    let meter = Meter::new(&ctx.limits, ctx.scratch.clone(), interrupt.flag.clone());
    let repo = fetch_commit(&tmp, &url, id, ctx, &interrupt.flag, &meter)?;
    ctx.check_cancelled()?;
    // The pack was indexed (every object's id recomputed from its content) on receipt, so
    // finding the commit under its id is the verification.
    let commit_obj = repo.find_commit(id).map_err(|_| {
        UnpackError::Fetch(format!("git source {}: commit {id} not found in the repository", redact(&url)))
    })?;
    let root = commit_obj
        .tree_id()
        .map_err(|e| {
            tracing::debug!(commit = %id, error = %e, "decoding the commit failed");
            UnpackError::CorruptArchive(format!("git commit {id} does not decode"))
        })?
        .detach();
    tree::walk(&repo, root, &spec.directory, id, ctx, sink)?;
    Ok(ResolvedSource::git(repository, id.to_string()))
}

/// The URL of a git source, if this server may fetch it: https, or plain http to a host listed
/// with `--insecure-source-host`.
fn check_url(repository: &str, network: &NetworkPolicy) -> Result<reqwest::Url, UnpackError> {
    let url = reqwest::Url::parse(repository).map_err(|e| {
        UnpackError::Unsupported(format!("git source {repository:?}: not a URL ({e}); use https://HOST/PATH"))
    })?;
    check_scheme(&url, network, "git")?;
    Ok(url)
}

/// Shared by the git and http sources: only https, or http to an allowed `HOST:PORT`.
pub(super) fn check_scheme(url: &reqwest::Url, network: &NetworkPolicy, kind: &str) -> Result<(), UnpackError> {
    // Credentials in the URL would end up in messages, logs and status: they belong in a Secret.
    if !url.username().is_empty() || url.password().is_some() {
        return Err(UnpackError::Unsupported(format!(
            "{kind} source {}: the URL holds credentials; put them in the authSecret instead",
            redact(url)
        )));
    }
    match url.scheme() {
        "https" => Ok(()),
        "http" => {
            let host_port = host_port(url);
            if network.allows_plain_http(&host_port) {
                Ok(())
            } else {
                Err(UnpackError::Unsupported(format!(
                    "{kind} source {}: plain http is refused; serve it over https, or start the server with \
                     --insecure-source-host {host_port}",
                    redact(url)
                )))
            }
        }
        other => Err(UnpackError::Unsupported(format!(
            "{kind} source {}: scheme {other:?} is not supported (https only)",
            redact(url)
        ))),
    }
}

/// `host:port` as `--insecure-source-host` spells it (IPv6 hosts in brackets).
pub(super) fn host_port(url: &reqwest::Url) -> String {
    // `host_str` already brackets IPv6 addresses.
    format!("{}:{}", url.host_str().unwrap_or(""), url.port_or_known_default().unwrap_or(0))
}

/// The URL without any user information, for messages and logs.
pub(super) fn redact(url: &reqwest::Url) -> String {
    let mut clean = url.clone();
    let _ = clean.set_username("");
    let _ = clean.set_password(None);
    clean.to_string()
}

fn parse_commit(commit: &str) -> Result<gix::ObjectId, UnpackError> {
    let valid = commit.len() == 40 && commit.bytes().all(|b| b.is_ascii_hexdigit());
    if !valid {
        return Err(UnpackError::Unsupported(format!(
            "git ref.commit {commit:?}: expected a full 40-hex-digit commit id"
        )));
    }
    gix::ObjectId::from_hex(commit.to_ascii_lowercase().as_bytes())
        .map_err(|e| UnpackError::Unsupported(format!("git ref.commit {commit:?}: {e}")))
}

/// `git ls-remote URL PATTERN`: the refs `pattern` (a full ref name, `HEAD` or `refs/tags/*`)
/// names, each with the commit it points at (tags peeled), at most [`MAX_TAGS`].
fn ls_remote(
    url: &reqwest::Url,
    pattern: &str,
    credentials: Option<Credentials>,
    roots: Vec<reqwest::Certificate>,
    scratch: &Scratch,
) -> Result<Vec<(String, String)>, UnpackError> {
    let shown = redact(url);
    let listing = Arc::new(Listing::default());
    let fail = |what: &str, e: &gix::Error| match listing.too_large.load(Ordering::Relaxed) {
        true => listing_too_large(&shown),
        false => {
            refused(failure::classify(e), format!("git source {shown}: {what}: {}", crate::unpack::error::describe(e)))
        }
    };
    // gix needs a repository to hang a remote on; an empty, isolated one in a temp dir.
    let tmp = TempDir::new(scratch)?;
    let repo = init_repo(tmp.path(), None)?;
    let remote = repo
        .remote_at(url.as_str())
        .map_err(|e| fail("invalid remote", &e))?
        .with_fetch_tags(gix::remote::fetch::Tags::None)
        .with_refspecs([pattern], Direction::Fetch)
        .map_err(|e| UnpackError::Unsupported(format!("git source {shown}: invalid ref {pattern:?}: {e}")))?;
    let connection = transport::connect(&remote, listing.clone(), roots)
        .map_err(|e| fail("connecting", &e))?
        .with_credentials(authenticate(credentials, host_port(url)));
    let (map, _handshake) =
        connection.ref_map(gix::progress::Discard, Default::default()).map_err(|e| fail("listing refs", &e))?;
    let mut refs = Vec::new();
    for r in &map.remote_refs {
        use gix::protocol::handshake::Ref;
        let (name, object) = match r {
            Ref::Peeled { full_ref_name, object, .. }
            | Ref::Direct { full_ref_name, object }
            | Ref::Symbolic { full_ref_name, object, .. } => (full_ref_name, object),
            Ref::Unborn { .. } => continue,
        };
        refs.push((name.to_string(), object.to_string()));
        if refs.len() > MAX_TAGS {
            return Err(UnpackError::TooLarge(format!(
                "git source {shown}: more than {MAX_TAGS} refs match {pattern}"
            )));
        }
    }
    Ok(refs)
}

/// A failed git request: a missing repository and refused credentials wait for a spec change or
/// the next poll; the rest is retried.
fn refused(failure: GitFailure, message: String) -> UnpackError {
    match failure {
        GitFailure::NotFound => UnpackError::NotFound(message),
        GitFailure::Denied => UnpackError::Denied(message),
        GitFailure::TooLarge | GitFailure::Other => UnpackError::Fetch(message),
    }
}

/// An empty bare repository that ignores the process's git configuration (no credential helpers,
/// proxies or URL rewrites from the host).
fn init_repo(dir: &Path, limits: Option<&UnpackLimits>) -> Result<gix::Repository, UnpackError> {
    gix::ThreadSafeRepository::init_opts(
        dir,
        gix::create::Kind::Bare,
        gix::create::Options::default(),
        open_options(limits),
    )
    .map(Into::into)
    .map_err(|e| UnpackError::Fetch(format!("creating a temporary git repository: {e}")))
}

/// Answers gix's credential requests from the source's Secret (or `--source-credentials`) only;
/// without any, says so in plain words (gix's own message blames a credential helper).
fn authenticate(
    credentials: Option<Credentials>,
    host_port: String,
) -> impl FnMut(gix::credentials::helper::Action) -> gix::Result<Option<gix::credentials::protocol::Outcome>> {
    move |action| {
        let gix::credentials::helper::Action::Get(context) = action else {
            // Store/Erase: nothing is remembered between fetches.
            return Ok(None);
        };
        let (username, password) = match &credentials {
            Some(Credentials::Basic { username, password }) => (username.clone(), password.clone()),
            Some(Credentials::Bearer(token)) => ("x-access-token".to_owned(), token.clone()),
            Some(Credentials::DockerConfig(_)) | None => {
                return Err(gix::Error::from_error(std::io::Error::other(format!(
                    "the server asks for credentials, and this source has none (an authSecret, or an entry for \
                     {host_port} in --source-credentials)"
                ))))
            }
        };
        Ok(Some(gix::credentials::protocol::Outcome {
            credentials: gix::sec::identity::Credentials::UsernamePassword {
                username,
                password,
                oauth_refresh_token: None,
            },
            next: context.into(),
        }))
    }
}

/// Fetches `id` into a new repository below `tmp`: first by id at depth 1, then, if the server
/// refuses that (`git http-backend` without `uploadpack.allowReachableSHA1InWant` on protocol v0),
/// every branch and tag in full.
fn fetch_commit(
    tmp: &TempDir,
    url: &reqwest::Url,
    id: gix::ObjectId,
    ctx: &SourceContext,
    interrupt: &AtomicBool,
    meter: &Meter,
) -> Result<gix::Repository, UnpackError> {
    let by_id = tmp.path().join("by-id");
    let first = fetch_into(&by_id, url, &[id.to_string()], true, ctx, interrupt, meter);
    match first {
        Ok(repo) if repo.has_object(id) => return Ok(repo),
        // A limit hit by the small fetch would be hit again by the full one.
        Err(e @ (UnpackError::Cancelled | UnpackError::TooLarge(_) | UnpackError::Storage(_))) => return Err(e),
        Ok(_) | Err(_) => {}
    }
    // The first attempt's pack is not needed any more: give its space back.
    let _ = std::fs::remove_dir_all(&by_id);
    if let Err(e) = &first {
        tracing::debug!(url = %redact(url), error = %e, "git fetch by commit id refused; fetching all branches and tags");
    }
    ctx.check_cancelled()?;
    let specs = ["+refs/heads/*:refs/heads/*".to_owned(), "+refs/tags/*:refs/tags/*".to_owned()];
    fetch_into(&tmp.path().join("full"), url, &specs, false, ctx, interrupt, meter)
}

fn fetch_into(
    dir: &Path,
    url: &reqwest::Url,
    refspecs: &[String],
    shallow: bool,
    ctx: &SourceContext,
    interrupt: &AtomicBool,
    meter: &Meter,
) -> Result<gix::Repository, UnpackError> {
    let shown = redact(url);
    let limits = &ctx.limits;
    let fail = |what: &str, e: &gix::Error| {
        let text = crate::unpack::error::describe(e);
        if let Some(stop) = meter.stopped(&format!("git source {shown}")) {
            stop
        } else if meter.listing().too_large.load(Ordering::Relaxed) {
            listing_too_large(&shown)
        } else if ctx.cancel.is_cancelled() {
            UnpackError::Cancelled
        } else {
            match failure::classify(e) {
                GitFailure::TooLarge => {
                    meter::object_too_large(&format!("git source {shown}"), limits.max_git_file_bytes)
                }
                _ => UnpackError::Fetch(format!("git source {shown}: {what}: {text}")),
            }
        }
    };
    let roots = super::trust::extra_roots(&ctx.network)?;
    std::fs::create_dir_all(dir).map_err(|e| UnpackError::Fetch(format!("creating a temporary directory: {e}")))?;
    let repo = init_repo(dir, Some(limits))?;
    {
        let remote = repo
            .remote_at(url.as_str())
            .map_err(|e| fail("invalid remote", &e))?
            .with_fetch_tags(gix::remote::fetch::Tags::None)
            .with_refspecs(refspecs.iter().map(String::as_str), Direction::Fetch)
            .map_err(|e| fail("invalid refspec", &e))?;
        let connection = transport::connect(&remote, meter.listing(), roots)
            .map_err(|e| fail("connecting", &e))?
            .with_credentials(authenticate(ctx.credentials.clone(), host_port(url)));
        let mut prepare = connection
            .prepare_fetch(gix::progress::Discard, Default::default())
            .map_err(|e| fail("listing refs", &e))?;
        if shallow {
            prepare = prepare.with_shallow(gix::remote::fetch::Shallow::DepthAtRemote(std::num::NonZeroU32::MIN));
        }
        prepare.receive(meter.clone(), interrupt).map_err(|e| fail("fetching", &e))?;
    }
    ctx.budget.add_downloaded(pack_bytes(dir));
    // Re-open so the object database sees the packs just written.
    gix::open_opts(dir, open_options(Some(limits)))
        .map_err(|e| UnpackError::Fetch(format!("git source {shown}: opening the fetched repository: {e}")))
}

fn listing_too_large(shown: &str) -> UnpackError {
    UnpackError::TooLarge(format!(
        "git source {shown}: the server sent more than {} bytes of refs before a pack",
        transport::MAX_LISTING_BYTES
    ))
}

/// Isolated from the host's git configuration; with `limits`, gix allocates at most
/// `max_git_file_bytes` for one object and checks packs on one thread (one object in memory).
fn open_options(limits: Option<&UnpackLimits>) -> gix::open::Options {
    let options = gix::open::Options::isolated();
    match limits {
        Some(limits) => options.config_overrides([
            format!("gitoxide.objects.allocLimit={}", limits.max_git_file_bytes),
            "pack.threads=1".to_owned(),
        ]),
        None => options,
    }
}

/// Bytes of the received packs: what was downloaded, for the expansion-ratio limit.
fn pack_bytes(git_dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(git_dir.join("objects").join("pack")) else {
        return 0;
    };
    entries
        .filter_map(Result::ok)
        .filter(|e| e.path().extension().is_some_and(|x| x == "pack"))
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .sum()
}
