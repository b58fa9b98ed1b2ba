//! `/version`: kube's `version.Info`, naming the Kubernetes release the API is served as, with
//! stowage's own version as build metadata.

use axum::http::StatusCode;
use axum::response::Response;
use k8s_openapi::apimachinery::pkg::version::Info;

use super::to_json;
use crate::apiserver::handlers::json_response;

/// The Kubernetes version `/version` reports, as (major, minor). kubectl (`kubectl version`) warns
/// when its own major differs or its minor is more than one away, so the server must name a
/// Kubernetes release, not stowage's own version: the API is served as kube-apiserver 1.33 serves
/// it, and stowage is tested with kubectl 1.32 and behind a 1.34 aggregator, both within one minor
/// of 1.33. Move it with the releases stowage is tested against. Stowage's own version is the
/// build metadata of `gitVersion` (`v1.33.0+stowage.0.1.0`), which kubectl parses and ignores.
pub const KUBERNETES_VERSION: (u32, u32) = (1, 33);

/// kube's `version.Info` for this build. The commit, tree state and build date come from
/// `STOWAGE_GIT_COMMIT`, `STOWAGE_GIT_TREE_STATE` and `STOWAGE_BUILD_DATE` at compile time when a
/// release build sets them (empty / the epoch otherwise, as kube reports unstamped builds).
pub fn version_info() -> Info {
    let (major, minor) = KUBERNETES_VERSION;
    let go_arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    Info {
        major: major.to_string(),
        minor: minor.to_string(),
        git_version: format!("v{major}.{minor}.0+stowage.{}", env!("CARGO_PKG_VERSION")),
        emulation_major: Some(major.to_string()),
        emulation_minor: Some(minor.to_string()),
        min_compatibility_major: Some(major.to_string()),
        min_compatibility_minor: Some(minor.saturating_sub(1).to_string()),
        git_commit: option_env!("STOWAGE_GIT_COMMIT").unwrap_or("").into(),
        git_tree_state: option_env!("STOWAGE_GIT_TREE_STATE").unwrap_or("").into(),
        build_date: option_env!("STOWAGE_BUILD_DATE").unwrap_or("1970-01-01T00:00:00Z").into(),
        go_version: "n/a".into(),
        compiler: "rustc".into(),
        platform: format!("{}/{go_arch}", std::env::consts::OS),
    }
}

/// `/version`: [`version_info`].
pub async fn version() -> Response {
    json_response(StatusCode::OK, &to_json(&version_info()), &[])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_names_a_kubernetes_release_with_stowage_as_build_metadata() {
        let info = version_info();
        assert_eq!((info.major.as_str(), info.minor.as_str()), ("1", "33"));
        let (core, build) = info.git_version.split_once('+').unwrap();
        assert_eq!(core, "v1.33.0");
        assert_eq!(build, format!("stowage.{}", env!("CARGO_PKG_VERSION")));
        // SemVer build metadata: dot-separated non-empty [0-9A-Za-z-] identifiers.
        assert!(build.split('.').all(|id| !id.is_empty() && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')));
    }
}
