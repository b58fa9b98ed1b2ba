//! What a store recovered from a crash state must hold, from the workload's marks before the cut:
//! every object in the state of its last acknowledged step (at that step's resourceVersion), or of
//! the step after it if that one had begun; every revision such a state attaches readable whole,
//! its tar matching the digest the writer was given; and the store writable again.

use std::collections::BTreeMap;

use serde_json::json;
use sha2::{Digest, Sha256};
use stowage::storage::{ObjectKey, ObjectWrite, Precondition, RangeSpec, Store};

use crate::workload::{Mark, NAMESPACE, RESOURCE};

#[derive(Debug, Clone)]
struct Step {
    delete: bool,
    rev: Option<(u64, String)>,
    intent: usize,
    ack: Option<(usize, u64)>,
}

/// Every object's steps, in order, with where in the trace each began and was acknowledged.
pub struct Expectations {
    objects: BTreeMap<String, Vec<Step>>,
}

impl Expectations {
    pub fn new(marks: &[(usize, String)]) -> Expectations {
        let mut objects: BTreeMap<String, Vec<Step>> = BTreeMap::new();
        for (at, line) in marks {
            match serde_json::from_str::<Mark>(line).unwrap() {
                Mark::Intent { obj, step, delete, rev, digest } => {
                    let steps = objects.entry(obj).or_default();
                    assert_eq!(steps.len(), step as usize, "steps are marked in order");
                    steps.push(Step { delete, rev: rev.zip(digest), intent: *at, ack: None });
                }
                Mark::Ack { obj, step, rv } => {
                    objects.get_mut(&obj).unwrap()[step as usize].ack = Some((*at, rv));
                }
            }
        }
        Expectations { objects }
    }

    /// Positions just after each acknowledgment of a step attaching a revision, and of the others.
    pub fn ack_points(&self) -> (Vec<usize>, Vec<usize>) {
        let (mut revisions, mut others) = (Vec::new(), Vec::new());
        for step in self.objects.values().flatten() {
            if let Some((at, _)) = step.ack {
                if step.rev.is_some() { &mut revisions } else { &mut others }.push(at + 1);
            }
        }
        (revisions, others)
    }

    pub fn acknowledged(&self) -> usize {
        self.objects.values().flatten().filter(|s| s.ack.is_some()).count()
    }

    /// Checks a store recovered from a cut after the first `p` operations; returns what is wrong.
    pub fn check(&self, store: &Store, p: usize) -> Vec<String> {
        let mut problems = Vec::new();
        let mut newest_ack = 0;
        for (name, steps) in &self.objects {
            // The last step acknowledged before the cut; the next one may have happened too.
            let acked = steps.iter().rposition(|s| s.ack.is_some_and(|(at, _)| at < p));
            let next = acked.map_or(0, |a| a + 1);
            let next_begun = steps.get(next).is_some_and(|s| s.intent < p);
            let acked_rv = acked.and_then(|a| steps[a].ack).map(|(_, rv)| rv);
            newest_ack = newest_ack.max(acked_rv.unwrap_or(0));
            let found = match store.get_object(&ObjectKey::new(RESOURCE, NAMESPACE, name)) {
                Ok(found) => found,
                Err(e) => {
                    problems.push(format!("{name}: reading it failed: {e}"));
                    continue;
                }
            };
            let absent_allowed = acked.is_none_or(|a| steps[a].delete) || (next_begun && steps[next].delete);
            let Some(object) = found else {
                if !absent_allowed {
                    problems.push(format!("{name}: gone, but step {acked:?} was acknowledged at rv {acked_rv:?}"));
                }
                continue;
            };
            let step = object.value.pointer("/spec/step").and_then(|s| s.as_u64()).unwrap_or(u64::MAX) as usize;
            let rv = object.resource_version;
            let fits = match acked {
                Some(a) if step == a => !steps[a].delete && Some(rv) == acked_rv,
                _ if step == next => next_begun && !steps[next].delete && acked_rv.is_none_or(|acked| rv > acked),
                _ => false,
            };
            if !fits {
                problems.push(format!(
                    "{name}: found at step {step} rv {rv}; last acknowledged step {acked:?} at rv {acked_rv:?}, \
                     step {next} begun: {next_begun}"
                ));
                continue;
            }
            if let Some((id, digest)) = &steps[step].rev {
                if object.revision != Some(*id) {
                    problems.push(format!("{name}: attaches revision {:?}, not {id}", object.revision));
                } else if let Err(e) = read_whole(store, *id, digest) {
                    problems.push(format!("{name}: revision {id}: {e}"));
                }
            }
        }
        match store.current_resource_version() {
            Ok(current) if current >= newest_ack => {}
            other => problems.push(format!("resourceVersion {other:?} is behind an acknowledged {newest_ack}")),
        }
        // The recovered store takes writes again (a create, or an update at a second check).
        let write = ObjectWrite::Put {
            key: ObjectKey::new(RESOURCE, NAMESPACE, "after-the-cut"),
            object: json!({"metadata": {"name": "after-the-cut"}}),
            precondition: Precondition::None,
            revision: None,
        };
        if let Err(e) = store.write_objects(vec![write]) {
            problems.push(format!("a write after recovery failed: {e}"));
        }
        problems
    }
}

/// Reads a revision's whole tar and compares its sha256 with `digest`.
fn read_whole(store: &Store, id: u64, digest: &str) -> Result<(), String> {
    let record = store.revision(id).map_err(|e| e.to_string())?;
    if record.digest != digest {
        return Err(format!("record digest {} instead of {digest}", record.digest));
    }
    let mut hash = Sha256::new();
    let mut len = 0u64;
    store
        .read_tar(id, record.tar_size, RangeSpec { start: 0, end: record.tar_size }, &mut |bytes| {
            hash.update(bytes);
            len += bytes.len() as u64;
            Ok(())
        })
        .map_err(|e| format!("reading its tar: {e}"))?;
    let read = format!("sha256:{}", hex::encode(hash.finalize()));
    if read != digest || len != record.tar_size {
        return Err(format!("tar read back ({len} bytes) hashes to {read}, not {digest}"));
    }
    Ok(())
}
