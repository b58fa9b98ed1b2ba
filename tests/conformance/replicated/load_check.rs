//! The checks after a load test, once every replica is back: every acknowledged upload is there
//! and its content reads back with its digest, every acknowledged label and delete holds, and each
//! watcher's events replay to exactly the final list and include every acknowledged write.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures_util::StreamExt;
use reqwest::{Client, StatusCode};
use serde_json::Value;

use super::load::{Acks, Upload};
use super::load_watch::WatchRecord;
use crate::harness::*;

/// name → resourceVersion of a namespace's Bundles, and the list's resourceVersion.
pub async fn list(client: &Client, base: &str, ns: &str) -> (u64, BTreeMap<String, u64>) {
    let body = client.get(format!("{base}{}", bundles(ns))).send().await.expect("final list").bytes().await.unwrap();
    let list = parse_json(&body, "final list");
    let rv = |v: &Value| str_at(v, "/metadata/resourceVersion").parse::<u64>().unwrap();
    let items = list["items"].as_array().unwrap_or_else(|| panic!("not a list: {list}"));
    (rv(&list), items.iter().map(|o| (str_at(o, "/metadata/name").to_owned(), rv(o))).collect())
}

async fn check_upload(client: &Client, base: &str, u: &Upload) -> Result<(), String> {
    let path = bundle(&u.namespace, &u.name);
    let resp = client.get(format!("{base}{path}")).send().await.map_err(|e| format!("GET {path}: {e}"))?;
    let b: Value = resp.json().await.map_err(|e| format!("GET {path}: {e}"))?;
    if b.pointer("/status/digest").and_then(Value::as_str) != Some(u.digest.as_str()) {
        return Err(format!("{path}: acknowledged {} but status is {}", u.digest, b["status"]));
    }
    let path = bundlecontent_content(&u.namespace, &u.content_name);
    let resp = client.get(format!("{base}{path}")).send().await.map_err(|e| format!("GET {path}: {e}"))?;
    let status = resp.status();
    let body = resp.bytes().await.map_err(|e| format!("GET {path}: {e}"))?;
    if status != StatusCode::OK || digest_of(&body) != u.digest {
        return Err(format!(
            "{path}: HTTP {status}, {} bytes, digest {} (acknowledged {})",
            body.len(),
            digest_of(&body),
            u.digest
        ));
    }
    Ok(())
}

/// Every acknowledged upload, label and delete, read back; the problems found.
pub async fn check_acks(client: &Client, base: &str, acks: &Arc<Acks>) -> Vec<String> {
    let uploads = acks.uploads.lock().unwrap().clone();
    let mut problems: Vec<String> = futures_util::stream::iter(uploads.iter())
        .map(|u| check_upload(client, base, u))
        .buffer_unordered(8)
        .filter_map(|r| async move { r.err() })
        .collect()
        .await;
    let labels = acks.labels.lock().unwrap().clone();
    for (key, turn) in labels {
        let (ns, name) = key.split_once('/').unwrap();
        let path = bundle(ns, name);
        let b: Value = client.get(format!("{base}{path}")).send().await.unwrap().json().await.unwrap();
        if b.pointer("/metadata/labels/turn").and_then(Value::as_str) != Some(turn.as_str()) {
            problems
                .push(format!("{path}: label turn={turn} acknowledged last, labels now {}", b["metadata"]["labels"]));
        }
    }
    let deleted = acks.deleted.lock().unwrap().clone();
    for (ns, name, answers) in deleted {
        let path = bundle(&ns, &name);
        let resp = client.get(format!("{base}{path}")).send().await.unwrap();
        let status = resp.status();
        if status != StatusCode::NOT_FOUND {
            // Which write the object is tells how it came back: older than the delete (the delete
            // did not hold) or newer (written again after it).
            let b: Value = resp.json().await.unwrap_or_default();
            let found = format!(
                "resourceVersion {}, uid {}, created {}",
                b["metadata"]["resourceVersion"], b["metadata"]["uid"], b["metadata"]["creationTimestamp"]
            );
            problems.push(format!("{path}: deleted (acknowledged; {answers}) but GET answers {status}: {found}"));
        }
    }
    problems
}

/// A watcher's events, replayed from its (empty) start up to the final list's version, give the
/// final list; and every write acknowledged in its namespace is among its events.
pub fn check_watch(record: &WatchRecord, final_list: &(u64, BTreeMap<String, u64>), acks: &Acks) -> Vec<String> {
    let mut problems = Vec::new();
    let who = format!("watcher of {} (from {}, {} resumes)", record.namespace, record.start, record.resumes);
    let mut state = BTreeMap::new();
    for (kind, name, rv) in record.events.iter().filter(|e| e.2 <= final_list.0) {
        if kind == "DELETED" {
            state.remove(name);
        } else {
            state.insert(name.clone(), *rv);
        }
    }
    if state != final_list.1 {
        let missing: Vec<_> = final_list.1.iter().filter(|(k, v)| state.get(*k) != Some(v)).take(10).collect();
        let extra: Vec<_> = state.iter().filter(|(k, v)| final_list.1.get(*k) != Some(v)).take(10).collect();
        problems.push(format!(
            "{who}: its events do not replay to the final list; list has {missing:?}, events give {extra:?}"
        ));
    }
    let seen: std::collections::HashSet<(&str, u64)> =
        record.events.iter().map(|(_, n, rv)| (n.as_str(), *rv)).collect();
    let writes = acks.writes.lock().unwrap();
    let missing: Vec<_> = writes
        .get(&record.namespace)
        .into_iter()
        .flatten()
        .filter(|(name, rv, _)| *rv > record.start && !seen.contains(&(name.as_str(), *rv)))
        .collect();
    if !missing.is_empty() {
        problems.push(format!(
            "{who}: {} acknowledged writes never arrived, e.g. {:?}",
            missing.len(),
            &missing[..missing.len().min(10)]
        ));
    }
    problems
}
