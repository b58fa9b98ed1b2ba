//! A stand-in kube-apiserver for delegated authentication and authorization, speaking the real wire
//! format over TLS (its own CA, on 127.0.0.1:0, requiring the bearer token of the kubeconfig it
//! writes):
//!
//! - `POST /apis/authentication.k8s.io/v1/tokenreviews`: static tokens the test registers
//!   ([`StubApiServer::add_token`]) and the stub's own service-account JWTs (verified like the
//!   kube-apiserver does: key, issuer, audiences — the requested ones or the API audiences —, expiry).
//! - `POST /apis/authorization.k8s.io/v1/subjectaccessreviews`: answered from [`SarRule`]s (any matching
//!   deny rule denies, else any matching allow rule allows, else no opinion).
//! - `GET /api/v1/namespaces/kube-system/configmaps/extension-apiserver-authentication`: whatever the
//!   test set ([`StubApiServer::set_authentication_config`], or [`StubApiServer::publish_pki`] for the
//!   stub's own client and front-proxy CAs), 404 until then.
//! - `GET /.well-known/openid-configuration`, `GET /openid/v1/jwks`: the issuer and its published keys
//!   ([`StubApiServer::rotate_signing_key`] adds one).
//!
//! - `GET /api/v1/namespaces/NS/secrets/NAME`: Secrets the test put ([`StubApiServer::put_secret`]).
//!
//! Requests are counted per [`Endpoint`]; [`StubApiServer::set_failure`] makes every endpoint answer an
//! error status and [`StubApiServer::stop`] takes the stub away (connections refused). The stub runs
//! on its own thread and runtime, so it serves blocking tests and a server under test alike
//! (`--kubeconfig` [`StubApiServer::kubeconfig`]).

// A toolkit for tests to come: not every helper is used yet.
#![allow(dead_code, unused_imports)]

mod handlers;
pub mod keys;
pub mod pki;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use base64::Engine;
use jsonwebtoken::Algorithm;
use serde_json::Value;
use stowage::auth::UserInfo;
use tokio_util::sync::CancellationToken;

pub use keys::{now, service_account_uid, SaToken};
pub use pki::{CertifiedKey, TestCa};

/// The issuer the stub's service-account tokens carry (kubeadm's default).
pub const STUB_ISSUER: &str = "https://kubernetes.default.svc.cluster.local";

/// What a request was for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Endpoint {
    TokenReview,
    SubjectAccessReview,
    AuthenticationConfigMap,
    OpenIdConfiguration,
    Jwks,
    Secret,
    /// `POST` and `PATCH` of `events.k8s.io/v1` Events.
    Event,
    Other,
}

/// One authorization rule. `"*"` matches anything; `subject` is a user name, `group:NAME` or `*`;
/// `resource` may be `resource/subresource`; `namespace` `""` is cluster scope only; a rule with a
/// `path` is a non-resource rule (`/prefix*` globs).
#[derive(Clone, Debug)]
pub struct SarRule {
    pub subject: String,
    pub verb: String,
    pub group: String,
    pub resource: String,
    pub namespace: String,
    pub name: String,
    pub path: String,
    pub allow: bool,
    pub reason: String,
}

/// A static token's TokenReview answer: `audiences: None` echoes the requested audiences (or the API
/// audiences); `Some` must intersect them.
#[derive(Clone, Debug)]
pub struct StaticToken {
    pub user: UserInfo,
    pub audiences: Option<Vec<String>>,
}

/// A Secret's type and data.
pub(crate) type StubSecret = (String, BTreeMap<String, Vec<u8>>);

pub(crate) struct State {
    pub(crate) bearer_token: String,
    pub(crate) url: String,
    pub(crate) issuer: String,
    pub(crate) api_audiences: Vec<String>,
    pub(crate) tokens: HashMap<String, StaticToken>,
    pub(crate) rules: Vec<SarRule>,
    pub(crate) no_opinion: (String, String),
    pub(crate) config_map: Option<BTreeMap<String, String>>,
    pub(crate) config_map_version: u64,
    pub(crate) keys: Vec<keys::SigningKey>,
    pub(crate) signing: usize,
    pub(crate) counts: HashMap<Endpoint, usize>,
    pub(crate) reviews: Vec<(Endpoint, Value)>,
    pub(crate) failure: Option<u16>,
    /// Secrets by (namespace, name): their type and data (raw bytes; served base64-encoded).
    pub(crate) secrets: HashMap<(String, String), StubSecret>,
    /// `events.k8s.io/v1` Events as created and patched, in creation order.
    pub(crate) events: Vec<Value>,
}

