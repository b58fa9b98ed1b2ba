//! The cluster install (`deploy/`, `stowage certs`) checked without a cluster: `stowage certs` into a
//! temporary copy of `deploy/`, `kubectl kustomize` renders it, `kubectl apply --dry-run=client`
//! accepts every object (against a stand-in discovery endpoint, since kubectl maps kinds to resources
//! even for a client-side dry run), and the rendered objects are checked field by field: the
//! APIService trusts exactly the generated CA, the serving certificate names the Service, RBAC grants
//! exactly what the README promises, the pod runs locked down.
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

fn repo_deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy")
}

/// A copy of `deploy/` without any generated files, so the repository is never modified.
fn copy_deploy(to: &Path) -> PathBuf {
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

fn stowage_certs(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_stowage")).arg("certs").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "stowage certs {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn kubectl(args: &[&str], stdin: Option<&str>, kubeconfig: Option<&Path>) -> String {
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

fn parse_docs(yaml: &str) -> Vec<Value> {
    serde_yaml_ng::Deserializer::from_str(yaml)
        .map(|doc| Value::deserialize(doc).unwrap())
        .filter(|v| !v.is_null())
        .collect()
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} rendered"))
}

fn kinds(objects: &[Value]) -> BTreeSet<String> {
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
    let groups = ["apps/v1", "rbac.authorization.k8s.io/v1", "apiregistration.k8s.io/v1", "cert-manager.io/v1"];
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
        "/apis/apps/v1" => resources("apps/v1", &[("statefulsets", "StatefulSet", true)]),
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
        _ => return None,
    })
}

/// Every object survives `kubectl apply --dry-run=client` and comes back the same kinds and names.
fn dry_run_apply(dir: &Path, rendered: &str, objects: &[Value]) {
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

    let rendered = kubectl(&["kustomize", deploy.join("apiservice").to_str().unwrap()], None, None);
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
    let rendered = kubectl(&["kustomize", repo_deploy().join("cert-manager").to_str().unwrap()], None, None);
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
    let patch = parse_docs(&String::from_utf8(read("apiservice-cabundle.yaml")).unwrap());
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
