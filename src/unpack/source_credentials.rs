//! The `--source-credentials` file: credentials for git and http sources by host, for sources
//! without an `authSecret` (in standalone mode there are no Secrets to name).
//!
//! ```yaml
//! hosts:
//!   git.example.com:              # https on port 443 (http: port 80)
//!     username: ci
//!     password: s3cret
//!   "files.example.com:8443":     # that port only
//!     token: glpat-…              # http: Authorization: Bearer; git: user x-access-token
//! ```
//!
//! YAML or JSON (JSON is YAML). A key without a port matches the host on the URL scheme's default
//! port only, as git's and docker's credential lookups do, so credentials never reach another
//! service on the same machine by accident. Problems are reported by position and host, never
//! by quoting the file: it holds secrets.

use std::collections::BTreeMap;

use serde_yaml_ng::Value;

use super::source::Credentials;

/// A parsed file: credentials by `(host, port)`, the host lower-case, `None` for "default port".
#[derive(Debug, Default)]
pub struct HostCredentials {
    hosts: BTreeMap<(String, Option<u16>), Credentials>,
}

impl HostCredentials {
    /// Parses the file's bytes; `Err` says what is wrong in plain words (no secret bytes).
    pub fn parse(bytes: &[u8]) -> Result<HostCredentials, String> {
        let doc: Value = serde_yaml_ng::from_slice(bytes).map_err(|e| match e.location() {
            Some(at) => format!("is not valid YAML or JSON (line {}, column {})", at.line(), at.column()),
            None => "is not valid YAML or JSON".to_owned(),
        })?;
        let hosts = match &doc {
            Value::Mapping(top) => {
                if let Some(other) = top.keys().find(|k| k.as_str() != Some("hosts")) {
                    return Err(format!("has an unknown top-level key {} (expected only hosts)", key_name(other)));
                }
                top.get("hosts")
            }
            Value::Null => None,
            _ => return Err("must be a map with a hosts key".to_owned()),
        };
        let mut parsed = HostCredentials::default();
        let entries = match hosts {
            Some(Value::Mapping(entries)) => entries,
            None | Some(Value::Null) => return Ok(parsed),
            Some(_) => return Err("hosts must be a map of HOST[:PORT] to credentials".to_owned()),
        };
        for (key, entry) in entries {
            let Some(key) = key.as_str() else {
                return Err(format!("hosts has a key that is not a string: {}", key_name(key)));
            };
            let host = parse_host(key).map_err(|problem| format!("host {key:?}: {problem}"))?;
            let credentials = parse_entry(entry).map_err(|problem| format!("host {key:?}: {problem}"))?;
            if parsed.hosts.insert(host, credentials).is_some() {
                return Err(format!("host {key:?} is listed twice"));
            }
        }
        Ok(parsed)
    }

    /// The credentials for `url`'s host and port, if the file names them.
    pub fn for_url(&self, url: &reqwest::Url) -> Option<Credentials> {
        let host = url.host_str()?.to_ascii_lowercase();
        let exact = url.port_or_known_default().and_then(|p| self.hosts.get(&(host.clone(), Some(p))));
        // `Url::port` is `None` exactly when the URL uses its scheme's default port.
        let default = url.port().is_none().then(|| self.hosts.get(&(host, None))).flatten();
        exact.or(default).cloned()
    }
}

/// `HOST`, `HOST:PORT`, `[IPv6]` or `[IPv6]:PORT`.
fn parse_host(key: &str) -> Result<(String, Option<u16>), String> {
    if key.contains("://") || key.contains(['/', '@', ' ', '\t']) {
        return Err("expected HOST or HOST:PORT, without a scheme, path or user".to_owned());
    }
    let (host, port) = if let Some(rest) = key.strip_prefix('[') {
        let (addr, after) = rest.split_once(']').ok_or("an IPv6 address misses its closing bracket")?;
        let port = match after {
            "" => None,
            _ => Some(after.strip_prefix(':').ok_or("expected :PORT after the IPv6 address")?),
        };
        (format!("[{addr}]"), port)
    } else {
        match key.split_once(':') {
            Some((_, p)) if p.contains(':') => return Err("IPv6 addresses go in brackets: [ADDRESS]:PORT".to_owned()),
            Some((host, port)) => (host.to_owned(), Some(port)),
            None => (key.to_owned(), None),
        }
    };
    if host.is_empty() || host == "[]" {
        return Err("the host is empty".to_owned());
    }
    let port = match port {
        None => None,
        Some(p) => Some(p.parse::<u16>().ok().filter(|p| *p > 0).ok_or("the port is not a number from 1 to 65535")?),
    };
    Ok((host.to_ascii_lowercase(), port))
}

