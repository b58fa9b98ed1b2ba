//! The cluster install (`deploy/`, `stowage certs`) checked without a cluster: `stowage certs` into a
//! temporary copy of `deploy/`, `kubectl kustomize` renders it, `kubectl apply --dry-run=client`
//! accepts every object (against a stand-in discovery endpoint, since kubectl maps kinds to resources
//! even for a client-side dry run), and the rendered objects are checked field by field: the
//! APIService trusts exactly the generated CA, the serving certificate names the Service, RBAC grants
//! exactly what the README promises, the pod runs locked down. `deploy/ha` (replicated mode) is the
//! same base with a three-replica Deployment configured from Secrets in place of the StatefulSet.
//!
//! Needs `kubectl` on PATH; a missing kubectl fails these tests, it never skips them.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use base64::Engine as _;
use serde::Deserialize as _;
use serde_json::{json, Value};

const APISERVICE: &str = "v1alpha1.content.stowage.dev";

pub(crate) fn repo_deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy")
}

/// A copy of `deploy/` without any generated files, so the repository is never modified.
pub(crate) fn copy_deploy(to: &Path) -> PathBuf {
    fn copy(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let entry = entry.unwrap();
            let name = entry.file_name();
            if name == "generated" {
                continue;
            }
            if entry.file_type().unwrap().is_dir() {
                copy(&entry.path(), &to.join(&name));
            } else {
                std::fs::copy(entry.path(), to.join(&name)).unwrap();
            }
        }
    }
    let dest = to.join("deploy");
    copy(&repo_deploy(), &dest);
    dest
}

pub(crate) fn stowage_certs(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_stowage")).arg("certs").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "stowage certs {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub(crate) fn kubectl(args: &[&str], stdin: Option<&str>, kubeconfig: Option<&Path>) -> String {
    let mut cmd = Command::new("kubectl");
    cmd.args(args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    // Never the developer's cluster.
    cmd.env("KUBECONFIG", kubeconfig.map(Path::as_os_str).unwrap_or("/nonexistent".as_ref()));
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("kubectl is needed on PATH for these tests: {e}"));
    if let Some(input) = stdin {
        child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    }
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "kubectl {args:?} failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

pub(crate) fn parse_docs(yaml: &str) -> Vec<Value> {
    serde_yaml_ng::Deserializer::from_str(yaml)
        .map(|doc| Value::deserialize(doc).unwrap())
        .filter(|v| !v.is_null())
        .collect()
}

pub(crate) fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} rendered"))
}

pub(crate) fn kinds(objects: &[Value]) -> BTreeSet<String> {
    objects.iter().map(|o| o["kind"].as_str().unwrap().to_owned()).collect()
}

/// resource → verbs of a ClusterRole's rules.
fn rules(role: &Value) -> BTreeMap<String, BTreeSet<String>> {
    let mut map: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for rule in role["rules"].as_array().unwrap() {
        assert!(rule.get("resourceNames").is_none(), "{rule}");
        for resource in rule["resources"].as_array().unwrap() {
            let verbs = rule["verbs"].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_owned());
            map.entry(resource.as_str().unwrap().to_owned()).or_default().extend(verbs);
        }
    }
    map
}

fn expect_rules(role: &Value, want: &[(&str, &[&str])]) {
    let want: BTreeMap<String, BTreeSet<String>> =
        want.iter().map(|(r, verbs)| (r.to_string(), verbs.iter().map(|v| v.to_string()).collect())).collect();
    assert_eq!(rules(role), want, "rules of ClusterRole {}", role["metadata"]["name"]);
}

fn pem_der(pem: &[u8]) -> Vec<u8> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem).unwrap();
    pem.contents
}

fn san_dns_names(der: &[u8]) -> Vec<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).unwrap();
    let san = cert.subject_alternative_name().unwrap().expect("a SAN extension");
    san.value
        .general_names
        .iter()
        .filter_map(|n| match n {
            x509_parser::extensions::GeneralName::DNSName(d) => Some(d.to_string()),
            _ => None,
        })
        .collect()
}

/// A stand-in for the kube-apiserver's discovery (kubectl's client-side dry run still maps every kind
/// to its resource): the group versions the manifests use, 404 for everything else (no live objects,
/// so `apply` would create them all).
fn discovery_kubeconfig(dir: &Path) -> PathBuf {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut request_line = String::new();
            if reader.read_line(&mut request_line).is_err() {
                continue;
            }
            let mut length = 0usize;
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    length = v.trim().parse().unwrap_or(0);
                }
            }
            let mut body = vec![0; length];
            let _ = reader.read_exact(&mut body);
            let path = request_line.split_whitespace().nth(1).unwrap_or("/").split('?').next().unwrap_or("/");
            let (status, answer) = match discovery(path) {
                Some(v) => ("200 OK", v),
                None => (
                    "404 Not Found",
                    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404}),
                ),
            };
            let answer = answer.to_string();
            let _ = write!(
                stream,
                "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{answer}",
                answer.len()
            );
        }
    });
    let path = dir.join("discovery.kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: d\n  cluster:\n    server: http://{addr}\n\
             contexts:\n- name: d\n  context:\n    cluster: d\n    namespace: default\ncurrent-context: d\n\
             users: []\n"
        ),
    )
    .unwrap();
    path
}

