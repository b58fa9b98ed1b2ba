//! The registry view on a replicated store: every replica serves the same manifests, configs and
//! layers under the same digests (they are functions of stored facts, not of the replica).

use super::api::At;
use super::cluster::Cluster;
use crate::harness::*;
use crate::oci_view::{chart_tree, plain_tree};
use crate::tarutil::build_tar;

#[tokio::test(flavor = "multi_thread")]
async fn replicas_serve_the_same_digests() {
    let cluster = Cluster::start("registry-view", 2, &[]).await;
    let first = At::new(cluster.client(), cluster.replicas[0].url());
    first.create_bundle("team-a", "app").await;
    first.upload("team-a", "app", plain_tree().0).await;
    first.create_bundle("team-a", "chart").await;
    first.upload("team-a", "chart", build_tar(&chart_tree("", "demo", "2.0.0"))).await;
    let mut seen = Vec::new();
    for replica in &cluster.replicas {
        let at = At::new(cluster.client(), replica.url());
        let mut digests = Vec::new();
        for (repository, tag) in [("team-a/app", "latest"), ("team-a/chart", "2.0.0")] {
            let path = format!("/v2/{repository}/manifests/{tag}");
            let response = eventually(std::time::Duration::from_secs(30), &format!("{path} on {}", at.base), || {
                let request = at.client.get(at.url(&path));
                async move {
                    let response = request.send().await.map_err(|e| e.to_string())?;
                    if response.status() != 200 {
                        return Err(format!("status {}", response.status()));
                    }
                    Ok(response)
                }
            })
            .await;
            let digest = header(response.headers(), "docker-content-digest").unwrap().to_string();
            let manifest = parse_json(&response.bytes().await.unwrap(), "manifest");
            let layer = manifest["layers"][0]["digest"].as_str().unwrap().to_string();
            let blob = at.download(&format!("/v2/{repository}/blobs/{layer}")).await;
            assert_eq!(digest_of(&blob), layer, "{repository} layer from {}", at.base);
            digests.push((digest, layer));
        }
        seen.push(digests);
    }
    assert_eq!(seen[0], seen[1], "both replicas name the same manifests and layers");
}
