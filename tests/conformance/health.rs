//! `/livez`, `/readyz` and `/healthz` as kube-apiserver answers them: `ok`, the per-check list
//! with `?verbose`, `?exclude=`, and one check at `/readyz/NAME` behind authorization. (Failing
//! checks: the replicated tests stop etcd and the bucket.)

use crate::harness::*;

async fn text(server: &Server, client: &reqwest::Client, path: &str) -> (u16, String) {
    let resp = client.get(server.url(path)).send().await.unwrap();
    (resp.status().as_u16(), resp.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread")]
async fn health_lists_each_check_as_kube_does() {
    let server = Server::start_temp(&[]);
    let anonymous = server.anonymous_client();
    for (path, listing) in [
        ("/readyz?verbose", "[+]ping ok\n[+]shutdown ok\n[+]store ok\nreadyz check passed\n"),
        ("/livez?verbose", "[+]ping ok\n[+]store ok\nlivez check passed\n"),
        ("/healthz?verbose=true", "[+]ping ok\n[+]store ok\nhealthz check passed\n"),
        ("/readyz?verbose&exclude=store", "[+]ping ok\n[+]shutdown ok\n[+]store excluded: ok\nreadyz check passed\n"),
        (
            "/livez?verbose&exclude=nope",
            "[+]ping ok\n[+]store ok\nwarn: some health checks cannot be excluded: no matches for \"nope\"\nlivez check passed\n",
        ),
        ("/readyz", "ok"),
        ("/livez?exclude=store", "ok"),
    ] {
        // Public, as kube's system:public-info-viewer makes them.
        assert_eq!(text(&server, &anonymous, path).await, (200, listing.to_owned()), "{path}");
    }
    // One check: its answer, for a user allowed `/readyz/*` (kube's system:monitoring).
    for path in ["/readyz/ping", "/readyz/shutdown", "/readyz/store", "/livez/store", "/healthz/ping"] {
        assert_eq!(text(&server, server.client(), path).await, (200, "ok".to_owned()), "{path}");
        let (code, body) = text(&server, &anonymous, path).await;
        assert_eq!(code, 403, "{path} anonymously: {body}");
    }
    for path in ["/readyz/etcd", "/livez/shutdown", "/readyz/nope"] {
        let (code, body) = text(&server, server.client(), path).await;
        assert_eq!(code, 404, "{path} names no check of this server: {body}");
    }
}
