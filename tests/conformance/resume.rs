//! Unpacks resumed after kill -9: a 1 GiB, 4-layer image downloads again only the layer that was
//! cut off, and only its rest (`Range`); an http file continues with `Range` + `If-Range`, and a
//! server that ignores `Range` still ends with the right content. The sources are reached through
//! an nginx that slows them down (so the kill lands mid-download) and logs every request with its
//! `Range`: the log is what the counts come from. The test watches the server's download spool
//! (`DATA_DIR/tmp/downloads/<uid>`) to know when to kill.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::Duration;

use serde_json::json;

use crate::harness::*;
use crate::http_server::run_nginx;
use crate::registry::{self, Layer, Registry};
use crate::tarutil::{random_bytes, summarize_served_tar, ChanReader, EntrySummary};
use crate::unpack::{create, http_server_args};

const NS: &str = "unpack";
const LAYER_BYTES: usize = 256 << 20;
const HTTP_FILE_BYTES: usize = 192 << 20;
const WAIT: Duration = Duration::from_secs(150);

#[tokio::test(flavor = "multi_thread")]
async fn a_restart_mid_image_downloads_again_only_the_rest_of_the_unfinished_layer() {
    let registry = Registry::start().await;
    let mut layers = Vec::new();
    let mut expected = BTreeMap::new();
    for i in 0..4u64 {
        let data = random_bytes(7000 + i, LAYER_BYTES);
        let (tar, files) = plain_bundle_tar(&format!("layer-{i}"), &data);
        expected.extend(files);
        layers.push(Layer::tar(tar));
    }
    let digests: Vec<String> = layers.iter().map(|l| registry::digest_of(&l.data)).collect();
    let sizes: BTreeMap<&str, u64> =
        digests.iter().map(String::as_str).zip(layers.iter().map(|l| l.data.len() as u64)).collect();
    registry.push_image("resume/big", "v1", &layers, "linux/amd64").await;
    drop(layers);
    let front = Nginx::start(&format!(
        "location / {{ proxy_pass http://{}; proxy_max_temp_file_size 0; proxy_http_version 1.1; \
         proxy_set_header Host $http_host; limit_rate 24m; }}",
        registry.host()
    ));
    let mut server = Server::start_temp(&["--insecure-registry", &front.host()]);
    let reference = format!("{}/resume/big:v1", front.host());
    create(&server, "big", json!({"sources": [{"image": {"ref": reference}}]})).await;
    let spool = spool_dir(&server, "big").await;

    // Kill once two layers are complete and the next one is well under way.
    let (complete, partial, at_kill) = eventually(WAIT, "two layers spooled and a third midway", || async {
        let (complete, partial) = spooled(&spool);
        match partial {
            Some((digest, len)) if complete.len() >= 2 && len >= 48 << 20 => Ok((complete, digest, len)),
            other => Err(format!("complete {complete:?}, partial {other:?}")),
        }
    })
    .await;
    server.kill9();
    assert!(at_kill < sizes[partial.as_str()], "the partial layer was whole at the kill");
    // The cut-off request is logged once nginx sees the connection close.
    let before = eventually(Duration::from_secs(20), "the interrupted GET logged", || async {
        let log = front.requests();
        match log.iter().any(|r| r.is_get_of(&partial)) {
            true => Ok(log.len()),
            false => Err(format!("{log:?}")),
        }
    })
    .await;
    let first_attempt = front.requests();

    server.restart();
    let b = wait_unpacked(&server, "big").await;
    let after: Vec<Request> = front.requests().into_iter().skip(before).collect();
    let gets = |digest: &str| after.iter().filter(|r| r.is_get_of(digest)).cloned().collect::<Vec<_>>();
    for digest in &complete {
        assert_eq!(gets(digest), vec![], "layer {digest} was complete at the kill, yet downloaded again");
    }
    let resumed = gets(&partial);
    assert_eq!(resumed.len(), 1, "the unfinished layer: {resumed:?}");
    let offset = resumed[0].range_start().unwrap_or_else(|| panic!("not a Range request: {:?}", resumed[0]));
    assert!(offset >= at_kill && offset < sizes[partial.as_str()], "Range from {offset}; {at_kill} bytes were on disk");
    assert_eq!(resumed[0].status, 206, "{resumed:?}");
    for digest in digests.iter().filter(|d| !complete.contains(d) && **d != partial) {
        let whole = gets(digest);
        assert!(whole.len() == 1 && whole[0].range.is_empty(), "layer {digest} not started before the kill: {whole:?}");
    }
    let again: u64 = after.iter().filter(|r| r.uri.contains("/blobs/")).map(|r| r.bytes).sum();
    let total: u64 = sizes.values().sum();
    let before_kill: u64 = first_attempt.iter().filter(|r| r.uri.contains("/blobs/")).map(|r| r.bytes).sum();
    report(&format!(
        "resume image: killed with {} of 4 layers complete and {} MiB of the next; after the restart {} blob GETs, \
         {} MiB downloaded (of {} MiB; {} MiB before the kill), the unfinished layer from byte {offset}, {} KiB twice",
        complete.len(),
        at_kill >> 20,
        after.iter().filter(|r| r.method == "GET" && r.uri.contains("/blobs/")).count(),
        again >> 20,
        total >> 20,
        before_kill >> 20,
        (again + before_kill).saturating_sub(total) >> 10
    ));
    // What was in flight at the kill (socket buffers, the spool's write buffer) comes twice.
    let overlap = (again + before_kill).saturating_sub(total);
    assert!(overlap < 24 << 20, "{overlap} bytes downloaded twice ({again} after the kill, {before_kill} before)");

    assert_served(&server, "big", &expected).await;
    assert_eq!(str_at(&b, "/status/resolvedSources/0/image/ref"), reference);
    wait_removed(&spool, Duration::from_secs(10), "the spool removed once committed").await;
}

