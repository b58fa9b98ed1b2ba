//! One Bundle's job: unpack its current generation (retrying transient failures with jittered
//! backoff), then, with `spec.pollInterval`, keep re-resolving its floating references (version
//! ranges through [`releases`]) and unpack again when one moved. Failures that the same request
//! would meet again (not found, refused credentials, no matching version, invalid content) wait
//! for a spec change or the next poll. The time of the next attempt is kept in
//! `status.nextPollTime`, so a restart keeps the schedule ([`super::plan`]).
//!
//! Pinned means pinned: a new generation resolves again only the sources whose own fields
//! changed; the others keep the pin in `status.resolvedSources` (a branch stays on its commit).
//! When no source changed, nothing is fetched: the served content is checked against the new
//! spec ([`revisions::recheck_served`]). Every source is resolved again on a poll, and when the
//! `content.stowage.dev/refresh` annotation gets a new value.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::plan::Plan;
use super::Shared;
use crate::api::{AvailableVersions, Bundle, BundleStatus};
use crate::unpack::error::UnpackError;
use crate::unpack::format::FormatReport;
use crate::unpack::revisions::{self, CommitError, Expect};
use crate::unpack::sink::TreeSink;
use crate::unpack::source::{Budget, Credentials, ResolvedSource, Scratch, Source, SourceContext};
use crate::unpack::{git, http, oci, releases};

const FIRST_RETRY: Duration = Duration::from_secs(5);
pub(super) const MAX_RETRY: Duration = Duration::from_secs(300);

/// What the next attempt does.
#[derive(Clone, Debug, PartialEq)]
enum Mode {
    /// Unpack the current generation (a new one, or a retry): sources still pinned keep their
    /// pin, the others are resolved; nothing is fetched when every source is still pinned.
    Unpack,
    /// A poll: resolve every source; fetch only if one differs from what is served.
    Recheck,
    /// The refresh annotation's new value: as a poll, then record the value as handled.
    Refresh(String),
}

enum Outcome {
    /// Served (or nothing changed).
    Done,
    Failed(UnpackError),
}

