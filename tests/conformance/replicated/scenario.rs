//! One load run through haproxy while replicas are disrupted (killed every so often, or restarted
//! one at a time), then the checks: the clients' problems, every acknowledged write, every
//! watcher's events against a final list, a kube-rs reflector converging on it, and haproxy's view
//! of the backends sampled every 100 ms throughout.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::{reflector, watcher, WatchStreamExt};
use kube::ResourceExt;

use super::cluster::Cluster;
use super::haproxy::{fewest_up, time_to_down};
use super::load::{namespace, spawn_workers, Acks, NAMESPACES};
use super::load_check::{check_acks, check_watch, list};
use super::load_watch::Watcher;
use super::retry::Stats;
use crate::harness::*;

pub enum Disruption {
    /// `kill -9` one replica (in turn) every period; it stays down a few seconds, then restarts.
    Kill9Every(Duration),
    /// SIGTERM each replica in turn, start it again and wait until it is ready and routed to.
    RollingRestart,
}

pub struct Outcome {
    pub problems: Vec<String>,
    pub summary: String,
    pub disruptions: usize,
    /// The fewest backends haproxy had up in any sample, and sampler errors.
    pub fewest_up: usize,
    pub sampler_errors: Vec<String>,
}

const DOWN_FOR: Duration = Duration::from_secs(3);
const CONVERGE: Duration = Duration::from_secs(60);

/// Runs `clients` workers for `duration` with `disruption`, then checks everything.
pub async fn run(cluster: &mut Cluster, clients: usize, duration: Duration, disruption: Disruption) -> Outcome {
    let seed = super::load::env_or("STOWAGE_LOAD_SEED", 17);
    let base = cluster.lb_url();
    let haproxy = cluster.haproxy.clone().expect("haproxy");
    let (stats, acks) = (Arc::new(Stats::default()), Arc::new(Acks::default()));
    let client = cluster.new_client();

    // Watchers from each (empty) namespace's list, before any write. One write first, so that no
    // list's version is 0 (a watch from "0" starts with the current state).
    marker(&client, &base, "load-start").await;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut watchers = Vec::new();
    for i in 0..NAMESPACES.max(clients / 10) {
        let ns = namespace(i);
        let (start, items) = list(&client, &base, &ns).await;
        assert!(items.is_empty(), "{ns} is empty before the load");
        let (progress_tx, progress_rx) = tokio::sync::watch::channel(start);
        let w = Watcher { namespace: ns, client: cluster.new_client(), base: base.clone(), stats: stats.clone() };
        watchers.push((tokio::spawn(w.run(start, progress_tx, stop_rx.clone())), progress_rx));
    }
    let (store, reflector_errors, reflector_task) = start_reflector(cluster, &base).await;

    let sampler = haproxy.sample(Duration::from_millis(100));
    let started = Instant::now();
    let deadline = started + duration;
    let workers = spawn_workers(clients, seed, deadline, &base, || cluster.new_client(), &stats, &acks);
    let mut kills = Vec::new();
    let admin = cluster.client().clone();
    let mut disruptions = 0;
    match disruption {
        Disruption::Kill9Every(period) => {
            let mut next = started + period;
            while next + DOWN_FOR < deadline {
                tokio::time::sleep_until(next.into()).await;
                let n = cluster.replicas.len();
                let r = &mut cluster.replicas[disruptions % n];
                r.kill9();
                kills.push((r.name(), Instant::now()));
                disruptions += 1;
                tokio::time::sleep(DOWN_FOR).await;
                r.restart(&admin).await;
                haproxy.wait_status(&r.name(), "UP", Duration::from_secs(10)).await;
                next += period;
            }
        }
        Disruption::RollingRestart => {
            while disruptions == 0 || Instant::now() + Duration::from_secs(30) < deadline {
                for r in cluster.replicas.iter_mut() {
                    let took = r.terminate(Duration::from_secs(30));
                    assert!(took.is_some(), "replica {} did not stop within 30 s of SIGTERM", r.index);
                    r.restart(&admin).await;
                    haproxy.wait_status(&r.name(), "UP", Duration::from_secs(10)).await;
                    disruptions += 1;
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }
    for w in workers {
        w.await.expect("worker panicked");
    }
    let load_took = started.elapsed();
    let samples = sampler.finish();
    let (fewest, _, sampler_errors) = fewest_up(&samples);
    let max_down = kills.iter().filter_map(|(name, at)| time_to_down(&samples, name, *at)).max();

    // Checks, with every replica up.
    let mut problems = stats.problems();
    problems.extend(check_acks(&client, &base, &acks).await);
    let mut finals = BTreeMap::new();
    let mut markers = BTreeMap::new();
    for i in 0..NAMESPACES {
        let ns = namespace(i);
        finals.insert(ns.clone(), list(&client, &base, &ns).await);
        // A write after the list, so that every watcher of the namespace passes the list's version.
        markers.insert(ns.clone(), marker(&client, &base, &ns).await);
    }
    let mut resumes = 0;
    let mut tasks = Vec::new();
    for (i, (task, mut progress)) in watchers.into_iter().enumerate() {
        let ns = namespace(i);
        let target = markers[&ns];
        let passed = tokio::time::timeout(CONVERGE, progress.wait_for(|v| *v >= target)).await;
        if !matches!(passed, Ok(Ok(_))) {
            problems
                .push(format!("watcher {i} of {ns} did not reach the marker written at {target} within {CONVERGE:?}"));
        }
        tasks.push(task);
    }
    stop_tx.send_replace(true);
    for (i, task) in tasks.into_iter().enumerate() {
        let record = task.await.expect("watcher panicked");
        resumes += record.resumes;
        problems.extend(check_watch(&record, &finals[&namespace(i)], &acks));
    }
    problems.extend(converge_reflector(&store, &client, &base, &reflector_errors).await);
    reflector_task.abort();

    let summary = format!(
        "{clients} clients for {load_took:.0?}, {disruptions} disruptions; {}; uploads acknowledged {}, watch resumes {resumes}; \
         haproxy: fewest up {fewest}, max kill→DOWN {max_down:?}, {} samples",
        stats.summary(),
        acks.uploads.lock().unwrap().len(),
        samples.len()
    );
    Outcome { problems, summary, disruptions, fewest_up: fewest, sampler_errors }
}

/// Creates Bundle `marker` in `ns`; its resourceVersion.
async fn marker(client: &reqwest::Client, base: &str, ns: &str) -> u64 {
    let resp = client
        .post(format!("{base}{}", bundles(ns)))
        .header("Content-Type", "application/json")
        .body(upload_bundle(ns, "marker").to_string())
        .send()
        .await
        .expect("create the marker");
    let body = resp.bytes().await.unwrap();
    str_at(&parse_json(&body, "marker"), "/metadata/resourceVersion").parse().unwrap()
}

type ReflectorParts = (reflector::Store<DynamicObject>, Arc<Mutex<Vec<String>>>, tokio::task::JoinHandle<()>);

/// A kube-rs reflector of every Bundle, through haproxy.
async fn start_reflector(cluster: &Cluster, base: &str) -> ReflectorParts {
    let path = cluster.kubeconfig(base);
    let kubeconfig = Kubeconfig::read_from(&path).expect("read the kubeconfig");
    let config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await.expect("kube config");
    let client = kube::Client::try_from(config).expect("kube client");
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("content.stowage.dev", "v1alpha1", "Bundle"),
        "bundles",
    );
    let api: Api<DynamicObject> = Api::all_with(client, &resource);
    let writer = reflector::store::Writer::<DynamicObject>::new(resource);
    let store = writer.as_reader();
    let errors = Arc::new(Mutex::new(Vec::new()));
    let stream = reflector(writer, watcher(api, watcher::Config::default())).default_backoff();
    let e = errors.clone();
    let task = tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            if let Err(err) = event {
                e.lock().unwrap().push(err.to_string());
            }
        }
    });
    (store, errors, task)
}