fn discovery(path: &str) -> Option<Value> {
    let resources = |gv: &str, list: &[(&str, &str, bool)]| {
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources":
            list.iter().map(|(name, kind, namespaced)| json!({"name": name, "singularName": "", "kind": kind,
                "namespaced": namespaced, "verbs": ["create", "get", "list", "patch", "update", "delete"]}))
                .collect::<Vec<_>>()})
    };
    let groups = [
        "apps/v1",
        "policy/v1",
        "rbac.authorization.k8s.io/v1",
        "apiregistration.k8s.io/v1",
        "cert-manager.io/v1",
        "scheduling.k8s.io/v1",
        "networking.k8s.io/v1",
        "monitoring.coreos.com/v1",
    ];
    Some(match path {
        "/api" => json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}),
        "/apis" => json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups.iter().map(|gv| {
            let (group, version) = gv.split_once('/').unwrap();
            json!({"name": group, "versions": [{"groupVersion": gv, "version": version}],
                   "preferredVersion": {"groupVersion": gv, "version": version}})
        }).collect::<Vec<_>>()}),
        "/api/v1" => resources(
            "v1",
            &[
                ("namespaces", "Namespace", false),
                ("serviceaccounts", "ServiceAccount", true),
                ("services", "Service", true),
                ("secrets", "Secret", true),
            ],
        ),
        "/apis/apps/v1" => {
            resources("apps/v1", &[("statefulsets", "StatefulSet", true), ("deployments", "Deployment", true)])
        }
        "/apis/policy/v1" => resources("policy/v1", &[("poddisruptionbudgets", "PodDisruptionBudget", true)]),
        "/apis/rbac.authorization.k8s.io/v1" => resources(
            "rbac.authorization.k8s.io/v1",
            &[
                ("clusterroles", "ClusterRole", false),
                ("clusterrolebindings", "ClusterRoleBinding", false),
                ("roles", "Role", true),
                ("rolebindings", "RoleBinding", true),
            ],
        ),
        "/apis/apiregistration.k8s.io/v1" => {
            resources("apiregistration.k8s.io/v1", &[("apiservices", "APIService", false)])
        }
        "/apis/cert-manager.io/v1" => {
            resources("cert-manager.io/v1", &[("issuers", "Issuer", true), ("certificates", "Certificate", true)])
        }
        "/apis/scheduling.k8s.io/v1" => {
            resources("scheduling.k8s.io/v1", &[("priorityclasses", "PriorityClass", false)])
        }
        "/apis/networking.k8s.io/v1" => {
            resources("networking.k8s.io/v1", &[("networkpolicies", "NetworkPolicy", true)])
        }
        "/apis/monitoring.coreos.com/v1" => {
            resources("monitoring.coreos.com/v1", &[("servicemonitors", "ServiceMonitor", true)])
        }
        _ => return None,
    })
}

/// Every object survives `kubectl apply --dry-run=client` and comes back the same kinds and names.
pub(crate) fn dry_run_apply(dir: &Path, rendered: &str, objects: &[Value]) {
    let kubeconfig = discovery_kubeconfig(dir);
    let applied = kubectl(
        &["apply", "--dry-run=client", "--validate=false", "-o", "yaml", "-f", "-"],
        Some(rendered),
        Some(&kubeconfig),
    );
    let applied = parse_docs(&applied);
    let items: Vec<Value> = match applied.as_slice() {
        [list] if list["kind"] == "List" => list["items"].as_array().unwrap().clone(),
        _ => applied,
    };
    let names = |objs: &[Value]| -> BTreeSet<(String, String)> {
        objs.iter()
            .map(|o| (o["kind"].as_str().unwrap().to_owned(), o["metadata"]["name"].as_str().unwrap().to_owned()))
            .collect()
    };
    assert_eq!(names(&items), names(objects), "objects after the dry-run apply");
}

