//! The test infrastructure on its own, before any replica: etcd answers the etcd-client crate,
//! Garage stores and returns an object through `object_store` (as the server talks to them), and
//! haproxy routes to a healthy backend (an embedded-store `stowage serve`), sees it go down when it
//! is killed and come back when it returns.

use std::time::{Duration, Instant};

use object_store::path::Path as ObjectPath;
use object_store::{ObjectStoreExt, PutPayload};

use super::etcd::Etcd;
use super::garage::Garage;
use super::haproxy::{time_to_down, Haproxy};
use crate::harness::{report, Server};

#[tokio::test(flavor = "multi_thread")]
async fn support_smoke() {
    let etcd = Etcd::start().await;
    let mut kv = etcd.client().await.expect("connect to etcd");
    kv.put("/smoke/key", "value", None).await.expect("etcd put");
    let got = kv.get("/smoke/key", None).await.expect("etcd get");
    assert_eq!(got.kvs().first().map(|kv| kv.value()), Some(&b"value"[..]));
    assert_eq!(etcd.count_prefix("/smoke/").await, 1);

    let garage = Garage::start("smoke");
    let store = garage.s3.object_store();
    let path = ObjectPath::from("blocks/ab/cd");
    let body = (0..300_000u32).map(|i| (i % 251) as u8).collect::<Vec<u8>>();
    store.put(&path, PutPayload::from(body.clone())).await.expect("put an object into Garage");
    let back = store.get(&path).await.expect("get it back").bytes().await.expect("read it");
    assert_eq!(back.as_ref(), &body[..], "Garage returns the bytes stored");

    // haproxy in front of a real (embedded-store) server: its TLS health check sees it up, a
    // request through it reaches the server, and a kill -9 turns it DOWN.
    let mut server = Server::start_temp(&[]);
    let port: u16 = server.url.rsplit(':').next().unwrap().parse().unwrap();
    let haproxy = std::sync::Arc::new(Haproxy::start(&[port]));
    haproxy.wait_status("r0", "UP", Duration::from_secs(10)).await;
    let through = server.client().get(format!("{}/readyz", haproxy.url)).send().await.expect("GET through haproxy");
    assert_eq!(through.status(), 200);
    assert_eq!(haproxy.up_count().unwrap(), 1);

    let sampler = haproxy.sample(Duration::from_millis(100));
    let killed = Instant::now();
    server.kill9();
    haproxy.wait_status("r0", "DOWN", Duration::from_secs(10)).await;
    sampler.wait_down("r0", killed, Duration::from_secs(10)).await;
    let samples = sampler.finish();
    let down = time_to_down(&samples, "r0", killed).expect("a sample shows r0 DOWN");
    report(&format!("support_smoke: haproxy marked a killed backend DOWN after {down:?} ({} samples)", samples.len()));
    let refused = server.client().get(format!("{}/readyz", haproxy.url)).send().await;
    assert!(refused.is_err(), "no backend: the connection is closed, got {refused:?}");

    server.restart();
    // The restarted server picked a new port: haproxy's r0 stays down (a replica keeps its port).
    assert_eq!(haproxy.up_count().unwrap(), 0);
}
