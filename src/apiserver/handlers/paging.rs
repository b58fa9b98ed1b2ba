//! List options as kube-apiserver reads them: `limit`/`continue` (chunked lists, every page at the
//! resourceVersion of the first) and `resourceVersion`/`resourceVersionMatch`.

use std::collections::HashMap;
use std::time::Duration;

use base64::Engine;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::apiserver::status::{ApiError, ApiResult};
use crate::apiserver::AppState;

/// How long a list waits for a resourceVersion the store has not reached (kube-apiserver: 3 s).
const FRESHNESS_WAIT: Duration = Duration::from_secs(3);

/// A parsed list request.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct ListOptions {
    /// List at exactly this resourceVersion (`continue`, or `resourceVersionMatch=Exact`).
    pub at: Option<u64>,
    /// Continue after this object (`namespace/name`).
    pub after: Option<String>,
    pub limit: Option<usize>,
    /// The store must have reached this resourceVersion first.
    pub not_older_than: u64,
    /// Whether `at` came from a continue token (decides the message once it expired).
    pub continued: bool,
}

/// The continue token: opaque to clients, shaped like kube-apiserver's.
#[derive(Serialize, Deserialize)]
struct ContinueToken {
    v: String,
    rv: u64,
    start: String,
}

const TOKEN_VERSION: &str = "meta.k8s.io/v1";

pub(crate) fn continue_token(rv: u64, last: &str) -> String {
    let token = ContinueToken { v: TOKEN_VERSION.into(), rv, start: last.into() };
    base64::engine::general_purpose::URL_SAFE.encode(json!(token).to_string())
}

fn decode_token(text: &str) -> ApiResult<ContinueToken> {
    let invalid = |detail: &str| ApiError::bad_request(format!("continue key is not valid: {detail}"));
    let bytes = base64::engine::general_purpose::URL_SAFE
        .decode(text)
        .or_else(|_| base64::engine::general_purpose::STANDARD.decode(text))
        .map_err(|_| invalid("not base64"))?;
    let token: ContinueToken = serde_json::from_slice(&bytes).map_err(|_| invalid("not a continue token"))?;
    if token.v != TOKEN_VERSION {
        return Err(invalid("incorrect encoded start resourceVersion (version meta.k8s.io/v1)"));
    }
    Ok(token)
}

pub(crate) fn parse(params: &HashMap<String, String>) -> ApiResult<ListOptions> {
    let get = |name: &str| params.get(name).map(String::as_str).filter(|v| !v.is_empty());
    let limit = match get("limit") {
        None => None,
        Some(text) => match text.parse::<i64>() {
            Ok(n) if n > 0 => Some(usize::try_from(n).unwrap_or(usize::MAX)),
            Ok(_) => None,
            Err(_) => return Err(ApiError::bad_request(format!("invalid limit {text:?}: must be an integer"))),
        },
    };
    let rv = get("resourceVersion");
    let rv_number = |text: &str| {
        text.parse::<u64>().map_err(|_| ApiError::bad_request(format!("invalid resourceVersion {text:?}")))
    };
    let mut options = ListOptions { limit, ..ListOptions::default() };
    if let Some(text) = get("continue") {
        if get("resourceVersionMatch").is_some() {
            return Err(ApiError::bad_request("resourceVersionMatch is forbidden when continue is provided"));
        }
        if rv.is_some_and(|rv| rv != "0") {
            return Err(ApiError::bad_request("specifying resource version is not allowed when using continue"));
        }
        let token = decode_token(text)?;
        options.at = (token.rv > 0).then_some(token.rv); // 0: an inconsistent continuation, at "now"
        options.after = Some(token.start);
        options.continued = true;
        return Ok(options);
    }
    match (get("resourceVersionMatch"), rv) {
        (Some(_), None) => {
            return Err(ApiError::bad_request("resourceVersionMatch is forbidden unless resourceVersion is provided"))
        }
        (Some("Exact"), Some("0")) => {
            return Err(ApiError::bad_request("resourceVersionMatch \"Exact\" is forbidden for resourceVersion \"0\""))
        }
        (Some("Exact"), Some(text)) => {
            let at = rv_number(text)?;
            options.at = Some(at);
            options.not_older_than = at;
        }
        (Some("NotOlderThan") | None, Some(text)) => options.not_older_than = rv_number(text)?,
        (None, None) => {}
        (Some(other), _) => {
            return Err(ApiError::bad_request(format!(
                "unsupported resourceVersionMatch {other:?}: supported values: \"Exact\", \"NotOlderThan\""
            )))
        }
    }
    Ok(options)
}

/// Waits (briefly) until the store reached `rv` durably (lists show nothing newer; notifications
/// come after each flush); a 504 like kube-apiserver's if it does not.
pub(super) async fn wait_for(app: &AppState, rv: u64) -> ApiResult<()> {
    if rv == 0 {
        return Ok(());
    }
    let mut notifications = app.store.subscribe();
    let deadline = tokio::time::Instant::now() + FRESHNESS_WAIT;
    loop {
        let current = app.store.durable_resource_version();
        if current >= rv {
            return Ok(());
        }
        match tokio::time::timeout_at(deadline, notifications.recv()).await {
            Ok(Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_))) => {}
            Ok(Err(_)) | Err(_) => return Err(ApiError::too_large_resource_version(rv, current)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn continue_tokens_round_trip_and_reject_garbage() {
        let token = continue_token(42, "team-a/web");
        let options = parse(&params(&[("continue", &token), ("limit", "5")])).unwrap();
        assert_eq!(options.at, Some(42));
        assert_eq!(options.after.as_deref(), Some("team-a/web"));
        assert_eq!(options.limit, Some(5));
        assert_eq!(parse(&params(&[("continue", "%%%")])).unwrap_err().code.as_u16(), 400);
        let with_rv = params(&[("continue", &token), ("resourceVersion", "7")]);
        assert_eq!(parse(&with_rv).unwrap_err().code.as_u16(), 400);
    }

    #[test]
    fn resource_version_match_rules() {
        assert_eq!(parse(&params(&[("resourceVersionMatch", "Exact")])).unwrap_err().code.as_u16(), 400);
        let exact0 = params(&[("resourceVersionMatch", "Exact"), ("resourceVersion", "0")]);
        assert_eq!(parse(&exact0).unwrap_err().code.as_u16(), 400);
        let exact = parse(&params(&[("resourceVersionMatch", "Exact"), ("resourceVersion", "9")])).unwrap();
        assert_eq!((exact.at, exact.not_older_than), (Some(9), 9));
        let newer = parse(&params(&[("resourceVersion", "9")])).unwrap();
        assert_eq!((newer.at, newer.not_older_than), (None, 9));
        assert_eq!(parse(&params(&[("limit", "0")])).unwrap().limit, None);
        assert_eq!(parse(&params(&[("limit", "x")])).unwrap_err().code.as_u16(), 400);
    }
}
