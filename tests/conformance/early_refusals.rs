//! Early refusals reach HTTP/1.1 clients that are still sending a large body: a 404 for a missing
//! Bundle, a 400 for a Bundle without an upload source, a 413 for a declared length over
//! `--max-body-bytes` and the refusal of an anonymous client arrive as their Status with real curl
//! (`--http1.1`, no `Expect: 100-continue`, so the body is on its way when the answer comes) and
//! with Python requests (which sends the whole body before it reads anything). Before, the server
//! closed with unread bytes, the kernel reset the connection, and curl failed with `(55) Broken
//! pipe`, requests with `SSLEOFError`. Over HTTP/2 the same refusals reach curl too.

use std::path::Path;
use std::process::Command;

use crate::harness::*;
use crate::unpack::create;

const NS: &str = "unpack";
/// The body every refused request tries to send.
const BODY_BYTES: u64 = 64 << 20;

/// `curl --http1.1 -T FILE` (a PUT streamed from the file), as the admin or anonymous; returns
/// (exit code, stdout + stderr).
fn curl_put(server: &Server, path: &str, file: &Path, admin: bool) -> (i32, String) {
    curl_put_over(server, "--http1.1", path, file, admin)
}

/// [`curl_put`] over `http` (`--http1.1` or `--http2`, which curl negotiates by ALPN).
fn curl_put_over(server: &Server, http: &str, path: &str, file: &Path, admin: bool) -> (i32, String) {
    let pki = server.data_dir().join("pki");
    let mut curl = Command::new("curl");
    curl.args(["--silent", "--show-error", http, "--max-time", "60", "--noproxy", "*"])
        .arg("--cacert")
        .arg(pki.join("ca.crt"));
    if admin {
        curl.arg("--cert").arg(pki.join("admin.crt")).arg("--key").arg(pki.join("admin.key"));
    }
    let output = curl
        // No `Expect: 100-continue`: the body is sent at once, as most clients do.
        .args(["-H", "Expect:", "-H", "Content-Type: application/x-tar", "--write-out", "\nHTTP %{http_code}\n"])
        .arg("--upload-file")
        .arg(file)
        .arg(server.url(path))
        .output()
        .expect("run curl");
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    (output.status.code().unwrap_or(-1), text)
}

/// Python requests PUTting the file's bytes; returns (exit code, what it printed).
fn requests_put(server: &Server, path: &str, file: &Path) -> (i32, String) {
    let pki = server.data_dir().join("pki");
    let script = r#"
import sys, requests
url, ca, crt, key, body = sys.argv[1:6]
data = open(body, "rb").read()
try:
    r = requests.put(url, data=data, verify=ca, cert=(crt, key), timeout=60,
                     headers={"Content-Type": "application/x-tar"})
except Exception as e:
    print("EXCEPTION", type(e).__name__, e)
    sys.exit(3)
print("HTTP", r.status_code)
print(r.text)
"#;
    let output = Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(server.url(path))
        .arg(pki.join("ca.crt"))
        .arg(pki.join("admin.crt"))
        .arg(pki.join("admin.key"))
        .arg(file)
        .env("NO_PROXY", "*")
        .output()
        .expect("run python3");
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    (output.status.code().unwrap_or(-1), text)
}

