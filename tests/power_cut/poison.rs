//! A failing disk: the shim makes one sync fail (then every later sync of that file, as a dying
//! disk does) while a child writes revisions and objects. The first write whose sync failed and
//! every write after it must be refused with `Poisoned`; every acknowledged object and revision
//! must still read back; after a restart the store takes writes again.

use std::path::Path;

use serde_json::json;
use stowage::storage::{ListQuery, ObjectKey, ObjectWrite, Precondition, StorageError, Store};

use crate::workload::{open, NAMESPACE, RESOURCE};

/// Runs the child with the sync of paths containing `failing` (`SUBSTRING:N`) failing from the
/// Nth on; then reopens the store without the shim. Returns whether all held.
pub fn suite(work: &Path, shim: &Path, failing: &str) -> bool {
    let (dir, ok) = crate::traced_child(work, shim, &format!("poison:{failing}"), 0, Some(failing));
    if !ok {
        println!("poisoned_store ({failing}): FAILED (the child says why above)");
        return false;
    }
    let store = open(&dir.join("root/data"));
    let write = ObjectWrite::Put {
        key: ObjectKey::new(RESOURCE, NAMESPACE, "after-restart"),
        object: json!({"metadata": {"name": "after-restart"}}),
        precondition: Precondition::MustNotExist,
        revision: None,
    };
    if let Err(e) = store.write_objects(vec![write]) {
        println!("poisoned_store ({failing}): FAILED: a restarted store refuses writes: {e}");
        return false;
    }
    println!("poisoned_store ({failing}): ok");
    true
}

fn put(
    store: &Store,
    name: &str,
    revision: Option<&mut stowage::storage::PendingRevision>,
) -> Result<u64, StorageError> {
    let write = ObjectWrite::Put {
        key: ObjectKey::new(RESOURCE, NAMESPACE, name),
        object: json!({"metadata": {"name": name}}),
        precondition: Precondition::MustNotExist,
        revision: revision.as_ref().map(|p| p.record().id),
    };
    match revision {
        Some(pending) => pending.commit(vec![write]),
        None => store.write_objects(vec![write]),
    }
    .map(|o| o.resource_version)
}

/// The child: writes until a write fails, then checks what a poisoned store does.
pub fn run(root: &Path, _failing: &str) {
    let store = open(&root.join("data"));
    let mut acknowledged: Vec<(String, Option<u64>)> = Vec::new();
    let mut failure = None;
    for i in 0..40 {
        let revision = (|| {
            let mut writer = store.begin_revision()?;
            let data = format!("file {i}\n").repeat(20_000);
            writer.add_file("a.txt", 0o644, data.len() as u64, &mut data.as_bytes())?;
            writer.finalize()
        })();
        let result = revision.and_then(|mut pending| {
            let id = pending.record().id;
            put(&store, &format!("rev-{i}"), Some(&mut pending)).map(|_| id)
        });
        let result = result.and_then(|id| {
            acknowledged.push((format!("rev-{i}"), Some(id)));
            put(&store, &format!("obj-{i}"), None)
        });
        match result {
            Ok(_) => acknowledged.push((format!("obj-{i}"), None)),
            Err(e) => {
                failure = Some(e);
                break;
            }
        }
    }
    let Some(failure) = failure else { panic!("no write failed: the sync failure never came") };
    assert!(matches!(failure, StorageError::Poisoned(_)), "the failed write says the store is poisoned: {failure}");
    assert!(store.is_poisoned());
    // Writes of every kind are refused now.
    let refused = put(&store, "later", None).unwrap_err();
    assert!(matches!(refused, StorageError::Poisoned(_)), "a later write is refused: {refused}");
    assert!(matches!(store.begin_revision().err(), Some(StorageError::Poisoned(_))), "a new revision is refused");
    assert!(matches!(store.collect(), Err(StorageError::Poisoned(_))), "garbage collection is refused");
    // Reads still work: every acknowledged object, every attached revision.
    for (name, revision) in &acknowledged {
        let object = store.get_object(&ObjectKey::new(RESOURCE, NAMESPACE, name)).unwrap();
        assert!(object.is_some(), "{name} reads back");
        if let Some(id) = revision {
            let record = store.revision(*id).unwrap();
            let mut len = 0;
            let range = stowage::storage::RangeSpec { start: 0, end: record.tar_size };
            store
                .read_tar(*id, record.tar_size, range, &mut |b| {
                    len += b.len() as u64;
                    Ok(())
                })
                .unwrap();
            assert_eq!(len, record.tar_size, "{name}'s revision reads back");
        }
    }
    let query = ListQuery { resource: RESOURCE, namespace: Some(NAMESPACE), at: None, after: None, limit: None };
    let listed = store.list_page(&query, None).unwrap().items.len();
    assert!(listed >= acknowledged.len(), "a list shows the {} acknowledged objects: {listed}", acknowledged.len());
    println!("poisoned after {} acknowledged writes: {failure}", acknowledged.len());
    // sled syncs its log when dropped and panics if that fails (sled 0.34, logger.rs): the
    // process ends here as a killed one would, its store not dropped.
    std::mem::forget(store);
}
