//! Store tests at scale: a revision of many files costs sled a few keys (and its release frees
//! them), the owner index (and building it for a store that predates it), and lists read in steps.

use serde_json::json;

use super::tests::open;
use super::*;

fn sled_keys(store: &Store) -> usize {
    store.tree().range::<std::ops::RangeFull>(..).count()
}

#[test]
fn a_revision_costs_sled_a_few_keys_however_many_files_it_has() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let before = sled_keys(&store);
    let mut writer = store.begin_revision().unwrap();
    for i in 0..20_000 {
        let data = format!("{i}");
        writer.add_file(&format!("f/{i:05}"), 0o644, data.len() as u64, &mut data.as_bytes()).unwrap();
    }
    let mut pending = writer.finalize().unwrap();
    let id = pending.record().id;
    let attach = ObjectWrite::Put {
        key: ObjectKey::new("bundlecontents", "ns", "c"),
        object: json!({"metadata": {"name": "c"}}),
        precondition: Precondition::MustNotExist,
        revision: Some(id),
    };
    pending.commit(vec![attach]).unwrap();
    // 20,000 chunk index entries (one per distinct file content), a record, an object, a log
    // entry, the manifest's pages and the frame plan's: nothing per file besides its content.
    let added = sled_keys(&store) - before;
    let pages = store.manifest(id).unwrap().pages.len();
    let plan = store.plan_chunks(pending.record()).unwrap().len();
    assert!(pages > 10, "the manifest spans pages ({pages})");
    assert!((1..=3).contains(&plan), "20 MiB of tar is one plan page and its root ({plan})");
    assert!(
        added <= 20_000 + pages + plan + 5,
        "{added} keys added by a 20,000-file revision ({pages} + {plan} pages)"
    );
    assert_eq!(store.files(id, "").count(), 20_000);
    store
        .write_objects(vec![ObjectWrite::Delete {
            key: ObjectKey::new("bundlecontents", "ns", "c"),
            precondition: Precondition::None,
        }])
        .unwrap();
    store.release_revision(id).unwrap();
    store.collect().unwrap();
    // What stays is the change log (the attach, the delete) and the resourceVersion counter.
    let kinds: Vec<u8> = store
        .tree()
        .range::<std::ops::RangeFull>(..)
        .map(|i| i.unwrap().0[0])
        .filter(|k| *k != b'l' && *k != b'm')
        .collect();
    assert_eq!(kinds, Vec::<u8>::new(), "no chunk, record or object is left");
    assert!(std::fs::read_dir(store.staging_root()).map_or(0, |d| d.count()) == 0, "no staging files left");
}

fn owned(name: &str, owners: &[&str]) -> ObjectWrite {
    let refs: Vec<_> = owners.iter().map(|uid| json!({"uid": uid, "name": "o", "kind": "Bundle"})).collect();
    ObjectWrite::Put {
        key: ObjectKey::new("bundles", "ns", name),
        object: json!({"metadata": {"name": name, "namespace": "ns", "ownerReferences": refs}}),
        precondition: Precondition::None,
        revision: None,
    }
}

fn dependent_names(store: &Store, uid: &str) -> Vec<String> {
    let mut names: Vec<String> = store
        .dependents("ns", uid)
        .unwrap()
        .into_iter()
        .map(|(_, o)| o.value["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    names.sort();
    names
}

#[test]
fn the_owner_index_follows_every_write_and_is_built_for_older_stores() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = open(dir.path());
        store.write_objects(vec![owned("a", &["u1"]), owned("b", &["u1", "u2"]), owned("c", &["u2"])]).unwrap();
        // A uid that is a prefix of another finds only its own dependents.
        store.write_objects(vec![owned("d", &["u"])]).unwrap();
        assert_eq!(dependent_names(&store, "u1"), ["a", "b"]);
        assert_eq!(dependent_names(&store, "u"), ["d"]);
        // Owners replaced, an object deleted: the index moves with them, in the same write.
        store.write_objects(vec![owned("b", &["u2"])]).unwrap();
        store
            .write_objects(vec![ObjectWrite::Delete {
                key: ObjectKey::new("bundles", "ns", "c"),
                precondition: Precondition::None,
            }])
            .unwrap();
        assert_eq!(dependent_names(&store, "u1"), ["a"]);
        assert_eq!(dependent_names(&store, "u2"), ["b"]);
        assert!(store.dependents("other-ns", "u2").unwrap().is_empty());
        // As a store from before the index: no `d` keys, no marker.
        let mut batch = meta::Batch::default();
        for item in store.tree().scan_prefix(b"d") {
            batch.remove(item.unwrap().0);
        }
        batch.remove(b"mownerindex");
        store.tree().apply_batch(batch).unwrap();
        assert_eq!(dependent_names(&store, "u2"), ["b"], "found by a scan meanwhile");
        store.flush().unwrap();
    }
    let store = open(dir.path());
    assert!(store.tree().scan_prefix(b"d").next().is_some(), "built at open");
    assert_eq!(dependent_names(&store, "u1"), ["a"]);
    assert_eq!(dependent_names(&store, "u2"), ["b"]);
}

/// Keeps at most `step` objects per step.
struct Steps {
    items: Vec<serde_json::Value>,
    in_step: usize,
    step: usize,
}

impl ListSink for Steps {
    fn push(&mut self, object: Listed<'_>) -> Result<()> {
        self.items.push(object.into_value()?);
        self.in_step += 1;
        Ok(())
    }
    fn restart(&mut self) {
        self.items.clear();
        self.in_step = 0;
    }
    fn is_full(&self) -> bool {
        self.in_step >= self.step
    }
}

#[test]
fn a_list_read_in_steps_is_the_snapshot_of_its_first_step() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let put = |name: String, v: u64| ObjectWrite::Put {
        key: ObjectKey::new("bundles", "ns", &name),
        object: json!({"metadata": {"name": name}, "v": v}),
        precondition: Precondition::None,
        revision: None,
    };
    store.write_objects((0..100).map(|i| put(format!("o{i:03}"), 0)).collect()).unwrap();
    let expected = store
        .list_page(&ListQuery { resource: "bundles", namespace: Some("ns"), at: None, after: None, limit: None }, None)
        .unwrap();
    let query = ListQuery { resource: "bundles", namespace: Some("ns"), at: None, after: None, limit: None };
    let mut sink = Steps { items: Vec::new(), in_step: 0, step: 7 };
    let mut cursor = store.list_start(&query, None, &mut sink).unwrap();
    let mut steps = 1;
    while !cursor.is_done() {
        // Writers go on between steps: changed, new and deleted objects.
        let i = steps * 7;
        store
            .write_objects(vec![
                put(format!("o{:03}", (i + 3) % 100), 1),
                put(format!("o{i:03}x"), 1),
                ObjectWrite::Delete {
                    key: ObjectKey::new("bundles", "ns", &format!("o{:03}", (i + 5) % 100)),
                    precondition: Precondition::None,
                },
            ])
            .unwrap();
        sink.in_step = 0;
        cursor.fill(&store, None, &mut sink).unwrap();
        steps += 1;
    }
    assert!(steps > 10, "read in {steps} steps");
    assert_eq!(cursor.resource_version(), expected.resource_version);
    assert_eq!(sink.items, expected.items, "every step is at the first step's resourceVersion");
}
