//! Turning a finalized revision into what a Bundle serves: one BundleContent per distinct content
//! (owned by its Bundle, named after the digest, reused when the same content comes back), the
//! Bundle's status pointing at it, and old BundleContents beyond `spec.revisionHistoryLimit`
//! deleted — all in one atomic store write. Used by uploads and by the reconcile loop alike; the
//! loop also re-checks what a Bundle serves when its spec changed but not its content (an upload
//! Bundle's spec, or a Bundle whose sources are all still pinned: [`recheck_served`]).
//!
//! `spec.revision` (a rollback) chooses which stored revision is served: new content is still
//! committed and recorded as the latest (`status.latestContentName`, with its pins in
//! `status.resolvedSources`), but the chosen one stays served, and is never pruned, until the
//! field is cleared; setting or clearing it switches what is served without fetching anything.

use serde_json::Value;

use super::error::UnpackError;
use super::format::FormatReport;
use super::sink;
use crate::api::event::Regarding;
use crate::api::{content_name, Bundle, BundleContent, BundleStatus, ResolvedSource, Served, BUNDLE_LABEL};
use crate::events::EventRecorder;
use crate::storage::{
    ObjectKey, ObjectWrite, PendingRevision, Precondition, RevisionId, StorageError, Store, StoredObject,
};
use crate::strategy::{self, bundlecontent::BUNDLE_CONTENT, decode};

/// What must still hold for a commit to land.
#[derive(Clone, Debug)]
pub struct Expect {
    pub namespace: String,
    pub name: String,
    /// The Bundle the work was for (a deleted and re-created Bundle is another one).
    pub uid: String,
    /// The generation the content was unpacked for; `None` accepts any (uploads).
    pub generation: Option<i64>,
    /// The generation whose spec the content was checked against, which the status names. An
    /// upload lands even when the spec moved on meanwhile; its status then names the older
    /// generation, and the reconcile loop checks the content against the new spec
    /// ([`recheck_upload`]).
    pub checked_generation: i64,
}

