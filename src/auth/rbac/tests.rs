//! The RBAC policy's behaviour, case by case against kube-apiserver's semantics.

use super::*;
use crate::auth::attributes::{Request, ResourceAttributes};
use crate::auth::UserInfo;

const CONTENT: &str = "content.stowage.dev";

const POLICY: &str = r#"
# ClusterRoles
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: bundle-viewer, labels: {any: thing}}
rules:
- {apiGroups: [content.stowage.dev], resources: [bundles, bundlecontents], verbs: [get, list, watch]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: content-reader}
rules: [{apiGroups: [content.stowage.dev], resources: [bundles/content], verbs: [get]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: metrics-reader}
rules: [{nonResourceURLs: [/metrics, /debug/*], verbs: [get]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: status-everything}
rules: [{apiGroups: ["*"], resources: ["*/status"], verbs: ["*"]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: bundles-slash-star}
rules: [{apiGroups: [content.stowage.dev], resources: [bundles/*], verbs: [get]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: bundle-one, namespace: team-a}
rules:
- {apiGroups: [content.stowage.dev], resources: [bundles/content], resourceNames: [one], verbs: [get, list]}
- {apiGroups: [""], resources: [secrets], resourceNames: [pull], verbs: [get]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: bundle-one, namespace: team-b}
rules: [{apiGroups: ["*"], resources: ["*"], verbs: ["*"]}]
---
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: alice-view, namespace: team-a}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: bundle-viewer}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: alice}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: bob-one, namespace: team-a}
roleRef: {kind: Role, name: bundle-one}
subjects: [{kind: User, name: nobody}, {kind: User, name: bob}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: robot, namespace: team-a}
roleRef: {kind: ClusterRole, name: content-reader}
subjects: [{kind: ServiceAccount, name: robot}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: ci, namespace: team-a}
roleRef: {kind: ClusterRole, name: bundle-viewer}
subjects: [{kind: ServiceAccount, name: ci, namespace: ci-system}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: dangling, namespace: team-a}
roleRef: {kind: Role, name: missing}
subjects: [{kind: User, name: carol}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: metrics-in-namespace, namespace: team-a}
roleRef: {kind: ClusterRole, name: metrics-reader}
subjects: [{kind: User, name: dave}]
---
apiVersion: v1
kind: List
items:
- apiVersion: rbac.authorization.k8s.io/v1
  kind: ClusterRoleBinding
  metadata: {name: auditors}
  roleRef: {kind: ClusterRole, name: bundle-viewer}
  subjects: [{kind: Group, name: auditors}]
- apiVersion: rbac.authorization.k8s.io/v1
  kind: ClusterRoleBinding
  metadata: {name: metrics}
  roleRef: {kind: ClusterRole, name: metrics-reader}
  subjects: [{kind: Group, name: "system:monitoring"}, {kind: User, name: erin}]
- apiVersion: rbac.authorization.k8s.io/v1
  kind: ClusterRoleBinding
  metadata: {name: status}
  roleRef: {kind: ClusterRole, name: status-everything}
  subjects: [{kind: User, name: frank}]
- apiVersion: rbac.authorization.k8s.io/v1
  kind: ClusterRoleBinding
  metadata: {name: slash-star}
  roleRef: {kind: ClusterRole, name: bundles-slash-star}
  subjects: [{kind: User, name: gina}]
- apiVersion: rbac.authorization.k8s.io/v1
  kind: ClusterRoleBinding
  metadata: {name: ghost}
  roleRef: {kind: ClusterRole, name: missing-cluster-role}
  subjects: [{kind: User, name: carol}]
- apiVersion: rbac.authorization.k8s.io/v1
  kind: ClusterRoleBinding
  metadata: {name: deployer}
  roleRef: {kind: ClusterRole, name: content-reader}
  subjects: [{kind: ServiceAccount, name: deployer, namespace: tools}]
"#;

fn user(spec: &str) -> UserInfo {
    let mut parts = spec.split('|');
    let name = parts.next().unwrap_or_default().to_owned();
    UserInfo { name, groups: parts.map(str::to_owned).collect(), ..UserInfo::default() }
}

/// `verb group resource[/subresource] namespace name`, `-` for empty.
fn res(spec: &str) -> Request {
    let f: Vec<&str> = spec.split(' ').map(|f| if f == "-" { "" } else { f }).collect();
    let (resource, subresource) = f[2].split_once('/').unwrap_or((f[2], ""));
    Request::Resource(ResourceAttributes {
        verb: f[0].into(),
        group: f[1].into(),
        resource: resource.into(),
        subresource: subresource.into(),
        namespace: f[3].into(),
        name: f[4].into(),
        ..ResourceAttributes::default()
    })
}

fn path(verb: &str, path: &str) -> Request {
    Request::NonResource(crate::auth::attributes::NonResourceAttributes { path: path.into(), verb: verb.into() })
}

fn decide(policy: &Policy, who: &str, request: Request) -> Decision {
    policy.authorize(&Attributes { user: user(who), request })
}

#[test]
fn rbac_table() {
    let policy = Policy::parse(POLICY).unwrap();
    let g = CONTENT;
    #[rustfmt::skip]
    let cases: Vec<(&str, &str, Request, bool)> = vec![
        ("rolebinding to clusterrole", "alice", res(&format!("get {g} bundles team-a b")), true),
        ("list via rolebinding", "alice", res(&format!("list {g} bundles team-a -")), true),
        ("rolebinding is namespaced", "alice", res(&format!("get {g} bundles team-b b")), false),
        ("rolebinding never grants cluster scope", "alice", res(&format!("list {g} bundles - -")), false),
        ("resource does not cover subresource", "alice", res(&format!("get {g} bundles/content team-a b")), false),
        ("verb not granted", "alice", res(&format!("create {g} bundles team-a -")), false),
        ("api group must match", "alice", res("get apps bundles team-a b"), false),
        ("resourceNames with get", "bob", res(&format!("get {g} bundles/content team-a one")), true),
        ("resourceNames other name", "bob", res(&format!("get {g} bundles/content team-a two")), false),
        ("resourceNames never match list", "bob", res(&format!("list {g} bundles/content team-a -")), false),
        ("resourceNames never match create", "bob", res(&format!("create {g} bundles/content team-a -")), false),
        ("role of another namespace", "bob", res(&format!("get {g} bundles/content team-b one")), false),
        ("core group secret by name", "bob", res("get - secrets team-a pull"), true),
        ("serviceaccount defaults to binding namespace", "system:serviceaccount:team-a:robot", res(&format!("get {g} bundles/content team-a x")), true),
        ("serviceaccount of another namespace", "system:serviceaccount:team-b:robot", res(&format!("get {g} bundles/content team-a x")), false),
        ("serviceaccount with explicit namespace", "system:serviceaccount:ci-system:ci", res(&format!("list {g} bundles team-a -")), true),
        ("serviceaccount in clusterrolebinding", "system:serviceaccount:tools:deployer", res(&format!("get {g} bundles/content team-z x")), true),
        ("missing role references grant nothing", "carol", res(&format!("get {g} bundles team-a b")), false),
        ("group via clusterrolebinding", "zed|auditors", res(&format!("get {g} bundles team-x b")), true),
        ("clusterrolebinding grants cluster scope", "zed|auditors", res(&format!("list {g} bundles - -")), true),
        ("other group", "zed|developers", res(&format!("get {g} bundles team-x b")), false),
        ("non-resource exact", "erin", path("get", "/metrics"), true),
        ("non-resource prefix star", "erin", path("get", "/debug/pprof/heap"), true),
        ("non-resource prefix is literal", "erin", path("get", "/debugger"), false),
        ("non-resource verb", "erin", path("post", "/metrics"), false),
        ("non-resource via group", "x|system:monitoring", path("get", "/metrics"), true),
        ("non-resource never via rolebinding", "dave", path("get", "/metrics"), false),
        ("non-resource rules never match resources", "dave", res(&format!("get {g} bundles team-a b")), false),
        ("star-slash-subresource and star verbs and groups", "frank", res("patch apps deployments/status team-q d"), true),
        ("star-slash-subresource needs a subresource", "frank", res("get apps deployments team-q d"), false),
        ("resource-slash-star is not a wildcard", "gina", res(&format!("get {g} bundles/content team-a b")), false),
        ("system:masters is always allowed", "root|system:masters", res("delete - nodes - n1"), true),
        ("system:masters non-resource", "root|system:masters", path("get", "/anything"), true),
        ("anonymous", "system:anonymous|system:unauthenticated", path("get", "/metrics"), false),
        ("user without bindings", "mallory|system:authenticated", res(&format!("get {g} bundles team-a b")), false),
    ];
    assert!(cases.len() >= 25);
    for (what, who, request, allowed) in cases {
        let decision = decide(&policy, who, request);
        assert_eq!(decision.is_allowed(), allowed, "{what}: {who}: {decision:?}");
        if !allowed {
            assert!(matches!(decision, Decision::NoOpinion(_)), "{what}: RBAC never denies: {decision:?}");
        }
    }
}

#[test]
fn reasons_are_kubes() {
    let policy = Policy::parse(POLICY).unwrap();
    let reason = |who: &str, r: &str| decide(&policy, who, res(r)).reason().to_owned();
    assert_eq!(
        reason("alice", "get content.stowage.dev bundles team-a b"),
        r#"RBAC: allowed by RoleBinding "alice-view/team-a" of ClusterRole "bundle-viewer" to User "alice""#
    );
    assert_eq!(
        reason("bob", "get content.stowage.dev bundles/content team-a one"),
        r#"RBAC: allowed by RoleBinding "bob-one/team-a" of Role "bundle-one" to User "bob""#
    );
    assert_eq!(
        reason("system:serviceaccount:team-a:robot", "get content.stowage.dev bundles/content team-a x"),
        r#"RBAC: allowed by RoleBinding "robot/team-a" of ClusterRole "content-reader" to ServiceAccount "robot/team-a""#
    );
    assert_eq!(
        reason("zed|auditors", "list content.stowage.dev bundles - -"),
        r#"RBAC: allowed by ClusterRoleBinding "auditors" of ClusterRole "bundle-viewer" to Group "auditors""#
    );
    assert_eq!(
        reason("carol", "get content.stowage.dev bundles team-a b"),
        r#"RBAC: [clusterrole.rbac.authorization.k8s.io "missing-cluster-role" not found, role.rbac.authorization.k8s.io "missing" not found]"#
    );
    assert_eq!(
        reason("carol", "get content.stowage.dev bundles - b"),
        r#"RBAC: clusterrole.rbac.authorization.k8s.io "missing-cluster-role" not found"#
    );
    assert_eq!(reason("alice", "get content.stowage.dev bundles team-b b"), "");
}

#[test]
fn stats_count_objects_in_lists_and_skip_empty_documents() {
    let stats = Policy::parse(POLICY).unwrap().stats();
    let expected = PolicyStats { roles: 2, cluster_roles: 5, role_bindings: 6, cluster_role_bindings: 6 };
    assert_eq!(stats, expected);
    assert_eq!(Policy::parse("").unwrap().stats(), PolicyStats::default());
    assert_eq!(Policy::parse("---\n---\n# only a comment\n").unwrap().stats(), PolicyStats::default());
    let empty = Policy::parse("").unwrap();
    assert!(!decide(&empty, "alice", path("get", "/")).is_allowed());
    assert!(decide(&empty, "root|system:masters", path("get", "/")).is_allowed());
}

#[test]
fn thousands_of_bindings() {
    let mut text = String::from(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: v}\n\
         rules: [{apiGroups: [\"\"], resources: [pods], verbs: [get]}]\n",
    );
    for i in 0..5000 {
        text.push_str(&format!(
            "---\napiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\n\
             metadata: {{name: b{i}, namespace: ns{}}}\nroleRef: {{kind: ClusterRole, name: v}}\n\
             subjects: [{{kind: User, name: u{i}}}, {{kind: Group, name: g{}}}]\n",
            i % 50,
            i % 7
        ));
    }
    let policy = Policy::parse(&text).unwrap();
    assert_eq!(policy.stats().role_bindings, 5000);
    assert!(decide(&policy, "u4321", res("get - pods ns21 p")).is_allowed());
    assert!(!decide(&policy, "u4321", res("get - pods ns22 p")).is_allowed());
    assert!(decide(&policy, "x|g3", res("get - pods ns3 p")).is_allowed());
    let started = std::time::Instant::now();
    for i in 0..10_000 {
        decide(&policy, &format!("u{i}|g1|g2"), res("get - pods ns7 p"));
    }
    assert!(started.elapsed() < std::time::Duration::from_secs(5), "{:?}", started.elapsed());
}

fn error(text: &str) -> String {
    Policy::parse(text).map(|_| String::new()).unwrap_or_else(|e| e.to_string())
}

#[test]
fn errors_name_the_document_and_kind() {
    const CR: &str = "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: a}\n";
    let pod = format!("{CR}---\n---\napiVersion: v1\nkind: Pod\nmetadata: {{name: p}}\n");
    assert!(error(&pod).starts_with(r#"document 3: unsupported kind "Pod" (apiVersion "v1")"#), "{}", error(&pod));
    let in_list = format!(
        "apiVersion: v1\nkind: List\nitems:\n- {}\n- {{apiVersion: v1, kind: Secret}}\n",
        "{apiVersion: rbac.authorization.k8s.io/v1, kind: ClusterRole, metadata: {name: a}}"
    );
    assert!(error(&in_list).starts_with(r#"document 1 items[1]: unsupported kind "Secret""#), "{}", error(&in_list));
    let beta = CR.replace("/v1", "/v1beta1");
    assert!(error(&beta).contains(r#"unsupported kind "ClusterRole" (apiVersion "rbac.authorization.k8s.io/v1beta1")"#));
    assert_eq!(error("just a string"), "document 1: not a Kubernetes object (a mapping with apiVersion and kind)");
    assert!(error(&format!("{CR}---\nkind: [unclosed\n")).starts_with("document 2: "));
    let typo = format!("{CR}rules: [{{apiGroup: [\"\"], resources: [pods], verbs: [get]}}]\n");
    assert!(error(&typo).starts_with(r#"document 1: ClusterRole "a": unknown field `apiGroup`"#), "{}", error(&typo));
    let no_groups = format!("{CR}rules: [{{resources: [pods], verbs: [get]}}]\n");
    assert!(error(&no_groups).starts_with(r#"document 1: ClusterRole "a": rules[0]: resource rules must supply"#));
    let no_ns = "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {name: r}\n";
    assert_eq!(error(no_ns), r#"document 1: Role "r": metadata.namespace is required"#);
    let ns_urls = format!(
        "{}rules: [{{nonResourceURLs: [/x], verbs: [get]}}]\n",
        no_ns.replace("{name: r}", "{name: r, namespace: n}")
    );
    assert!(error(&ns_urls).ends_with("rules[0]: namespaced rules cannot apply to non-resource URLs"));
    let crb = "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {name: b}\n";
    let to_role = format!("{crb}roleRef: {{kind: Role, name: r}}\n");
    assert_eq!(
        error(&to_role),
        r#"document 1: ClusterRoleBinding "b": roleRef.kind must be "ClusterRole", not "Role""#
    );
    let sa = format!("{crb}roleRef: {{kind: ClusterRole, name: r}}\nsubjects: [{{kind: ServiceAccount, name: s}}]\n");
    assert!(error(&sa).ends_with("subjects[0]: namespace is required"));
    let kind = format!("{crb}roleRef: {{kind: ClusterRole, name: r}}\nsubjects: [{{kind: Robot, name: s}}]\n");
    assert!(error(&kind).contains("subjects[0]: kind must be"));
    assert_eq!(
        error(&format!("{crb}subjects: []\n")),
        r#"document 1: ClusterRoleBinding "b": missing field `roleRef`"#
    );
    assert_eq!(error(&format!("{CR}---\n{CR}")), r#"document 2: ClusterRole "a" is defined twice"#);
}

#[test]
fn rules_for_lists_cluster_then_namespace_bindings() {
    let policy = Policy::parse(POLICY).unwrap();
    let rules = |who: &str, namespace: &str| policy.rules_for(&user(who), namespace);
    // alice's RoleBinding counts in team-a only.
    let alice = rules("alice", "team-a");
    assert_eq!(alice.rules.len(), 1, "{alice:?}");
    assert_eq!(alice.rules[0].resources, ["bundles", "bundlecontents"]);
    assert_eq!(alice.evaluation_error(), None);
    assert!(rules("alice", "team-b").rules.is_empty());
    assert!(rules("alice", "").rules.is_empty(), "no namespace, no RoleBindings");
    // bob's Role is the one of team-a, resourceNames kept.
    let bob = rules("bob", "team-a");
    assert_eq!(bob.rules.len(), 2);
    assert_eq!(bob.rules[0].resource_names, ["one"]);
    // A ClusterRoleBinding counts everywhere; a group binds its members.
    assert_eq!(rules("x|auditors", "anywhere").rules.len(), 1);
    let erin = rules("erin", "team-a");
    assert_eq!(erin.rules[0].non_resource_urls, ["/metrics", "/debug/*"]);
    // Dangling references are reported, cluster ones first, as kube aggregates them.
    let carol = rules("carol", "team-a");
    assert!(carol.rules.is_empty());
    assert_eq!(
        carol.evaluation_error().as_deref(),
        Some(
            r#"[clusterrole.rbac.authorization.k8s.io "missing-cluster-role" not found, role.rbac.authorization.k8s.io "missing" not found]"#
        )
    );
    assert_eq!(rules("system:serviceaccount:team-a:robot", "team-a").rules.len(), 1);
    // No special case for masters here: the bootstrap policy's cluster-admin binding lists them.
    assert!(rules("root|system:masters", "team-a").rules.is_empty());
}