#[test]
fn apiservice_kustomization_renders_with_generated_certs() {
    let tmp = tempfile::tempdir().unwrap();
    let deploy = copy_deploy(tmp.path());
    let generated = deploy.join("apiservice/generated");
    stowage_certs(&["--out", generated.to_str().unwrap()]);

    // Two kustomizations: the server, then (once it is ready) its APIService.
    let server = kubectl(&["kustomize", deploy.join("apiservice").to_str().unwrap()], None, None);
    let registration = kubectl(&["kustomize", deploy.join("apiservice/registration").to_str().unwrap()], None, None);
    assert!(!parse_docs(&server).iter().any(|o| o["kind"] == "APIService"), "the server's kustomization registers it");
    assert_eq!(kinds(&parse_docs(&registration)), BTreeSet::from(["APIService".to_string()]));
    let rendered = format!("{server}---\n{registration}");
    let objects = parse_docs(&rendered);
    let want_kinds = [
        "APIService",
        "ClusterRole",
        "ClusterRoleBinding",
        "Namespace",
        "RoleBinding",
        "Secret",
        "Service",
        "ServiceAccount",
        "StatefulSet",
    ];
    assert_eq!(kinds(&objects), want_kinds.iter().map(|k| k.to_string()).collect());
    dry_run_apply(tmp.path(), &rendered, &objects);

    // The APIService trusts exactly the generated CA, and never skips verification.
    let apiservice = find(&objects, "APIService", APISERVICE);
    let spec = &apiservice["spec"];
    assert!(spec.get("insecureSkipTLSVerify").is_none(), "{spec}");
    let ca_pem = std::fs::read(generated.join("ca.crt")).unwrap();
    let bundle = base64::engine::general_purpose::STANDARD.decode(spec["caBundle"].as_str().unwrap()).unwrap();
    assert_eq!(bundle, ca_pem);
    assert_eq!(spec["group"], "content.stowage.dev");
    assert_eq!(spec["version"], "v1alpha1");
    assert_eq!(spec["groupPriorityMinimum"], 1000);
    assert_eq!(spec["versionPriority"], 15);
    assert_eq!(spec["service"], json!({"name": "stowage", "namespace": "stowage", "port": 443}));

    // The Secret carries the generated serving certificate, issued by that CA for the Service's names.
    let secret = find(&objects, "Secret", "stowage-tls");
    assert_eq!(secret["metadata"]["namespace"], "stowage");
    assert_eq!(secret["type"], "kubernetes.io/tls");
    let b64 = |v: &Value| base64::engine::general_purpose::STANDARD.decode(v.as_str().unwrap()).unwrap();
    let tls_crt = std::fs::read(generated.join("tls.crt")).unwrap();
    assert_eq!(b64(&secret["data"]["tls.crt"]), tls_crt);
    assert_eq!(b64(&secret["data"]["tls.key"]), std::fs::read(generated.join("tls.key")).unwrap());
    let leaf_der = pem_der(&tls_crt);
    let names = san_dns_names(&leaf_der);
    for name in ["stowage.stowage.svc", "stowage.stowage.svc.cluster.local", "stowage.stowage", "stowage"] {
        assert!(names.iter().any(|n| n == name), "{name} not in {names:?}");
    }
    let ca_der = pem_der(&ca_pem);
    let (_, ca) = x509_parser::parse_x509_certificate(&ca_der).unwrap();
    let (_, leaf) = x509_parser::parse_x509_certificate(&leaf_der).unwrap();
    assert!(ca.is_ca());
    assert!(!leaf.is_ca());
    assert_eq!(leaf.issuer(), ca.subject());
    #[cfg(unix)]
    for private in ["tls.key", "ca.key", "secret.yaml"] {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(generated.join(private)).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{private}");
    }

    // RBAC: exactly the promised rules.
    let view = find(&objects, "ClusterRole", "stowage-view");
    assert_eq!(view["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"], "true");
    expect_rules(
        view,
        &[
            ("bundles", &["get", "list", "watch"]),
            ("bundles/status", &["get", "list", "watch"]),
            ("bundlecontents", &["get", "list", "watch"]),
        ],
    );
    let edit = find(&objects, "ClusterRole", "stowage-edit");
    assert_eq!(edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"], "true");
    assert_eq!(edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-admin"], "true");
    let read = ["get", "list", "watch"];
    expect_rules(
        edit,
        &[
            ("bundles", &["get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"]),
            ("bundles/status", &read),
            ("bundles/content", &["get", "update", "create", "patch", "delete"]),
            ("bundlecontents", &read),
            ("bundlecontents/content", &["get"]),
        ],
    );
    let reader = find(&objects, "ClusterRole", "stowage-content-reader");
    assert!(reader["metadata"]["labels"].get("rbac.authorization.k8s.io/aggregate-to-view").is_none());
    expect_rules(
        reader,
        &[
            ("bundles", &read),
            ("bundlecontents", &read),
            ("bundles/content", &["get"]),
            ("bundlecontents/content", &["get"]),
        ],
    );
    for role in [view, edit, reader] {
        for rule in role["rules"].as_array().unwrap() {
            assert_eq!(rule["apiGroups"], json!(["content.stowage.dev"]), "{rule}");
        }
    }
    let server = find(&objects, "ClusterRole", "stowage:secret-reader");
    expect_rules(server, &[("secrets", &["get"])]);
    assert_eq!(server["rules"][0]["apiGroups"], json!([""]));

    // The server's own bindings: auth-delegator, the authentication reader in kube-system, secrets.
    let sa = json!([{"kind": "ServiceAccount", "name": "stowage", "namespace": "stowage"}]);
    let binding = |kind: &str, role: &str| {
        objects
            .iter()
            .find(|o| o["kind"] == kind && o["roleRef"]["name"] == role)
            .unwrap_or_else(|| panic!("no {kind} to {role}"))
    };
    let delegator = binding("ClusterRoleBinding", "system:auth-delegator");
    assert_eq!(delegator["subjects"], sa);
    let auth_reader = binding("RoleBinding", "extension-apiserver-authentication-reader");
    assert_eq!(auth_reader["metadata"]["namespace"], "kube-system");
    assert_eq!(auth_reader["roleRef"]["kind"], "Role");
    assert_eq!(auth_reader["subjects"], sa);
    assert_eq!(binding("ClusterRoleBinding", "stowage:secret-reader")["subjects"], sa);
    // Events about Bundles go to the cluster: created, and patched as a series.
    let recorder = find(&objects, "ClusterRole", "stowage:event-recorder");
    assert_eq!(
        recorder["rules"],
        json!([{"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]}])
    );
    assert_eq!(binding("ClusterRoleBinding", "stowage:event-recorder")["subjects"], sa);

    // The Service and the locked-down StatefulSet.
    let service = find(&objects, "Service", "stowage");
    assert_eq!(service["spec"]["ports"][0]["port"], 443);
    assert_eq!(service["spec"]["ports"][0]["targetPort"], "https");
    let sts = find(&objects, "StatefulSet", "stowage");
    assert_eq!(sts["metadata"]["namespace"], "stowage");
    assert_eq!(sts["spec"]["replicas"], 1);
    let pod = &sts["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "stowage");
    assert_eq!(pod["terminationGracePeriodSeconds"], 30);
    let psc = &pod["securityContext"];
    assert_eq!(psc["runAsNonRoot"], true);
    assert!(psc["runAsUser"].as_u64().unwrap() > 0);
    assert!(psc["runAsGroup"].as_u64().unwrap() > 0);
    assert!(psc["fsGroup"].as_u64().unwrap() > 0);
    assert_eq!(psc["seccompProfile"]["type"], "RuntimeDefault");
    let container = &pod["containers"][0];
    let csc = &container["securityContext"];
    assert_eq!(csc["readOnlyRootFilesystem"], true);
    assert_eq!(csc["allowPrivilegeEscalation"], false);
    assert_eq!(csc["capabilities"]["drop"], json!(["ALL"]));
    assert!(csc["capabilities"].get("add").is_none());
    assert_eq!(csc["seccompProfile"]["type"], "RuntimeDefault");
    let args: Vec<&str> = container["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
    assert_eq!(
        args,
        [
            "serve",
            "--data-dir",
            "/var/lib/stowage",
            "--listen",
            "0.0.0.0:8443",
            "--tls-cert-file",
            "/etc/stowage/tls/tls.crt",
            "--tls-private-key-file",
            "/etc/stowage/tls/tls.key"
        ]
    );
    for limit in ["requests", "limits"] {
        assert!(container["resources"][limit]["memory"].is_string(), "{limit}");
        assert!(container["resources"][limit]["cpu"].is_string(), "{limit}");
    }
    for (probe, path) in [("livenessProbe", "/livez"), ("readinessProbe", "/readyz")] {
        let get = &container[probe]["httpGet"];
        assert_eq!(get["path"], path);
        assert_eq!(get["scheme"], "HTTPS");
        assert_eq!(get["port"], "https");
    }
    assert_eq!(container["ports"][0], json!({"name": "https", "containerPort": 8443, "protocol": "TCP"}));
    let mounts: BTreeMap<&str, &str> = container["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["name"].as_str().unwrap(), m["mountPath"].as_str().unwrap()))
        .collect();
    assert_eq!(mounts["data"], "/var/lib/stowage");
    assert_eq!(mounts["tls"], "/etc/stowage/tls");
    let tls_volume = pod["volumes"].as_array().unwrap().iter().find(|v| v["name"] == "tls").unwrap();
    assert_eq!(tls_volume["secret"]["secretName"], "stowage-tls");
    let claim = &sts["spec"]["volumeClaimTemplates"][0];
    assert_eq!(claim["metadata"]["name"], "data");
    assert!(claim["spec"]["resources"]["requests"]["storage"].is_string());
}

#[test]
fn cert_manager_overlay_injects_the_ca() {
    let server = kubectl(&["kustomize", repo_deploy().join("cert-manager").to_str().unwrap()], None, None);
    let registration =
        kubectl(&["kustomize", repo_deploy().join("cert-manager/registration").to_str().unwrap()], None, None);
    assert!(!parse_docs(&server).iter().any(|o| o["kind"] == "APIService"), "the server's kustomization registers it");
    let rendered = format!("{server}---\n{registration}");
    assert!(!rendered.contains("caBundle"), "{rendered}");
    let objects = parse_docs(&rendered);
    let apiservice = find(&objects, "APIService", APISERVICE);
    assert_eq!(apiservice["metadata"]["annotations"]["cert-manager.io/inject-ca-from"], "stowage/stowage-tls");
    assert!(apiservice["spec"].get("caBundle").is_none());
    assert!(apiservice["spec"].get("insecureSkipTLSVerify").is_none());
    // No static Secret: cert-manager writes stowage-tls from the Certificate.
    assert!(!objects.iter().any(|o| o["kind"] == "Secret"));
    let certificate = find(&objects, "Certificate", "stowage-tls");
    assert_eq!(certificate["metadata"]["namespace"], "stowage");
    assert_eq!(certificate["spec"]["secretName"], "stowage-tls");
    let names = certificate["spec"]["dnsNames"].as_array().unwrap();
    assert!(names.contains(&json!("stowage.stowage.svc")));
    assert!(names.contains(&json!("stowage.stowage.svc.cluster.local")));
    assert!(kinds(&objects).contains("StatefulSet"));
    let tmp = tempfile::tempdir().unwrap();
    dry_run_apply(tmp.path(), &rendered, &objects);
}

#[test]
fn certs_keeps_the_ca_unless_forced() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("generated");
    let out_arg = out.to_str().unwrap();
    let read = |name: &str| std::fs::read(out.join(name)).unwrap();

    let first = stowage_certs(&["--out", out_arg, "--namespace", "stowage", "--service", "stowage", "--days", "90"]);
    assert!(first.contains("created a new CA"), "{first}");
    let (ca, tls) = (read("ca.crt"), read("tls.crt"));

    let second = stowage_certs(&["--out", out_arg, "--days", "90"]);
    assert!(second.contains("kept the existing CA"), "{second}");
    assert_eq!(read("ca.crt"), ca);
    assert_eq!(read("tls.crt"), tls);

    let forced = stowage_certs(&["--out", out_arg, "--days", "90", "--force"]);
    assert!(forced.contains("rotated the CA"), "{forced}");
    let new_ca = read("ca.crt");
    assert_ne!(new_ca, ca);
    assert_ne!(read("tls.crt"), tls);
    // Until the pod has the new serving certificate, the kube-apiserver must trust both CAs.
    let patch = parse_docs(&String::from_utf8(read("registration/apiservice-cabundle.yaml")).unwrap());
    let bundle =
        base64::engine::general_purpose::STANDARD.decode(patch[0]["spec"]["caBundle"].as_str().unwrap()).unwrap();
    let bundle = String::from_utf8(bundle).unwrap();
    assert!(bundle.starts_with(std::str::from_utf8(&new_ca).unwrap()));
    assert!(bundle.contains(std::str::from_utf8(&ca).unwrap()));

    // Another namespace: the same CA, a new serving certificate with that namespace's names.
    stowage_certs(&["--out", out_arg, "--namespace", "content"]);
    assert_eq!(read("ca.crt"), new_ca);
    let names = san_dns_names(&pem_der(&read("tls.crt")));
    assert!(names.contains(&"stowage.content.svc".to_string()), "{names:?}");

    // Bad names are refused, nothing is written.
    let bad = Command::new(env!("CARGO_BIN_EXE_stowage"))
        .args(["certs", "--out", tmp.path().join("bad").to_str().unwrap(), "--namespace", "Not_A_Label"])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(!tmp.path().join("bad").exists());
}

/// `stowage certs | head -1`: the closed pipe ends the output quietly (it was a panic, exit 101).
#[test]
fn certs_into_a_closed_pipe_ends_quietly() {
    let out = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_stowage"))
        .args(["certs", "--out", out.path().to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The reader is gone before anything is written.
    drop(child.stdout.take());
    let result = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(!stderr.contains("panicked"), "stowage certs panicked on a closed pipe: {stderr}");
    assert!(result.status.success(), "stowage certs failed on a closed pipe: {:?} {stderr}", result.status);
    assert!(out.path().join("secret.yaml").exists());
}

/// Whether a `matchLabels` selector (no `matchExpressions`) selects an object with `labels`; an
/// empty selector selects nothing here (a PodDisruptionBudget's would select every pod).
pub(crate) fn selects(match_labels: &Value, labels: &Value) -> bool {
    let wanted = match_labels.as_object().unwrap_or_else(|| panic!("matchLabels {match_labels}"));
    !wanted.is_empty() && wanted.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// A container's environment variable by name.
fn env_var<'a>(container: &'a Value, name: &str) -> &'a Value {
    container["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == name)
        .unwrap_or_else(|| panic!("no env {name} in {}", container["env"]))
}

/// `flag → value` of `serve`'s arguments (`--flag value`, `--flag=value`; a flag followed by
/// another flag or nothing has the value "").
fn flag_values(args: &[&str]) -> BTreeMap<String, String> {
    let mut flags = BTreeMap::new();
    let mut i = 0;
    while i < args.len() {
        let arg = args[i];
        i += 1;
        let Some(flag) = arg.strip_prefix("--") else { continue };
        let (name, value) = match flag.split_once('=') {
            Some((name, value)) => (name.to_owned(), value.to_owned()),
            None => match args.get(i) {
                Some(next) if !next.starts_with("--") => {
                    i += 1;
                    (flag.to_owned(), next.to_string())
                }
                _ => (flag.to_owned(), String::new()),
            },
        };
        assert!(flags.insert(name.clone(), value).is_none(), "--{name} given twice in {args:?}");
    }
    flags
}

/// `deploy/ha`: the base (Namespace, RBAC, Service, the generated `stowage-tls`) with a
/// three-replica Deployment on etcd and S3 in place of the StatefulSet and its volume, a
/// PodDisruptionBudget, and every setting of the replicated store from the `stowage-store` and
/// `stowage-etcd-tls` Secrets that `store-secrets.example.yaml` shows (which is not rendered).
#[test]
fn ha_overlay_runs_three_replicas_configured_from_secrets() {
    let tmp = tempfile::tempdir().unwrap();
    let deploy = copy_deploy(tmp.path());
    let ha_dir = deploy.join("ha");

    // Like deploy/apiservice: nothing renders until `stowage certs` wrote the component.
    let without = Command::new("kubectl")
        .args(["kustomize", ha_dir.to_str().unwrap()])
        .env("KUBECONFIG", "/nonexistent")
        .output()
        .unwrap_or_else(|e| panic!("kubectl is needed on PATH for these tests: {e}"));
    assert!(!without.status.success(), "deploy/ha rendered without deploy/apiservice/generated");
    assert!(String::from_utf8_lossy(&without.stderr).contains("generated"));

    stowage_certs(&["--out", deploy.join("apiservice/generated").to_str().unwrap()]);
    let rendered = kubectl(&["kustomize", ha_dir.to_str().unwrap()], None, None);
    let objects = parse_docs(&rendered);
    let base = parse_docs(&kubectl(&["kustomize", deploy.join("apiservice").to_str().unwrap()], None, None));
    let want_kinds = [
        "ClusterRole",
        "ClusterRoleBinding",
        "Deployment",
        "Namespace",
        "PodDisruptionBudget",
        "RoleBinding",
        "Secret",
        "Service",
        "ServiceAccount",
    ];
    assert_eq!(kinds(&objects), want_kinds.iter().map(|k| k.to_string()).collect());
    // Nothing local to keep: no StatefulSet, no claim (not even a template of one).
    for absent in ["StatefulSet", "PersistentVolumeClaim"] {
        assert!(!objects.iter().any(|o| o["kind"] == absent), "{absent} rendered");
    }
    for absent in ["volumeClaimTemplates", "persistentVolumeClaim", "hostPath"] {
        assert!(!rendered.contains(absent), "{absent} in the rendered overlay");
    }

    // Everything else is the base's, unchanged: RBAC, Namespace, ServiceAccount, Service, the
    // serving certificate Secret (the APIService is deploy/apiservice/registration, as there).
    let id = |o: &Value| (o["kind"].clone(), o["metadata"]["name"].clone(), o["metadata"]["namespace"].clone());
    let shared: Vec<&Value> = base.iter().filter(|o| o["kind"] != "StatefulSet").collect();
    assert_eq!(shared.len(), base.len() - 1, "the base renders one StatefulSet");
    for object in &shared {
        let ours = objects.iter().find(|o| id(o) == id(object)).unwrap_or_else(|| panic!("{:?} missing", id(object)));
        assert_eq!(ours, *object, "{:?} differs from deploy/apiservice's", id(object));
    }
    let added: BTreeSet<String> = objects
        .iter()
        .filter(|o| !shared.iter().any(|b| id(b) == id(o)))
        .map(|o| format!("{}/{}", o["kind"].as_str().unwrap(), o["metadata"]["name"].as_str().unwrap()))
        .collect();
    assert_eq!(added, ["Deployment/stowage", "PodDisruptionBudget/stowage"].map(String::from).into());

    // The example Secrets are documentation, not rendered; with them every object passes a dry run.
    let example_text = std::fs::read_to_string(ha_dir.join("store-secrets.example.yaml")).unwrap();
    let example = parse_docs(&example_text);
    for secret in &example {
        assert_eq!(secret["kind"], "Secret");
        assert_eq!(secret["metadata"]["namespace"], "stowage");
        let name = &secret["metadata"]["name"];
        assert!(!objects.iter().any(|o| o["kind"] == "Secret" && o["metadata"]["name"] == *name), "{name} rendered");
    }
    let example_keys = |name: &str| -> BTreeSet<String> {
        let secret = example.iter().find(|s| s["metadata"]["name"] == name).unwrap_or_else(|| panic!("no {name}"));
        secret["stringData"].as_object().unwrap().keys().cloned().collect()
    };
    let with_secrets = format!("{rendered}\n---\n{example_text}");
    let mut all = objects.clone();
    all.extend(example.iter().cloned());
    dry_run_apply(tmp.path(), &with_secrets, &all);

    // Three replicas; a rollout adds one before it removes one.
    let deployment = find(&objects, "Deployment", "stowage");
    assert_eq!(deployment["metadata"]["namespace"], "stowage");
    let spec = &deployment["spec"];
    assert_eq!(spec["replicas"], 3);
    assert_eq!(spec["strategy"]["type"], "RollingUpdate");
    assert_eq!(spec["strategy"]["rollingUpdate"]["maxUnavailable"], 0);
    assert_eq!(spec["strategy"]["rollingUpdate"]["maxSurge"], 1);
    let pod_labels = &spec["template"]["metadata"]["labels"];
    assert!(selects(&spec["selector"]["matchLabels"], pod_labels));
    assert!(spec["selector"].get("matchExpressions").is_none());
    let service = find(&objects, "Service", "stowage");
    assert!(selects(&service["spec"]["selector"], pod_labels), "the Service reaches the replicas");

    // The budget selects the replicas and lets exactly one of three go at a time; unready ones
    // (the backends down) may still be evicted.
    let pdb = find(&objects, "PodDisruptionBudget", "stowage");
    assert_eq!(pdb["apiVersion"], "policy/v1");
    assert_eq!(pdb["metadata"]["namespace"], "stowage");
    assert!(pdb["spec"]["selector"].get("matchExpressions").is_none());
    assert!(selects(&pdb["spec"]["selector"]["matchLabels"], pod_labels), "the budget selects the pods");
    let budget = &pdb["spec"];
    let disruptable = match (budget.get("maxUnavailable"), budget.get("minAvailable")) {
        (Some(max), None) => max.as_i64().expect("an integer maxUnavailable"),
        (None, Some(min)) => 3 - min.as_i64().expect("an integer minAvailable"),
        other => panic!("a budget sets one of maxUnavailable and minAvailable: {other:?}"),
    };
    assert_eq!(disruptable, 1, "{budget}");
    assert_eq!(budget["unhealthyPodEvictionPolicy"], "AlwaysAllow");

    // Replicas apart: anti-affinity on the node, of pods like these.
    let pod = &spec["template"]["spec"];
    let anti = &pod["affinity"]["podAntiAffinity"];
    let terms: Vec<&Value> = anti["preferredDuringSchedulingIgnoredDuringExecution"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| &t["podAffinityTerm"])
        .chain(anti["requiredDuringSchedulingIgnoredDuringExecution"].as_array().into_iter().flatten())
        .collect();
    assert!(
        terms
            .iter()
            .any(|t| t["topologyKey"] == "kubernetes.io/hostname"
                && selects(&t["labelSelector"]["matchLabels"], pod_labels)),
        "no anti-affinity on kubernetes.io/hostname selecting the replicas: {anti}"
    );
    for spread in pod["topologySpreadConstraints"].as_array().unwrap() {
        assert!(selects(&spread["labelSelector"]["matchLabels"], pod_labels), "{spread}");
    }

    // Locked down exactly as the base's StatefulSet, same account.
    let sts = find(&base, "StatefulSet", "stowage");
    let base_pod = &sts["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"], base_pod["securityContext"]);
    assert_eq!(pod["serviceAccountName"], base_pod["serviceAccountName"]);
    assert_eq!(pod["automountServiceAccountToken"], base_pod["automountServiceAccountToken"]);
    let containers = pod["containers"].as_array().unwrap();
    assert_eq!(containers.len(), 1);
    let container = &containers[0];
    let base_container = &base_pod["containers"][0];
    assert_eq!(container["securityContext"], base_container["securityContext"]);
    assert_eq!(container["image"], base_container["image"]);
    assert_eq!(container["ports"], base_container["ports"]);
    assert_eq!(container["resources"], base_container["resources"]);
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(container["securityContext"]["readOnlyRootFilesystem"], true);

    // Ready only when etcd and the bucket answer: /readyz, given longer than the server's own
    // checks of them take (2 s for etcd, 5 s for the bucket). Liveness does not depend on them.
    for (probe, path) in [("livenessProbe", "/livez"), ("readinessProbe", "/readyz"), ("startupProbe", "/livez")] {
        let get = &container[probe]["httpGet"];
        assert_eq!(get["path"], path, "{probe}");
        assert_eq!(get["scheme"], "HTTPS", "{probe}");
        assert_eq!(get["port"], "https", "{probe}");
    }
    assert!(container["readinessProbe"]["timeoutSeconds"].as_u64().unwrap() > 7);

    // Volumes: the serving certificate as in the base, the etcd client certificate from its
    // Secret, and only emptyDir scratch besides.
    let volumes: BTreeMap<&str, &Value> =
        pod["volumes"].as_array().unwrap().iter().map(|v| (v["name"].as_str().unwrap(), v)).collect();
    let mounts: BTreeMap<&str, &str> = container["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["name"].as_str().unwrap(), m["mountPath"].as_str().unwrap()))
        .collect();
    assert_eq!(mounts.keys().collect::<BTreeSet<_>>(), volumes.keys().collect::<BTreeSet<_>>());
    for mount in container["volumeMounts"].as_array().unwrap() {
        assert!(mount.get("subPath").is_none(), "{mount}: the kubelet does not update subPath mounts");
    }
    let secret_volume = |secret: &str| -> &str {
        let (name, _) = volumes
            .iter()
            .find(|(_, v)| v["secret"]["secretName"] == secret)
            .unwrap_or_else(|| panic!("no volume of Secret {secret}"));
        mounts[name]
    };
    assert_eq!(secret_volume("stowage-tls"), "/etc/stowage/tls");
    let etcd_tls = secret_volume("stowage-etcd-tls");
    for (name, volume) in &volumes {
        let kind: Vec<&String> = volume.as_object().unwrap().keys().filter(|k| *k != "name").collect();
        assert!(kind == ["emptyDir"] || kind == ["secret"], "volume {name}: {kind:?}");
    }

    // The arguments: base's serve flags, the data directory on scratch, etcd from the Secret (by
    // $(VAR) substitution: --etcd-servers has no environment variable), its client certificate
    // from the mounted Secret.
    let args: Vec<&str> = container["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
    assert_eq!(args[0], "serve");
    let flags = flag_values(&args[1..]);
    let base_args: Vec<&str> = base_container["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
    for (flag, value) in flag_values(&base_args[1..]) {
        assert_eq!(flags.get(&flag), Some(&value), "--{flag} as in the base");
    }
    let data_dir = flags["data-dir"].as_str();
    let (data_volume, _) = mounts.iter().find(|(_, path)| **path == data_dir).expect("a volume at --data-dir");
    assert!(volumes[data_volume].get("emptyDir").is_some(), "--data-dir is scratch: {}", volumes[data_volume]);
    assert_eq!(flags["etcd-servers"], "$(ETCD_SERVERS)");
    let example_store = example_keys("stowage-store");
    let from_store = |name: &str| {
        let var = env_var(container, name);
        assert!(var.get("value").is_none(), "{name} is a literal: {var}");
        let reference = &var["valueFrom"]["secretKeyRef"];
        assert_eq!(reference["name"], "stowage-store", "{name}");
        let key = reference["key"].as_str().unwrap();
        assert!(example_store.contains(key), "{name}: key {key} not in the example stowage-store");
        reference.get("optional").and_then(Value::as_bool).unwrap_or(false)
    };
    assert!(!from_store("ETCD_SERVERS"));
    // The bucket either by flag from the environment or read from it by the server.
    match flags.get("s3-bucket") {
        Some(value) => {
            let var = value.strip_prefix("$(").and_then(|v| v.strip_suffix(')')).expect("--s3-bucket=$(VAR)");
            assert!(!from_store(var));
        }
        None => assert!(!from_store("STOWAGE_S3_BUCKET")),
    }
    assert!(!from_store("AWS_ACCESS_KEY_ID"));
    assert!(!from_store("AWS_SECRET_ACCESS_KEY"));
    // Optional: AWS S3 needs no endpoint; the region has a default.
    assert!(from_store("STOWAGE_S3_ENDPOINT"));
    assert!(from_store("AWS_REGION"));
    assert_eq!(env_var(container, "POD_NAME")["valueFrom"]["fieldRef"]["fieldPath"], "metadata.name");
    assert!(!flags.contains_key("replica-id"), "--replica-id comes from POD_NAME");
    let example_etcd_tls = example_keys("stowage-etcd-tls");
    for flag in ["etcd-cafile", "etcd-certfile", "etcd-keyfile"] {
        let path = Path::new(&flags[flag]);
        assert_eq!(path.parent().unwrap(), Path::new(etcd_tls), "--{flag}");
        let file = path.file_name().unwrap().to_str().unwrap();
        assert!(example_etcd_tls.contains(file), "--{flag}: {file} not in the example stowage-etcd-tls");
    }
    assert_eq!(flags["etcd-prefix"], "/stowage");
    assert!(flags.contains_key("s3-path-style"));
    // README.md's patch for AWS S3 (virtual-hosted requests) removes exactly this argument.
    let readme = std::fs::read_to_string(ha_dir.join("README.md")).unwrap();
    assert!(readme.contains("{op: test, path: /spec/template/spec/containers/0/args/19, value: --s3-path-style}"));
    assert_eq!(args[19], "--s3-path-style", "README.md's patch for AWS S3 removes args/19");
    // Every $(VAR) is an environment variable of the container (else the kubelet leaves it as is).
    for arg in &args {
        if let Some(var) = arg.strip_prefix("$(").and_then(|a| a.strip_suffix(')')) {
            env_var(container, var);
        }
    }

    // And the server knows them: every flag is one of `serve`'s, every variable it reads itself
    // is one it names.
    let help = Command::new(env!("CARGO_BIN_EXE_stowage")).args(["serve", "--help"]).output().unwrap();
    assert!(help.status.success());
    let help = String::from_utf8(help.stdout).unwrap();
    for flag in flags.keys() {
        assert!(help.contains(&format!("--{flag} ")) || help.contains(&format!("--{flag}\n")), "--{flag} unknown");
    }
    for var in ["POD_NAME", "STOWAGE_S3_BUCKET", "STOWAGE_S3_ENDPOINT", "AWS_REGION"] {
        assert!(help.contains(&format!("[env: {var}")), "{var} is not read by stowage serve");
    }
    for var in ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"] {
        assert!(help.contains(var), "{var} is not named by stowage serve --help");
    }
}
