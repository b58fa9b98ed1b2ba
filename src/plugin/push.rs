//! `push NAME DIR|FILE`: local checks first (the path exists; a file is a tar, tar.gz or tar.zst),
//! then the Bundle (it must exist and take uploads, or `--create` makes one), then the archive
//! (packed or hashed), then the upload — resumed from a session an interrupted push of the same
//! archive left, if the server still has it.

use std::path::Path;

use anyhow::Context;
use kube::api::PostParams;
use kube::Api;

use super::output::Hinted;
use super::progress::Bar;
use super::resume::{Key, Sessions};
use super::Connection;
use crate::api::{Bundle, BundleSpec, Source, UploadSource};
use crate::client::{Archive, ClientError, Compression, ContentClient, PushEvent, PushOptions};

/// A directory, or an archive file: anything else fails here, before any request.
pub fn check_path(path: &Path) -> anyhow::Result<()> {
    let metadata = match std::fs::metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            anyhow::bail!("the path {:?} does not exist", path.display().to_string())
        }
        other => other.map_err(|source| ClientError::Io { path: path.to_owned(), source })?,
    };
    if metadata.is_dir() {
        return Ok(());
    }
    let mut head = Vec::with_capacity(512);
    let read = std::fs::File::open(path)
        .and_then(|file| std::io::Read::read_to_end(&mut std::io::Read::take(file, 512), &mut head));
    read.map_err(|source| ClientError::Io { path: path.to_owned(), source })?;
    match Compression::sniff(&head) {
        Some(_) => Ok(()),
        None => Err(ClientError::NotAnArchive(path.to_owned()).into()),
    }
}

/// What `--create` makes: an upload Bundle with these settings (`--format`, `--allow-empty`,
/// `--label`).
#[derive(Clone, Debug, Default)]
pub struct Creation {
    pub format: Option<crate::api::Format>,
    pub allow_empty: bool,
    pub labels: Vec<(String, String)>,
}

/// `--label KEY=VALUE`.
pub fn parse_label(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_owned(), value.to_owned())),
        _ => Err(format!("{text:?} is not KEY=VALUE")),
    }
}

/// Pushes and returns the result line.
pub async fn run(
    content: &ContentClient,
    connection: &Connection,
    name: &str,
    path: &Path,
    create: Option<&Creation>,
    piece_bytes: u64,
) -> anyhow::Result<String> {
    let namespace = connection.namespace.as_str();
    let bundles: Api<Bundle> = Api::namespaced(connection.client.clone(), namespace);
    let existing = match bundles.get(name).await.map_err(ClientError::from) {
        Ok(bundle) => Some(bundle),
        Err(e) if e.status().is_some_and(|s| s.code == 404) => match create {
            Some(_) => None,
            None => {
                let hint = format!("hint: add --create to create Bundle {name:?} with an upload source");
                return Err(Hinted { error: e, hint }.into());
            }
        },
        Err(e) => return Err(e.into()),
    };
    if existing.as_ref().is_some_and(|b| !b.takes_uploads()) {
        anyhow::bail!(
            "Bundle {namespace}/{name} does not take uploads: its spec.sources fetch its content (add {{upload: {{}}}} to them to push)"
        );
    }
    let source = path.to_owned();
    let archive = tokio::task::spawn_blocking(move || match source.is_dir() {
        true => Archive::pack(&source),
        false => Archive::open(&source),
    })
    .await
    .context("preparing the archive")??;
    if let (None, Some(creation)) = (&existing, create) {
        let upload = Source { upload: Some(UploadSource {}), ..Default::default() };
        let spec = BundleSpec {
            sources: vec![upload],
            format: creation.format,
            allow_empty: creation.allow_empty.then_some(true),
            ..Default::default()
        };
        let mut bundle = Bundle::new(name, spec);
        if !creation.labels.is_empty() {
            bundle.metadata.labels = Some(creation.labels.iter().cloned().collect());
        }
        match bundles.create(&PostParams::default(), &bundle).await.map_err(ClientError::from) {
            Err(e) if e.status().is_none_or(|s| s.code != 409) => return Err(e.into()),
            _ => {}
        }
    }

    let sessions = Sessions::new();
    let key = Key {
        server: connection.server.clone(),
        namespace: namespace.to_string(),
        name: name.to_string(),
        archive: archive.identity().to_string(),
    };
    let options = PushOptions { piece_bytes, resume: sessions.recall(&key) };
    let bar = Bar::new(&format!("pushing {name}"), archive.known_len());
    let mut resumed_at = 0;
    let pushed = content
        .push(namespace, name, &archive, &options, &mut |event| match event {
            PushEvent::Session { upload_id, offset } => {
                sessions.remember(&key, upload_id);
                resumed_at = offset;
                bar.start_at(offset);
            }
            PushEvent::Sent(moved) => bar.update(moved),
            PushEvent::Committing => bar.set_message(&format!("unpacking {name}")),
        })
        .await;
    bar.finish(pushed.is_ok());
    // A session worth keeping is one a network failure interrupted; a refused one is gone.
    // So is one whose bytes could not be packed (the push deleted it).
    let refused = |e: &ClientError| {
        matches!(e, ClientError::Io { .. })
            || e.status().is_some_and(|s| (400..500).contains(&s.code) && ![408, 429].contains(&s.code))
    };
    match &pushed {
        Ok(_) => sessions.forget(&key),
        Err(e) if refused(e) => sessions.forget(&key),
        Err(_) => {}
    }
    let status = pushed?.status.unwrap_or_default();
    if status.serves_older() {
        let (latest, served) = (status.latest_content().unwrap_or(""), status.content_name.as_deref().unwrap_or(""));
        return Ok(format!(
            "{namespace}/{name}: pushed {latest}, not served: spec.revision keeps {served} served (`kubectl stowage \
             rollback {name} --latest` serves the newest)"
        ));
    }
    let digest = status.digest.unwrap_or_default();
    let revision = status.content_name.unwrap_or_default();
    let resumed = match resumed_at {
        0 => String::new(),
        at => format!(", resumed at byte {at} of {}", archive.known_len().unwrap_or(at)),
    };
    Ok(format!("{namespace}/{name}: pushed {digest} ({revision}{resumed})"))
}
