//! `/livez`, `/readyz` and `/healthz` as kube-apiserver answers them (k8s.io/apiserver's
//! `healthz` package): each is a list of named checks, run together.
//!
//! - `GET /readyz` answers `ok` while every check passes; `?verbose` lists them, `[+]NAME ok`
//!   one a line, then `readyz check passed`. A failing check makes the answer 503 with the list
//!   (always: kube is verbose on failure), the failing ones as `[-]NAME failed: reason withheld` —
//!   the endpoint is public, so reasons stay out of it (they are logged at debug), then
//!   `readyz check failed`. `?exclude=NAME` (repeatable) skips a check (`[+]NAME excluded: ok`).
//!   kube answers a failure 500; stowage keeps 503, what a load balancer and a kubelet read the
//!   same and what it always answered.
//! - `GET /readyz/NAME` runs one check and gives its reason: `ok`, or 503 `internal server error:
//!   REASON`. Behind the gate, as kube's `system:monitoring` role grants `/readyz/*`.
//!
//! The checks: `ping` (always passes) everywhere; `shutdown` (fails once stopping, so load
//! balancers drain this server) in readyz; then the store's own ([`Store::health_checks`]):
//! embedded, `store` (fails while a failed sync poisoned the store: writes are refused until a
//! restart, which is what a failed liveness check brings) in all three; replicated, `etcd` (a read
//! within 2 s), `lease` (this replica holds its etcd lease, without which its writes are refused)
//! and `object-storage` (a listing within 5 s) in readyz only — restarting a replica does not
//! bring etcd back. Readiness never asks for leadership: every replica serves; which one leads is
//! `stowage_leader` in `/metrics`.
//!
//! [`Store::health_checks`]: crate::storage::Store::health_checks

use axum::extract::{Path, RawQuery, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use super::status::ApiError;
use super::AppState;
use crate::storage::HealthCheck;

/// The three lists of checks.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Endpoint {
    Livez,
    Readyz,
    Healthz,
}

impl Endpoint {
    fn name(self) -> &'static str {
        match self {
            Endpoint::Livez => "livez",
            Endpoint::Readyz => "readyz",
            Endpoint::Healthz => "healthz",
        }
    }

    /// The checks of this endpoint, in the order they are listed: the server's, then those of the
    /// store's (`of_store`, [`crate::storage::Store::health_checks`]) that this endpoint lists.
    fn checks(self, of_store: &[HealthCheck]) -> Vec<&'static str> {
        let own: &[&'static str] = match self {
            Endpoint::Readyz => &["ping", "shutdown"],
            _ => &["ping"],
        };
        let of_store = of_store.iter().filter(|c| self == Endpoint::Readyz || c.liveness);
        own.iter().copied().chain(of_store.map(|c| c.name)).collect()
    }
}

/// Runs the check `name`; `Err` says why it failed.
async fn run(app: &AppState, name: &'static str) -> Result<(), String> {
    match name {
        "ping" => Ok(()),
        "shutdown" if app.shutdown.is_cancelled() => Err("the server is shutting down".into()),
        "shutdown" => Ok(()),
        _ => {
            let Some(check) = app.store.health_checks().iter().find(|c| c.name == name) else { return Ok(()) };
            if !check.blocking {
                return app.store.health_check(name).unwrap_or(Ok(()));
            }
            let store = app.store.clone();
            match tokio::task::spawn_blocking(move || store.health_check(name)).await {
                Ok(result) => result.unwrap_or(Ok(())),
                Err(_) => Err("the check did not finish".into()),
            }
        }
    }
}

fn text(code: StatusCode, body: String) -> Response {
    let mut response = (code, body).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    response
}

/// `?verbose` and the `?exclude=` names.
fn options(query: Option<&str>) -> (bool, Vec<String>) {
    let mut verbose = false;
    let mut excluded = Vec::new();
    for (key, value) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        match key.as_ref() {
            "verbose" => verbose = true,
            "exclude" => excluded.push(value.into_owned()),
            _ => {}
        }
    }
    (verbose, excluded)
}