/// A spooled layer damaged on disk while the server was down is caught by its digest, dropped,
/// and downloaded whole by the next attempt: the content served is still exactly the image's.
#[tokio::test(flavor = "multi_thread")]
async fn a_damaged_spool_is_dropped_and_downloaded_again() {
    let registry = Registry::start().await;
    let (mut layers, mut expected) = (Vec::new(), BTreeMap::new());
    for i in 0..2u64 {
        let (tar, files) = plain_bundle_tar(&format!("small-{i}"), &random_bytes(8000 + i, 64 << 20));
        expected.extend(files);
        layers.push(Layer::tar(tar));
    }
    registry.push_image("resume/small", "v1", &layers, "linux/amd64").await;
    let front = Nginx::start(&format!(
        "location / {{ proxy_pass http://{}; proxy_max_temp_file_size 0; proxy_http_version 1.1; limit_rate 16m; }}",
        registry.host()
    ));
    let mut server = Server::start_temp(&["--insecure-registry", &front.host()]);
    let reference = format!("{}/resume/small:v1", front.host());
    create(&server, "small", json!({"sources": [{"image": {"ref": reference}}]})).await;
    let spool = spool_dir(&server, "small").await;
    let (complete, partial) = eventually(WAIT, "one layer spooled and the next begun", || async {
        match spooled(&spool) {
            (complete, Some((partial, len))) if complete.len() == 1 && len >= 8 << 20 => Ok((complete, partial)),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    server.kill9();
    let damaged = spool.join(complete[0].replace(':', "-"));
    let mut bytes = std::fs::read(&damaged).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x20;
    std::fs::write(&damaged, bytes).unwrap();
    let before = eventually(Duration::from_secs(20), "the interrupted GET logged", || async {
        let log = front.requests();
        if log.iter().any(|r| r.is_get_of(&partial)) {
            Ok(log.len())
        } else {
            Err(format!("{log:?}"))
        }
    })
    .await;

    server.restart();
    wait_unpacked(&server, "small").await;
    assert_served(&server, "small", &expected).await;
    let after: Vec<Request> = front.requests().into_iter().skip(before).collect();
    let again: Vec<&Request> = after.iter().filter(|r| r.is_get_of(&complete[0])).collect();
    assert!(again.len() == 1 && again[0].range.is_empty(), "the damaged layer, downloaded whole: {again:?}");
    assert!(
        server.log().contains("which is dropped: the next attempt downloads it again"),
        "the failed attempt says why"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_restart_mid_http_download_continues_with_range() {
    http_resume(false).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_server_ignoring_range_still_ends_with_the_right_content() {
    http_resume(true).await;
}

/// kill -9 in the middle of an http download; after the restart, one more GET: a `Range` +
/// `If-Range` request, answered with the rest (`206`) or, by a server ignoring ranges, whole.
async fn http_resume(ignore_range: bool) {
    let data = random_bytes(if ignore_range { 41 } else { 42 }, HTTP_FILE_BYTES);
    let (tar, expected) = plain_bundle_tar("big", &data);
    drop(data);
    let ranges = if ignore_range { "max_ranges 0;" } else { "" };
    let web = Nginx::start(&format!("location / {{ root {{ROOT}}; limit_rate 16m; {ranges} }}"));
    std::fs::write(web.root().join("big.tar"), &tar).unwrap();
    let mut server = Server::start_temp(&http_server_args(&web.host()).iter().map(String::as_str).collect::<Vec<_>>());
    let url = format!("http://{}/big.tar", web.host());
    create(&server, "file", json!({"sources": [{"http": {"url": url}}]})).await;
    let spool = spool_dir(&server, "file").await;
    let at_kill = eventually(WAIT, "the download midway", || async {
        match spooled(&spool).1 {
            Some((_, len)) if len >= 24 << 20 => Ok(len),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    server.kill9();
    let before = eventually(Duration::from_secs(20), "the interrupted GET logged", || async {
        let log = front_gets(&web);
        if log.len() == 1 {
            Ok(web.requests().len())
        } else {
            Err(format!("{log:?}"))
        }
    })
    .await;
    // What no unfinished unpack will resume is swept at start.
    let stale = spool.with_file_name("0a1b2c3d-stale");
    std::fs::create_dir_all(&stale).unwrap();
    std::fs::write(stale.join("http-0123.partial"), b"left behind").unwrap();

    server.restart();
    wait_unpacked(&server, "file").await;
    assert!(!stale.exists(), "a stale spool survived the restart");
    let after: Vec<Request> = web.requests().into_iter().skip(before).filter(|r| r.method == "GET").collect();
    assert_eq!(after.len(), 1, "{after:?}");
    let offset = after[0].range_start().unwrap_or_else(|| panic!("not a Range request: {:?}", after[0]));
    assert!(offset >= at_kill && offset < tar.len() as u64, "Range from {offset}; {at_kill} bytes were on disk");
    assert!(!after[0].if_range.is_empty(), "no If-Range: {after:?}");
    let (status, sent) = (after[0].status, after[0].bytes);
    if ignore_range {
        assert_eq!((status, sent), (200, tar.len() as u64), "{after:?}");
    } else {
        assert_eq!((status, sent), (206, tar.len() as u64 - offset), "{after:?}");
    }
    report(&format!(
        "resume http{}: killed with {} MiB on disk; after the restart one GET from byte {offset}: {status}, {} MiB sent",
        if ignore_range { " (server ignoring Range)" } else { "" },
        at_kill >> 20,
        sent >> 20
    ));
    assert_served(&server, "file", &expected).await;
    assert!(!spool.exists(), "the spool outlived the commit");
    if ignore_range {
        return;
    }

    // A Bundle deleted mid-download takes its spool with it.
    create(&server, "gone", json!({"sources": [{"http": {"url": url}}]})).await;
    let spool = spool_dir(&server, "gone").await;
    eventually(WAIT, "the download begun", || async {
        match spooled(&spool).1 {
            Some((_, len)) if len > 0 => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let resp = server.delete(&bundle(NS, "gone")).await;
    assert!(resp.status().is_success(), "{}", resp.status());
    wait_removed(&spool, Duration::from_secs(30), "the deleted Bundle's spool removed").await;
}

fn front_gets(web: &Nginx) -> Vec<Request> {
    web.requests().into_iter().filter(|r| r.method == "GET").collect()
}

/// A plain bundle's tar: `manifests/NAME.yaml` (a ConfigMap) and `data/NAME.bin` holding `data`;
/// and what each file should be served as (size, sha256).
fn plain_bundle_tar(name: &str, data: &[u8]) -> (Vec<u8>, BTreeMap<String, (u64, String)>) {
    let manifest = format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n");
    let mut builder = tar::Builder::new(Vec::with_capacity(data.len() + 8192));
    let mut files = BTreeMap::new();
    for (path, bytes) in [(format!("manifests/{name}.yaml"), manifest.as_bytes()), (format!("data/{name}.bin"), data)] {
        let mut header = tar::Header::new_gnu();
        header.set_size(bytes.len() as u64);
        header.set_mode(0o644);
        header.set_entry_type(tar::EntryType::Regular);
        builder.append_data(&mut header, &path, bytes).unwrap();
        files.insert(path, (bytes.len() as u64, sha256_hex(bytes)));
    }
    (builder.into_inner().unwrap(), files)
}

async fn spool_dir(server: &Server, name: &str) -> PathBuf {
    let b = server.get_json(&bundle(NS, name)).await;
    server.data_dir().join("tmp/downloads").join(str_at(&b, "/metadata/uid"))
}

/// Waits until the spool directory `dir` is gone.
async fn wait_removed(dir: &Path, timeout: Duration, what: &str) {
    eventually(timeout, what, || async {
        match dir.exists() {
            true => Err(format!("{:?}", spooled(dir))),
            false => Ok(()),
        }
    })
    .await;
}

/// The complete downloads in a spool, and the partial one with its length.
fn spooled(dir: &Path) -> (Vec<String>, Option<(String, u64)>) {
    let (mut complete, mut partial) = (Vec::new(), None);
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().replace("sha256-", "sha256:");
        match name.strip_suffix(".partial") {
            Some(key) => partial = Some((key.to_owned(), entry.metadata().map(|m| m.len()).unwrap_or(0))),
            None => complete.push(name),
        }
    }
    complete.sort();
    (complete, partial)
}

async fn wait_unpacked(server: &Server, name: &str) -> serde_json::Value {
    eventually(WAIT, &format!("{name} unpacked after the restart"), || async {
        let b = server.get_json(&bundle(NS, name)).await;
        match b["status"]["phase"] == "Unpacked" {
            true => Ok(b),
            false => Err(format!("{}", b["status"])),
        }
    })
    .await
}

/// Every served file by size and sha256, streamed (the content is too big to hold twice).
async fn assert_served(server: &Server, name: &str, expected: &BTreeMap<String, (u64, String)>) {
    let (tx, rx) = std::sync::mpsc::sync_channel(16);
    let parser = std::thread::spawn(move || summarize_served_tar(ChanReader::new(rx)));
    let mut resp = server.client().get(server.url(&bundle_content(NS, name))).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    while let Some(chunk) = resp.chunk().await.expect("download interrupted") {
        tokio::task::block_in_place(|| tx.send(chunk)).expect("tar parser stopped");
    }
    drop(tx);
    let served: BTreeMap<String, EntrySummary> = parser.join().unwrap().expect("the served tar parses");
    let got: BTreeMap<String, (u64, String)> = served.into_iter().map(|(path, s)| (path, (s.size, s.sha256))).collect();
    assert_eq!(&got, expected, "served content of {name}");
}

/// One logged request.
#[derive(Clone, Debug, PartialEq)]
struct Request {
    method: String,
    uri: String,
    status: u16,
    range: String,
    if_range: String,
    bytes: u64,
}

impl Request {
    fn is_get_of(&self, digest: &str) -> bool {
        self.method == "GET" && self.uri.ends_with(&format!("/blobs/{digest}"))
    }

    fn range_start(&self) -> Option<u64> {
        self.range.strip_prefix("bytes=")?.strip_suffix('-')?.parse().ok()
    }
}

/// nginx on 127.0.0.1 with one `location` (`{ROOT}` stands for its www directory), logging each
/// request with its `Range` and `If-Range` headers and the bytes it sent.
struct Nginx {
    dir: tempfile::TempDir,
    port: u16,
    child: Child,
}

impl Nginx {
    fn start(location: &str) -> Nginx {
        let dir = tempfile::tempdir().unwrap();
        for sub in ["www", "tmp", "logs"] {
            std::fs::create_dir(dir.path().join(sub)).unwrap();
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let location = location.replace("{ROOT}", &format!("{}/www", dir.path().display()));
        let format = r#"$request_method $uri $status "$http_range" "$http_if_range" $body_bytes_sent"#;
        let server = format!("listen 127.0.0.1:{port};\n        client_max_body_size 0;\n        {location}");
        let child = run_nginx(dir.path(), port, Some(format), &server);
        Nginx { dir, port, child }
    }

    fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn root(&self) -> PathBuf {
        self.dir.path().join("www")
    }

    /// Every request logged so far, in order.
    fn requests(&self) -> Vec<Request> {
        let log = std::fs::read_to_string(self.dir.path().join("logs/access.log")).unwrap_or_default();
        log.lines()
            .filter_map(|line| {
                let quoted: Vec<&str> = line.split('"').collect();
                let head: Vec<&str> = quoted.first()?.split_whitespace().collect();
                let unquote = |s: &str| if s == "-" { String::new() } else { s.to_owned() };
                Some(Request {
                    method: head.first()?.to_string(),
                    uri: head.get(1)?.to_string(),
                    status: head.get(2)?.parse().ok()?,
                    range: unquote(quoted.get(1)?),
                    if_range: unquote(quoted.get(3)?),
                    bytes: quoted.get(4)?.trim().parse().ok()?,
                })
            })
            .collect()
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}
