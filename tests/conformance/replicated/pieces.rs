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

/// A session outlives the replica it started on (kill -9): its next pieces, its offset and its
/// commit go to another replica. An abandoned session expires everywhere: its record leaves etcd
/// and its pieces leave the bucket.
#[tokio::test(flavor = "multi_thread")]
async fn sessions_outlive_their_replica_and_expire_from_the_shared_store() {
    let mut cluster = Cluster::start("sessions", 2, &["--upload-session-timeout", "6s"]).await;
    let client = cluster.client().clone();
    let (first, second) = (At::new(&client, cluster.replicas[0].url()), At::new(&client, cluster.replicas[1].url()));
    let tar = system_tar(&corpus().join("rukpak-testdata"));
    second.create_bundle(NS, "survivor").await;
    second.create_bundle(NS, "abandoned").await;

    let half = tar.len() / 2;
    let survivor = format!("{}?upload={}", bundle_content(NS, "survivor"), start_session(&first, "survivor").await);
    send_piece(&first, survivor.clone(), 0, tar[..half].to_vec()).await;
    let abandoned = start_session(&first, "abandoned").await;
    let abandoned_session = format!("{}?upload={abandoned}", bundle_content(NS, "abandoned"));
    send_piece(&first, abandoned_session.clone(), 0, tar[..half].to_vec()).await;

    cluster.replicas[0].kill9();
    assert_eq!(
        u64_at(&second.get_json(&survivor).await, "/offset"),
        half as u64,
        "the offset, asked of the other replica"
    );
    send_piece(&second, survivor.clone(), half, tar[half..].to_vec()).await;
    let commit = second.client.put(second.url(&format!("{survivor}&digest={}", digest_of(&tar))));
    let b = parse_json(&second.expect(commit, StatusCode::OK, "commit on the other replica").await, "commit");
    assert_unpacked(&b);
    assert_eq!(digest_of(&second.download(&bundle_content(NS, "survivor")).await), str_at(&b, "/status/digest"));

    // Expiry: the surviving replica leads once the killed one's lease is gone, and sweeps.
    let record = format!("{}/uploads/{abandoned}", cluster.prefix);
    assert_eq!(cluster.etcd.count_prefix(&record).await, 1, "the abandoned session's record is in etcd");
    let pieces = || async {
        let store = cluster.garage.s3.object_store();
        let prefix = object_store::path::Path::from(format!("uploads/{abandoned}"));
        store.list(Some(&prefix)).collect::<Vec<_>>().await.len()
    };
    assert!(pieces().await > 0, "the abandoned session's piece is in the bucket");
    let every = std::time::Duration::from_millis(500);
    eventually_every(std::time::Duration::from_secs(40), every, "the abandoned session removed", || async {
        match (cluster.etcd.count_prefix(&record).await, pieces().await) {
            (0, 0) => Ok(()),
            (records, pieces) => Err(format!("{records} record(s) in etcd, {pieces} piece(s) in the bucket")),
        }
    })
    .await;
    let gone = second.client.get(second.url(&abandoned_session)).send().await.expect("ask for the session");
    assert_eq!(gone.status(), StatusCode::NOT_FOUND, "an expired session is gone");
}

async fn start_session(at: &At<'_>, name: &str) -> String {
    let url = at.url(&format!("{}?uploads", bundle_content(NS, name)));
    let body = at.expect(at.client.post(url), StatusCode::ACCEPTED, "start").await;
    str_at(&parse_json(&body, "session"), "/uploadID").to_owned()
}

async fn send_piece(at: &At<'_>, session: String, start: usize, bytes: Vec<u8>) {
    let end = start + bytes.len();
    let piece =
        at.client.patch(at.url(&session)).header("Content-Range", format!("bytes {start}-{}/*", end - 1)).body(bytes);
    at.expect(piece, StatusCode::ACCEPTED, &format!("piece {start}-{end}")).await;
}

/// Pieces larger than the server buffers go to the bucket as multipart uploads: a 30 MiB archive
/// sent as a 20 MiB piece to one replica and the rest to another commits and reads back whole.
#[tokio::test(flavor = "multi_thread")]
async fn large_pieces_commit_across_replicas() {
    let cluster = Cluster::start("largepieces", 2, &[]).await;
    let client = cluster.client().clone();
    let (first, second) = (At::new(&client, cluster.replicas[0].url()), At::new(&client, cluster.replicas[1].url()));
    let expected: Tree =
        [("big.bin".to_owned(), file(random_bytes(17, 30 << 20))), ("small.yaml".to_owned(), file("kind: Small\n"))]
            .into_iter()
            .collect();
    let entries: Entries = expected
        .iter()
        .map(|(path, node)| match node {
            Node::File { data, .. } => (path.clone(), Entry::File { data: data.clone(), mode: 0o644 }),
            Node::Symlink(target) => (path.clone(), Entry::Symlink(target.clone())),
        })
        .collect();
    let tar = tar_of_entries(&entries);
    first.create_bundle(NS, "large").await;
    let session = format!("{}?upload={}", bundle_content(NS, "large"), start_session(&first, "large").await);
    let cut = 20 << 20;
    send_piece(&first, session.clone(), 0, tar[..cut].to_vec()).await;
    send_piece(&second, session.clone(), cut, tar[cut..].to_vec()).await;
    let commit = first.client.put(first.url(&format!("{session}&digest={}", digest_of(&tar))));
    let b = parse_json(&first.expect(commit, StatusCode::OK, "commit").await, "commit");
    assert_unpacked(&b);
    let served = second.download(&bundle_content(NS, "large")).await;
    assert_eq!(digest_of(&served), str_at(&b, "/status/digest"));
    assert_trees_equal(&expected, &parse_served_tar(&served), "the large upload");
}
