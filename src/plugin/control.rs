//! What an operator reads first and the switches they reach for: `status NAME` (phase, served
//! content, conditions with reasons and messages, pins per source, next poll, available versions,
//! as `flux get sources` or `helm status` show theirs), `refresh NAME` (sets the
//! `content.stowage.dev/refresh` annotation: every source resolved again now), `suspend NAME` and
//! `resume NAME` (`spec.paused`), `rollback NAME [REV]` (`spec.revision`: serve an earlier
//! revision; `--latest` serves the newest again).

use kube::api::{Patch, PatchParams};
use kube::Api;
use serde_json::json;

use crate::api::{Bundle, REFRESH_ANNOTATION};
use crate::client::{ClientError, ContentClient};

/// How `status` prints: lines for people, or the Bundle's `status` as JSON or YAML.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum StatusFormat {
    Json,
    Yaml,
}

/// `status NAME`: the lines to print.
pub async fn status(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    format: Option<StatusFormat>,
) -> anyhow::Result<Vec<String>> {
    let bundle = Api::<Bundle>::namespaced(client.clone(), namespace).get(name).await.map_err(ClientError::from)?;
    let status = bundle.status.clone().unwrap_or_default();
    match format {
        Some(StatusFormat::Json) => return Ok(vec![serde_json::to_string_pretty(&status)?]),
        Some(StatusFormat::Yaml) => return Ok(vec![serde_yaml_ng::to_string(&status)?.trim_end().to_owned()]),
        None => {}
    }
    let mut lines = vec![format!("Bundle:       {namespace}/{name}")];
    lines.push(format!("Phase:        {}", status.phase.as_deref().unwrap_or("-")));
    let served = match (&status.content_name, &status.digest) {
        (Some(content), Some(digest)) => {
            let format = status.format.as_deref().filter(|f| !f.is_empty()).unwrap_or("no format");
            let (files, size) = (status.files.unwrap_or(0), status.size.unwrap_or(0));
            format!("{content} ({digest}, {format}, {files} files, {size} bytes)")
        }
        _ => "nothing yet".to_owned(),
    };
    lines.push(format!("Served:       {served}"));
    lines.push(format!("Because:      {}", why_served(&bundle)));
    lines.push(format!("Paused:       {}", bundle.spec.paused.unwrap_or(false)));
    if let Some(next) = &status.next_poll_time {
        lines.push(format!("Next poll:    {next}"));
    }
    if let Some(refresh) = &status.last_handled_refresh {
        lines.push(format!("Refreshed:    {refresh}"));
    }
    lines.push("Conditions:".to_owned());
    for condition in &status.conditions {
        let message = if condition.message.is_empty() { String::new() } else { format!(": {}", condition.message) };
        lines.push(format!("  {} {} ({}){message}", condition.type_, condition.status, condition.reason));
    }
    if !status.resolved_sources.is_empty() {
        lines.push("Sources:".to_owned());
        for (index, source) in status.resolved_sources.iter().enumerate() {
            lines.push(format!("  {index}: {}", serde_json::to_string(source)?));
        }
    }
    for available in &status.available_versions {
        lines.push(format!("Versions of source {}: {}", available.source, available.versions.join(", ")));
    }
    Ok(lines)
}

/// Why the Bundle serves what it serves: `spec.revision` chose it, or it is the newest content.
fn why_served(bundle: &Bundle) -> String {
    let status = bundle.status.clone().unwrap_or_default();
    let latest = status.latest_content().unwrap_or("").to_owned();
    match (bundle.spec.chosen_revision(), status.content_name.as_deref()) {
        (_, None) => "nothing is served yet".to_owned(),
        (Some(chosen), Some(served)) if chosen == served => match latest == served {
            true => "spec.revision chooses it (it is the newest; newer content will not be served)".to_owned(),
            false => format!("spec.revision chooses it (rolled back; the newest is {latest})"),
        },
        (Some(chosen), Some(_)) => format!("spec.revision chooses {chosen}, which is not served yet (see Unpacked)"),
        (None, Some(served)) if !latest.is_empty() && latest != served => {
            format!("spec.revision was cleared; switching to the newest, {latest}")
        }
        (None, Some(_)) => "it is the newest content".to_owned(),
    }
}

/// Where `rollback` goes.
#[derive(Clone, Debug)]
pub enum Target {
    /// The revision stored before the one served now.
    Previous,
    /// This BundleContent.
    Revision(String),
    /// The newest content again (`spec.revision` cleared).
    Latest,
}

/// `rollback NAME [REV]`: sets (or clears) `spec.revision`; the line to print.
pub async fn rollback(
    content: &ContentClient,
    client: &kube::Client,
    namespace: &str,
    name: &str,
    to: Target,
) -> anyhow::Result<String> {
    let api = Api::<Bundle>::namespaced(client.clone(), namespace);
    let (revision, done) = match to {
        Target::Latest => (None, "serves its newest content again".to_owned()),
        Target::Revision(revision) => (Some(revision.clone()), format!("rolled back to {revision}")),
        Target::Previous => {
            let bundle = api.get(name).await.map_err(ClientError::from)?;
            let served = bundle.status.as_ref().and_then(|s| s.content_name.clone()).unwrap_or_default();
            let revisions = content.revisions(namespace, name).await?;
            let Some(at) = revisions.iter().position(|r| r.name == served) else {
                anyhow::bail!("bundle {namespace}/{name} serves no stored revision yet: nothing to roll back");
            };
            let Some(previous) = at.checked_sub(1).and_then(|i| revisions.get(i)) else {
                anyhow::bail!(
                    "bundle {namespace}/{name} serves its oldest stored revision, {served}: there is none before it \
                     (spec.revisionHistoryLimit says how many are kept)"
                );
            };
            (Some(previous.name.clone()), format!("rolled back to {}", previous.name))
        }
    };
    let patch = json!({"spec": {"revision": revision}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await.map_err(ClientError::from)?;
    Ok(format!("bundle.content.stowage.dev/{name} {done}"))
}

/// `refresh`, `suspend` or `resume NAME`: the line to print.
pub async fn switch(client: &kube::Client, namespace: &str, name: &str, action: Switch) -> anyhow::Result<String> {
    let api = Api::<Bundle>::namespaced(client.clone(), namespace);
    let (patch, done) = match action {
        Switch::Refresh => {
            let now = now();
            (json!({"metadata": {"annotations": {REFRESH_ANNOTATION: now}}}), "refresh requested")
        }
        Switch::Suspend => (json!({"spec": {"paused": true}}), "suspended"),
        Switch::Resume => (json!({"spec": {"paused": null}}), "resumed"),
    };
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await.map_err(ClientError::from)?;
    Ok(format!("bundle.content.stowage.dev/{name} {done}"))
}

/// The switches an operator flips.
#[derive(Clone, Copy, Debug)]
pub enum Switch {
    Refresh,
    Suspend,
    Resume,
}

/// Now, as RFC 3339 with nanoseconds: a new value each time, as the annotation needs.
fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Nanos, true)
}