pub(super) async fn run(shared: &Arc<Shared>, expect: Expect, plan: Plan, cancel: CancellationToken) {
    let (mut mode, mut wait) = match plan {
        Plan::Nothing => return,
        Plan::RecheckUpload => return super::recheck::run(shared, &expect, &cancel).await,
        Plan::MarkPaused => return mark_paused(shared, &expect, &cancel).await,
        Plan::Unpack(delay) => (Mode::Unpack, delay),
        Plan::Poll(delay) => (Mode::Recheck, delay),
        Plan::Refresh(value) => (Mode::Refresh(value), Duration::ZERO),
    };
    let mut failures = 0u32;
    loop {
        if !wait.is_zero() {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
        }
        let queued = shared.config.metrics.queued();
        let permit = tokio::select! {
            _ = cancel.cancelled() => return,
            permit = shared.slots.acquire() => match permit { Ok(p) => p, Err(_) => return },
        };
        drop(queued);
        // What the attempt presents, read before it: a fix written while a refusal is being
        // recorded then still counts as a change.
        let presented = match revisions::current(&shared.store, &expect) {
            Ok(current) => credentials_of(shared, &current.bundle).await,
            Err(_) => return,
        };
        let outcome = attempt(shared, &expect, &mode, &cancel).await;
        drop(permit);
        // A refresh is acted on once it got an answer (a transient failure retries it, across
        // restarts too).
        if let Mode::Refresh(value) = &mode {
            if !matches!(&outcome, Outcome::Failed(e) if e.is_transient() || matches!(e, UnpackError::Cancelled)) {
                let value = value.clone();
                let _ = write_status(shared, &expect, move |b| with(b, |s, _| s.refreshed(&value))).await;
            }
        }
        let bundle = match revisions::current(&shared.store, &expect) {
            Ok(current) => current.bundle,
            Err(_) => return, // gone or superseded: the loop starts what the new spec needs
        };
        // Polls are spread a little too, so Bundles created together do not poll together.
        let next_poll =
            bundle.spec.poll_interval().map(|interval| interval.mul_f64(fastrand::f64().mul_add(0.1, 0.95)));
        match outcome {
            Outcome::Done => {
                failures = 0;
                mode = Mode::Recheck;
                if let Some(delay) = next_poll {
                    let _ = write_status(shared, &expect, move |b| with(b, |s, _| s.schedule(Some(delay)))).await;
                }
            }
            Outcome::Failed(UnpackError::Cancelled) => return,
            Outcome::Failed(error) if error.is_transient() => {
                failures += 1;
                let delay = backoff(failures);
                tracing::info!(bundle = %expect.name, namespace = %expect.namespace, error = %error, "unpack failed; retrying in {delay:?}");
                if matches!(error, UnpackError::Storage(_)) {
                    // Out of space (or the store failing): give back what was downloaded too.
                    shared.config.downloads.for_bundle(&expect.uid).remove();
                }
                let note = format!("{error}; retrying in {}s", delay.as_secs().max(1));
                shared.config.events.warning(&regarding(&expect), error.reason(), "Unpack", &note);
                let _ = write_status(shared, &expect, move |b| failed(b, &error, Some(delay))).await;
                // A retry of a recheck only needs the recheck.
                wait = delay;
                continue;
            }
            Outcome::Failed(error) => {
                // Not found, refused, invalid: the same request would get the same answer. It
                // waits for a spec change or the next poll, which may see a moved tag; refused
                // credentials also for new ones.
                tracing::info!(bundle = %expect.name, namespace = %expect.namespace, error = %error, "unpack failed");
                let denied = matches!(error, UnpackError::Denied(_));
                shared.config.events.warning(&regarding(&expect), error.reason(), "Unpack", &error.to_string());
                let _ = write_status(shared, &expect, move |b| {
                    let mut status = failed(b, &error, None);
                    status.schedule(next_poll);
                    status
                })
                .await;
                shared.config.downloads.for_bundle(&expect.uid).remove();
                failures = 0;
                mode = Mode::Recheck;
                if denied {
                    let Some(changed) = await_new_credentials(shared, &bundle, presented, next_poll, &cancel).await
                    else {
                        return;
                    };
                    if changed {
                        mode = Mode::Unpack;
                    }
                    wait = Duration::ZERO;
                    continue;
                }
            }
        }
        match next_poll {
            Some(delay) => wait = delay,
            None => return,
        }
    }
}

/// `spec.paused`: said in the status for the current generation. A spec whose sources are all
/// still pinned gets its served content checked first, so `Unpacked` can answer for it.
async fn mark_paused(shared: &Arc<Shared>, expect: &Expect, cancel: &CancellationToken) {
    let pinned = current(shared, expect).is_ok_and(|b| b.still_pinned() && !b.is_unpacked());
    if pinned {
        super::recheck::run(shared, expect, cancel).await;
    }
    let _ = write_status(shared, expect, |b| with(b, |s, generation| s.paused(generation))).await;
}

/// How often the credentials of a Bundle whose credentials were refused are read again.
const CREDENTIAL_CHECK: Duration = Duration::from_secs(5);

/// After refused credentials (`refused`, what the attempt presented): waits, asking nothing of
/// the source, until the credentials it would present differ (`Some(true)`: a Secret or
/// `--source-credentials` was fixed) or `until` passes (`Some(false)`: the poll is due). `None`
/// once cancelled.
async fn await_new_credentials(
    shared: &Arc<Shared>,
    bundle: &Bundle,
    refused: Vec<Option<Credentials>>,
    until: Option<Duration>,
    cancel: &CancellationToken,
) -> Option<bool> {
    let started = std::time::Instant::now();
    loop {
        let left = until.map(|u| u.saturating_sub(started.elapsed()));
        if left.is_some_and(|l| l.is_zero()) {
            return Some(false);
        }
        tokio::select! {
            _ = cancel.cancelled() => return None,
            _ = tokio::time::sleep(left.map_or(CREDENTIAL_CHECK, |l| l.min(CREDENTIAL_CHECK))) => {}
        }
        if credentials_of(shared, bundle).await != refused {
            return Some(true);
        }
    }
}

