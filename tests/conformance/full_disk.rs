//! A server whose data directory is a small tmpfs that fills up: writes fail with 507
//! `InsufficientStorage` (uploads, creates, chunked sessions, and an unpack reports
//! `StorageFailed` and is retried), nothing stored is lost, reads and watches keep working,
//! deletes work while only the reserve is touched, a restart on the full disk serves; once space is
//! freed writes succeed again without a restart, and a restart finds everything intact.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::harness::*;
use crate::http_server::{HttpAuth, HttpServer};
use crate::store_check::*;
use crate::tarutil::*;
use crate::tmpfs::Tmpfs;
use crate::unpack::condition;
use crate::watch::read_events;

const NS: &str = "full";
const MIB: u64 = 1 << 20;
/// `--min-free-bytes`: content is refused below it, every write below a quarter of it.
const RESERVE: u64 = 16 * MIB;
const WAIT: Duration = Duration::from_secs(150);

async fn expect_full(resp: reqwest::Response, what: &str) {
    let status = expect_status(resp, 507, "InsufficientStorage").await;
    let message = status["message"].as_str().unwrap_or_default();
    assert!(message.contains("out of space"), "{what}: the message does not say the disk is full: {status:#}");
}

/// Waits for the Bundle's `Unpacked` condition to have `reason`; returns the Bundle.
async fn wait_unpacked_reason(server: &Server, name: &str, reason: &str) -> Value {
    eventually(WAIT, &format!("{name}: Unpacked reason {reason}"), || async {
        let b = server.get_json(&bundle(NS, name)).await;
        match condition(&b, "Unpacked") {
            c if c["reason"] == reason => Ok(b),
            c => Err(format!("{c}")),
        }
    })
    .await
}

