//! Range requests: a download cut off by a proxy resumes where it stopped, on the whole tar
//! stream and on single files; conditional requests.

use reqwest::StatusCode;

use crate::harness::*;
use crate::tarutil::*;

/// GET with extra headers; returns status, Content-Range and body.
async fn get_with(server: &Server, path: &str, headers: &[(&str, &str)]) -> (StatusCode, Option<String>, Vec<u8>) {
    let mut req = server.client().get(server.url(path));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status();
    let content_range = header(resp.headers(), "content-range").map(str::to_owned);
    let body = resp.bytes().await.unwrap().to_vec();
    (status, content_range, body)
}

/// Offsets in a served tar: (header position, data position, size) of every entry.
fn layout(tar: &[u8]) -> Vec<(u64, u64, u64)> {
    let mut archive = tar::Archive::new(tar);
    archive
        .entries()
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (e.raw_header_position(), e.raw_file_position(), e.size())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn whole_tar_download_resumes_in_ranges() {
    let server = Server::start_temp(&[]);
    let dir = corpus().join("kube-prometheus-stack/88.5.3");
    server.create_bundle("ns", "kps").await;
    let b = server.upload_ok("ns", "kps", system_tar(&dir), None).await;
    let digest = str_at(&b, "/status/digest").to_owned();
    let content_name = str_at(&b, "/status/contentName").to_owned();
    let etag = format!("\"{digest}\"");

    for path in [bundle_content("ns", "kps"), bundlecontent_content("ns", &content_name)] {
        // Where the cuts fall, from the served layout.
        let full = server.download(&path).await;
        let total = full.len() as u64;
        assert!(total > 4 << 20, "want a multi-MiB content, got {total} bytes");
        let entries = layout(&full);
        let (header_pos, _, _) =
            *entries.iter().find(|(h, _, _)| *h >= total / 3).expect("an entry past the first third");
        let cut1 = header_pos + 137; // inside a 512-byte header
        let (_, data_pos, size) = *entries
            .iter()
            .filter(|(_, d, s)| *d > cut1 && *s > 2)
            .max_by_key(|(_, _, s)| *s)
            .expect("a file after the first cut");
        let cut2 = data_pos + size / 2; // inside file data
        assert!(cut1 < cut2 && cut2 < total);

        // A download cut off after cut1 bytes, resumed twice.
        let mut joined = Vec::new();
        let plan = [format!("bytes=0-{}", cut1 - 1), format!("bytes={}-{}", cut1, cut2 - 1), format!("bytes={cut2}-")];
        let expected_ranges = [(0, cut1 - 1), (cut1, cut2 - 1), (cut2, total - 1)];
        for (range, (first, last)) in plan.iter().zip(expected_ranges) {
            let (status, content_range, body) =
                get_with(&server, &path, &[("Range", range), ("If-Range", &etag)]).await;
            assert_eq!(status, StatusCode::PARTIAL_CONTENT, "{path} {range}");
            assert_eq!(content_range, Some(format!("bytes {first}-{last}/{total}")), "{path} {range}: Content-Range");
            assert_eq!(body.len() as u64, last - first + 1, "{path} {range}: length");
            joined.extend_from_slice(&body);
        }
        assert_eq!(digest_of(&joined), digest, "{path}: resumed download");

        // If-Range with a stale ETag: the whole current content instead of a piece.
        let stale = format!("\"sha256:{}\"", "0".repeat(64));
        let (status, _, body) = get_with(&server, &path, &[("Range", "bytes=100-"), ("If-Range", &stale)]).await;
        assert_eq!(status, StatusCode::OK, "{path}: If-Range with a stale ETag");
        assert_eq!(digest_of(&body), digest);

        // If-None-Match with the current ETag: nothing to send.
        let (status, _, body) = get_with(&server, &path, &[("If-None-Match", &etag)]).await;
        assert_eq!(status, StatusCode::NOT_MODIFIED, "{path}: If-None-Match");
        assert!(body.is_empty());
        let (status, _, _) = get_with(&server, &path, &[("If-None-Match", &stale)]).await;
        assert_eq!(status, StatusCode::OK, "{path}: If-None-Match with another ETag");

        // Past the end.
        let past = format!("bytes={total}-");
        let (status, _, _) = get_with(&server, &path, &[("Range", &past)]).await;
        assert_eq!(status, StatusCode::RANGE_NOT_SATISFIABLE, "{path}: {past}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn single_file_ranges_and_conditionals() {
    let server = Server::start_temp(&[]);
    let dir = corpus().join("kube-prometheus-stack/88.5.3");
    let tree = tree_from_dir(&dir);
    let (path, data) = tree
        .iter()
        .filter_map(|(p, n)| match n {
            Node::File { data, .. } => Some((p.clone(), data.clone())),
            Node::Symlink(_) => None,
        })
        .max_by_key(|(_, d)| d.len())
        .unwrap();
    let size = data.len() as u64;
    assert!(size > 100_000, "want a big file, got {path} of {size} bytes");
    server.create_bundle("ns", "kps").await;
    server.upload_ok("ns", "kps", system_tar(&dir), None).await;
    let url = with_path(&bundle_content("ns", "kps"), &path);
    let etag = format!("\"sha256:{}\"", sha256_hex(&data));

    let (a, b) = (1000u64, size / 2);
    let range = format!("bytes={a}-{b}");
    let (status, content_range, body) = get_with(&server, &url, &[("Range", &range), ("If-Range", &etag)]).await;
    assert_eq!(status, StatusCode::PARTIAL_CONTENT, "{path} {range}");
    assert_eq!(content_range, Some(format!("bytes {a}-{b}/{size}")));
    assert!(body[..] == data[a as usize..=b as usize], "{path} {range}: bytes differ");

    let range = format!("bytes={}-", b + 1);
    let (status, _, rest) = get_with(&server, &url, &[("Range", &range)]).await;
    assert_eq!(status, StatusCode::PARTIAL_CONTENT, "{path} {range}");
    assert!(rest[..] == data[b as usize + 1..], "{path} {range}: bytes differ");

    let (status, _, body) = get_with(&server, &url, &[("If-None-Match", &etag)]).await;
    assert_eq!(status, StatusCode::NOT_MODIFIED, "{path}: If-None-Match");
    assert!(body.is_empty());

    let stale = format!("\"sha256:{}\"", "f".repeat(64));
    let (status, _, body) = get_with(&server, &url, &[("Range", "bytes=0-9"), ("If-Range", &stale)]).await;
    assert_eq!(status, StatusCode::OK, "{path}: If-Range with a stale ETag");
    assert!(body == data, "{path}: full body after a stale If-Range");

    let past = format!("bytes={}-{}", size + 10, size + 20);
    let (status, _, _) = get_with(&server, &url, &[("Range", &past)]).await;
    assert_eq!(status, StatusCode::RANGE_NOT_SATISFIABLE, "{path}: {past}");
}