/// The credentials each source would present now (`None` where there are none or they cannot
/// be read).
async fn credentials_of(shared: &Arc<Shared>, bundle: &Bundle) -> Vec<Option<Credentials>> {
    let mut all = Vec::with_capacity(bundle.spec.sources.len());
    for source in &bundle.spec.sources {
        all.push(shared.config.credentials.for_source(bundle.namespace(), source).await.ok().flatten());
    }
    all
}

/// The wait before retry number `failures`: 5 s doubling up to 5 min, each drawn at random from
/// its upper half so that Bundles failing together (a registry outage) do not retry in lockstep.
pub(super) fn backoff(failures: u32) -> Duration {
    let ceiling = FIRST_RETRY.saturating_mul(1 << failures.saturating_sub(1).min(10)).min(MAX_RETRY);
    ceiling.mul_f64(fastrand::f64().mul_add(0.5, 0.5))
}

/// The Bundle's status changed by `change` (given the Bundle's generation).
fn with(bundle: &Bundle, change: impl FnOnce(&mut BundleStatus, i64)) -> BundleStatus {
    let mut status = bundle.status_or_default();
    change(&mut status, bundle.generation());
    status
}

/// The current generation failed; whatever was served before stays served. With `retry_in`, the
/// retry is scheduled (`nextPollTime`) and the message says when.
fn failed(bundle: &Bundle, error: &UnpackError, retry_in: Option<Duration>) -> BundleStatus {
    let retry = match (retry_in, error) {
        (Some(d), _) => format!("; retrying in {}s", d.as_secs().max(1)),
        (None, UnpackError::Denied(_)) => "; tried again when its credentials change".to_owned(),
        (None, _) => String::new(),
    };
    with(bundle, |s, generation| {
        s.failed(generation, error.reason(), &format!("{error}{retry}"));
        if retry_in.is_some() {
            s.schedule(retry_in);
        }
    })
}

fn unpacking(bundle: &Bundle) -> BundleStatus {
    with(bundle, |s, generation| s.unpacking(generation))
}

async fn write_status<F>(shared: &Arc<Shared>, expect: &Expect, compute: F) -> Result<(), CommitError>
where
    F: Fn(&Bundle) -> BundleStatus + Send + 'static,
{
    let (store, expect) = (shared.store.clone(), expect.clone());
    tokio::task::spawn_blocking(move || revisions::write_status(&store, &expect, &compute))
        .await
        .unwrap_or(Err(CommitError::Gone))
}

async fn attempt(shared: &Arc<Shared>, expect: &Expect, mode: &Mode, cancel: &CancellationToken) -> Outcome {
    let started = std::time::Instant::now();
    let outcome = try_attempt(shared, expect, mode, cancel).await;
    shared.config.metrics.job_ended(&outcome, started.elapsed());
    match outcome {
        Ok(_) => Outcome::Done,
        Err(e) => Outcome::Failed(e),
    }
}

