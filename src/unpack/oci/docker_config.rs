//! Docker config files (`.dockerconfigjson` Secrets, the `--registry-config` file): finding the
//! username and password for one registry.
//!
//! The format is `{"auths": {KEY: {"auth": base64("user:pass")} | {"username", "password"}}}`
//! where KEY is `host[:port]`, optionally written as a URL (`https://index.docker.io/v1/`). The
//! input is untrusted (any Secret a user may read): every malformed shape is an error or "no
//! entry", never a panic.

use base64::Engine;
use serde_json::Value;

/// A username and password for HTTP basic authentication.
#[derive(Clone, PartialEq, Eq)]
pub struct BasicCredentials {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for BasicCredentials {
    // Never print the password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BasicCredentials({}, <redacted>)", self.username)
    }
}

/// The credentials `config` holds for `registry` (`host[:port]`, as in an image reference):
/// `Ok(None)` when it has no usable entry for that host, `Err` when `config` is not a docker config
/// file at all. Docker Hub's aliases (`docker.io`, `index.docker.io`, `registry-1.docker.io`) match
/// each other; keys may carry a scheme and a path.
pub fn credentials_for(config: &[u8], registry: &str) -> Result<Option<BasicCredentials>, String> {
    let value: Value = serde_json::from_slice(config)
        .map_err(|e| format!("not a docker config file: it {}", crate::unpack::error::json_problem(&e)))?;
    let auths = match value.get("auths") {
        Some(Value::Object(auths)) => auths,
        // A config without an `auths` section (only `credHelpers`, say) has nothing for us.
        None | Some(Value::Null) => return Ok(None),
        Some(_) => return Err("not a docker config file: `auths` is not an object".to_owned()),
    };
    let wanted = normalise_host(registry);
    // Prefer an exact key over a normalised match, so `docker.io` and a URL key cannot shadow
    // each other unpredictably (JSON object order is the file's order).
    let matching =
        auths.iter().filter(|(key, _)| normalise_host(key) == wanted).max_by_key(|(key, _)| key.as_str() == registry);
    match matching {
        Some((key, entry)) => entry_credentials(entry).map_err(|e| format!("docker config entry {key:?}: {e}")),
        None => Ok(None),
    }
}

/// `host[:port]`, lower-cased, of a registry name or a config key: scheme and path removed, Docker
/// Hub's aliases folded into `docker.io`.
pub fn normalise_host(key: &str) -> String {
    let key = key.trim();
    let without_scheme = key.split_once("://").map_or(key, |(_, rest)| rest);
    let host = without_scheme.split('/').next().unwrap_or_default().to_ascii_lowercase();
    match host.as_str() {
        "index.docker.io" | "registry-1.docker.io" | "registry.hub.docker.com" => "docker.io".to_owned(),
        _ => host,
    }
}

/// One `auths` entry: `auth` (base64 `user:pass`) wins over `username`/`password`; an entry with
/// neither (only an `identitytoken`, say) is "no credentials".
fn entry_credentials(entry: &Value) -> Result<Option<BasicCredentials>, String> {
    let Value::Object(entry) = entry else {
        return Err("not an object".to_owned());
    };
    if let Some(auth) = entry.get("auth").and_then(Value::as_str).filter(|a| !a.is_empty()) {
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(auth.trim())
            .map_err(|_| "`auth` is not base64".to_owned())?;
        let decoded = String::from_utf8(decoded).map_err(|_| "`auth` is not UTF-8".to_owned())?;
        let (username, password) =
            decoded.split_once(':').ok_or_else(|| "`auth` is not `username:password`".to_owned())?;
        return Ok(Some(BasicCredentials { username: username.to_owned(), password: password.to_owned() }));
    }
    match (entry.get("username").and_then(Value::as_str), entry.get("password").and_then(Value::as_str)) {
        (Some(username), Some(password)) if !username.is_empty() => {
            Ok(Some(BasicCredentials { username: username.to_owned(), password: password.to_owned() }))
        }
        _ => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn creds(user: &str, pass: &str) -> Option<BasicCredentials> {
        Some(BasicCredentials { username: user.into(), password: pass.into() })
    }

    #[test]
    fn auth_field_and_username_password() {
        let config = br#"{"auths": {
            "registry.example:5000": {"auth": "dXNlcjpwYTpzcw=="},
            "other.example": {"username": "u2", "password": "p2"}
        }}"#;
        assert_eq!(credentials_for(config, "registry.example:5000").unwrap(), creds("user", "pa:ss"));
        assert_eq!(credentials_for(config, "other.example").unwrap(), creds("u2", "p2"));
        assert_eq!(credentials_for(config, "registry.example").unwrap(), None, "the port is part of the host");
        assert_eq!(credentials_for(config, "unknown.example").unwrap(), None);
    }

    #[test]
    fn docker_hub_aliases_and_url_keys() {
        let config = br#"{"auths": {"https://index.docker.io/v1/": {"auth": "YTpi"}}}"#;
        assert_eq!(credentials_for(config, "docker.io").unwrap(), creds("a", "b"));
        assert_eq!(credentials_for(config, "index.docker.io").unwrap(), creds("a", "b"));
        let config = br#"{"auths": {"http://LOCALHOST:5000/v2": {"username": "x", "password": "y"}}}"#;
        assert_eq!(credentials_for(config, "localhost:5000").unwrap(), creds("x", "y"));
    }

    #[test]
    fn exact_key_wins_over_alias() {
        let config = br#"{"auths": {"docker.io": {"auth": "YTpi"}, "index.docker.io": {"auth": "Yzpk"}}}"#;
        assert_eq!(credentials_for(config, "index.docker.io").unwrap(), creds("c", "d"));
        assert_eq!(credentials_for(config, "docker.io").unwrap(), creds("a", "b"));
    }

    #[test]
    fn malformed_input_is_an_error_or_nothing() {
        assert!(credentials_for(b"", "h").is_err());
        assert!(credentials_for(b"[1]", "h").unwrap().is_none());
        assert!(credentials_for(br#"{"auths": 3}"#, "h").is_err());
        assert!(credentials_for(br#"{"auths": {"h": 3}}"#, "h").is_err());
        assert!(credentials_for(br#"{"auths": {"h": {"auth": "!!"}}}"#, "h").is_err());
        assert!(credentials_for(br#"{"auths": {"h": {"auth": "bm9jb2xvbg=="}}}"#, "h").is_err());
        assert!(credentials_for(br#"{"auths": {"h": {"identitytoken": "t"}}}"#, "h").unwrap().is_none());
        assert!(credentials_for(br#"{"credHelpers": {"h": "x"}}"#, "h").unwrap().is_none());
        for key in ["", "://", "/", "a://b://c/d", "\u{1F600}:1"] {
            let _ = normalise_host(key);
        }
    }

    #[test]
    fn debug_hides_the_password() {
        let c = BasicCredentials { username: "u".into(), password: "secret".into() };
        assert!(!format!("{c:?}").contains("secret"));
    }
}
