//! A 1 GiB bundle, generated while it is sent and checked while it is received, round-trips with
//! the server's peak memory staying far below the content size.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use sha2::{Digest, Sha256};

use crate::harness::*;
use crate::tarutil::*;

const GIB: u64 = 1 << 30;
const BIG_FILES: usize = 4;
const SMALL_FILES: usize = 3000;
const MAX_PEAK_RSS_KIB: u64 = 150 << 10;
const PHASE_TIMEOUT: Duration = Duration::from_secs(15 * 60);

fn mb_per_s(bytes: u64, elapsed: Duration) -> f64 {
    bytes as f64 / 1e6 / elapsed.as_secs_f64()
}

#[tokio::test(flavor = "multi_thread")]
async fn one_gib_bundle_round_trips_in_bounded_memory() {
    let server = Server::start_temp(&[]);
    let small_total = synth_total_size(&synth_files(42, 0, 0, SMALL_FILES));
    let big_size = (GIB - small_total) / BIG_FILES as u64;
    let files = synth_files(42, BIG_FILES, big_size, SMALL_FILES);
    let total = synth_total_size(&files);
    assert!(total > GIB - 8 && total <= GIB);
    server.create_bundle("big", "gib").await;

    // Upload, generating the tar on the fly.
    let stream = stream_tar(files.clone());
    let started = Instant::now();
    let resp = tokio::time::timeout(PHASE_TIMEOUT, server.try_upload("big", "gib", stream.body, None))
        .await
        .expect("upload timed out")
        .expect("upload failed");
    let status = resp.status();
    let body = resp.bytes().await.unwrap();
    let upload_time = started.elapsed();
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let sent = stream.sent.load(Ordering::Relaxed);
    let expected = stream.done.join().unwrap().expect("tar generator");
    let b = parse_json(&body, "upload response");
    assert_unpacked(&b);
    assert_eq!(u64_at(&b, "/status/files"), files.len() as u64);
    assert_eq!(u64_at(&b, "/status/size"), total);
    let digest = str_at(&b, "/status/digest").to_owned();
    let rss_after_upload = server.peak_rss_kib();
    report(&format!(
        "1 GiB upload: {sent} bytes in {upload_time:.1?} = {:.0} MB/s, server peak RSS {} MiB",
        mb_per_s(sent, upload_time),
        rss_after_upload >> 10
    ));

    // Download while hashing; another thread parses the tar and hashes every file.
    let (tx, rx) = std::sync::mpsc::sync_channel(16);
    let parser = std::thread::spawn(move || summarize_served_tar(ChanReader::new(rx)));
    let started = Instant::now();
    let (received, tar_digest) = tokio::time::timeout(PHASE_TIMEOUT, async {
        let mut resp =
            server.client().get(server.url(&bundle_content("big", "gib"))).send().await.expect("GET content");
        assert_eq!(resp.status(), StatusCode::OK);
        let mut hasher = Sha256::new();
        let mut n = 0u64;
        while let Some(chunk) = resp.chunk().await.expect("download interrupted") {
            hasher.update(&chunk);
            n += chunk.len() as u64;
            tokio::task::block_in_place(|| tx.send(chunk)).expect("tar parser stopped");
        }
        (n, format!("sha256:{}", hex::encode(hasher.finalize())))
    })
    .await
    .expect("download timed out");
    let download_time = started.elapsed();
    drop(tx);
    let served: BTreeMap<String, EntrySummary> = parser.join().unwrap().expect("the served tar parses");
    report(&format!(
        "1 GiB download: {received} bytes in {download_time:.1?} = {:.0} MB/s",
        mb_per_s(received, download_time)
    ));
    assert_eq!(tar_digest, digest, "sha256 of the downloaded tar");

    // Every file, byte for byte (by hash).
    assert_eq!(served.len(), files.len(), "number of files served");
    for f in &files {
        let got = served.get(&f.path).unwrap_or_else(|| panic!("{} missing from the download", f.path));
        assert_eq!(got.size, f.size, "{}: size", f.path);
        assert_eq!(got.sha256, expected[&f.path], "{}: content", f.path);
        assert_eq!(got.exec, f.exec, "{}: mode", f.path);
    }

    // Spot checks through `?path=`: a few small files, one big one streamed.
    for f in [&files[BIG_FILES], &files[BIG_FILES + 1234], &files[files.len() - 1]] {
        let data = server.download(&with_path(&bundle_content("big", "gib"), &f.path)).await;
        assert_eq!(sha256_hex(&data), expected[&f.path], "?path={}", f.path);
    }
    let f = &files[BIG_FILES - 1];
    let mut resp = server
        .client()
        .get(server.url(&with_path(&bundle_content("big", "gib"), &f.path)))
        .send()
        .await
        .expect("GET one big file");
    assert_eq!(resp.status(), StatusCode::OK);
    let mut hasher = Sha256::new();
    let mut n = 0u64;
    while let Some(chunk) = resp.chunk().await.unwrap() {
        hasher.update(&chunk);
        n += chunk.len() as u64;
    }
    assert_eq!(n, f.size, "?path={}: length", f.path);
    assert_eq!(hex::encode(hasher.finalize()), expected[&f.path], "?path={}", f.path);

    let peak = server.peak_rss_kib();
    report(&format!("1 GiB round trip: server peak RSS {} MiB", peak >> 10));
    assert!(
        peak < MAX_PEAK_RSS_KIB,
        "server peak RSS {} KiB ≥ {} KiB while handling a 1 GiB bundle",
        peak,
        MAX_PEAK_RSS_KIB
    );
}

