//! The OCI image source against a real registry (`docker-registry` on 127.0.0.1): what a user
//! would notice — the files of an image, platform selection, layers with whiteouts, every layer
//! encoding, pull secrets, tampered blobs, Helm charts, malicious layers, moved tags.
//! `resolve` and `fetch` are called directly with a sink that records the tree.

use std::io::Read;
use std::process::Command;
use std::sync::Arc;

use stowage::unpack::oci::{fetch, resolve};
use stowage::unpack::source::{Budget, Credentials, ImageSource, NetworkPolicy, SourceContext, UnpackLimits};
use stowage::unpack::{EntrySink, ResolvedSource, UnpackError};
use tokio_util::sync::CancellationToken;

use crate::harness::{corpus, eventually};
use crate::registry::{chart_tgz, Layer, Registry};
use crate::tarutil::{self, assert_trees_equal, file, Node, Tree};

/// Collects what a fetch writes (hard links as copies, like the real store).
#[derive(Default)]
struct Recorder(Tree);

impl EntrySink for Recorder {
    type Error = UnpackError;
    fn file(&mut self, path: &str, mode: u32, size: u64, data: &mut dyn Read) -> Result<(), UnpackError> {
        let mut bytes = Vec::new();
        data.read_to_end(&mut bytes).map_err(|e| UnpackError::from_io(path, e))?;
        assert_eq!(bytes.len() as u64, size, "{path}: the data is not the size announced");
        let exec = mode & 0o100 != 0;
        assert!(self.0.insert(path.to_owned(), Node::File { data: bytes, exec }).is_none(), "{path} twice");
        Ok(())
    }
    /// Directories are implied in [`Tree`]s.
    fn dir(&mut self, _: &str, _: u32) -> Result<(), UnpackError> {
        Ok(())
    }
    fn symlink(&mut self, path: &str, target: &str) -> Result<(), UnpackError> {
        assert!(self.0.insert(path.to_owned(), Node::Symlink(target.to_owned())).is_none(), "{path} twice");
        Ok(())
    }
    fn hardlink(&mut self, path: &str, target: &str) -> Result<(), UnpackError> {
        let node = self.0.get(target).cloned().expect("hard link target written before");
        self.0.insert(path.to_owned(), node);
        Ok(())
    }
}

fn init() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
}

fn context(reg_host: &str, credentials: Option<Credentials>, limits: UnpackLimits) -> SourceContext {
    SourceContext {
        runtime: tokio::runtime::Handle::current(),
        cancel: CancellationToken::new(),
        network: Arc::new(NetworkPolicy {
            insecure_registries: vec![reg_host.to_owned()],
            insecure_hosts: vec![],
            ..Default::default()
        }),
        credentials,
        limits,
        budget: Arc::new(Budget::default()),
        scratch: Default::default(),
        downloads: None,
    }
}

fn spec(reference: &str, platform: &str) -> ImageSource {
    ImageSource { reference: reference.to_owned(), platform: platform.to_owned(), ..Default::default() }
}

/// `resolve`, then `fetch` on a blocking thread, as the reconciler does.
async fn pull(spec: &ImageSource, ctx: &SourceContext) -> Result<(ResolvedSource, Tree), UnpackError> {
    let pinned = resolve(spec, ctx, None).await?;
    fetch_pinned(spec, ctx, pinned).await
}

async fn fetch_pinned(
    spec: &ImageSource,
    ctx: &SourceContext,
    pinned: ResolvedSource,
) -> Result<(ResolvedSource, Tree), UnpackError> {
    let (spec, ctx) = (spec.clone(), ctx.clone());
    tokio::task::spawn_blocking(move || {
        let mut rec = Recorder::default();
        let resolved = fetch(&spec, &ctx, &pinned, &mut rec)?;
        Ok((resolved, rec.0))
    })
    .await
    .expect("fetch panicked")
}

