//! Credentials for sources, from Secrets in the Bundle's namespace (in a cluster), the
//! `--registry-config` file (images, any mode) or the `--source-credentials` file (git and http
//! sources without an `authSecret`, any mode). Both files are read at every attempt, so editing
//! one takes effect at the next retry; a Secret named by the source always wins.
//!
//! Whether the *user* may reference a Secret was checked when the Bundle was written (the server
//! must not be a confused deputy); here the server reads it with its own identity.

use std::collections::BTreeMap;
use std::path::PathBuf;

use k8s_openapi::api::core::v1::Secret;

use super::error::UnpackError;
use super::source::{Credentials, Source};
use super::source_credentials::HostCredentials;
use super::trust;

/// Where Secrets come from.
#[derive(Clone)]
pub enum SecretStore {
    /// Standalone: no cluster to read Secrets from.
    None,
    Cluster(kube::Client),
}

/// Reads the credentials each source names.
#[derive(Clone)]
pub struct CredentialSource {
    pub secrets: SecretStore,
    /// `--registry-config`: a docker config file used for images without a `pullSecret`.
    pub registry_config: Option<PathBuf>,
    /// `--source-credentials`: per-host credentials for git and http sources without an
    /// `authSecret` ([`HostCredentials`]).
    pub source_credentials: Option<PathBuf>,
}

impl CredentialSource {
    pub async fn for_source(&self, namespace: &str, source: &Source) -> Result<Option<Credentials>, UnpackError> {
        if let Some(image) = &source.image {
            if image.pull_secret.is_empty() {
                return self.registry_config().await;
            }
            let data = self.secret(namespace, &image.pull_secret).await?;
            return docker_config(&data, namespace, &image.pull_secret).map(Some);
        }
        let (secret, url) = match (&source.git, &source.http) {
            (Some(git), _) => (&git.auth_secret, &git.repository),
            (_, Some(http)) => (&http.auth_secret, &http.url),
            _ => return Ok(None),
        };
        if secret.is_empty() {
            return self.host_credentials(url).await;
        }
        let data = self.secret(namespace, secret).await?;
        basic_or_token(&data, namespace, secret).map(Some)
    }

    async fn registry_config(&self) -> Result<Option<Credentials>, UnpackError> {
        let Some(path) = &self.registry_config else { return Ok(None) };
        match tokio::fs::read(path).await {
            Ok(bytes) => Ok(Some(Credentials::DockerConfig(bytes))),
            Err(e) => Err(UnpackError::Fetch(format!("reading --registry-config {}: {e}", path.display()))),
        }
    }

    /// The `--source-credentials` entry for `url`'s host, if any. A URL that does not parse gets
    /// none: the source itself reports it.
    async fn host_credentials(&self, url: &str) -> Result<Option<Credentials>, UnpackError> {
        let Some(path) = &self.source_credentials else { return Ok(None) };
        let Ok(url) = reqwest::Url::parse(url) else { return Ok(None) };
        let shown = format!("--source-credentials {}", path.display());
        let bytes = tokio::fs::read(path)
            .await
            .map_err(|e| UnpackError::Fetch(format!("{shown}: cannot be read: {}", trust::io_problem(&e))))?;
        let hosts =
            HostCredentials::parse(&bytes).map_err(|problem| UnpackError::Fetch(format!("{shown}: {problem}")))?;
        Ok(hosts.for_url(&url))
    }

    async fn secret(&self, namespace: &str, name: &str) -> Result<BTreeMap<String, Vec<u8>>, UnpackError> {
        let SecretStore::Cluster(client) = &self.secrets else {
            return Err(UnpackError::Unsupported(format!(
                "Secret {namespace}/{name}: Secrets are read from the cluster, and this server runs standalone \
                 (for registries use --registry-config; for git and http sources, --source-credentials)"
            )));
        };
        let api = kube::Api::<Secret>::namespaced(client.clone(), namespace);
        match api.get_opt(name).await {
            // Missing now may exist later: retried.
            Ok(None) => Err(UnpackError::Fetch(format!("Secret {namespace}/{name} not found"))),
            Ok(Some(secret)) => Ok(secret.data.unwrap_or_default().into_iter().map(|(k, v)| (k, v.0)).collect()),
            Err(e) => Err(UnpackError::Fetch(format!("reading Secret {namespace}/{name}: {e}"))),
        }
    }
}