/// `Ok(true)` when it committed new content, `Ok(false)` when there was nothing to unpack.
async fn try_attempt(
    shared: &Arc<Shared>,
    expect: &Expect,
    mode: &Mode,
    cancel: &CancellationToken,
) -> Result<bool, UnpackError> {
    let bundle = current(shared, expect)?;
    let unpack = *mode == Mode::Unpack;
    // Another job may have finished this generation since the plan was made.
    if unpack && bundle.is_unpacked() {
        return Ok(false);
    }
    if unpack && bundle.still_pinned() {
        recheck_served(shared, expect).await?;
        return Ok(false);
    }
    let specs = bundle.spec.sources.clone();
    if unpack {
        write_status(shared, expect, unpacking).await.map_err(commit_error)?;
    }
    let mut contexts = Vec::with_capacity(specs.len());
    let mut resolved = Vec::with_capacity(specs.len());
    let mut concrete = Vec::with_capacity(specs.len());
    let mut available = Vec::new();
    let status = bundle.status_or_default();
    let served: &[ResolvedSource] = &status.resolved_sources;
    for (i, spec) in specs.iter().enumerate() {
        let ctx = SourceContext {
            runtime: tokio::runtime::Handle::current(),
            cancel: cancel.clone(),
            network: shared.config.network.clone(),
            credentials: shared.config.credentials.for_source(&expect.namespace, spec).await?,
            limits: shared.config.limits,
            budget: Arc::new(Budget::default()),
            scratch: Scratch { dir: shared.config.scratch_dir.clone(), space: Some(shared.store.clone()) },
            downloads: Some(shared.config.downloads.for_bundle(&expect.uid)),
        };
        // A source whose own fields did not change keeps its pin through a new generation.
        let kept = served.get(i).filter(|pin| unpack && pin.resolved_from(spec));
        if let Some(pin) = kept {
            available.extend(status.available_versions.iter().filter(|a| a.source == i).cloned());
            concrete.push((concrete_source(spec, pin), pin_tag(pin)));
            resolved.push(pin.clone());
            contexts.push(ctx);
            continue;
        }
        let previous = if unpack { None } else { served.get(i) };
        // A version range first picks its tag; the source then resolves as if the tag were written.
        let (concrete_spec, tag) = match releases::pick(spec, &ctx).await? {
            Some(picked) => {
                available.push(AvailableVersions { source: i, versions: picked.available });
                (picked.source, picked.tag)
            }
            None => (spec.clone(), String::new()),
        };
        let mut pinned = resolve(&concrete_spec, &ctx, previous).await?;
        if !tag.is_empty() {
            pinned = pinned.with_tag(&tag);
        }
        resolved.push(pinned.recording(spec));
        concrete.push((concrete_spec, tag));
        contexts.push(ctx);
    }
    if bundle.status.as_ref().map_or(&[][..], |s| &s.available_versions) != available.as_slice() {
        let seen = available.clone();
        write_status(shared, expect, move |b| with(b, |s, _| s.available_versions.clone_from(&seen)))
            .await
            .map_err(commit_error)?;
    }
    if !unpack && resolved.as_slice() == served && status.serves_content() {
        // Nothing moved: the content served is what the sources hold now.
        if !bundle.is_unpacked() {
            recheck_served(shared, expect).await?;
        }
        return Ok(false);
    }
    if !unpack {
        write_status(shared, expect, unpacking).await.map_err(commit_error)?;
        for (i, now) in resolved.iter().enumerate().filter(|(i, now)| served.get(*i) != Some(*now)) {
            let pin = serde_json::to_string(now).unwrap_or_default();
            let note = format!("source {i} resolved to new content: {pin}");
            shared.config.events.normal(&regarding(expect), "NewVersion", "Resolve", &note);
        }
    }
    let note = format!("fetching the sources of generation {}", bundle.generation());
    shared.config.events.normal(&regarding(expect), "Unpacking", "Unpack", &note);
    let declared = bundle.spec.format_name();
    let allow_empty = bundle.spec.allows_empty();
    let (store, limits, expect_owned) = (shared.store.clone(), shared.config.limits, expect.clone());
    let metrics = shared.config.metrics.clone();
    let events = shared.config.events.clone();
    let spool = shared.config.downloads.for_bundle(&expect.uid);
    tokio::task::spawn_blocking(move || -> Result<bool, UnpackError> {
        let mut writer = store.begin_revision()?;
        let budget = Arc::new(Budget::default());
        let mut sink = TreeSink::new(&mut writer, limits, budget.clone());
        let mut finals = Vec::with_capacity(specs.len());
        for ((((spec, tag), ctx), pinned), asked) in concrete.iter().zip(contexts).zip(&resolved).zip(&specs) {
            ctx.check_cancelled()?;
            sink.set_destination(&spec.destination);
            // One budget across sources, so the expansion ratio covers the whole unpack.
            let ctx = SourceContext { budget: budget.clone(), ..ctx };
            let before = budget.downloaded();
            let fetched = fetch(spec, &ctx, pinned, &mut sink);
            metrics.fetched(spec, budget.downloaded().saturating_sub(before));
            let fetched = if tag.is_empty() { fetched? } else { fetched?.with_tag(tag) };
            finals.push(fetched.recording(asked));
        }
        let report: FormatReport = sink.finish(declared, true, allow_empty)?;
        let pending = writer.finalize()?;
        let record = pending.record().clone();
        revisions::commit(&store, &expect_owned, pending, &report, &finals, &events).map_err(commit_error)?;
        let note = format!("unpacked {} ({} files, {} bytes)", record.digest, record.files, record.size);
        events.normal(&regarding(&expect_owned), "Unpacked", "Unpack", &note);
        spool.remove();
        Ok(true)
    })
    .await?
}