fn assert_status_arrived(client: &str, (code, text): (i32, String), http: u16, reason: &str) {
    assert_eq!(code, 0, "{client} failed instead of reading the answer: {text}");
    assert!(text.contains(&format!("HTTP {http}")), "{client}: expected HTTP {http}: {text}");
    assert!(text.contains(r#""kind":"Status""#) && text.contains(reason), "{client}: the Status arrives: {text}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_early_refusal_reaches_curl_and_python_requests_on_http1() {
    assert!(
        Command::new("python3").args(["-c", "import requests"]).status().is_ok_and(|s| s.success()),
        "python3 with requests missing: install the Debian package python3-requests"
    );
    let server = Server::start_temp(&["--max-body-bytes", "1048576"]);
    let files = tempfile::tempdir().unwrap();
    let body = files.path().join("body.tar");
    std::fs::File::create(&body).unwrap().set_len(BODY_BYTES).unwrap();
    // A Bundle that takes no uploads (its only source is an http URL it never reaches).
    create(&server, "pulled", serde_json::json!({"sources": [{"http": {"url": "https://127.0.0.1:9/x.tar"}}]})).await;

    for _ in 0..2 {
        let missing = bundle_content(NS, "missing");
        assert_status_arrived("curl", curl_put(&server, &missing, &body, true), 404, "NotFound");
        assert_status_arrived("requests", requests_put(&server, &missing, &body), 404, "NotFound");
        let no_upload = bundle_content(NS, "pulled");
        assert_status_arrived("curl", curl_put(&server, &no_upload, &body, true), 400, "no upload source");
        assert_status_arrived("requests", requests_put(&server, &no_upload, &body), 400, "no upload source");
    }

    // Over --max-body-bytes by its Content-Length: refused before a byte is read.
    server.create_bundle(NS, "small").await;
    let small = bundle_content(NS, "small");
    assert_status_arrived("curl", curl_put(&server, &small, &body, true), 413, "--max-body-bytes");
    assert_status_arrived("requests", requests_put(&server, &small, &body), 413, "--max-body-bytes");

    // Refused before the handler: no client certificate, so no user.
    let (code, text) = curl_put(&server, &small, &body, false);
    assert_eq!(code, 0, "curl failed instead of reading the answer: {text}");
    assert!(text.contains("HTTP 401") || text.contains("HTTP 403"), "anonymous: {text}");
    assert!(text.contains(r#""kind":"Status""#), "anonymous: the Status arrives: {text}");

    // The server is unharmed and still answers.
    let b = server.get_json(&bundle(NS, "small")).await;
    assert_eq!(str_at(&b, "/metadata/name"), "small");
}

/// Over HTTP/2 (curl's default with TLS), a refusal sent before the body was read used to arrive
/// after a `RST_STREAM(CANCEL)`: curl 7.88 failed with `(92) Stream error in the HTTP/2 framing
/// layer` and no status. The body now outlives the answer, the reset says `NO_ERROR`.
#[tokio::test(flavor = "multi_thread")]
async fn an_early_refusal_reaches_curl_on_http2() {
    let server = Server::start_temp(&["--max-body-bytes", "1048576"]);
    let files = tempfile::tempdir().unwrap();
    let body = files.path().join("body.tar");
    std::fs::File::create(&body).unwrap().set_len(BODY_BYTES).unwrap();
    create(&server, "pulled-h2", serde_json::json!({"sources": [{"http": {"url": "https://127.0.0.1:9/x.tar"}}]}))
        .await;
    server.create_bundle(NS, "small-h2").await;
    for _ in 0..2 {
        let put = |path: String, admin| curl_put_over(&server, "--http2", &path, &body, admin);
        assert_status_arrived("curl --http2", put(bundle_content(NS, "missing"), true), 404, "NotFound");
        assert_status_arrived("curl --http2", put(bundle_content(NS, "pulled-h2"), true), 400, "no upload source");
        assert_status_arrived("curl --http2", put(bundle_content(NS, "small-h2"), true), 413, "--max-body-bytes");
        let (code, text) = put(bundle_content(NS, "small-h2"), false);
        assert_eq!(code, 0, "curl --http2 failed instead of reading the answer: {text}");
        assert!(text.contains("HTTP 401") || text.contains("HTTP 403"), "anonymous: {text}");
    }
    // An upload that is read goes through on the same protocol.
    let tar = files.path().join("ok.tar");
    std::fs::write(&tar, crate::tarutil::system_tar(&corpus().join("rukpak-testdata/plain-v0/valid"))).unwrap();
    let (code, text) = curl_put_over(&server, "--http2", &bundle_content(NS, "small-h2"), &tar, true);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("HTTP 200"), "the upload is accepted over HTTP/2: {text}");
}