/// The registry view's 1 GiB layer, pulled by skopeo: the server's peak memory (measured from a
/// restart, so it covers the pull alone) stays far below the content size.
#[tokio::test(flavor = "multi_thread")]
async fn one_gib_bundle_pulls_through_the_registry_view_in_bounded_memory() {
    let mut server = Server::start_temp(&[]);
    let small_total = synth_total_size(&synth_files(7, 0, 0, SMALL_FILES));
    let files = synth_files(7, BIG_FILES, (GIB - small_total) / BIG_FILES as u64, SMALL_FILES);
    server.create_bundle("big", "gib").await;
    let stream = stream_tar(files);
    let resp = tokio::time::timeout(PHASE_TIMEOUT, server.try_upload("big", "gib", stream.body, None))
        .await
        .expect("upload timed out")
        .expect("upload failed");
    assert_eq!(resp.status(), StatusCode::OK);
    let b = parse_json(&resp.bytes().await.unwrap(), "upload response");
    let digest = str_at(&b, "/status/digest").to_owned();
    server.restart();

    // skopeo with the admin's client certificate, as docs/registry.md shows it.
    let work = tempfile::tempdir().unwrap();
    let certs = work.path().join("certs");
    std::fs::create_dir(&certs).unwrap();
    let pki = server.data_dir().join("pki");
    for (from, to) in [("ca.crt", "ca.crt"), ("admin.crt", "admin.cert"), ("admin.key", "admin.key")] {
        std::fs::copy(pki.join(from), certs.join(to)).unwrap();
    }
    let host = server.url.trim_start_matches("https://").to_string();
    let layout = work.path().join("layout");
    let started = Instant::now();
    let output = std::process::Command::new("skopeo")
        .args(["copy", "--preserve-digests", "--src-cert-dir", certs.to_str().unwrap()])
        .arg(format!("docker://{host}/big/gib:latest"))
        .arg(format!("oci:{}:latest", layout.display()))
        .output()
        .expect("run skopeo");
    let elapsed = started.elapsed();
    assert!(output.status.success(), "skopeo copy: {}", String::from_utf8_lossy(&output.stderr));
    let layer = layout.join("blobs/sha256").join(digest.trim_start_matches("sha256:"));
    let size = std::fs::metadata(&layer).expect("the layer is the served tar, under its digest").len();
    let mut hasher = Sha256::new();
    let mut file = std::fs::File::open(&layer).unwrap();
    let mut buffer = vec![0u8; 1 << 20];
    loop {
        let n = std::io::Read::read(&mut file, &mut buffer).unwrap();
        if n == 0 {
            break;
        }
        hasher.update(&buffer[..n]);
    }
    assert_eq!(format!("sha256:{}", hex::encode(hasher.finalize())), digest);
    let peak = server.peak_rss_kib();
    report(&format!(
        "1 GiB skopeo pull from the registry view: {size} bytes in {elapsed:.1?} = {:.0} MB/s, server peak RSS {} MiB",
        mb_per_s(size, elapsed),
        peak >> 10
    ));
    assert!(peak < MAX_PEAK_RSS_KIB, "server peak RSS {} MiB during a 1 GiB pull", peak >> 10);
}