/// The served content checked against the current spec, nothing fetched ([`revisions::recheck_served`]).
async fn recheck_served(shared: &Arc<Shared>, expect: &Expect) -> Result<(), UnpackError> {
    let (store, expect, events) = (shared.store.clone(), expect.clone(), shared.config.events.clone());
    tokio::task::spawn_blocking(move || revisions::recheck_served(&store, &expect, &events))
        .await
        .unwrap_or(Err(CommitError::Gone))
        .map_err(commit_error)
}

/// `spec` as it was made concrete when `pin` was resolved: the tag a version range chose, the
/// release URL filled in.
fn concrete_source(spec: &Source, pin: &ResolvedSource) -> Source {
    let mut concrete = spec.clone();
    match (pin, &mut concrete) {
        (ResolvedSource::Image { reference, .. }, Source { image: Some(image), .. }) => {
            reference.clone_into(&mut image.reference);
            image.semver.clear();
        }
        (ResolvedSource::Git { commit, .. }, Source { git: Some(repo), .. }) => {
            repo.reference = crate::api::GitRef { commit: commit.clone(), ..Default::default() };
        }
        (ResolvedSource::Http { url, .. }, Source { http: Some(http), .. }) => {
            url.clone_into(&mut http.url);
            http.releases = None;
        }
        _ => {}
    }
    concrete
}

/// The tag a version range chose for `pin` (empty without a range).
fn pin_tag(pin: &ResolvedSource) -> String {
    match pin {
        ResolvedSource::Image { tag, .. } | ResolvedSource::Git { tag, .. } | ResolvedSource::Http { tag, .. } => {
            tag.clone()
        }
        ResolvedSource::Upload { .. } => String::new(),
    }
}

/// The Bundle the job's Events are about.
fn regarding(expect: &Expect) -> crate::api::event::Regarding {
    crate::api::event::Regarding::bundle(&expect.namespace, &expect.name, &expect.uid)
}

fn current(shared: &Arc<Shared>, expect: &Expect) -> Result<Bundle, UnpackError> {
    revisions::current(&shared.store, expect).map(|c| c.bundle).map_err(commit_error)
}

fn commit_error(e: CommitError) -> UnpackError {
    match e {
        CommitError::Gone | CommitError::Superseded => UnpackError::Cancelled,
        CommitError::Storage(e) => UnpackError::Storage(e),
    }
}

async fn resolve(
    spec: &Source,
    ctx: &SourceContext,
    previous: Option<&ResolvedSource>,
) -> Result<ResolvedSource, UnpackError> {
    if let Some(image) = &spec.image {
        oci::resolve(image, ctx, previous).await
    } else if let Some(repo) = &spec.git {
        git::resolve(repo, ctx, previous).await
    } else if let Some(url) = &spec.http {
        http::resolve(url, ctx, previous).await
    } else {
        Err(UnpackError::Unsupported("a source must be one of image, git, http".into()))
    }
}

fn fetch(
    spec: &Source,
    ctx: &SourceContext,
    pinned: &ResolvedSource,
    sink: &mut TreeSink<'_>,
) -> Result<ResolvedSource, UnpackError> {
    if let Some(image) = &spec.image {
        oci::fetch(image, ctx, pinned, sink)
    } else if let Some(repo) = &spec.git {
        git::fetch(repo, ctx, pinned, sink)
    } else if let Some(url) = &spec.http {
        http::fetch(url, ctx, pinned, sink)
    } else {
        Err(UnpackError::Unsupported("a source must be one of image, git, http".into()))
    }
}