/// `{username, password}` or `{token}`.
fn parse_entry(entry: &Value) -> Result<Credentials, String> {
    let Value::Mapping(fields) = entry else {
        return Err("expected a map with username and password, or token".to_owned());
    };
    let mut text = BTreeMap::new();
    for (key, value) in fields {
        let name = key.as_str().filter(|k| ["username", "password", "token"].contains(k));
        let Some(name) = name else {
            return Err(format!("unknown field {} (expected username, password or token)", key_name(key)));
        };
        let Value::String(value) = value else {
            return Err(format!("{name} must be a string (put it in quotes)"));
        };
        if value.is_empty() {
            return Err(format!("{name} is empty"));
        }
        text.insert(name, value.clone());
    }
    match (text.remove("username"), text.remove("password"), text.remove("token")) {
        (Some(username), Some(password), None) => Ok(Credentials::Basic { username, password }),
        (None, None, Some(token)) => Ok(Credentials::Bearer(token)),
        (Some(_), None, None) => Err("username without a password".to_owned()),
        (None, Some(_), None) => Err("password without a username".to_owned()),
        _ => Err("set either username and password, or token".to_owned()),
    }
}

/// A key as messages show it: strings quoted, anything else by kind (keys are not secret, but
/// a mis-indented value could end up as a key).
fn key_name(key: &Value) -> String {
    match key {
        Value::String(s) if s.len() <= 64 => format!("{s:?}"),
        Value::String(_) => "(a long string)".to_owned(),
        _ => "(not a string)".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(s: &str) -> reqwest::Url {
        reqwest::Url::parse(s).unwrap()
    }

    fn err(text: &str) -> String {
        HostCredentials::parse(text.as_bytes()).unwrap_err()
    }

    #[test]
    fn yaml_and_json_with_basic_and_token_entries() {
        let yaml = "hosts:\n  Git.Example.com:\n    username: ci\n    password: s3cret\n  \
                    files.example.com:8443:\n    token: tok\n  \"[::1]:3000\":\n    token: six\n";
        let creds = HostCredentials::parse(yaml.as_bytes()).unwrap();
        let basic = creds.for_url(&url("https://git.example.com/team/repo.git"));
        assert!(
            matches!(basic, Some(Credentials::Basic { ref username, ref password }) if username == "ci" && password == "s3cret")
        );
        assert!(
            matches!(creds.for_url(&url("https://files.example.com:8443/a.tgz")), Some(Credentials::Bearer(ref t)) if t == "tok")
        );
        assert!(matches!(creds.for_url(&url("http://[::1]:3000/x")), Some(Credentials::Bearer(ref t)) if t == "six"));

        let json = r#"{"hosts": {"127.0.0.1:9000": {"username": "u", "password": "p"}}}"#;
        let creds = HostCredentials::parse(json.as_bytes()).unwrap();
        assert!(creds.for_url(&url("http://127.0.0.1:9000/repo")).is_some());
        assert!(HostCredentials::parse(b"").unwrap().for_url(&url("https://a.example/")).is_none(), "empty file");
        assert!(HostCredentials::parse(b"hosts: {}").is_ok());
    }

    #[test]
    fn a_key_without_a_port_means_the_default_port_only() {
        let creds = HostCredentials::parse(b"hosts: {example.com: {token: t}, other.example:443: {token: u}}").unwrap();
        assert!(creds.for_url(&url("https://example.com/x")).is_some());
        assert!(creds.for_url(&url("https://example.com:443/x")).is_some(), "443 is https's default");
        assert!(creds.for_url(&url("http://example.com/x")).is_some(), "80 is http's default");
        assert!(creds.for_url(&url("https://example.com:8443/x")).is_none(), "another port: another service");
        assert!(creds.for_url(&url("https://sub.example.com/x")).is_none(), "no suffix matching");
        assert!(creds.for_url(&url("https://other.example/x")).is_some(), "an explicit default port");
        assert!(creds.for_url(&url("http://other.example/x")).is_none(), "port 80 is not 443");
    }

    #[test]
    fn problems_in_plain_words_without_secrets() {
        assert!(err("hosts: [").starts_with("is not valid YAML or JSON (line"), "{}", err("hosts: ["));
        assert_eq!(err("[1, 2]"), "must be a map with a hosts key");
        assert_eq!(err("auths: {}"), "has an unknown top-level key \"auths\" (expected only hosts)");
        assert_eq!(err("hosts: {a.example: {username: u}}"), "host \"a.example\": username without a password");
        assert_eq!(
            err("hosts: {a.example: {username: u, password: hunter2, token: t}}"),
            "host \"a.example\": set either username and password, or token"
        );
        let typo = err("hosts: {a.example: {user: u, password: hunter2}}");
        assert_eq!(typo, "host \"a.example\": unknown field \"user\" (expected username, password or token)");
        let number = err("hosts: {a.example: {username: u, password: 123456}}");
        assert!(number.contains("password must be a string") && !number.contains("123456"), "{number}");
        assert!(err("hosts: {https://a.example: {token: t}}").contains("without a scheme"));
        assert!(err("hosts: {a.example:99999: {token: t}}").contains("port is not a number"));
        assert!(err("hosts: {\"fe80::1\": {token: t}}").contains("IPv6 addresses go in brackets"));
        assert!(err("hosts: {A.example: {token: t}, a.example: {token: u}}").contains("listed twice"));
    }
}
