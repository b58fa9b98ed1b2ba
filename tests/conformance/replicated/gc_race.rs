//! A seeded race between uploads that reuse old content and garbage collection on another replica:
//! replica A uploads content X, then X plus a little to another Bundle, while replica B deletes X's
//! Bundle (X's blocks become garbage unless the new upload references them) and churns through
//! create-upload-delete to keep the collector busy. No block referenced by a committed revision may
//! ever go missing: every BundleContent left reads back completely with its digest, through each
//! replica, right after its upload and at the end. `STOWAGE_GC_SEED` and `STOWAGE_GC_ROUNDS` (25)
//! choose the run; the seed is printed and named in every failure.

use std::time::Duration;

use serde_json::Value;

use super::api::At;
use super::cluster::Cluster;
use super::load::env_or;
use crate::harness::*;
use crate::tarutil::*;

const NS: &str = "gc-race";
/// Files of the sliding window each round's content is made of (each spans several blocks).
const WINDOW: u64 = 4;
const FILE_SIZE: usize = 192 << 10;

/// Content of round `i`: files `i..i+WINDOW` of the seeded pool, plus `extra` bytes of its own.
fn content(seed: u64, i: u64, extra: Option<u64>) -> Vec<u8> {
    let mut tree = Tree::new();
    for k in i..i + WINDOW {
        tree.insert(format!("pool/file-{k}.bin"), file(random_bytes(splitmix64(seed ^ k), FILE_SIZE)));
    }
    if let Some(n) = extra {
        tree.insert(format!("extra-{i}.txt"), file(random_bytes(splitmix64(seed ^ !i), 100 + n as usize % 5000)));
    }
    build_tar(&tree)
}

/// A committed revision to read back: (what, BundleContent name, digest).
type Kept = (String, String, String);

async fn read_back(at: &At<'_>, kept: &Kept, seed: u64) {
    let (what, name, digest) = kept;
    let body = at.download(&bundlecontent_content(NS, name)).await;
    assert_eq!(
        &digest_of(&body),
        digest,
        "seed {seed}: {what} ({name}) through {} reads back with another digest",
        at.base
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn uploads_reusing_old_content_race_garbage_collection() {
    let seed = env_or("STOWAGE_GC_SEED", 0x5eed_0017);
    let rounds = env_or("STOWAGE_GC_ROUNDS", 25);
    report(&format!("gc race: seed {seed} (STOWAGE_GC_SEED), {rounds} rounds"));
    let cluster = Cluster::start("gcrace", 2, &[]).await;
    let client = cluster.client().clone();
    let (a, b) = (At::new(&client, cluster.replicas[0].url()), At::new(&client, cluster.replicas[1].url()));
    let mut kept: Vec<Kept> = Vec::new();
    let mut rng = splitmix64(seed);
    for i in 0..rounds {
        rng = splitmix64(rng);
        let x = format!("x{i}");
        a.create_bundle(NS, &x).await;
        a.upload(NS, &x, content(seed, i, None)).await;

        // B deletes X's Bundle and churns; A meanwhile uploads X plus a little (or X exactly).
        let delay = Duration::from_millis(rng % 300);
        let exact = rng.is_multiple_of(5);
        let churn = async {
            b.delete(&bundle(NS, &x)).await;
            for k in 0..3 {
                let junk = format!("j{i}-{k}");
                b.create_bundle(NS, &junk).await;
                let tree = Tree::from([("junk.bin".to_string(), file(random_bytes(rng ^ k, 40_000)))]);
                b.upload(NS, &junk, build_tar(&tree)).await;
                b.delete(&bundle(NS, &junk)).await;
            }
        };
        let reuse = async {
            tokio::time::sleep(delay).await;
            let y = format!("y{i}");
            a.create_bundle(NS, &y).await;
            let bytes = content(seed, i, if exact { None } else { Some(rng >> 16) });
            let done = a.upload(NS, &y, bytes).await;
            let what = format!("round {i}: {y} (delay {delay:?}, exact {exact})");
            (what, str_at(&done, "/status/contentName").to_owned(), str_at(&done, "/status/digest").to_owned())
        };
        let ((), revision) = tokio::join!(churn, reuse);
        // Read at once through the collecting replica, while its collection may still run.
        read_back(&b, &revision, seed).await;
        kept.push(revision);
    }

    // Let the releases the deletes started finish on every replica, then read everything left.
    for at in [&a, &b] {
        eventually(Duration::from_secs(60), "deleted revisions released", || async {
            let metrics = at.metrics().await;
            let state = |s: &str| metrics.get(&format!("stowage_revisions{{state=\"{s}\"}}")).copied();
            match (state("staging"), state("deleting")) {
                (Some(s), Some(d)) if s == 0.0 && d == 0.0 => Ok(()),
                seen => Err(format!("{}: staging/deleting = {seen:?}", at.base)),
            }
        })
        .await;
    }
    // The race was run: some replica (the leader) made collection passes meanwhile.
    let mut sweeps = 0.0;
    let mut chunks = Vec::new();
    for at in [&a, &b] {
        let metrics = at.metrics().await;
        sweeps += metrics.iter().filter(|(k, _)| k.starts_with("stowage_store_sweeps")).map(|(_, v)| v).sum::<f64>();
        chunks.push(metrics.get("stowage_chunks").copied());
    }
    report(&format!("gc race: seed {seed}: {sweeps} collection passes, chunks now {chunks:?}"));
    assert!(sweeps > 0.0, "seed {seed}: no collection pass ran during the race (stowage_store_sweeps)");
    for at in [&a, &b] {
        for k in &kept {
            read_back(at, k, seed).await;
        }
        let list = at.get_json(&bundlecontents(NS)).await;
        let items = list["items"].as_array().unwrap_or_else(|| panic!("not a list: {list}"));
        assert!(items.len() >= kept.len(), "seed {seed}: {} BundleContents listed, {} kept", items.len(), kept.len());
        for item in items {
            let name = str_at(item, "/metadata/name").to_owned();
            let digest = item.pointer("/spec/digest").and_then(Value::as_str).unwrap_or_default().to_owned();
            read_back(at, &(format!("listed BundleContent {name}"), name, digest), seed).await;
        }
    }
}
