//! The smallest complete provisioner (docs/provisioners.md): watches the Bundles of its namespace
//! and keeps `DIR/NAME/` equal to the content of each unpacked one. Usage: `minimal_provisioner DIR`
//! (credentials as kubectl finds them: `KUBECONFIG`, `~/.kube/config` or in-cluster).
use futures_util::TryStreamExt;
use kube::runtime::{watcher, WatchStreamExt};
use std::{collections::HashMap, future::ready, path::PathBuf, pin::pin};
use stowage_client::{api::Bundle, ContentClient, Fetched::Updated};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = PathBuf::from(std::env::args().nth(1).ok_or("usage: minimal_provisioner DIR")?);
    let client = kube::Client::try_default().await?;
    let (bundles, content) = (kube::Api::<Bundle>::default_namespaced(client.clone()), ContentClient::new(client));
    let mut seen = pin!(watcher(bundles, Default::default()).applied_objects().try_filter(|b| ready(b.is_unpacked())));
    let mut held = HashMap::new(); // name → digest of the content in DIR/NAME (sent as If-None-Match)
    while let Some(bundle) = seen.try_next().await? {
        let (name, known) = (bundle.name(), held.get(bundle.name()).map(String::as_str));
        if let Updated { digest } = content.fetch_into(bundle.namespace(), name, &out.join(name), known).await? {
            println!("{name} {}", held.entry(name.to_string()).insert_entry(digest).get());
        }
    }
    Ok(())
}