/// The running stub. Dropping it stops it.
pub struct StubApiServer {
    addr: SocketAddr,
    ca: TestCa,
    client_ca: TestCa,
    request_header_ca: TestCa,
    kubeconfig: PathBuf,
    _dir: tempfile::TempDir,
    state: Arc<Mutex<State>>,
    shutdown: CancellationToken,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl StubApiServer {
    /// Starts a stub with one RS256 signing key, no tokens, no rules and no ConfigMap.
    pub fn start() -> StubApiServer {
        let ca = TestCa::new("stub-kube-apiserver-ca");
        let serving = ca.server_cert(&["127.0.0.1", "localhost"]);
        let state = Arc::new(Mutex::new(State {
            bearer_token: format!("stub-{}", uuid::Uuid::new_v4()),
            url: String::new(),
            issuer: STUB_ISSUER.to_owned(),
            api_audiences: vec![STUB_ISSUER.to_owned()],
            tokens: HashMap::new(),
            rules: Vec::new(),
            no_opinion: (String::new(), String::new()),
            config_map: None,
            config_map_version: 1,
            keys: vec![keys::SigningKey::generate(Algorithm::RS256, "stub-key-1")],
            signing: 0,
            counts: HashMap::new(),
            reviews: Vec::new(),
            failure: None,
            secrets: HashMap::new(),
            events: Vec::new(),
        }));
        let shutdown = CancellationToken::new();
        let (addr, thread) = handlers::spawn(&serving, Arc::clone(&state), shutdown.clone());
        let url = format!("https://{addr}");
        let dir = tempfile::tempdir().expect("stub temp dir");
        let kubeconfig = dir.path().join("kubeconfig");
        let bearer_token = {
            let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
            s.url = url.clone();
            s.bearer_token.clone()
        };
        let ca_data = base64::engine::general_purpose::STANDARD.encode(&ca.cert_pem);
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: stub\n  cluster:\n    server: {url}\n    \
             certificate-authority-data: {ca_data}\nusers:\n- name: stub\n  user:\n    token: {bearer_token}\n\
             contexts:\n- name: stub\n  context:\n    cluster: stub\n    user: stub\ncurrent-context: stub\n"
        );
        std::fs::write(&kubeconfig, text).expect("write the stub kubeconfig");
        StubApiServer {
            addr,
            ca,
            client_ca: TestCa::new("stub-client-ca"),
            request_header_ca: TestCa::new("stub-front-proxy-ca"),
            kubeconfig,
            _dir: dir,
            state,
            shutdown,
            thread: Some(thread),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// A kubeconfig (CA + bearer token) for the stub: what the server under test gets as `--kubeconfig`.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The CA the stub's serving certificate chains to.
    pub fn ca_pem(&self) -> &str {
        &self.ca.cert_pem
    }

    /// The CA [`Self::publish_pki`] publishes as `client-ca-file`: sign user certificates with it.
    pub fn client_ca(&self) -> &TestCa {
        &self.client_ca
    }

    /// The CA [`Self::publish_pki`] publishes as `requestheader-client-ca-file`: sign front-proxy
    /// certificates with it.
    pub fn request_header_ca(&self) -> &TestCa {
        &self.request_header_ca
    }

    // ----- TokenReview -------------------------------------------------------------------------

    /// TokenReview authenticates `token` as `user` (for any requested audience).
    pub fn add_token(&self, token: &str, user: UserInfo) {
        self.add_static_token(token, StaticToken { user, audiences: None });
    }

    pub fn add_static_token(&self, token: &str, answer: StaticToken) {
        self.state().tokens.insert(token.to_owned(), answer);
    }

    pub fn remove_token(&self, token: &str) {
        self.state().tokens.remove(token);
    }

    /// The audiences a TokenReview without `spec.audiences` is checked against (default: the issuer).
    pub fn set_api_audiences(&self, audiences: &[&str]) {
        self.state().api_audiences = audiences.iter().map(|a| a.to_string()).collect();
    }

    // ----- SubjectAccessReview -----------------------------------------------------------------

    pub fn add_rule(&self, rule: SarRule) {
        self.state().rules.push(rule);
    }

    /// Allows `subject` to `verb` `resource` (any group, any name) in `namespace`.
    pub fn allow(&self, subject: &str, verb: &str, resource: &str, namespace: &str) {
        self.add_rule(SarRule::resource(subject, verb, resource, namespace, true, "allowed by the stub"));
    }

    /// Denies `subject` to `verb` `resource` in `namespace`, with `reason`.
    pub fn deny(&self, subject: &str, verb: &str, resource: &str, namespace: &str, reason: &str) {
        self.add_rule(SarRule::resource(subject, verb, resource, namespace, false, reason));
    }

    /// Allows `subject` to `verb` a non-resource `path` (`/prefix*` globs).
    pub fn allow_path(&self, subject: &str, verb: &str, path: &str) {
        let mut rule = SarRule::resource(subject, verb, "", "*", true, "allowed by the stub");
        rule.path = path.to_owned();
        self.add_rule(rule);
    }

    pub fn clear_rules(&self) {
        self.state().rules.clear();
    }

    /// The `reason` and `evaluationError` of no-opinion answers (default: both empty).
    pub fn set_no_opinion(&self, reason: &str, evaluation_error: &str) {
        self.state().no_opinion = (reason.to_owned(), evaluation_error.to_owned());
    }

    /// The request bodies received for `endpoint` (TokenReview bodies with `spec.token` removed).
    pub fn reviews(&self, endpoint: Endpoint) -> Vec<Value> {
        self.state().reviews.iter().filter(|(e, _)| *e == endpoint).map(|(_, v)| v.clone()).collect()
    }

    // ----- the authentication ConfigMap --------------------------------------------------------

    /// Sets the ConfigMap's `data` (`None`: it does not exist).
    pub fn set_authentication_config(&self, data: Option<BTreeMap<String, String>>) {
        let mut state = self.state();
        state.config_map = data;
        state.config_map_version += 1;
    }

    /// Publishes the stub's client CA and request-header CA with the kube-apiserver's usual headers and
    /// these allowed front-proxy names.
    pub fn publish_pki(&self, allowed_names: &[&str]) {
        let list = |v: &[&str]| serde_json::to_string(v).unwrap_or_default();
        let data = [
            ("client-ca-file", self.client_ca.cert_pem.clone()),
            ("requestheader-client-ca-file", self.request_header_ca.cert_pem.clone()),
            ("requestheader-allowed-names", list(allowed_names)),
            ("requestheader-username-headers", list(&["X-Remote-User"])),
            ("requestheader-group-headers", list(&["X-Remote-Group"])),
            ("requestheader-extra-headers-prefix", list(&["X-Remote-Extra-"])),
        ];
        self.set_authentication_config(Some(data.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()));
    }

    // ----- service-account tokens --------------------------------------------------------------

    pub fn issuer(&self) -> String {
        self.state().issuer.clone()
    }

    /// An unbound token for `namespace/name`, signed with the current key.
    pub fn service_account_token(&self, namespace: &str, name: &str, audiences: &[&str], exp: i64) -> String {
        self.sign(&SaToken::new(namespace, name, audiences, exp))
    }

    /// Signs `token` with the current key (or the key its `kid` names).
    pub fn sign(&self, token: &SaToken) -> String {
        let state = self.state();
        let claims = token.claims(&state.issuer);
        let key = match token.kid.as_deref() {
            Some(kid) if !kid.is_empty() => state.keys.iter().find(|k| k.kid == kid).expect("no such stub key"),
            _ => &state.keys[state.signing],
        };
        let kid = match token.kid.as_deref() {
            Some("") => None,
            _ => Some(key.kid.as_str()),
        };
        key.sign(&claims, kid)
    }

    /// Adds a new published key and signs with it from now on; returns its `kid`. The old keys stay
    /// published until [`Self::unpublish_key`].
    pub fn rotate_signing_key(&self, algorithm: Algorithm) -> String {
        let mut state = self.state();
        let kid = format!("stub-key-{}", state.keys.len() + 1);
        state.keys.push(keys::SigningKey::generate(algorithm, &kid));
        state.signing = state.keys.len() - 1;
        kid
    }

    pub fn unpublish_key(&self, kid: &str) {
        for key in self.state().keys.iter_mut().filter(|k| k.kid == kid) {
            key.published = false;
        }
    }

    // ----- observing and breaking --------------------------------------------------------------

    /// How many requests `endpoint` received (including refused and failed ones).
    /// Serves a Secret of `type_` (e.g. `kubernetes.io/dockerconfigjson`) with `data`.
    pub fn put_secret(&self, namespace: &str, name: &str, type_: &str, data: &[(&str, &[u8])]) {
        let data = data.iter().map(|(k, v)| (k.to_string(), v.to_vec())).collect();
        self.state().secrets.insert((namespace.into(), name.into()), (type_.into(), data));
    }

    /// The Events received (`events.k8s.io/v1`), as they stand after their patches.
    pub fn events(&self) -> Vec<Value> {
        self.state().events.clone()
    }

    pub fn requests(&self, endpoint: Endpoint) -> usize {
        self.state().counts.get(&endpoint).copied().unwrap_or(0)
    }

    pub fn reset_counts(&self) {
        self.state().counts.clear();
    }

    /// Every request is answered with this HTTP status (a `Status` body) until `None`.
    pub fn set_failure(&self, status: Option<u16>) {
        self.state().failure = status;
    }

    /// Stops serving: new connections are refused, open ones closed.
    pub fn stop(&mut self) {
        self.shutdown.cancel();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for StubApiServer {
    fn drop(&mut self) {
        self.stop();
    }
}

impl SarRule {
    pub fn resource(subject: &str, verb: &str, resource: &str, namespace: &str, allow: bool, reason: &str) -> Self {
        SarRule {
            subject: subject.to_owned(),
            verb: verb.to_owned(),
            group: "*".to_owned(),
            resource: resource.to_owned(),
            namespace: namespace.to_owned(),
            name: "*".to_owned(),
            path: String::new(),
            allow,
            reason: reason.to_owned(),
        }
    }
}
