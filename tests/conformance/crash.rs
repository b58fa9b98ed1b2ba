//! kill -9 in the middle of an upload: the store reopens, every committed revision is intact,
//! nothing of the interrupted one is visible, and its orphan chunks are collected.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use reqwest::StatusCode;

use crate::harness::*;
use crate::tarutil::*;

const KILL_AFTER: u64 = 150 << 20;

fn revision_tree(seed: u64) -> Tree {
    let mut t = Tree::new();
    for i in 0..24 {
        let size = 50_000 + (splitmix64(seed + i) % 250_000) as usize;
        t.insert(format!("manifests/m-{i:02}.yaml"), file(random_bytes(seed * 1000 + i, size)));
    }
    t.insert("metadata/annotations.yaml".into(), file(format!("seed: {seed}\n")));
    t
}

#[tokio::test(flavor = "multi_thread")]
async fn kill9_during_upload_keeps_committed_revisions() {
    let mut server = Server::start_temp(&[]);
    server.create_bundle("ns", "app").await;
    server.create_bundle("ns", "other").await;

    // Committed state: two revisions of `app`, one of `other`.
    let (tree1, tree2, tree_other) = (revision_tree(1), revision_tree(2), revision_tree(3));
    let mut trees: BTreeMap<String, Tree> = BTreeMap::new();
    for (name, tree) in [("app", &tree1), ("app", &tree2), ("other", &tree_other)] {
        let b = server.upload_ok("ns", name, build_tar(tree), None).await;
        trees.insert(str_at(&b, "/status/digest").to_owned(), tree.clone());
    }
    let app = server.get_json(&bundle("ns", "app")).await;
    let (app_digest, app_content) =
        (str_at(&app, "/status/digest").to_owned(), str_at(&app, "/status/contentName").to_owned());
    assert_eq!(app_digest, digest_of(&server.download(&bundle_content("ns", "app")).await));
    let contents_before = server.bundlecontent_names("ns").await;
    let mut digests_before = BTreeMap::new();
    for name in &contents_before {
        let bc = server.get_json(&bundlecontent("ns", name)).await;
        digests_before.insert(name.clone(), str_at(&bc, "/spec/digest").to_owned());
    }
    let chunks_before = server.metrics().await["stowage_chunks"];

    // A ~400 MiB upload, killed once 150 MiB are on the wire.
    let files = synth_files(99, 2, 200 << 20, 500);
    let stream = stream_tar(files);
    let sent = stream.sent.clone();
    let upload = {
        let client = server.client().clone();
        let url = server.url(&bundle_content("ns", "app"));
        tokio::spawn(async move {
            client.put(url).header("Content-Type", "application/x-tar").body(stream.body).send().await
        })
    };
    let every = Duration::from_millis(20);
    eventually_every(Duration::from_secs(300), every, &format!("{KILL_AFTER} bytes of the upload sent"), || async {
        assert!(!upload.is_finished(), "upload ended before the kill");
        match sent.load(Ordering::Relaxed) {
            n if n >= KILL_AFTER => Ok(()),
            n => Err(format!("stalled at {n} bytes")),
        }
    })
    .await;
    // The server must be in the middle of writing it: staging, with new chunks stored.
    let during = eventually(Duration::from_secs(30), "upload in progress on the server", || async {
        let m = server.metrics().await;
        let staging = m.get(r#"stowage_revisions{state="staging"}"#).copied();
        let chunks = m.get("stowage_chunks").copied().unwrap_or(0.0);
        if staging >= Some(1.0) && chunks > chunks_before {
            Ok(chunks)
        } else {
            Err(format!("staging {staging:?}, chunks {chunks} (before: {chunks_before})"))
        }
    })
    .await;
    assert!(!upload.is_finished(), "upload ended before the kill");
    server.kill9();
    report(&format!(
        "crash: killed after {} MiB sent; chunks {chunks_before} before, {during} at the kill",
        sent.load(Ordering::Relaxed) >> 20
    ));
    let outcome = upload.await.unwrap();
    assert!(
        !matches!(&outcome, Ok(r) if r.status() == StatusCode::OK),
        "the interrupted upload reported success: {outcome:?}"
    );
    let _ = stream.done.join();

    // Restart on the same data directory.
    server.restart();
    let app = server.get_json(&bundle("ns", "app")).await;
    assert_eq!(str_at(&app, "/status/digest"), app_digest, "Bundle moved off its last good revision");
    assert_eq!(str_at(&app, "/status/contentName"), app_content);
    assert_eq!(
        server.bundlecontent_names("ns").await,
        contents_before,
        "BundleContents changed across the crash (a revision of the interrupted upload?)"
    );
    for (name, digest) in &digests_before {
        let tar = server.download(&bundlecontent_content("ns", name)).await;
        assert_eq!(&digest_of(&tar), digest, "{name} after the crash");
        assert_trees_equal(&trees[digest], &parse_served_tar(&tar), name);
    }
    for name in ["app", "other"] {
        let b = server.get_json(&bundle("ns", name)).await;
        let tar = server.download(&bundle_content("ns", name)).await;
        assert_eq!(digest_of(&tar), str_at(&b, "/status/digest"), "{name} after the crash");
    }

    // The interrupted upload's chunks are collected.
    eventually(Duration::from_secs(30), "orphan chunks collected", || async {
        let m = server.metrics().await;
        let staging = m.get(r#"stowage_revisions{state="staging"}"#).copied();
        let chunks = m.get("stowage_chunks").copied();
        if staging == Some(0.0) && chunks == Some(chunks_before) {
            Ok(())
        } else {
            Err(format!("staging {staging:?}, chunks {chunks:?} (before: {chunks_before})"))
        }
    })
    .await;

    // And the store takes new writes.
    let tree4 = revision_tree(4);
    let b = server.upload_ok("ns", "app", build_tar(&tree4), None).await;
    let tar = server.download(&bundle_content("ns", "app")).await;
    assert_eq!(digest_of(&tar), str_at(&b, "/status/digest"));
    assert_trees_equal(&tree4, &parse_served_tar(&tar), "upload after the crash");
}

/// kill -9 while deletions are being collected (and again right after the restart, while recovery
/// collects): the store reopens, the Bundle that was kept still serves its exact content, the
/// deleted ones stay gone, and their chunks are eventually released.
#[tokio::test(flavor = "multi_thread")]
async fn kill9_during_garbage_collection_keeps_the_rest() {
    let mut server = Server::start_temp(&[]);
    let keep = revision_tree(7);
    server.create_bundle("gc", "keep").await;
    let kept = server.upload_ok("gc", "keep", build_tar(&keep), None).await;
    let kept_digest = str_at(&kept, "/status/digest").to_owned();
    let chunks_kept_only = server.metrics().await["stowage_chunks"];
    for i in 0..6 {
        let name = format!("drop-{i}");
        server.create_bundle("gc", &name).await;
        let mut tree = revision_tree(20 + i);
        tree.extend(keep.clone()); // shares every chunk of `keep`
        server.upload_ok("gc", &name, build_tar(&tree), None).await;
    }
    for i in 0..6 {
        let resp = server.delete(&bundle("gc", &format!("drop-{i}"))).await;
        assert!(resp.status().is_success(), "{}", resp.status());
    }
    server.kill9();
    server.restart();
    server.kill9();
    server.restart();

    let tar = server.download(&bundle_content("gc", "keep")).await;
    assert_eq!(digest_of(&tar), kept_digest, "kept bundle damaged by collection interrupted twice");
    assert_trees_equal(&keep, &parse_served_tar(&tar), "kept bundle after two kills");
    // The deleted Bundles' contents go by background deletion, which resumes after the restart.
    let kept_content = vec![str_at(&kept, "/status/contentName").to_owned()];
    eventually(Duration::from_secs(30), "only the kept bundle's content remains", || async {
        match server.bundlecontent_names("gc").await {
            names if names == kept_content => Ok(()),
            names => Err(format!("{names:?}")),
        }
    })
    .await;
    eventually(Duration::from_secs(30), "only the kept bundle's chunks remain", || async {
        let m = server.metrics().await;
        match (m["stowage_chunks"], m[r#"stowage_revisions{state="deleting"}"#]) {
            (chunks, deleting) if chunks == chunks_kept_only && deleting == 0.0 => Ok(()),
            other => Err(format!("{other:?} (want {chunks_kept_only} chunks)")),
        }
    })
    .await;
}

/// A second `stowage serve` on a data directory in use stops before touching it, and says which
/// process has it (sled's own refusal came late, as `IO error: could not acquire lock … WouldBlock`).
#[tokio::test(flavor = "multi_thread")]
async fn a_second_server_on_the_same_data_dir_says_who_has_it() {
    let server = Server::start_temp(&[]);
    server.create_bundle("ns", "kept").await;
    let mut second = std::process::Command::new(env!("CARGO_BIN_EXE_stowage"))
        .arg("serve")
        .arg("--data-dir")
        .arg(server.data_dir())
        .args(["--listen", "127.0.0.1:0"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn a second server");
    let exited = poll_until(Duration::from_secs(30), Duration::from_millis(100), || {
        let status = second.try_wait().expect("wait");
        async move { status.ok_or_else(|| "still running".to_owned()) }
    })
    .await;
    let Ok(status) = exited else {
        let _ = second.kill();
        panic!("a second server on the same data directory kept running");
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut second.stderr.take().expect("stderr"), &mut stderr).expect("read stderr");
    assert!(!status.success(), "{stderr}");
    let expected = format!("is in use by another stowage process (pid {})", server.pid());
    assert!(stderr.contains(&expected), "{stderr}");
    assert!(!stderr.contains("WouldBlock") && !stderr.contains("os error"), "{stderr}");
    // The first server goes on serving what it holds.
    assert_eq!(server.get(&bundle("ns", "kept")).await.status(), 200);
}