/// Waits until the reflector holds exactly the Bundles a final list shows.
async fn converge_reflector(
    store: &reflector::Store<DynamicObject>,
    client: &reqwest::Client,
    base: &str,
    errors: &Mutex<Vec<String>>,
) -> Vec<String> {
    let converged = poll_until(CONVERGE, Duration::from_millis(500), || async {
        // Every namespace: the reflector watches them all.
        let body = client.get(format!("{base}{API}/bundles")).send().await.expect("list all").bytes().await.unwrap();
        let all = parse_json(&body, "list of all Bundles");
        let server: BTreeMap<String, String> = all["items"]
            .as_array()
            .unwrap_or_else(|| panic!("not a list: {all}"))
            .iter()
            .map(|o| {
                let key = format!("{}/{}", str_at(o, "/metadata/namespace"), str_at(o, "/metadata/name"));
                (key, str_at(o, "/metadata/resourceVersion").to_owned())
            })
            .collect();
        let local: BTreeMap<String, String> = store
            .state()
            .iter()
            .map(|o| {
                (
                    format!("{}/{}", o.namespace().unwrap_or_default(), o.name_any()),
                    o.resource_version().unwrap_or_default(),
                )
            })
            .collect();
        if server == local {
            return Ok(());
        }
        let differ: Vec<_> = server.iter().filter(|(k, v)| local.get(*k) != Some(v)).take(10).collect();
        let errors: Vec<String> = errors.lock().unwrap().iter().rev().take(5).cloned().collect();
        Err(format!(
            "the reflector did not converge within {CONVERGE:?}: {} objects on the server, {} in the reflector; differing {differ:?}; last errors {errors:?}",
            server.len(),
            local.len()
        ))
    })
    .await;
    converged.err().into_iter().collect()
}
