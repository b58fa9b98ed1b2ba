//! Chunked, resumable uploads (`POST …/content?uploads`, `PATCH ?upload=ID` pieces, `PUT
//! ?upload=ID&digest=…` to commit): the result equals a single PUT of the same tar; pieces ingested
//! as they arrive, re-sent pieces, gaps, a kill -9 mid-session, a wrong digest, aborts, expiry and
//! foreign Bundles.

use std::path::Path;
use std::time::Duration;

use reqwest::{Response, StatusCode};
use serde_json::Value;

use crate::harness::*;
use crate::tarutil::*;

const NS: &str = "chunks";

fn session_url(server: &Server, name: &str, id: &str) -> String {
    server.url(&format!("{}?upload={id}", bundle_content(NS, name)))
}

async fn start(server: &Server, name: &str, encoding: Option<&str>) -> String {
    let mut req = server.client().post(server.url(&format!("{}?uploads", bundle_content(NS, name))));
    if let Some(enc) = encoding {
        req = req.header("Content-Encoding", enc);
    }
    let resp = req.send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    let location = header(resp.headers(), "location").unwrap_or_default().to_owned();
    assert_eq!(header(resp.headers(), "upload-offset"), Some("0"));
    let body = parse_json(&resp.bytes().await.unwrap(), "upload session");
    assert_eq!(body["offset"], 0, "{body:#}");
    let id = str_at(&body, "/uploadID").to_owned();
    assert!(location.ends_with(&format!("/bundles/{name}/content?upload={id}")), "Location {location:?}");
    id
}

async fn patch(server: &Server, name: &str, id: &str, start: u64, bytes: &[u8]) -> Response {
    let end = start + bytes.len() as u64 - 1;
    server
        .client()
        .patch(session_url(server, name, id))
        .header("Content-Range", format!("bytes {start}-{end}/*"))
        .body(bytes.to_vec())
        .send()
        .await
        .unwrap()
}

/// PATCHes `bytes` at `start`; asserts 202 and that the upload now ends at `start + len`.
async fn patch_ok(server: &Server, name: &str, id: &str, start: u64, bytes: &[u8]) {
    let resp = patch(server, name, id, start, bytes).await;
    let status = resp.status();
    let offset = (start + bytes.len() as u64).to_string();
    assert_eq!(header(resp.headers(), "upload-offset"), Some(offset.as_str()));
    let range = format!("0-{}", start + bytes.len() as u64 - 1);
    assert_eq!(header(resp.headers(), "range"), Some(range.as_str()));
    let body = resp.bytes().await.unwrap();
    assert_eq!(status, StatusCode::ACCEPTED, "{}", String::from_utf8_lossy(&body));
    assert_eq!(parse_json(&body, "piece")["offset"].to_string(), offset);
}

async fn offset(server: &Server, name: &str, id: &str) -> u64 {
    let resp = server.client().get(session_url(server, name, id)).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    u64_at(&parse_json(&resp.bytes().await.unwrap(), "upload status"), "/offset")
}

async fn commit(server: &Server, name: &str, id: &str, digest: &str) -> Response {
    let url = format!("{}&digest={digest}", session_url(server, name, id));
    server.client().put(url).send().await.unwrap()
}

async fn commit_ok(server: &Server, name: &str, id: &str, digest: &str) -> Value {
    let resp = commit(server, name, id, digest).await;
    let status = resp.status();
    let body = resp.bytes().await.unwrap();
    assert_eq!(status, StatusCode::OK, "commit: {}", String::from_utf8_lossy(&body[..body.len().min(2000)]));
    let b = parse_json(&body, "commit");
    assert_eq!(b["kind"], "Bundle");
    assert_unpacked(&b);
    b
}

/// Pieces of `data` at these boundaries.
fn cuts(len: usize, pieces: usize) -> Vec<(usize, usize)> {
    let step = len.div_ceil(pieces);
    (0..len).step_by(step).map(|s| (s, (s + step).min(len))).collect()
}