fn tree(entries: &[(&str, &str)]) -> Tree {
    entries.iter().map(|(p, d)| (p.to_string(), file(d.as_bytes()))).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn single_platform_image_has_the_corpus_files() {
    init();
    let reg = Registry::start().await;
    let expected = tarutil::tree_from_dir(&corpus().join("operator-registry/etcd"));
    let img = reg.push_image("bundles/etcd", "v1", &[Layer::gzip_tree(&expected)], "linux/amd64").await;

    // Another client reads the fixture as a normal image.
    let out = Command::new("skopeo")
        .args(["inspect", "--raw", "--tls-verify=false", &format!("docker://{}", reg.reference("bundles/etcd", "v1"))])
        .output()
        .expect("run skopeo (install the Debian package skopeo)");
    assert!(out.status.success(), "skopeo inspect: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(crate::registry::digest_of(&out.stdout), img.digest);

    let ctx = context(&reg.host(), None, UnpackLimits::default());
    let s = spec(&reg.reference("bundles/etcd", "v1"), "");
    let (resolved, got) = pull(&s, &ctx).await.expect("pull");
    assert_trees_equal(&expected, &got, "image");
    assert_eq!(resolved, ResolvedSource::image(&s.reference.clone(), img.digest.clone(), String::new()));
    // Re-resolving an unchanged tag says "unchanged" by returning an equal value.
    assert_eq!(resolve(&s, &ctx, Some(&resolved)).await.expect("re-resolve"), resolved);
    assert!(ctx.budget.downloaded() > 0, "downloaded bytes are counted for the expansion limit");
}

#[tokio::test(flavor = "multi_thread")]
async fn index_selects_the_platform_and_lists_the_available_ones() {
    init();
    let reg = Registry::start().await;
    let amd = reg.push_image("multi", "", &[Layer::gzip_tree(&tree(&[("arch", "amd64")]))], "linux/amd64").await;
    let arm = reg
        .push_image("multi", "", &[Layer::zstd(&tarutil::build_tar(&tree(&[("arch", "arm64")])))], "linux/arm64/v8")
        .await;
    let index = reg.push_index("multi", "latest", &[("linux/arm64/v8", &arm), ("linux/amd64", &amd)]).await;
    let ctx = context(&reg.host(), None, UnpackLimits::default());
    let reference = reg.reference("multi", "latest");

    let (resolved, got) = pull(&spec(&reference, ""), &ctx).await.expect("default platform");
    assert_eq!(got, tree(&[("arch", "amd64")]));
    assert_eq!(resolved, ResolvedSource::image(&reference.clone(), index.digest.clone(), amd.digest));

    let (resolved, got) = pull(&spec(&reference, "linux/arm64"), &ctx).await.expect("arm64");
    assert_eq!(got, tree(&[("arch", "arm64")]));
    assert!(matches!(resolved, ResolvedSource::Image { ref manifest, .. } if *manifest == arm.digest));

    let err = pull(&spec(&reference, "windows/amd64"), &ctx).await.expect_err("no such platform");
    let text = err.to_string();
    assert!(matches!(err, UnpackError::Unsupported(_)), "{err:?}");
    assert!(text.contains("linux/arm64/v8") && text.contains("linux/amd64"), "lists the platforms: {text}");

    // An index without linux/amd64: its only image is the default; with two, the user must choose.
    let only = reg.push_index("multi", "arm-only", &[("linux/arm64/v8", &arm)]).await;
    let (_, got) = pull(&spec(&reg.reference("multi", "arm-only"), ""), &ctx).await.expect("only entry");
    assert_eq!(got, tree(&[("arch", "arm64")]));
    let _ = only;
    let s390 = reg.push_image("multi", "", &[Layer::gzip_tree(&tree(&[("arch", "s390x")]))], "linux/s390x").await;
    reg.push_index("multi", "no-amd", &[("linux/arm64/v8", &arm), ("linux/s390x", &s390)]).await;
    let err = pull(&spec(&reg.reference("multi", "no-amd"), ""), &ctx).await.expect_err("ambiguous");
    assert!(matches!(err, UnpackError::Unsupported(ref m) if m.contains("linux/s390x")), "{err:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn layers_apply_in_order_with_whiteouts_and_opaque_dirs() {
    init();
    let reg = Registry::start().await;
    let base = tree(&[
        ("config", "old"),
        ("deleted", "gone"),
        ("dir/removed", "gone"),
        ("dir/kept", "kept"),
        ("opaque/old", "gone"),
        ("tree/a/b", "gone"),
        ("keep", "keep"),
    ]);
    let mut middle = tree(&[
        ("config", "new"),
        (".wh.deleted", ""),
        ("dir/.wh.removed", ""),
        ("opaque/.wh..wh..opq", ""),
        ("opaque/fresh", "fresh"),
        (".wh.tree", ""),
    ]);
    middle.insert("link".into(), Node::Symlink("keep".into()));
    let top = tree(&[("added", "top"), ("tree/new", "recreated")]);
    let layers =
        [Layer::gzip_tree(&base), Layer::zstd(&tarutil::build_tar(&middle)), Layer::tar(tarutil::build_tar(&top))];
    reg.push_image("layered", "v1", &layers, "linux/amd64").await;
    let ctx = context(&reg.host(), None, UnpackLimits::default());
    let (_, got) = pull(&spec(&reg.reference("layered", "v1"), ""), &ctx).await.expect("pull");
    let mut expected = tree(&[
        ("config", "new"),
        ("dir/kept", "kept"),
        ("opaque/fresh", "fresh"),
        ("keep", "keep"),
        ("added", "top"),
        ("tree/new", "recreated"),
    ]);
    expected.insert("link".into(), Node::Symlink("keep".into()));
    assert_trees_equal(&expected, &got, "flattened layers");
}

#[tokio::test(flavor = "multi_thread")]
async fn docker_schema2_images_and_unsupported_layers() {
    init();
    let reg = Registry::start().await;
    let content = tree(&[("manifests/a.yaml", "kind: ConfigMap\n")]);
    reg.push_docker_image("docker", "v1", &[Layer::docker_gzip(&tarutil::build_tar(&content))]).await;
    let ctx = context(&reg.host(), None, UnpackLimits::default());
    let (_, got) = pull(&spec(&reg.reference("docker", "v1"), ""), &ctx).await.expect("docker image");
    assert_eq!(got, content);

    let odd = Layer::raw("application/vnd.example.weird", b"?".to_vec());
    reg.push_image("odd", "v1", &[odd], "linux/amd64").await;
    let err = pull(&spec(&reg.reference("odd", "v1"), ""), &ctx).await.expect_err("unknown media type");
    assert!(matches!(err, UnpackError::Unsupported(ref m) if m.contains("vnd.example.weird")), "{err:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn pull_secrets_authenticate() {
    init();
    let reg = Registry::start_with_auth("robot", "s3cret:pass").await;
    let content = tree(&[("f", "private")]);
    reg.push_image("private/app", "v1", &[Layer::gzip_tree(&content)], "linux/amd64").await;
    let s = spec(&reg.reference("private/app", "v1"), "");

    let creds = Credentials::DockerConfig(reg.docker_config("robot", "s3cret:pass"));
    let ctx = context(&reg.host(), Some(creds), UnpackLimits::default());
    let (_, got) = pull(&s, &ctx).await.expect("with the pull secret");
    assert_eq!(got, content);

    let basic = Credentials::Basic { username: "robot".into(), password: "s3cret:pass".into() };
    let (_, got) = pull(&s, &context(&reg.host(), Some(basic), UnpackLimits::default())).await.expect("basic");
    assert_eq!(got, content);

    for creds in [None, Some(Credentials::DockerConfig(reg.docker_config("robot", "wrong")))] {
        let err = pull(&s, &context(&reg.host(), creds, UnpackLimits::default())).await.expect_err("unauthorized");
        assert!(matches!(err, UnpackError::Denied(_)) && !err.is_transient(), "{err:?}");
        assert!(err.to_string().contains("private/app"), "names the image: {err}");
    }
    // A digest-pinned fetch needs the credentials too.
    let pinned = resolve(&s, &ctx, None).await.expect("resolve");
    let err = fetch_pinned(&s, &context(&reg.host(), None, UnpackLimits::default()), pinned).await.expect_err("anon");
    assert!(matches!(err, UnpackError::Denied(_)), "{err:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn tampered_blob_is_a_digest_mismatch() {
    init();
    let reg = Registry::start().await;
    let content = tarutil::tree_from_dir(&corpus().join("rukpak-testdata/registry"));
    let layer = Layer::gzip_tree(&content);
    let layer_digest = crate::registry::digest_of(&layer.data);
    reg.push_image("tampered", "v1", std::slice::from_ref(&layer), "linux/amd64").await;
    reg.tamper_blob(&layer_digest);
    let ctx = context(&reg.host(), None, UnpackLimits::default());
    let err = pull(&spec(&reg.reference("tampered", "v1"), ""), &ctx).await.expect_err("tampered");
    assert!(matches!(err, UnpackError::DigestMismatch { ref what, .. } if what.contains(&layer_digest)), "{err:?}");
    assert!(!err.is_transient());

    // A manifest served with other bytes than its digest names.
    let other =
        reg.push_image("tampered-manifest", "v1", &[Layer::gzip_tree(&tree(&[("f", "x")]))], "linux/amd64").await;
    reg.tamper_blob(&other.digest);
    let s = spec(&reg.pinned("tampered-manifest", &other.digest), "");
    let err = pull(&s, &ctx).await.expect_err("tampered manifest");
    assert!(matches!(err, UnpackError::DigestMismatch { .. }), "{err:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn helm_chart_artifact() {
    init();
    let reg = Registry::start().await;
    let dir = corpus().join("kube-prometheus-stack/88.5.3");
    let tgz = chart_tgz(&dir, "kube-prometheus-stack");
    reg.push_helm_chart("charts/kube-prometheus-stack", "88.5.3", &tgz, "kube-prometheus-stack", "88.5.3").await;
    let ctx = context(&reg.host(), None, UnpackLimits::default());
    let (_, got) =
        pull(&spec(&reg.reference("charts/kube-prometheus-stack", "88.5.3"), ""), &ctx).await.expect("chart");
    let expected: Tree = tarutil::tree_from_dir(&dir)
        .into_iter()
        .map(|(path, node)| (format!("kube-prometheus-stack/{path}"), node))
        .collect();
    assert_trees_equal(&expected, &got, "chart");
    assert!(got.contains_key("kube-prometheus-stack/Chart.yaml"));

    // A signed chart also carries a provenance layer: not content, skipped.
    let small = tree(&[("mychart/Chart.yaml", "apiVersion: v2\nname: mychart\nversion: 0.1.0\n")]);
    let layers = [
        Layer::raw("application/vnd.cncf.helm.chart.content.v1.tar+gzip", tarutil::gzip(&tarutil::build_tar(&small))),
        Layer::raw(
            "application/vnd.cncf.helm.chart.provenance.v1.prov",
            b"-----BEGIN PGP SIGNED MESSAGE-----".to_vec(),
        ),
    ];
    reg.push_image("charts/mychart", "0.1.0", &layers, "linux/amd64").await;
    let (_, got) = pull(&spec(&reg.reference("charts/mychart", "0.1.0"), ""), &ctx).await.expect("signed chart");
    assert_eq!(got, small);
}

#[tokio::test(flavor = "multi_thread")]
async fn malicious_layers_are_refused() {
    init();
    let reg = Registry::start().await;
    let ctx = context(&reg.host(), None, UnpackLimits::default());
    let traversal = tarutil::raw_tar(&[tarutil::raw_entry("../x", b'0', b"x", "")]);
    let escape = tarutil::raw_tar(&[tarutil::raw_entry("l", b'2', b"", "../../etc/passwd")]);
    for (tag, tar) in [("traversal", traversal), ("escape", escape)] {
        reg.push_image("evil", tag, &[Layer::gzip(&tar)], "linux/amd64").await;
        let err = pull(&spec(&reg.reference("evil", tag), ""), &ctx).await.expect_err(tag);
        assert!(matches!(err, UnpackError::InvalidEntry { .. }), "{tag}: {err:?}");
    }
    // 64 MiB of zeros gzip to ~64 KiB: past a 1 MiB limit.
    let bomb = tarutil::build_tar(&[("zeros".to_string(), file(vec![0u8; 64 << 20]))].into_iter().collect());
    reg.push_image("evil", "bomb", &[Layer::gzip(&bomb)], "linux/amd64").await;
    let small = UnpackLimits { max_total_bytes: 1 << 20, ..UnpackLimits::default() };
    let err =
        pull(&spec(&reg.reference("evil", "bomb"), ""), &context(&reg.host(), None, small)).await.expect_err("bomb");
    assert!(matches!(err, UnpackError::TooLarge(_)), "{err:?}");
}

/// A registry that answers every manifest request with an endless body (no Content-Length):
/// the fetch stops at the 4 MiB manifest limit with `LimitExceeded`, having read a bounded amount.
#[tokio::test(flavor = "multi_thread")]
async fn an_endless_manifest_is_refused_at_the_limit() {
    use std::io::Write;
    init();
    let offered: u64 = 256 << 20;
    let sent = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counter = sent.clone();
    // Endless answers still being written: one ends when the client closes its connection.
    let writing = Arc::new(std::sync::atomic::AtomicI64::new(0));
    let writers = writing.clone();
    let host = crate::hostile_http::serve(move |request, stream| {
        if !request.path.contains("/manifests/") {
            let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}");
            return;
        }
        let head =
            "HTTP/1.1 200 OK\r\nContent-Type: application/vnd.oci.image.manifest.v1+json\r\nConnection: close\r\n\r\n";
        writers.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        crate::hostile_http::endless(stream, head, b' ', offered, &counter);
        writers.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    });
    let ctx = context(&host, None, UnpackLimits::default());
    let reference = format!("{host}/evil/endless@sha256:{}", "ab".repeat(32));
    let err = pull(&spec(&reference, ""), &ctx).await.expect_err("an endless manifest");
    assert!(matches!(err, UnpackError::TooLarge(_)), "{err:?}");
    assert!(err.to_string().contains("manifest"), "{err}");
    // The client hung up: the registry's writes fail and it stops sending.
    eventually(std::time::Duration::from_secs(10), "the endless answer ended", || async {
        match writing.load(std::sync::atomic::Ordering::SeqCst) {
            0 => Ok(()),
            n => Err(format!("{n} still being written")),
        }
    })
    .await;
    let read = sent.load(std::sync::atomic::Ordering::Relaxed);
    assert!(read < 64 << 20, "{read} bytes were sent before the client stopped reading");
}

#[tokio::test(flavor = "multi_thread")]
async fn moved_tags_resolve_anew_and_digests_need_no_registry() {
    init();
    let reg = Registry::start().await;
    let v1 = reg.push_image("app", "stable", &[Layer::gzip_tree(&tree(&[("v", "1")]))], "linux/amd64").await;
    let ctx = context(&reg.host(), None, UnpackLimits::default());
    let s = spec(&reg.reference("app", "stable"), "");
    let first = resolve(&s, &ctx, None).await.expect("resolve v1");
    assert!(matches!(first, ResolvedSource::Image { ref digest, .. } if *digest == v1.digest));

    let v2 = reg.push_image("app", "", &[Layer::gzip_tree(&tree(&[("v", "2")]))], "linux/amd64").await;
    reg.move_tag("app", "stable", &v2).await;
    let second = resolve(&s, &ctx, Some(&first)).await.expect("resolve v2");
    assert_ne!(second, first, "a moved tag is a change");
    assert!(matches!(second, ResolvedSource::Image { ref digest, .. } if *digest == v2.digest));
    let (_, got) = fetch_pinned(&s, &ctx, second).await.expect("fetch v2");
    assert_eq!(got, tree(&[("v", "2")]));
    // The pinned v1 is still fetchable after the tag moved.
    let (_, got) = fetch_pinned(&s, &ctx, first).await.expect("fetch pinned v1");
    assert_eq!(got, tree(&[("v", "1")]));

    let err = resolve(&spec(&reg.reference("app", "missing"), ""), &ctx, None).await.expect_err("missing tag");
    assert!(
        matches!(err, UnpackError::NotFound(ref m) if m.contains("app:missing")),
        "a missing tag may appear later: {err:?}"
    );

    let pinned = spec(&reg.pinned("app", &v1.digest), "");
    let cancelled = context(&reg.host(), None, UnpackLimits::default());
    cancelled.cancel.cancel();
    let err = pull(&pinned, &cancelled).await.expect_err("cancelled");
    assert!(matches!(err, UnpackError::Cancelled), "{err:?}");

    drop(reg);
    let resolved = resolve(&pinned, &ctx, None).await.expect("digest-pinned resolve without a registry");
    assert_eq!(resolved, ResolvedSource::image(&pinned.reference.clone(), v1.digest, String::new()));
    let err = pull(&s, &ctx).await.expect_err("registry gone");
    assert!(matches!(err, UnpackError::Fetch(_)), "{err:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn hard_links_are_copies_within_their_layer() {
    init();
    let reg = Registry::start().await;
    let ctx = context(&reg.host(), None, UnpackLimits::default());
    let linked = tarutil::raw_tar(&[
        tarutil::raw_entry("bin/tool", b'0', b"#!/bin/sh\n", ""),
        tarutil::raw_entry("bin/alias", b'1', b"", "bin/tool"),
    ]);
    reg.push_image("links", "ok", &[Layer::gzip(&linked)], "linux/amd64").await;
    let (_, got) = pull(&spec(&reg.reference("links", "ok"), ""), &ctx).await.expect("hard link");
    assert_eq!(got, tree(&[("bin/tool", "#!/bin/sh\n"), ("bin/alias", "#!/bin/sh\n")]));

    // The link's target was replaced by an upper layer: its original bytes are gone.
    let upper = Layer::gzip_tree(&tree(&[("bin/tool", "new")]));
    reg.push_image("links", "shadowed", &[Layer::gzip(&linked), upper], "linux/amd64").await;
    let err = pull(&spec(&reg.reference("links", "shadowed"), ""), &ctx).await.expect_err("shadowed target");
    assert!(matches!(err, UnpackError::InvalidEntry { ref path, .. } if path == "bin/alias"), "{err:?}");
}

/// Cancels its context when the first file arrives, then records as usual.
struct CancelOnFirstFile(CancellationToken, Recorder);

impl EntrySink for CancelOnFirstFile {
    type Error = UnpackError;
    fn file(&mut self, path: &str, mode: u32, size: u64, data: &mut dyn Read) -> Result<(), UnpackError> {
        self.0.cancel();
        self.1.file(path, mode, size, data)
    }
    fn dir(&mut self, path: &str, mode: u32) -> Result<(), UnpackError> {
        self.1.dir(path, mode)
    }
    fn symlink(&mut self, path: &str, target: &str) -> Result<(), UnpackError> {
        self.1.symlink(path, target)
    }
    fn hardlink(&mut self, path: &str, target: &str) -> Result<(), UnpackError> {
        self.1.hardlink(path, target)
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn cancellation_stops_a_download_midway() {
    init();
    let reg = Registry::start().await;
    let big: Tree = (0..4).map(|i| (format!("f{i}"), file(tarutil::random_bytes(i, 8 << 20)))).collect();
    reg.push_image("big", "v1", &[Layer::gzip_tree(&big)], "linux/amd64").await;
    let ctx = context(&reg.host(), None, UnpackLimits::default());
    let s = spec(&reg.reference("big", "v1"), "");
    let pinned = resolve(&s, &ctx, None).await.expect("resolve");
    let task_ctx = ctx.clone();
    let result = tokio::task::spawn_blocking(move || {
        let mut sink = CancelOnFirstFile(task_ctx.cancel.clone(), Recorder::default());
        fetch(&s, &task_ctx, &pinned, &mut sink)
    })
    .await
    .expect("fetch panicked");
    assert!(matches!(result, Err(UnpackError::Cancelled)), "{result:?}");
    assert!(ctx.budget.downloaded() < 32 << 20, "stopped before the whole layer: {}", ctx.budget.downloaded());
}