/// `GET /livez`, `/readyz`, `/healthz`.
async fn aggregate(app: AppState, endpoint: Endpoint, query: Option<String>) -> Response {
    let (verbose, mut excluded) = options(query.as_deref());
    let checks = endpoint.checks(app.store.health_checks());
    let results = futures_util::future::join_all(checks.iter().map(|&name| {
        let app = &app;
        let skip = excluded.iter().any(|e| e == name);
        async move { (name, if skip { None } else { Some(run(app, name).await) }) }
    }))
    .await;
    let mut listing = String::new();
    let mut failed = Vec::new();
    for (name, result) in results {
        match result {
            None => {
                excluded.retain(|e| e != name);
                listing.push_str(&format!("[+]{name} excluded: ok\n"));
            }
            Some(Ok(())) => listing.push_str(&format!("[+]{name} ok\n")),
            Some(Err(reason)) => {
                listing.push_str(&format!("[-]{name} failed: reason withheld\n"));
                failed.push(format!("[-]{name} failed: {reason}"));
            }
        }
    }
    if !excluded.is_empty() {
        excluded.sort();
        excluded.dedup();
        let names: Vec<String> = excluded.iter().map(|e| format!("{e:?}")).collect();
        listing.push_str(&format!("warn: some health checks cannot be excluded: no matches for {}\n", names.join(",")));
    }
    let name = endpoint.name();
    if !failed.is_empty() {
        tracing::debug!(checks = %failed.join("; "), "{name} check failed");
        return text(StatusCode::SERVICE_UNAVAILABLE, format!("{listing}{name} check failed\n"));
    }
    if !verbose {
        return text(StatusCode::OK, "ok".into());
    }
    text(StatusCode::OK, format!("{listing}{name} check passed\n"))
}

/// `GET /ENDPOINT/NAME`: one check, with its reason.
async fn single(app: AppState, endpoint: Endpoint, check: &str) -> Response {
    let Some(name) = endpoint.checks(app.store.health_checks()).into_iter().find(|&c| c == check) else {
        return ApiError::not_found_message(format!(
            "the server could not find the requested resource (/{}/{check})",
            endpoint.name()
        ))
        .into_response();
    };
    match run(&app, name).await {
        Ok(()) => text(StatusCode::OK, "ok".into()),
        Err(reason) => text(StatusCode::SERVICE_UNAVAILABLE, format!("internal server error: {reason}\n")),
    }
}

pub async fn livez(State(app): State<AppState>, RawQuery(query): RawQuery) -> Response {
    aggregate(app, Endpoint::Livez, query).await
}

pub async fn readyz(State(app): State<AppState>, RawQuery(query): RawQuery) -> Response {
    aggregate(app, Endpoint::Readyz, query).await
}

pub async fn healthz(State(app): State<AppState>, RawQuery(query): RawQuery) -> Response {
    aggregate(app, Endpoint::Healthz, query).await
}

pub async fn livez_check(State(app): State<AppState>, Path(check): Path<String>) -> Response {
    single(app, Endpoint::Livez, &check).await
}

pub async fn readyz_check(State(app): State<AppState>, Path(check): Path<String>) -> Response {
    single(app, Endpoint::Readyz, &check).await
}

pub async fn healthz_check(State(app): State<AppState>, Path(check): Path<String>) -> Response {
    single(app, Endpoint::Healthz, &check).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_and_lists() {
        assert_eq!(options(None), (false, vec![]));
        assert_eq!(options(Some("verbose")), (true, vec![]));
        assert_eq!(options(Some("verbose=1&exclude=etcd&exclude=lease")), (true, vec!["etcd".into(), "lease".into()]));
        let replicated = [
            HealthCheck { name: "etcd", liveness: false, blocking: true },
            HealthCheck { name: "object-storage", liveness: false, blocking: true },
        ];
        let embedded = [HealthCheck { name: "store", liveness: true, blocking: false }];
        assert!(Endpoint::Readyz.checks(&replicated).contains(&"object-storage"));
        assert!(!Endpoint::Livez.checks(&replicated).contains(&"etcd"), "liveness never waits on etcd");
        assert!(!Endpoint::Livez.checks(&embedded).contains(&"shutdown"));
        assert_eq!(Endpoint::Healthz.checks(&embedded), ["ping", "store"]);
        assert_eq!(Endpoint::Readyz.checks(&embedded), ["ping", "shutdown", "store"]);
    }
}