fn spool_files(server: &Server) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(server.data_dir().join("uploads"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[tokio::test(flavor = "multi_thread")]
async fn pieces_commit_to_the_same_content_as_one_put() {
    let server = Server::start_temp(&[]);
    let dir = corpus().join("kube-prometheus-stack/88.5.3");
    let tar = system_tar(&dir);
    server.create_bundle(NS, "whole").await;
    server.create_bundle(NS, "chunked").await;
    let whole = server.upload_ok(NS, "whole", tar.clone(), None).await;
    let digest = str_at(&whole, "/status/digest").to_owned();
    // Something served before, to see that a failed commit changes nothing.
    let small = system_tar(&corpus().join("operator-registry/etcd"));
    let before = server.upload_ok(NS, "chunked", small, None).await;

    let id = start(&server, "chunked", None).await;
    let pieces = cuts(tar.len(), 6);
    assert!(pieces.len() >= 5);
    for (i, &(s, e)) in pieces.iter().enumerate() {
        if i == 3 {
            // A re-sent piece whose first part already landed: the overlap is skipped.
            let back = s - 1000;
            patch_ok(&server, "chunked", &id, back as u64, &tar[back..e]).await;
        } else {
            patch_ok(&server, "chunked", &id, s as u64, &tar[s..e]).await;
        }
        if i == 1 {
            // A piece past the offset is a gap: 416, with the offset to resume from.
            let resp = patch(&server, "chunked", &id, e as u64 + 10, &tar[e + 10..e + 20]).await;
            assert_eq!(header(resp.headers(), "upload-offset"), Some(e.to_string().as_str()));
            assert_eq!(header(resp.headers(), "range"), Some(format!("0-{}", e - 1).as_str()));
            expect_status(resp, 416, "RequestedRangeNotSatisfiable").await;
            assert_eq!(offset(&server, "chunked", &id).await, e as u64);
        }
    }
    assert_eq!(offset(&server, "chunked", &id).await, tar.len() as u64);

    // The session belongs to its Bundle: another one does not know it.
    let resp = server.client().get(session_url(&server, "whole", &id)).send().await.unwrap();
    expect_status(resp, 404, "NotFound").await;
    let resp = patch(&server, "whole", &id, tar.len() as u64, b"x").await;
    expect_status(resp, 404, "NotFound").await;

    // A wrong digest: an error, nothing served changes, the session stays.
    let wrong = digest_of(b"something else");
    let status = expect_status(commit(&server, "chunked", &id, &wrong).await, 400, "BadRequest").await;
    assert!(status["message"].as_str().unwrap().contains("digest mismatch"), "{status:#}");
    let fetched = server.get_json(&bundle(NS, "chunked")).await;
    assert_eq!(fetched["status"]["digest"], before["status"]["digest"]);
    assert_eq!(offset(&server, "chunked", &id).await, tar.len() as u64);

    // `digest` names the bytes uploaded; status.digest the served (normalised) tar.
    let b = commit_ok(&server, "chunked", &id, &digest_of(&tar)).await;
    assert_eq!(str_at(&b, "/status/digest"), digest);
    let served = server.download(&bundle_content(NS, "chunked")).await;
    assert_eq!(digest_of(&served), digest);
    assert_trees_equal(&tree_from_dir(&dir), &parse_served_tar(&served), "chunked upload");
    // A committed session takes no more pieces and its bytes are gone; a re-sent commit (the
    // first response lost, or cut by the aggregator while it ran) answers with the Bundle.
    expect_status(patch(&server, "chunked", &id, 0, b"x").await, 409, "Conflict").await;
    assert_eq!(spool_files(&server), vec![format!("{id}.json")], "only the sidecar stays until it expires");
    let again = commit_ok(&server, "chunked", &id, &digest_of(&tar)).await;
    assert_eq!(str_at(&again, "/status/digest"), digest);

    // A commit whose client gives up at once still lands; re-sending it waits for it.
    let id = start(&server, "chunked", None).await;
    patch_ok(&server, "chunked", &id, 0, &tar).await;
    let url = format!("{}&digest={}", session_url(&server, "chunked", &id), digest_of(&tar));
    let cut = server.client().put(&url).timeout(std::time::Duration::from_millis(1)).send().await;
    assert!(cut.is_err(), "the client gave up before the answer");
    let b = commit_ok(&server, "chunked", &id, &digest_of(&tar)).await;
    assert_eq!(str_at(&b, "/status/digest"), digest);

    // A gzip session: encoding given at the start, pieces of the compressed bytes.
    let gz = gzip(&tar);
    let id = start(&server, "chunked", Some("gzip")).await;
    for (s, e) in cuts(gz.len(), 5) {
        patch_ok(&server, "chunked", &id, s as u64, &gz[s..e]).await;
    }
    let b = commit_ok(&server, "chunked", &id, &digest_of(&gz)).await;
    assert_eq!(str_at(&b, "/status/digest"), digest);
}

/// Revisions being written: a session's pieces are ingested as they arrive.
async fn staging_revisions(server: &Server) -> f64 {
    server.metrics().await.get(r#"stowage_revisions{state="staging"}"#).copied().unwrap_or(0.0)
}

async fn wait_staging(server: &Server, expected: f64, what: &str) {
    eventually(Duration::from_secs(20), what, || async {
        let found = staging_revisions(server).await;
        if found == expected {
            Ok(())
        } else {
            Err(format!("{found} staging revisions"))
        }
    })
    .await;
}

/// The pieces are ingested as they arrive (the commit then waits only for the last one): a
/// revision is being written from the first piece on, the commit serves it, an aborted session's
/// is released, and a spec changed after the first piece still decides the committed content.
#[tokio::test(flavor = "multi_thread")]
async fn pieces_are_ingested_as_they_arrive() {
    let server = Server::start_temp(&[]);
    let dir = corpus().join("kube-prometheus-stack/88.5.3");
    let tar = system_tar(&dir);
    server.create_bundle(NS, "early").await;
    let pieces = cuts(tar.len(), 4);

    let id = start(&server, "early", None).await;
    assert_eq!(staging_revisions(&server).await, 0.0);
    let (s, e) = pieces[0];
    patch_ok(&server, "early", &id, s as u64, &tar[s..e]).await;
    wait_staging(&server, 1.0, "a revision being written after the first piece").await;
    for &(s, e) in &pieces[1..] {
        patch_ok(&server, "early", &id, s as u64, &tar[s..e]).await;
    }
    let b = commit_ok(&server, "early", &id, &digest_of(&tar)).await;
    wait_staging(&server, 0.0, "the commit took the revision").await;
    let served = server.download(&bundle_content(NS, "early")).await;
    assert_eq!(digest_of(&served), str_at(&b, "/status/digest"));
    assert_trees_equal(&tree_from_dir(&dir), &parse_served_tar(&served), "pieces ingested as they arrived");

    // Aborted after two pieces: the revision being written is released.
    let id = start(&server, "early", None).await;
    for &(s, e) in &pieces[..2] {
        patch_ok(&server, "early", &id, s as u64, &tar[s..e]).await;
    }
    wait_staging(&server, 1.0, "a revision being written for the second session").await;
    let resp = server.client().delete(session_url(&server, "early", &id)).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::NO_CONTENT);
    wait_staging(&server, 0.0, "the aborted session's revision released").await;

    // The spec changes after the first piece (content now goes under a destination): the commit
    // checks against the spec it finds, as a commit ingesting only then would.
    let id = start(&server, "early", None).await;
    let (s, e) = pieces[0];
    patch_ok(&server, "early", &id, s as u64, &tar[s..e]).await;
    wait_staging(&server, 1.0, "a revision being written for the third session").await;
    let spec = serde_json::json!({"spec": {"sources": [{"upload": {}, "destination": "charts/kps"}]}});
    server.merge_patch_ok(&bundle(NS, "early"), &spec).await;
    for &(s, e) in &pieces[1..] {
        patch_ok(&server, "early", &id, s as u64, &tar[s..e]).await;
    }
    commit_ok(&server, "early", &id, &digest_of(&tar)).await;
    let served = parse_served_tar(&server.download(&bundle_content(NS, "early")).await);
    let paths: Vec<&String> = served.keys().collect();
    assert!(
        !paths.is_empty()
            && paths.iter().all(|p| p.starts_with("charts/kps/") || "charts/kps/".starts_with(p.as_str())),
        "every served path under the new destination: {paths:?}"
    );
    wait_staging(&server, 0.0, "nothing left being written").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sessions_survive_kill9_and_can_be_aborted() {
    let mut server = Server::start_temp(&[]);
    let dir = corpus().join("operator-registry/etcd");
    let tar = system_tar(&dir);
    server.create_bundle(NS, "app").await;
    let id = start(&server, "app", None).await;
    let pieces = cuts(tar.len(), 5);
    for &(s, e) in &pieces[..2] {
        patch_ok(&server, "app", &id, s as u64, &tar[s..e]).await;
    }
    server.kill9();
    server.restart();
    let resume = offset(&server, "app", &id).await;
    assert_eq!(resume, pieces[1].1 as u64);
    for (s, e) in cuts(tar.len() - resume as usize, 3) {
        let (s, e) = (s + resume as usize, e + resume as usize);
        patch_ok(&server, "app", &id, s as u64, &tar[s..e]).await;
    }
    let b = commit_ok(&server, "app", &id, &digest_of(&tar)).await;
    let committed = id.clone();
    let served = server.download(&bundle_content(NS, "app")).await;
    assert_eq!(digest_of(&served), str_at(&b, "/status/digest"));
    assert_trees_equal(&tree_from_dir(&dir), &parse_served_tar(&served), "resumed upload");

    // Abort: the session and its files are gone.
    let id = start(&server, "app", None).await;
    patch_ok(&server, "app", &id, 0, &tar[..1000]).await;
    assert!(spool_files(&server).contains(&id));
    let resp = server.client().delete(session_url(&server, "app", &id)).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::NO_CONTENT);
    expect_status(patch(&server, "app", &id, 1000, &tar[1000..2000]).await, 404, "NotFound").await;
    assert_eq!(spool_files(&server), vec![format!("{committed}.json")], "only the committed session's sidecar");
}

#[tokio::test(flavor = "multi_thread")]
async fn idle_sessions_are_swept() {
    let server = Server::start_temp(&["--upload-session-timeout", "1s", "--max-body-bytes", "100000"]);
    server.create_bundle(NS, "idle").await;
    let id = start(&server, "idle", None).await;
    patch_ok(&server, "idle", &id, 0, b"not much of a tar").await;
    // Not a tar: the commit fails like a single PUT of it would, and the session stays.
    let bytes = b"not much of a tar";
    let resp = commit(&server, "idle", &id, &digest_of(bytes)).await;
    assert!(resp.status().is_client_error(), "{}", resp.status());
    assert_eq!(offset(&server, "idle", &id).await, bytes.len() as u64);
    // More than --max-body-bytes in all: 413, the offset stays.
    let big = vec![b'x'; 60_000];
    let id2 = start(&server, "idle", None).await;
    patch_ok(&server, "idle", &id2, 0, &big).await;
    expect_status(patch(&server, "idle", &id2, 60_000, &big).await, 413, "RequestEntityTooLarge").await;
    assert_eq!(offset(&server, "idle", &id2).await, 60_000);
    assert!(server.data_dir().join("uploads").join(&id).is_file());
    let spool: &Path = &server.data_dir().join("uploads").join(&id);
    eventually(Duration::from_secs(15), "the idle session is swept", || async {
        if spool.exists() {
            Err(format!("{} still exists", spool.display()))
        } else {
            Ok(())
        }
    })
    .await;
    let resp = server.client().get(session_url(&server, "idle", &id)).send().await.unwrap();
    expect_status(resp, 404, "NotFound").await;
    assert!(spool_files(&server).is_empty(), "{:?}", spool_files(&server));
}

/// Every request of a chunked upload is authorized as the single PUT is: `update` on
/// `bundles/content`; reading content (`get`) is not enough to start, continue or inspect one.
#[tokio::test(flavor = "multi_thread")]
async fn chunked_uploads_need_update_on_bundles_content() {
    let policy = format!(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {{name: r, namespace: {NS}}}\n\
         rules: [{{apiGroups: [content.stowage.dev], resources: [bundles/content], verbs: [get]}}]\n---\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{name: r, namespace: {NS}}}\n\
         roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: r}}\n\
         subjects: [{{kind: User, name: reader}}]\n---\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {{name: w, namespace: {NS}}}\n\
         rules: [{{apiGroups: [content.stowage.dev], resources: [bundles/content], verbs: [update]}}]\n---\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{name: w, namespace: {NS}}}\n\
         roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: w}}\n\
         subjects: [{{kind: User, name: writer}}]\n"
    );
    let server = Server::start_with_users("reader-token,reader,2001,\"\"\nwriter-token,writer,2002,\"\"\n", &policy);
    server.create_bundle(NS, "app").await;
    let start_url = server.url(&format!("{}?uploads", bundle_content(NS, "app")));
    let as_reader = server.anonymous_client().post(&start_url).bearer_auth("reader-token").send().await.unwrap();
    expect_status(as_reader, 403, "Forbidden").await;
    let as_writer = server.anonymous_client().post(&start_url).bearer_auth("writer-token").send().await.unwrap();
    assert_eq!(as_writer.status(), StatusCode::ACCEPTED);
    let id = str_at(&parse_json(&as_writer.bytes().await.unwrap(), "session"), "/uploadID").to_owned();
    let url = session_url(&server, "app", &id);
    let peek = server.anonymous_client().get(&url).bearer_auth("reader-token").send().await.unwrap();
    expect_status(peek, 403, "Forbidden").await;
    let piece = server.anonymous_client().patch(&url).bearer_auth("reader-token").body("x").send().await.unwrap();
    expect_status(piece, 403, "Forbidden").await;
    let piece = server.anonymous_client().patch(&url).bearer_auth("writer-token").body("x").send().await.unwrap();
    assert_eq!(piece.status(), StatusCode::ACCEPTED);
    let abort = server.anonymous_client().delete(&url).bearer_auth("writer-token").send().await.unwrap();
    assert_eq!(abort.status(), StatusCode::NO_CONTENT);
}