#[derive(Debug, thiserror::Error)]
pub enum CommitError {
    #[error("the Bundle is gone")]
    Gone,
    #[error("the Bundle's spec changed while unpacking")]
    Superseded,
    #[error(transparent)]
    Storage(#[from] StorageError),
}

/// Attaches `pending` (or reuses the BundleContent already holding the same digest) and points the
/// Bundle at it; returns the Bundle as written. Blocking.
pub fn commit(
    store: &Store,
    expect: &Expect,
    mut pending: PendingRevision,
    report: &FormatReport,
    resolved: &[ResolvedSource],
    events: &EventRecorder,
) -> Result<Value, CommitError> {
    let record = pending.record().clone();
    let content = content_name(&expect.name, &record.digest);
    let served = Served {
        content: content.clone(),
        digest: record.digest.clone(),
        files: record.files,
        size: record.size,
        format: report.format.clone(),
        format_details: report.details(),
        resolved: resolved.to_vec(),
    };
    let bundle_key = ObjectKey::new(Bundle::PLURAL, &expect.namespace, &expect.name);
    let content_key = ObjectKey::new(BundleContent::PLURAL, &expect.namespace, &content);
    // Retry on conflict: the Bundle's metadata may change while a long unpack runs.
    for _ in 0..8 {
        let current = current(store, expect)?;
        let existing = store.get_object(&content_key)?;
        let existing_typed = existing.as_ref().map(|e| decode::<BundleContent>(&e.value)).transpose().ok().flatten();
        let reuse = existing_typed.is_some_and(|e| e.spec.digest == record.digest && e.owned_by(current.bundle.uid()));
        let status = committed_status(store, &current.bundle, expect, &served)?;
        let mut writes = vec![ObjectWrite::Put {
            key: bundle_key.clone(),
            object: with_status(&current.stored.value, &status),
            precondition: Precondition::ResourceVersion(current.stored.resource_version),
            revision: None,
        }];
        writes.extend(prune(store, &current.bundle, &status)?);
        let writes_made = writes.clone();
        let result = if reuse {
            // Identical content is already stored: the new copy is released when `pending` drops.
            store.write_objects(writes)
        } else {
            let precondition = match &existing {
                // Same name, other content or owner (a 10-hex-digit prefix collision, or a leftover
                // orphan): delete it first, which releases its revision, then write ours.
                Some(e) => {
                    let precondition = Precondition::ResourceVersion(e.resource_version);
                    writes.insert(0, ObjectWrite::Delete { key: content_key.clone(), precondition });
                    precondition
                }
                None => Precondition::MustNotExist,
            };
            let object = new_content(&current.bundle, &served, record.stored_size)?;
            writes.insert(
                usize::from(existing.is_some()),
                ObjectWrite::Put { key: content_key.clone(), object, precondition, revision: Some(record.id) },
            );
            pending.commit(writes)
        };
        match result {
            Err(StorageError::Conflict(_)) => continue,
            // The content appeared since it was read (the same upload retried by its client on
            // another replica while the first attempt was still committing): look again, and
            // reuse it if it is this content.
            Err(StorageError::AlreadyExists(_)) if existing.is_none() => continue,
            Err(e) => return Err(e.into()),
            Ok(outcome) => {
                announce(events, &current.bundle, &status, &writes_made);
                if !reuse {
                    // Its first zstd download then finds the frames ready ([`Store::warm_zstd_frames`]).
                    store.warm_zstd_frames(record.id);
                }
                return Ok(outcome
                    .objects
                    .into_iter()
                    .find(|o| o.get("kind").and_then(Value::as_str) == Some(Bundle::KIND))
                    .unwrap_or(Value::Null));
            }
        }
    }
    Err(StorageError::Conflict(format!("bundles {:?}", expect.name)).into())
}

/// The Bundle's status once `newest` is committed: `newest` served, unless `spec.revision`
/// chooses another revision — then that one stays served and `newest` is recorded as the latest.
fn committed_status(
    store: &Store,
    bundle: &Bundle,
    expect: &Expect,
    newest: &Served,
) -> Result<BundleStatus, StorageError> {
    let generation = expect.checked_generation.min(bundle.generation());
    let before = bundle.status_or_default();
    let mut status = before.clone();
    status.unpacked(generation, newest.clone());
    match bundle.spec.chosen_revision() {
        None => {}
        // Choosing the newest content by name pins it: what comes later is not served.
        Some(chosen) if chosen == newest.content => status.serves_chosen(generation, newest.clone()),
        Some(_) => match choice(store, bundle)? {
            Choice::Newest => {}
            Choice::Chosen(chosen, _) => status.serves_chosen(generation, *chosen),
            Choice::Missing(message) => {
                status = before;
                status.latest_content_name = Some(newest.content.clone());
                status.resolved_sources.clone_from(&newest.resolved);
                status.chosen_missing(generation, &message);
            }
        },
    }
    Ok(status)
}

/// What `spec.revision` makes a Bundle serve.
enum Choice {
    /// Not set: the newest content.
    Newest,
    /// The BundleContent it names, as it would be served, and its revision.
    Chosen(Box<Served>, RevisionId),
    /// It names no BundleContent of this Bundle: the message says so.
    Missing(String),
}

fn choice(store: &Store, bundle: &Bundle) -> Result<Choice, StorageError> {
    let Some(name) = bundle.spec.chosen_revision() else { return Ok(Choice::Newest) };
    Ok(match content_of(store, bundle, name)? {
        Some((served, revision)) => Choice::Chosen(Box::new(served), revision),
        None => Choice::Missing(format!(
            "spec.revision names {name:?}, which is not a stored revision of this Bundle (kubectl get \
             bundlecontents -l {BUNDLE_LABEL}={})",
            bundle.name()
        )),
    })
}

/// BundleContent `name`, if the Bundle owns it and it holds a revision: as it would be served
/// (pinned as its spec records), and the revision.
fn content_of(store: &Store, bundle: &Bundle, name: &str) -> Result<Option<(Served, RevisionId)>, StorageError> {
    let key = ObjectKey::new(BundleContent::PLURAL, bundle.namespace(), name);
    let Some(stored) = store.get_object(&key)? else { return Ok(None) };
    let (Some(revision), Ok(typed)) = (stored.revision, decode::<BundleContent>(&stored.value)) else {
        return Ok(None);
    };
    if !typed.owned_by(bundle.uid()) || typed.metadata.deletion_timestamp.is_some() {
        return Ok(None);
    }
    let spec = typed.spec;
    let served = Served {
        content: name.to_owned(),
        digest: spec.digest,
        files: spec.files,
        size: spec.size,
        format: spec.format,
        format_details: spec.format_details,
        resolved: spec.sources,
    };
    Ok(Some((served, revision)))
}

/// The BundleContent for `served`, created the way the API creates objects (stamped, validated).
fn new_content(bundle: &Bundle, served: &Served, stored_size: u64) -> Result<Value, CommitError> {
    let content = BundleContent::for_bundle(bundle, served, stored_size);
    let value = serde_json::to_value(content).map_err(|e| StorageError::Corrupt(e.to_string()))?;
    strategy::prepare_create(&BUNDLE_CONTENT, value).map_err(|causes| {
        let problems: Vec<String> = causes.iter().map(|c| format!("{}: {}", c.field, c.message)).collect();
        StorageError::Corrupt(format!("BundleContent refused: {}", problems.join("; "))).into()
    })
}

/// A Bundle as stored and as typed.
pub struct Current {
    pub bundle: Bundle,
    pub stored: StoredObject,
}

/// The stored object with `status` replaced — nothing else is rewritten, so the user's spec stays
/// byte for byte as written.
fn with_status(stored: &Value, status: &BundleStatus) -> Value {
    let mut object = stored.clone();
    if let (Some(map), Ok(status)) = (object.as_object_mut(), serde_json::to_value(status)) {
        map.insert("status".into(), status);
    }
    object
}

/// The Bundle, if it is still the one (and the generation) the work was for.
pub fn current(store: &Store, expect: &Expect) -> Result<Current, CommitError> {
    let key = ObjectKey::new(Bundle::PLURAL, &expect.namespace, &expect.name);
    let Some(stored) = store.get_object(&key)? else { return Err(CommitError::Gone) };
    let bundle: Bundle = decode(&stored.value)
        .map_err(|c| StorageError::Corrupt(format!("stored Bundle {:?} {}", expect.name, c.message)))?;
    if bundle.uid() != expect.uid || bundle.is_deleting() {
        return Err(CommitError::Gone);
    }
    if expect.generation.is_some_and(|g| g != bundle.generation()) {
        return Err(CommitError::Superseded);
    }
    Ok(Current { bundle, stored })
}

/// Writes `status` computed from the current Bundle, if it is still the expected one. Blocking.
pub fn write_status(
    store: &Store,
    expect: &Expect,
    compute: &dyn Fn(&Bundle) -> BundleStatus,
) -> Result<(), CommitError> {
    write_status_with(store, expect, &mut |bundle| Ok(Some((compute(bundle), Vec::new())))).map(|_| ())
}

/// Brings a Bundle's status to its current generation without fetching anything, when what it
/// serves is still what its spec asks for (an upload Bundle; a Bundle whose every source is still
/// pinned): the content to serve — the revision `spec.revision` chooses, else the newest — is
/// checked against the current spec (`format`, `allowEmpty`; the checks an unpack or upload
/// makes) and served if it passes; the `Unpacked` condition says whether it is valid for it —
/// what was served stays served otherwise — and BundleContents past a lowered
/// `revisionHistoryLimit` go. With nothing served, the conditions (`AwaitingUpload`,
/// `ContentDeleted`) stay true as they are. Blocking; a write that raced with another (an upload
/// landing) is done again on what is new.
pub fn recheck_served(store: &Store, expect: &Expect, events: &EventRecorder) -> Result<(), CommitError> {
    let written = write_status_with(store, expect, &mut |bundle| {
        let generation = bundle.generation();
        let mut status = bundle.status_or_default();
        let done = match bundle.takes_uploads() {
            true => status.observed_generation == Some(generation),
            false => bundle.is_unpacked(),
        };
        if done {
            return Ok(None);
        }
        // What is to be served: the revision spec.revision chooses, else the newest.
        let (target, chosen) = match choice(store, bundle)? {
            Choice::Missing(message) => {
                status.chosen_missing(generation, &message);
                status.restamp(generation);
                let writes = prune(store, bundle, &status)?;
                return Ok(Some((status, writes)));
            }
            Choice::Chosen(served, revision) => (Some((*served, revision)), true),
            Choice::Newest => match status.latest_content() {
                Some(latest) => (content_of(store, bundle, latest)?, false),
                None => (None, false),
            },
        };
        match target {
            None => status.restamp(generation),
            Some((served, revision)) => {
                let destinations: Vec<String> = bundle.spec.sources.iter().map(|s| s.destination.clone()).collect();
                let checks = (bundle.spec.format_name(), !bundle.takes_uploads(), bundle.spec.allows_empty());
                match sink::recheck(store, revision, &destinations, checks) {
                    Ok(report) => {
                        // The pins stay those of the newest content, as resolved.
                        let resolved = status.resolved_sources.clone();
                        let served = Served {
                            format: report.format.clone(),
                            format_details: report.details(),
                            resolved,
                            ..served
                        };
                        match chosen {
                            true => status.serves_chosen(generation, served),
                            false => status.unpacked(generation, served),
                        }
                        status.restamp(generation);
                    }
                    Err(UnpackError::Storage(e)) => return Err(e.into()),
                    Err(e) => status.recheck_failed(generation, e.reason(), &e.to_string()),
                }
            }
        }
        let writes = prune(store, bundle, &status)?;
        Ok(Some((status, writes)))
    })?;
    if let Some((before, (status, writes))) = written {
        announce(events, &before, &status, &writes);
    }
    Ok(())
}

/// The Events a status write makes: what is served now (a rollback, or the newest), the chosen
/// revision missing, and the revisions pruned with it.
fn announce(events: &EventRecorder, before: &Bundle, after: &BundleStatus, writes: &[ObjectWrite]) {
    let regarding = Regarding::bundle(before.namespace(), before.name(), before.uid());
    let served_before = before.status.as_ref().and_then(|s| s.content_name.as_deref());
    if let Some(served) = after.content_name.as_deref().filter(|now| Some(*now) != served_before) {
        let digest = after.digest.as_deref().unwrap_or("");
        match (after.serves_older(), before.spec.chosen_revision()) {
            (true, _) | (false, Some(_)) => events.normal(
                &regarding,
                "RolledBack",
                "Serve",
                &format!(
                    "serving {served} ({digest}) because spec.revision chooses it; the newest is {}",
                    after.latest_content().unwrap_or(served)
                ),
            ),
            (false, None) => events.normal(&regarding, "Serving", "Serve", &format!("serving {served} ({digest})")),
        }
    }
    let missing = after.reason_for_generation(before.generation()) == Some(crate::api::REVISION_NOT_FOUND)
        && before.unpacked_reason() != Some(crate::api::REVISION_NOT_FOUND);
    if missing {
        let message = after.condition(crate::api::UNPACKED).map(|c| c.message.as_str()).unwrap_or("");
        events.warning(&regarding, crate::api::REVISION_NOT_FOUND, "Serve", message);
    }
    for write in writes {
        if let ObjectWrite::Delete { key, .. } = write {
            if key.resource == BundleContent::PLURAL {
                let limit = before.spec.history_limit();
                let note = format!(
                    "deleted BundleContent {}: older than the {limit} kept by spec.revisionHistoryLimit",
                    key.name
                );
                events.normal(&regarding, "RevisionPruned", "Prune", &note);
            }
        }
    }
}

/// A Bundle's new status and the writes that go with it (BundleContents pruned).
type StatusWrite = (BundleStatus, Vec<ObjectWrite>);

/// Writes the status `compute` makes of the current Bundle (`None`: nothing to write), with the
/// writes it adds, if it is still the expected one; after a conflicting write it is computed
/// again on what is new.
fn write_status_with(
    store: &Store,
    expect: &Expect,
    compute: &mut dyn FnMut(&Bundle) -> Result<Option<StatusWrite>, CommitError>,
) -> Result<Option<(Bundle, StatusWrite)>, CommitError> {
    for _ in 0..8 {
        let current = current(store, expect)?;
        let Some((status, mut writes)) = compute(&current.bundle)? else { return Ok(None) };
        let updated = with_status(&current.stored.value, &status);
        if updated == current.stored.value && writes.is_empty() {
            return Ok(None);
        }
        let made = writes.clone();
        writes.insert(
            0,
            ObjectWrite::Put {
                key: ObjectKey::new(Bundle::PLURAL, &expect.namespace, &expect.name),
                object: updated,
                precondition: Precondition::ResourceVersion(current.stored.resource_version),
                revision: None,
            },
        );
        match store.write_objects(writes) {
            Err(StorageError::Conflict(_)) => continue,
            Err(e) => return Err(e.into()),
            Ok(_) => return Ok(Some((current.bundle, (status, made)))),
        }
    }
    Err(StorageError::Conflict(format!("bundles {:?}", expect.name)).into())
}

/// Deletes of the Bundle's BundleContents beyond its history limit: newest kept, never the one
/// `status` serves, the newest content, nor the one `spec.revision` chooses.
fn prune(store: &Store, bundle: &Bundle, status: &BundleStatus) -> Result<Vec<ObjectWrite>, StorageError> {
    let namespace = bundle.namespace();
    let kept = [status.content_name.as_deref(), status.latest_content(), bundle.spec.chosen_revision()];
    // The Bundle's own contents, through the store's owner index: no scan of the namespace.
    let mut old: Vec<(BundleContent, u64)> = store
        .dependents(namespace, bundle.uid())?
        .into_iter()
        .filter(|(resource, _)| resource == BundleContent::PLURAL)
        .filter_map(|(_, c)| decode::<BundleContent>(&c.value).ok().map(|typed| (typed, c.resource_version)))
        .filter(|(c, _)| !kept.contains(&Some(c.name())) && c.metadata.deletion_timestamp.is_none())
        .collect();
    // Newest first: BundleContents never change after creation, so the resourceVersion orders them.
    old.sort_by_key(|(_, rv)| std::cmp::Reverse(*rv));
    Ok(old
        .into_iter()
        .skip(bundle.spec.history_limit())
        .map(|(c, rv)| ObjectWrite::Delete {
            key: ObjectKey::new(BundleContent::PLURAL, namespace, c.name()),
            precondition: Precondition::ResourceVersion(rv),
        })
        .collect())
}
