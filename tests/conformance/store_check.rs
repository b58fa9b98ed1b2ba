//! Shared checks of what a server stores, for the fault and full-disk suites: seeded random trees,
//! a ledger of what the server acknowledged, and the verification that every acknowledged
//! revision is listed and downloads with its digest while nothing else (half-written) is visible.

use std::collections::BTreeMap;

use crate::harness::*;
use crate::tarutil::*;

/// `files` incompressible files of `size` bytes each (seeded), plus a small manifest.
pub fn random_tree(seed: u64, files: u64, size: usize) -> Tree {
    let mut tree = Tree::new();
    for i in 0..files {
        tree.insert(format!("data/f-{i:02}.bin"), file(random_bytes(splitmix64(seed ^ (i << 32)), size)));
    }
    tree.insert("seed.txt".into(), file(format!("seed: {seed}\n")));
    tree
}

/// [`random_tree`] as a plain bundle (one object under `manifests/`), as pulled sources must be.
pub fn plain_bundle_tree(seed: u64, files: u64, size: usize) -> Tree {
    let mut tree = random_tree(seed, files, size);
    let object = format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: seed-{seed}\n");
    tree.insert("manifests/configmap.yaml".into(), file(object));
    tree
}

/// What the server acknowledged: BundleContent name → digest, per namespace.
#[derive(Default, Debug, Clone)]
pub struct Ledger {
    /// (namespace, BundleContent name) → `sha256:…`, for revisions acknowledged and not since
    /// deleted with an acknowledgement.
    pub contents: BTreeMap<(String, String), String>,
    /// Bundles whose deletion was acknowledged: they must never come back.
    pub deleted_bundles: Vec<(String, String)>,
}

impl Ledger {
    /// Records an acknowledged upload or unpack (the Bundle as the server returned it).
    pub fn acknowledged(&mut self, ns: &str, bundle: &serde_json::Value) {
        let name = str_at(bundle, "/status/contentName").to_owned();
        self.contents.insert((ns.to_owned(), name), str_at(bundle, "/status/digest").to_owned());
    }

    /// Records an acknowledged Bundle deletion: its contents go with it (owner references).
    pub fn bundle_deleted(&mut self, ns: &str, name: &str) {
        let prefix = format!("{name}-");
        self.contents.retain(|(n, c), _| !(n == ns && c.starts_with(&prefix) && c.len() == prefix.len() + 10));
        self.deleted_bundles.push((ns.to_owned(), name.to_owned()));
    }
}

/// Every BundleContent listed in `ns` downloads with a sha256 equal to its `spec.digest` (nothing
/// half-written is visible), and every acknowledged one of the ledger is among them with the
/// acknowledged digest. Returns the listed BundleContents: name → digest. `context` goes into every message.
pub async fn verify_contents(server: &Server, ns: &str, ledger: &Ledger, context: &str) -> BTreeMap<String, String> {
    let list = server.get_json(&bundlecontents(ns)).await;
    let items = list["items"].as_array().cloned().unwrap_or_default();
    let mut listed = BTreeMap::new();
    for item in &items {
        let name = str_at(item, "/metadata/name").to_owned();
        let digest = str_at(item, "/spec/digest").to_owned();
        let tar = server.download(&bundlecontent_content(ns, &name)).await;
        assert_eq!(
            digest_of(&tar),
            digest,
            "{context}: BundleContent {ns}/{name} serves bytes that do not match its digest"
        );
        parse_served_tar(&tar);
        listed.insert(name, digest);
    }
    for ((acked_ns, name), digest) in &ledger.contents {
        if acked_ns != ns {
            continue;
        }
        assert_eq!(
            listed.get(name),
            Some(digest),
            "{context}: acknowledged revision {ns}/{name} ({digest}) is missing or changed; listed: {listed:?}"
        );
    }
    let bundles_now = server.get_json(&bundles(ns)).await;
    let existing: Vec<&str> = bundles_now["items"]
        .as_array()
        .map(|items| items.iter().map(|b| str_at(b, "/metadata/name")).collect())
        .unwrap_or_default();
    for (deleted_ns, name) in &ledger.deleted_bundles {
        assert!(
            deleted_ns != ns || !existing.contains(&name.as_str()),
            "{context}: Bundle {ns}/{name} came back after its acknowledged deletion"
        );
    }
    listed
}
