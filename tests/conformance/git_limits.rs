//! What a git source may cost the server, against a real `git http-backend`: a fetch larger than
//! `--max-git-fetch-bytes` is stopped with a plain message; the pack is downloaded under the data
//! directory (`DATA/tmp/git`, emptied at start), so it counts against the free-space reserve; and
//! a file is held in memory only up to `--max-git-file-bytes` (gix decodes objects whole, and
//! holds a pack entry's compressed bytes until the entry is complete).
//! An endless ref advertisement is cut at 32 MiB. Before, packs went to the system temp dir
//! whatever their size, a blob was loaded whole whatever its size (up to `--max-file-bytes`,
//! 16 GiB), and refs were read for as long as the server sent them.

use std::io::{Read, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use crate::git_server::GitServer;
use crate::harness::*;
use crate::tarutil::{random_bytes, XorReader};
use crate::tmpfs::Tmpfs;
use crate::unpack::{condition, create, wait_reason};

const MIB: u64 = 1 << 20;

/// Writes a file's bytes.
type Writer<'a> = &'a dyn Fn(&mut std::fs::File);

/// A repository whose `main` holds a plain bundle (one ConfigMap) and the given files under
/// `data/` (name, writer of its bytes).
fn repo_with(server: &GitServer, repo: &str, files: &[(&str, Writer)]) {
    let work = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(work.path().join("manifests")).unwrap();
    std::fs::create_dir_all(work.path().join("data")).unwrap();
    let config_map = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: data\n";
    std::fs::write(work.path().join("manifests").join("configmap.yaml"), config_map).unwrap();
    for (name, write) in files {
        let mut file = std::fs::File::create(work.path().join("data").join(name)).unwrap();
        write(&mut file);
    }
    server.create(repo);
    server.commit_dir(repo, "main", work.path());
}

fn git_source(server: &GitServer, repo: &str) -> serde_json::Value {
    json!({"sources": [{"git": {"repository": server.url(repo), "ref": {"branch": "main"}}}]})
}

fn message(b: &serde_json::Value) -> String {
    condition(b, "Unpacked")["message"].as_str().unwrap_or_default().to_owned()
}

/// Entries left in the git scratch directory of a data directory.
fn scratch_entries(data: &Path) -> Vec<String> {
    match std::fs::read_dir(data.join("tmp").join("git")) {
        Ok(entries) => entries.filter_map(Result::ok).map(|e| e.file_name().to_string_lossy().into_owned()).collect(),
        Err(e) => panic!("DATA/tmp/git: {e}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_git_fetch_over_the_cap_is_stopped_and_leaves_nothing_behind() {
    let git = GitServer::start().await;
    let random = |file: &mut std::fs::File| {
        std::io::copy(&mut XorReader::new(7, 32 * MIB), file).unwrap();
    };
    repo_with(&git, "big", &[("random.bin", &random)]);
    let small = |file: &mut std::fs::File| file.write_all(b"small\n").unwrap();
    repo_with(&git, "small", &[("README", &small)]);

    // What a crash left behind is removed when the server starts.
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let stale = data.join("tmp").join("git").join("fetch-left-by-a-crash");
    std::fs::create_dir_all(stale.join("objects")).unwrap();
    std::fs::write(stale.join("objects").join("pack.tmp"), random_bytes(1, MIB as usize)).unwrap();
    let cap = (8 * MIB).to_string();
    let server = Server::start(&data, &["--insecure-source-host", &git.host_port(), "--max-git-fetch-bytes", &cap]);
    assert!(!stale.exists(), "a stale fetch directory survived the start");

    create(&server, "big", git_source(&git, "big")).await;
    let b = wait_reason(&server, "big", "LimitExceeded").await;
    let text = message(&b);
    assert!(text.contains("--max-git-fetch-bytes") && text.contains(&cap), "names the limit: {text}");
    assert_eq!(scratch_entries(&data), Vec::<String>::new(), "the refused fetch's files are gone");

    create(&server, "small", git_source(&git, "small")).await;
    assert_unpacked(&wait_reason(&server, "small", "Unpacked").await);
    assert_eq!(scratch_entries(&data), Vec::<String>::new(), "a finished fetch's files are gone");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_git_fetch_counts_against_the_data_directory_reserve() {
    // 96 MiB that git cannot compress (zlib's window is 32 KiB) but the store keeps once (the
    // same 1 MiB block, deduplicated): only the pack itself can fill the disk.
    let git = GitServer::start().await;
    let block = random_bytes(3, MIB as usize);
    let repeated = |file: &mut std::fs::File| {
        for _ in 0..96 {
            file.write_all(&block).unwrap();
        }
    };
    repo_with(&git, "repeated", &[("repeated.bin", &repeated)]);
    let tmpfs = Tmpfs::mount(80 * MIB);
    let data = tmpfs.path().join("data");
    let reserve = (8 * MIB).to_string();
    let server = Server::start(&data, &["--insecure-source-host", &git.host_port(), "--min-free-bytes", &reserve]);
    let free_before = tmpfs.free();

    create(&server, "repeated", git_source(&git, "repeated")).await;
    let b = wait_reason(&server, "repeated", "StorageFailed").await;
    let text = message(&b);
    assert!(text.contains("git") && text.contains("--min-free-bytes"), "says the fetch ran out of space: {text}");
    // Between attempts (it is retried), the partial pack is gone and the space is back.
    eventually(Duration::from_secs(30), "the partial pack is removed", || async {
        let (entries, free) = (scratch_entries(&data), tmpfs.free());
        match entries.is_empty() && free + 8 * MIB > free_before {
            true => Ok(()),
            false => Err(format!("{entries:?}, {free} bytes free, {free_before} before")),
        }
    })
    .await;
    report(&format!("git fetch stopped by the reserve: {text}"));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_git_file_is_held_in_memory_only_up_to_the_configured_size() {
    let git = GitServer::start().await;
    let zeros = |size: u64| {
        move |file: &mut std::fs::File| {
            std::io::copy(&mut std::io::repeat(0).take(size), file).unwrap();
        }
    };
    let (huge, fits) = (zeros(256 * MIB), zeros(16 * MIB));
    repo_with(&git, "huge", &[("zeros.bin", &huge)]);
    repo_with(&git, "fits", &[("zeros.bin", &fits)]);
    // Incompressible: as big in the pack as on disk, where gix holds an entry's bytes until it is
    // complete.
    let noise = |file: &mut std::fs::File| {
        std::io::copy(&mut XorReader::new(11, 160 * MIB), file).unwrap();
    };
    repo_with(&git, "noise", &[("noise.bin", &noise)]);
    let limit = (64 * MIB).to_string();
    let server = Server::start_temp(&[
        "--insecure-source-host",
        &git.host_port(),
        "--max-git-file-bytes",
        &limit,
        // Zeros compress 1000x: this test is about memory, not about the ratio.
        "--max-expansion-ratio",
        "100000",
    ]);

    create(&server, "huge", git_source(&git, "huge")).await;
    let b = wait_reason(&server, "huge", "LimitExceeded").await;
    let text = message(&b);
    assert!(text.contains("--max-git-file-bytes") && text.contains(&limit), "names the limit: {text}");
    create(&server, "noise", git_source(&git, "noise")).await;
    let b = wait_reason(&server, "noise", "LimitExceeded").await;
    let text = message(&b);
    assert!(text.contains("--max-git-file-bytes") && text.contains(&limit), "names the limit: {text}");
    create(&server, "fits", git_source(&git, "fits")).await;
    assert_unpacked(&wait_reason(&server, "fits", "Unpacked").await);
    let peak = server.peak_rss_kib();
    assert!(peak < 160 << 10, "peak RSS {peak} KiB: a file over the limit was held in memory");
    report(&format!("git 256 MiB and 160 MiB files refused at 64 MiB: peak RSS {peak} KiB"));
}

/// A "git server" whose ref advertisement never ends (up to 512 MiB of refs); returns its
/// `HOST:PORT` and the bytes it got to send.
fn endless_refs_server() -> (String, Arc<AtomicU64>) {
    let sent = Arc::new(AtomicU64::new(0));
    let counter = sent.clone();
    let host = crate::hostile_http::serve(move |_request, stream| {
        let sha = "1".repeat(40);
        let mut head = String::from(
            "HTTP/1.1 200 OK\r\nContent-Type: application/x-git-upload-pack-advertisement\r\n\
             Connection: close\r\n\r\n001e# service=git-upload-pack\n0000",
        );
        let first = format!("{sha} HEAD\0multi_ack side-band-64k\n");
        head.push_str(&format!("{:04x}{first}", first.len() + 4));
        if stream.write_all(head.as_bytes()).is_err() {
            return;
        }
        let mut total = 0u64;
        for i in 0u64.. {
            let mut block = String::with_capacity(64 << 10);
            for j in 0..1000 {
                let ref_line = format!("{sha} refs/heads/b{:012}\n", i * 1000 + j);
                block.push_str(&format!("{:04x}{ref_line}", ref_line.len() + 4));
            }
            if total > 512 * MIB || stream.write_all(block.as_bytes()).is_err() {
                return;
            }
            total += block.len() as u64;
            counter.fetch_add(block.len() as u64, Ordering::Relaxed);
        }
    });
    (host, sent)
}

#[tokio::test(flavor = "multi_thread")]
async fn an_endless_ref_advertisement_is_cut_at_its_bound() {
    let (host, sent) = endless_refs_server();
    let server = Server::start_temp(&["--insecure-source-host", &host]);
    let source = json!({"sources": [{"git": {"repository": format!("http://{host}/endless.git")}}]});
    create(&server, "refs", source).await;
    let b = wait_reason(&server, "refs", "LimitExceeded").await;
    let (read, peak) = (sent.load(Ordering::Relaxed), server.peak_rss_kib());
    assert!(read < 64 * MIB, "the server got to send {read} bytes of refs (peak RSS {peak} KiB)");
    assert!(peak < 400 << 10, "peak RSS {peak} KiB while refusing an endless ref list");
    let text = message(&b);
    assert!(text.contains("bytes of refs"), "says what was too large: {text}");
    report(&format!("endless git refs: {read} bytes sent, peak RSS {peak} KiB: {text}"));
}