/// Reads keep working: get, list, a watch's initial events, and every stored revision verifies.
async fn assert_reads_work(server: &Server, ledger: &Ledger, names: &[&str], context: &str) {
    for name in names {
        let b = server.get_json(&bundle(NS, name)).await;
        let tar = server.download(&bundle_content(NS, name)).await;
        assert_eq!(digest_of(&tar), str_at(&b, "/status/digest"), "{context}: {name}");
    }
    let watch = server.get(&format!("{}?watch=1&resourceVersion=0&timeoutSeconds=5", bundles(NS))).await;
    assert_eq!(watch.status().as_u16(), 200, "{context}: watch");
    let events = read_events(watch, names.len()).await;
    assert!(events.len() >= names.len() && events.iter().all(|e| e["type"] == "ADDED"), "{context}: {events:#?}");
    assert!(verify_contents(server, NS, ledger, context).await.len() >= names.len());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_full_disk_refuses_writes_keeps_reads_and_recovers_without_restart() {
    let started = Instant::now();
    let tmpfs = Tmpfs::mount(96 * MIB);
    let filler = tmpfs.filler();
    let web = HttpServer::start(HttpAuth::None);
    let pulled_tar = gzip(&build_tar(&plain_bundle_tree(900, 4, 4 << 20)));
    web.put("pulled.tar.gz", &pulled_tar);
    let reserve = RESERVE.to_string();
    let mut server = Server::start(
        &tmpfs.path().join("data"),
        &["--min-free-bytes", &reserve, "--insecure-source-host", &web.host_port()],
    );

    // Stored before the disk fills.
    let mut ledger = Ledger::default();
    let kept = ["keep-0", "keep-1", "keep-2"];
    for (i, name) in kept.iter().enumerate() {
        server.create_bundle(NS, name).await;
        let b = server.upload_ok(NS, name, build_tar(&random_tree(i as u64, 2, 512 << 10)), None).await;
        ledger.acknowledged(NS, &b);
    }

    // An upload of 8 MiB with 3 MiB above the reserve: it crosses it and stops there, cleanly.
    filler.leave_free(&tmpfs, RESERVE + 3 * MIB);
    let crossing = server.try_upload(NS, "keep-0", build_tar(&random_tree(40, 4, 2 << 20)), None).await;
    match crossing {
        Ok(resp) => expect_full(resp, "an upload crossing the reserve").await,
        // HTTP/1.1: the early answer may be lost when the server stops reading the body.
        Err(e) => report(&format!("full disk: the upload crossing the reserve was cut: {e}")),
    }
    verify_contents(&server, NS, &ledger, "after an upload crossed the reserve").await;

    // An unpack that needs 16 MiB with 6 MiB above the reserve: it crosses it and stops there,
    // reported as a storage failure that says why, retried, with nothing half-written visible.
    filler.leave_free(&tmpfs, RESERVE + 6 * MIB);
    let spec = json!({"sources": [{"http": {"url": web.url("pulled.tar.gz"), "sha256": sha256_hex(&pulled_tar)}}]});
    let pulled = json!({"apiVersion": API_VERSION, "kind": "Bundle",
        "metadata": {"name": "pulled", "namespace": NS}, "spec": spec});
    let resp = server.post_json(&bundles(NS), &pulled).await;
    assert_eq!(resp.status().as_u16(), 201, "create with room above the reserve");
    let failed = wait_unpacked_reason(&server, "pulled", "StorageFailed").await;
    let unpacked = condition(&failed, "Unpacked");
    assert_eq!(unpacked["status"], "False", "{failed:#}");
    assert!(unpacked["message"].as_str().unwrap_or_default().contains("out of space"), "{failed:#}");
    assert!(failed.pointer("/status/digest").is_none(), "a failed unpack shows content: {failed:#}");

    // What the failed unpack wrote is given back without a restart (its pack is compacted).
    eventually(WAIT, "the failed unpack's bytes freed", || async {
        match tmpfs.free() {
            free if free >= RESERVE + 4 * MIB => Ok(()),
            free => Err(format!("{} KiB free", free >> 10)),
        }
    })
    .await;

    // Below the reserve: every way of writing content or objects is refused, up front.
    filler.leave_free(&tmpfs, RESERVE - 4 * MIB);
    expect_full(server.upload(NS, "keep-0", build_tar(&random_tree(50, 1, 64 << 10)), None).await, "upload").await;
    let create = server.post_json(&bundles(NS), &upload_bundle(NS, "refused")).await;
    expect_full(create, "create").await;
    let patch = server
        .client()
        .patch(server.url(&bundle(NS, "keep-0")))
        .header("Content-Type", "application/merge-patch+json")
        .body(r#"{"metadata":{"labels":{"a":"b"}}}"#)
        .send()
        .await
        .unwrap();
    expect_full(patch, "patch").await;
    let session =
        server.client().post(server.url(&format!("{}?uploads", bundle_content(NS, "keep-0")))).send().await.unwrap();
    expect_full(session, "chunked upload session").await;
    assert_reads_work(&server, &ledger, &kept, "in the reserve").await;
    // Deleting is how space comes back: allowed in the reserve.
    let resp = server.delete(&bundle(NS, "keep-2")).await;
    assert!(resp.status().is_success(), "delete in the reserve: {}", resp.status());
    ledger.bundle_deleted(NS, "keep-2");
    let kept = &kept[..2];

    // At the floor nothing is written at all (sled must never meet a full disk), reads still work.
    filler.leave_free(&tmpfs, MIB);
    let resp = server.delete(&bundle(NS, "keep-1")).await;
    expect_full(resp, "delete at the floor").await;
    assert_reads_work(&server, &ledger, kept, "at the floor").await;
    // A restart on the full disk: the store opens (recovery waits for space) and serves.
    server.restart();
    assert_reads_work(&server, &ledger, kept, "restarted at the floor").await;
    // The unpack's retries meet the floor too: one ended since the restart, failed for want of
    // space.
    eventually(WAIT, "the unpack retried at the floor", || async {
        let m = server.metrics().await;
        match m.get(r#"stowage_unpack_jobs_total{result="failed",reason="StorageFailed"}"#).copied() {
            Some(failed) if failed >= 1.0 => Ok(()),
            failed => Err(format!("failed unpack jobs since the restart: {failed:?}")),
        }
    })
    .await;
    wait_unpacked_reason(&server, "pulled", "StorageFailed").await;

    // Space comes back: writes succeed again, without a restart, and the unpack is retried.
    filler.remove();
    let b = server.upload_ok(NS, "keep-0", build_tar(&random_tree(60, 2, 256 << 10)), None).await;
    ledger.acknowledged(NS, &b);
    server.create_bundle(NS, "after").await;
    let b = server.upload_ok(NS, "after", build_tar(&random_tree(61, 2, 256 << 10)), None).await;
    ledger.acknowledged(NS, &b);
    let b = wait_unpacked_reason(&server, "pulled", "Unpacked").await;
    let tar = server.download(&bundle_content(NS, "pulled")).await;
    assert_eq!(digest_of(&tar), str_at(&b, "/status/digest"));
    ledger.acknowledged(NS, &b);
    verify_contents(&server, NS, &ledger, "after space came back").await;

    server.restart();
    assert_reads_work(&server, &ledger, &["keep-0", "keep-1", "after", "pulled"], "after a restart").await;
    report(&format!("full disk: {:.1}s", started.elapsed().as_secs_f64()));
}
