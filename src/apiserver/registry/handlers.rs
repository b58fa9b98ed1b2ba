//! The distribution spec's pull endpoints over [`Repository`]: manifests by tag or digest, blobs
//! with `Range`, tag lists and the catalog with `n`/`last` paging. Store work runs on the blocking
//! pool; layer bytes are streamed in steps like every download, so memory does not follow size.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Extension, Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::artifact::{self, Built};
use super::chart_layer::{window, ChartLayer};
use super::error::RegistryError;
use super::gate::may_read;
use super::repository::{Artifacts, LayerSource, Repository};
use crate::apiserver::access::Identity;
use crate::apiserver::content::download::{serve_range_of, serve_ranged, Streaming};
use crate::apiserver::range;
use crate::apiserver::request_info::RequestInfo;
use crate::apiserver::stall::ConnectionCut;
use crate::apiserver::status::ApiError;
use crate::apiserver::AppState;
use crate::storage::{StorageError, Store};
use crate::strategy::bundle::BUNDLE;

/// Page size of tag and catalog lists when the client names none, and the most it may ask for.
const DEFAULT_PAGE: usize = 100;
const MAX_PAGE: usize = 1000;
/// Bundles one catalog request looks at (an authorization check each) before it answers with what
/// it found and a link to go on from.
const CATALOG_EXAMINED: usize = 10_000;

const DIGEST_HEADER: &str = "docker-content-digest";

impl From<StorageError> for RegistryError {
    fn from(e: StorageError) -> Self {
        RegistryError::from(ApiError::from(e))
    }
}

async fn blocking<T, F>(app: &AppState, f: F) -> Result<T, RegistryError>
where
    T: Send + 'static,
    F: FnOnce(&Store) -> Result<T, RegistryError> + Send + 'static,
{
    let store = app.store.clone();
    tokio::task::spawn_blocking(move || f(&store))
        .await
        .map_err(|e| RegistryError::Other(StatusCode::INTERNAL_SERVER_ERROR, format!("registry read failed: {e}")))?
}

fn load(store: &Store, namespace: &str, name: &str) -> Result<Repository, RegistryError> {
    Repository::load(store, namespace, name)?.ok_or_else(|| {
        RegistryError::NameUnknown(format!(
            "repository {namespace}/{name} not found: there is no Bundle {name:?} in namespace {namespace:?}"
        ))
    })
}

/// `GET /v2/`: the API is here and the caller is known.
pub async fn root() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], "{}").into_response()
}

/// Anything under `/v2/` that is not a pull: pushes and deletes are refused (content enters
/// through the Kubernetes API), unknown paths are not found.
pub async fn other(method: Method, info: Option<Extension<RequestInfo>>) -> Response {
    // The gate kept the path as sent (nesting strips `/v2` from the URI handlers see).
    let path = info.as_ref().map_or("/v2/", |Extension(info)| info.path.as_str());
    if method != Method::GET && method != Method::HEAD {
        return unsupported(method).await.into_response();
    }
    if path == "/v2" || path == "/v2/" {
        return root().await;
    }
    RegistryError::NameUnknown(format!("{path} names no repository: repositories are <namespace>/<bundle>"))
        .into_response()
}

pub async fn unsupported(method: Method) -> RegistryError {
    RegistryError::Unsupported(format!(
        "{method} is not supported: this registry is read-only; content enters through the Kubernetes API (a Bundle's sources or an upload)"
    ))
}

pub async fn manifest(
    State(app): State<AppState>,
    Extension(artifacts): Extension<Arc<Artifacts>>,
    Path((namespace, name, reference)): Path<(String, String, String)>,
    method: Method,
    headers: HeaderMap,
) -> Result<Response, RegistryError> {
    if artifact::is_digest(&reference) {
        artifact::parse_digest(&reference).map_err(RegistryError::DigestInvalid)?;
    } else if !artifact::is_tag(&reference) {
        return Err(RegistryError::ManifestUnknown(format!("{reference:?} is not a tag or a digest")));
    }
    let manifest = blocking(&app, move |store| {
        let repository = load(store, &namespace, &name)?;
        let unknown =
            || RegistryError::ManifestUnknown(format!("manifest {reference:?} not found in {namespace}/{name}"));
        if artifact::is_digest(&reference) {
            for revision in &repository.revisions {
                if let Ok(found) = artifacts.artifact(store, revision)? {
                    if found.manifest.digest == reference {
                        return Ok(found.manifest);
                    }
                }
            }
            return Err(unknown());
        }
        let revision = repository.by_tag(&reference).ok_or_else(unknown)?;
        artifacts.artifact(store, revision)?.map(|found| found.manifest).map_err(RegistryError::ManifestUnknown)
    })
    .await?;
    Ok(small_blob(manifest, artifact::MANIFEST, &method, &headers))
}

/// A built blob (manifest or config), whole: `If-None-Match` on its digest, no ranges (a server
/// may ignore them; these are a few hundred bytes).
fn small_blob(built: Built, content_type: &'static str, method: &Method, headers: &HeaderMap) -> Response {
    let etag = format!("\"{}\"", built.digest);
    let not_modified = range::if_none_match(headers, &etag);
    let size = built.size();
    let digest = built.digest.clone();
    let body = if *method == Method::HEAD || not_modified { Body::empty() } else { Body::from(built.bytes) };
    let mut response = Response::new(body);
    if not_modified {
        *response.status_mut() = StatusCode::NOT_MODIFIED;
    }
    let h = response.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    if let Ok(v) = HeaderValue::from_str(&digest) {
        h.insert(DIGEST_HEADER, v);
    }
    if let Ok(v) = HeaderValue::from_str(&etag) {
        h.insert(header::ETAG, v);
    }
    if !not_modified {
        h.insert(header::CONTENT_LENGTH, HeaderValue::from(size));
    }
    response
}

