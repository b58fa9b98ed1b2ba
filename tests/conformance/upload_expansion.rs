//! Uploads obey `--max-expansion-ratio` like pulled content: a gzip bomb (a ~1 MiB body holding a
//! 1 GiB file of zeros) is refused with 413 and a Status naming the limit, by a single PUT and
//! by a chunked upload session alike, and nothing is stored. Before, the body's bytes were not
//! counted at all, so an upload could expand 1,000x (an 8 MiB body became an 8 GiB file) while
//! the same bytes as an image layer were refused.

use std::io::Write;

use reqwest::StatusCode;

use crate::harness::*;
use crate::tarutil::{build_tar, gzip};
use crate::unpack::corpus_tree;

const NS: &str = "bombs";
const UNPACKED: u64 = 1 << 30;

/// A gzip'd tar of one file of `size` zero bytes, made by streaming zeros through gzip (the
/// unpacked bytes never exist at once).
fn gzip_bomb(size: u64) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    let mut header = tar::Header::new_ustar();
    header.set_path("bomb.bin").unwrap();
    header.set_size(size);
    header.set_mode(0o644);
    header.set_cksum();
    gz.write_all(header.as_bytes()).unwrap();
    let zeros = vec![0u8; 1 << 20];
    let mut left = size;
    while left > 0 {
        let n = left.min(zeros.len() as u64) as usize;
        gz.write_all(&zeros[..n]).unwrap();
        left -= n as u64;
    }
    gz.write_all(&vec![0u8; (size.next_multiple_of(512) - size) as usize + 1024]).unwrap();
    gz.finish().unwrap()
}

async fn assert_refused(resp: reqwest::Response, how: &str) {
    let status = resp.status();
    let body = resp.bytes().await.unwrap();
    let text = String::from_utf8_lossy(&body);
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{how}: {text}");
    let s = parse_json(&body, how);
    assert_eq!(s["kind"], "Status", "{how}: {s:#}");
    let message = str_at(&s, "/message");
    assert!(message.contains("--max-expansion-ratio") && message.contains("250x"), "{how}: names the limit: {message}");
}

async fn assert_nothing_stored(server: &Server, name: &str) {
    assert!(server.bundlecontent_names(NS).await.is_empty(), "no BundleContent after a refused upload");
    let b = server.get_json(&bundle(NS, name)).await;
    assert!(b.pointer("/status/digest").is_none(), "the Bundle points at no content: {b:#}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_gzip_bomb_upload_is_refused_by_the_expansion_ratio() {
    let bomb = gzip_bomb(UNPACKED);
    assert!(bomb.len() < 2 << 20, "a {}-byte bomb", bomb.len());
    let server = Server::start_temp(&[]);

    // A single PUT.
    server.create_bundle(NS, "single").await;
    let resp = server.upload(NS, "single", bomb.clone(), Some("gzip")).await;
    assert_refused(resp, "PUT").await;
    assert_nothing_stored(&server, "single").await;

    // A chunked upload session, committed.
    server.create_bundle(NS, "chunked").await;
    let content = bundle_content(NS, "chunked");
    let resp = server
        .client()
        .post(server.url(&format!("{content}?uploads")))
        .header("Content-Encoding", "gzip")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    let id = str_at(&parse_json(&resp.bytes().await.unwrap(), "session"), "/uploadID").to_owned();
    let session = server.url(&format!("{content}?upload={id}"));
    let resp = server.client().patch(&session).body(bomb.clone()).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    let resp = server.client().put(format!("{session}&digest={}", digest_of(&bomb))).send().await.unwrap();
    assert_refused(resp, "chunked commit").await;
    assert_nothing_stored(&server, "chunked").await;

    // Ordinary compressed uploads are unaffected.
    let tree = corpus_tree("rukpak-testdata/plain-v0/valid");
    server.upload_ok(NS, "single", gzip(&build_tar(&tree)), Some("gzip")).await;
}