fn docker_config(data: &BTreeMap<String, Vec<u8>>, namespace: &str, name: &str) -> Result<Credentials, UnpackError> {
    if let Some(config) = data.get(".dockerconfigjson") {
        return Ok(Credentials::DockerConfig(config.clone()));
    }
    if let Some(legacy) = data.get(".dockercfg") {
        // `kubernetes.io/dockercfg`: the `auths` map without its wrapper.
        let auths: serde_json::Value = serde_json::from_slice(legacy).map_err(|e| {
            let problem = crate::unpack::error::json_problem(&e);
            UnpackError::Unsupported(format!("Secret {namespace}/{name}: .dockercfg {problem}"))
        })?;
        return Ok(Credentials::DockerConfig(serde_json::json!({"auths": auths}).to_string().into_bytes()));
    }
    Err(UnpackError::Unsupported(format!(
        "Secret {namespace}/{name} has no .dockerconfigjson key (use type kubernetes.io/dockerconfigjson)"
    )))
}

fn basic_or_token(data: &BTreeMap<String, Vec<u8>>, namespace: &str, name: &str) -> Result<Credentials, UnpackError> {
    let text = |key: &str| data.get(key).map(|v| String::from_utf8_lossy(v).trim_end_matches('\n').to_string());
    match (text("username"), text("password"), text("token")) {
        (Some(username), Some(password), _) => Ok(Credentials::Basic { username, password }),
        (_, _, Some(token)) => Ok(Credentials::Bearer(token)),
        _ => Err(UnpackError::Unsupported(format!(
            "Secret {namespace}/{name} needs username and password keys (kubernetes.io/basic-auth) or a token key"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(pairs: &[(&str, &str)]) -> BTreeMap<String, Vec<u8>> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.as_bytes().to_vec())).collect()
    }

    #[test]
    fn basic_auth_wins_over_a_token() {
        let creds = basic_or_token(&data(&[("username", "u"), ("password", "p\n"), ("token", "t")]), "ns", "s");
        assert!(matches!(creds, Ok(Credentials::Basic { ref password, .. }) if password == "p"));
        assert!(matches!(basic_or_token(&data(&[("token", "t")]), "ns", "s"), Ok(Credentials::Bearer(_))));
        assert!(matches!(basic_or_token(&data(&[("x", "y")]), "ns", "s"), Err(UnpackError::Unsupported(_))));
    }

    #[tokio::test]
    async fn the_credentials_file_serves_sources_without_an_auth_secret() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("credentials.yaml");
        std::fs::write(&path, "hosts: {git.example: {token: t0k}}").unwrap();
        let store =
            CredentialSource { secrets: SecretStore::None, registry_config: None, source_credentials: Some(path) };
        let git = |repository: &str, auth_secret: &str| Source {
            git: Some(crate::api::GitSource {
                repository: repository.into(),
                auth_secret: auth_secret.into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let found = store.for_source("ns", &git("https://git.example/r.git", "")).await.unwrap();
        assert!(matches!(found, Some(Credentials::Bearer(ref t)) if t == "t0k"), "{found:?}");
        assert!(store.for_source("ns", &git("https://other.example/r.git", "")).await.unwrap().is_none());
        // The source's own Secret wins: here, standalone, that is a refusal, not the file.
        let named = store.for_source("ns", &git("https://git.example/r.git", "creds")).await.unwrap_err();
        assert!(named.to_string().contains("Secret ns/creds"), "{named}");
    }

    #[test]
    fn legacy_dockercfg_is_wrapped() {
        let creds = docker_config(&data(&[(".dockercfg", r#"{"r.example":{"auth":"dTpw"}}"#)]), "ns", "s");
        let Ok(Credentials::DockerConfig(bytes)) = creds else { panic!("expected a docker config") };
        let value: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(value["auths"]["r.example"]["auth"], "dTpw");
    }
}
