//! Standalone, the server serves the Events it writes about its own objects (`crate::events`):
//! `events.k8s.io/v1` as stored, and the core `v1` view `kubectl describe` and `kubectl get
//! events` read — get, list (selectors, paging) and watch, through the generic verbs with the
//! strategies of `strategy::event`. In a cluster Events go to the cluster's API server and
//! none of this is routed (the APIService covers `content.stowage.dev` only).

use axum::extract::{Extension, Path, State};
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::get;
use axum::Router;

use super::discovery;
use super::handlers::{read, Params};
use super::stall::ConnectionCut;
use super::status::ApiResult;
use super::AppState;
use crate::strategy::event::{CORE_EVENT, EVENT};
use crate::strategy::ResourceDef;

pub fn routes(standalone: bool) -> Router<AppState> {
    if !standalone {
        return Router::new();
    }
    let mut router = Router::new()
        .route("/api/v1", get(discovery::events::core_resources))
        .route("/apis/events.k8s.io", get(discovery::events::group))
        .route("/apis/events.k8s.io/v1", get(discovery::events::resources));
    for (base, def) in [("/apis/events.k8s.io/v1", &EVENT), ("/api/v1", &CORE_EVENT)] {
        let def: &'static ResourceDef = def;
        router = router
            .route(
                &format!("{base}/events"),
                get(
                    move |state: State<AppState>,
                          params: Params,
                          cut: Option<Extension<ConnectionCut>>,
                          headers: HeaderMap| {
                        read::list_of(state, None, def, params, cut, headers)
                    },
                ),
            )
            .route(
                &format!("{base}/namespaces/{{namespace}}/events"),
                get(
                    move |state: State<AppState>,
                          Path(namespace): Path<String>,
                          params: Params,
                          cut: Option<Extension<ConnectionCut>>,
                          headers: HeaderMap| {
                        read::list_of(state, Some(namespace), def, params, cut, headers)
                    },
                ),
            )
            .route(
                &format!("{base}/namespaces/{{namespace}}/events/{{name}}"),
                get(
                    move |state: State<AppState>,
                          Path((namespace, name)): Path<(String, String)>,
                          params: Params,
                          headers: HeaderMap| async move {
                        let response: ApiResult<Response> =
                            read::get_of(state, def, namespace, name, params, headers).await;
                        response
                    },
                ),
            );
    }
    router
}