/// What a blob digest names in a repository.
enum Blob {
    Built(Built),
    Layer { source: LayerSource, size: u64 },
}

pub async fn blob(
    State(app): State<AppState>,
    Extension(artifacts): Extension<Arc<Artifacts>>,
    Path((namespace, name, digest)): Path<(String, String, String)>,
    method: Method,
    cut: Option<Extension<ConnectionCut>>,
    headers: HeaderMap,
) -> Result<Response, RegistryError> {
    artifact::parse_digest(&digest).map_err(RegistryError::DigestInvalid)?;
    let wanted = digest.clone();
    let found = blocking(&app, move |store| {
        let repository = load(store, &namespace, &name)?;
        for revision in &repository.revisions {
            let Ok(found) = artifacts.artifact(store, revision)? else { continue };
            if found.layer.digest == wanted {
                return Ok(Blob::Layer { size: found.layer.size, source: found.source });
            }
            if found.config.digest == wanted {
                return Ok(Blob::Built(found.config));
            }
        }
        Err(RegistryError::BlobUnknown(format!("blob {wanted} not found in {namespace}/{name}")))
    })
    .await?;
    let streaming = Streaming::new(&app, cut.map(|Extension(c)| c));
    let mut response = match found {
        Blob::Built(built) => return Ok(small_blob(built, "application/octet-stream", &method, &headers)),
        Blob::Layer { source: LayerSource::Tar { revision, size }, .. } => {
            serve_ranged(&streaming, &headers, &digest, size, "application/octet-stream", move |store, range, out| {
                store.read_tar(revision, size, range, &mut |bytes| {
                    out.extend_from_slice(bytes);
                    Ok(())
                })
            })
            .map_err(RegistryError::from)?
        }
        Blob::Layer { source: LayerSource::Chart { revision, root, name }, size } => {
            serve_range_of(&streaming, &headers, &digest, size, "application/octet-stream", |spec| {
                window(ChartLayer::new(revision, &root, &name), spec.start, spec.end)
            })
            .map_err(RegistryError::from)?
        }
    };
    if let Ok(v) = HeaderValue::from_str(&digest) {
        response.headers_mut().insert(DIGEST_HEADER, v);
    }
    if method == Method::HEAD {
        *response.body_mut() = Body::empty();
    }
    Ok(response)
}

/// `n` and `last` of a list request.
fn page(params: &HashMap<String, String>) -> Result<(usize, Option<String>), RegistryError> {
    let n = match params.get("n") {
        None => DEFAULT_PAGE,
        Some(n) => n
            .parse::<usize>()
            .map_err(|_| RegistryError::Other(StatusCode::BAD_REQUEST, format!("n={n:?} is not a count")))?
            .min(MAX_PAGE),
    };
    Ok((n, params.get("last").cloned()))
}

/// The list response, with a `Link` to the next page when there may be more.
fn list_response(
    key: &str,
    name: Option<&str>,
    items: Vec<String>,
    next: Option<String>,
    n: usize,
    path: &str,
) -> Response {
    let body = match name {
        Some(name) => json!({"name": name, key: items}),
        None => json!({key: items}),
    };
    let mut response = ([(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response();
    if let Some(last) = next {
        // Repository names and tags need no escaping in a query.
        if let Ok(v) = HeaderValue::from_str(&format!("<{path}?n={n}&last={last}>; rel=\"next\"")) {
            response.headers_mut().insert(header::LINK, v);
        }
    }
    response
}

pub async fn tags(
    State(app): State<AppState>,
    Path((namespace, name)): Path<(String, String)>,
    Query(params): Query<HashMap<String, String>>,
) -> Result<Response, RegistryError> {
    let (n, last) = page(&params)?;
    let repository_name = format!("{namespace}/{name}");
    let tags = blocking(&app, move |store| Ok(load(store, &namespace, &name)?.tags())).await?;
    let mut after: Vec<String> =
        tags.into_keys().filter(|tag| last.as_ref().is_none_or(|last| tag > last)).take(n.saturating_add(1)).collect();
    let more = after.len() > n;
    after.truncate(n);
    let next = if more { after.last().cloned() } else { None };
    let path = format!("/v2/{repository_name}/tags/list");
    Ok(list_response("tags", Some(&repository_name), after, next, n, &path))
}

/// `GET /v2/_catalog`: the repositories the caller may read, never the others.
pub async fn catalog(
    State(app): State<AppState>,
    Extension(Identity(user)): Extension<Identity>,
    Query(params): Query<HashMap<String, String>>,
) -> Result<Response, RegistryError> {
    let (n, last) = page(&params)?;
    let mut found = Vec::new();
    let mut after = last;
    let mut examined = 0usize;
    let mut next = None;
    'pages: loop {
        let from = after.clone();
        let (bundles, more) =
            blocking(&app, move |store| Ok(store.objects_page(BUNDLE.plural, None, from.as_deref(), 500)?)).await?;
        for bundle in bundles {
            let meta = |key: &str| {
                bundle.value.pointer(&format!("/metadata/{key}")).and_then(|v| v.as_str()).unwrap_or("").to_string()
            };
            let (namespace, name) = (meta("namespace"), meta("name"));
            let repository = format!("{namespace}/{name}");
            examined += 1;
            if found.len() == n {
                next = found.last().cloned();
                break 'pages;
            }
            if may_read(&app.access, &user, &namespace, &name).await? {
                found.push(repository.clone());
            }
            after = Some(repository);
            if examined >= CATALOG_EXAMINED {
                next = after.clone();
                break 'pages;
            }
        }
        if more.is_none() {
            break;
        }
    }
    Ok(list_response("repositories", None, found, next, n, "/v2/_catalog"))
}
