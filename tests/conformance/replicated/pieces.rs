//! Content uploaded in pieces spread over all three replicas (the chunked-upload protocol: the
//! session lives in the shared store) commits on yet another replica and reads back byte-identical
//! through each of them: the whole tar, the revision by name, and Range requests.

use futures_util::StreamExt;
use object_store::ObjectStore;
use reqwest::StatusCode;

use super::api::At;
use super::cluster::Cluster;
use crate::harness::*;
use crate::tarutil::*;

const NS: &str = "pieces";

#[tokio::test(flavor = "multi_thread")]
async fn pieces_over_all_replicas_commit_and_read_back_through_each() {
    let cluster = Cluster::start("pieces", 3, &[]).await;
    let at: Vec<At> = cluster.replicas.iter().map(|r| At::new(cluster.client(), r.url())).collect();
    let dir = corpus().join("kube-prometheus-stack/88.5.3");
    let tar = system_tar(&dir);
    at[0].create_bundle(NS, "chart").await;

    // Start on replica 0; pieces go to 1, 2, 0, 1, 2, …; the offset is asked of each in turn.
    let content = bundle_content(NS, "chart");
    let started =
        at[0].expect(at[0].client.post(at[0].url(&format!("{content}?uploads"))), StatusCode::ACCEPTED, "start").await;
    let id = str_at(&parse_json(&started, "session"), "/uploadID").to_owned();
    let session = format!("{content}?upload={id}");
    let step = tar.len().div_ceil(9);
    let mut pieces = 0;
    for (i, start) in (0..tar.len()).step_by(step).enumerate() {
        let end = (start + step).min(tar.len());
        let on = &at[(i + 1) % 3];
        let piece = on
            .client
            .patch(on.url(&session))
            .header("Content-Range", format!("bytes {start}-{}/*", end - 1))
            .body(tar[start..end].to_vec());
        let body = on.expect(piece, StatusCode::ACCEPTED, &format!("piece {i} ({start}-{end})")).await;
        assert_eq!(u64_at(&parse_json(&body, "piece"), "/offset"), end as u64, "piece {i} on replica {}", (i + 1) % 3);
        let asked = &at[(i + 2) % 3];
        let status = asked.get_json(&session).await;
        assert_eq!(u64_at(&status, "/offset"), end as u64, "offset seen by replica {} after piece {i}", (i + 2) % 3);
        pieces += 1;
    }
    assert!(pieces >= 9, "every replica took three pieces");

    // Committed on the replica that took neither the last piece nor the last offset question.
    let committer = &at[pieces % 3];
    let commit = committer.client.put(committer.url(&format!("{session}&digest={}", digest_of(&tar))));
    let b = parse_json(&committer.expect(commit, StatusCode::OK, "commit").await, "commit");
    assert_unpacked(&b);
    let digest = str_at(&b, "/status/digest").to_owned();
    let content_name = str_at(&b, "/status/contentName").to_owned();
    let expected = tree_from_dir(&dir);

    let mut whole: Option<Vec<u8>> = None;
    for (i, replica) in at.iter().enumerate() {
        let served = replica.download(&content).await;
        assert_eq!(digest_of(&served), digest, "replica {i}: the tar's sha256 is status.digest");
        assert_trees_equal(&expected, &parse_served_tar(&served), &format!("content through replica {i}"));
        let revision = replica.download(&bundlecontent_content(NS, &content_name)).await;
        assert!(revision == served, "replica {i}: bundlecontents/{content_name}/content is the same tar");
        if let Some(first) = &whole {
            assert!(first == &served, "replica {i} serves the same bytes as replica 0");
        }
        // Ranges: the start, one across the middle, the very end.
        let len = served.len() as u64;
        for (s, e) in [(0, 4095), (len / 2 - 100_000, len / 2 + 100_000), (len - 777, len - 1)] {
            let part = replica.range(&content, s, e).await;
            assert!(part == served[s as usize..=e as usize], "replica {i}: bytes {s}-{e} differ");
        }
        whole = Some(served);
    }
    let bundle_seen: Vec<String> = {
        let mut v = Vec::new();
        for replica in &at {
            v.push(str_at(&replica.get_json(&bundle(NS, "chart")).await, "/status/digest").to_owned());
        }
        v
    };
    assert_eq!(bundle_seen, vec![digest.clone(); 3], "every replica shows the committed digest");

    // The shared store holds it: objects under the etcd prefix, blocks in the bucket.
    assert!(cluster.etcd.count_prefix(&cluster.prefix).await > 0, "no keys under {} in etcd", cluster.prefix);
    let store = cluster.garage.s3.object_store();
    let objects: Vec<_> = store.list(None).take(1).collect().await;
    assert!(!objects.is_empty(), "the bucket holds no objects");
}
