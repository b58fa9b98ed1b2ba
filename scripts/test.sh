#!/usr/bin/env bash
# Runs every test of the project: formatting, unit tests and the black-box conformance suite
# (tests/conformance), installing the few system tools they need first. Idempotent.
set -euo pipefail

cd "$(dirname "$0")/.."
# nginx lives in /usr/sbin, not always on a non-root PATH.
export PATH="$PATH:/usr/sbin:/sbin"

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

# Debian packages the tests use, by the command that must exist.
declare -A needed=(
    [tar]=tar           # bundles are tarred the way users do it
    [gzip]=gzip
    [git]=git           # git sources: repositories made with the CLI, served by git http-backend
    [nginx]=nginx       # http sources: a real static file server
    [openssl]=openssl   # htpasswd entries for nginx's auth_basic
    [docker-registry]=docker-registry   # a real OCI registry for the image source tests
    [skopeo]=skopeo
    [curl]=curl         # the README test runs its curl snippets
    [zsh]=zsh           # the plugin's completion scripts, sourced by each shell
    [fish]=fish
    [cc]=gcc            # the power-cut suite compiles its LD_PRELOAD shim (it fails, never skips, without)
    [etcd]=etcd-server  # the replicated store's API objects (tests/conformance/replicated)
    [haproxy]=haproxy   # the load balancer in front of the replicas, like a Service
    [protoc]=protobuf-compiler  # etcd-client's build compiles etcd's protos
    [buildah]=buildah   # scripts/image.sh builds the server image (tests/conformance/image.rs)
    [podman]=podman     # runs it as a kubelet would
    [runc]=runc         # podman's runtime here (crun refuses this machine's hybrid cgroups)
    [strip]=binutils    # the image's binary without symbols
    [containerd]=containerd  # `ctr pull` from the registry view (tests/conformance/oci_clients.rs)
)
# etcd-client's protos import google's well-known types, which protoc alone does not bring.
wellknown=/usr/include/google/protobuf/descriptor.proto
missing=()
for cmd in "${!needed[@]}"; do
    command -v "$cmd" >/dev/null 2>&1 || missing+=("${needed[$cmd]}")
done
[ -f "$wellknown" ] || missing+=(libprotobuf-dev)
if [ "${#missing[@]}" -gt 0 ]; then
    echo "test.sh: installing ${missing[*]}" >&2
    as_root apt-get update
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
fi

# Real Helm (v4's Go SDK, bound by helm-python-sdk) and the oras SDK pull from the registry view
# (tests/conformance/oci_clients.rs); pinned, so the clients tested are the ones named here.
python_packages=(helm-python-sdk==0.2.2 oras==0.2.43)
if ! python3 -c 'import helm_python, oras.client' >/dev/null 2>&1; then
    echo "test.sh: installing ${python_packages[*]} from PyPI" >&2
    python3 -m pip install --quiet "${python_packages[@]}"
fi

# kubectl is part of the test environment, not something this script installs.
if ! command -v kubectl >/dev/null 2>&1; then
    echo "test.sh: kubectl not found on PATH; the conformance tests drive the real kubectl" >&2
    exit 1
fi

# The tests generate the bundles and charts they need. STOWAGE_CORPUS=DIR (a corpus of real ones,
# as ../shared/corpus of the team's machines) makes them use those instead: an extra pass, not
# needed for a green run.
if [ -n "${STOWAGE_CORPUS:-}" ]; then
    echo "test.sh: the tests read bundles from STOWAGE_CORPUS=$STOWAGE_CORPUS" >&2
fi

# Garage, the S3-compatible object store of the replicated tests: built from crates.io once (about
# 10 min on 2 cores) and cached outside the repository, so a reused machine skips the build.
garage_root="$HOME/.cache/stowage-tools/garage-2.5.0"
if [ ! -x "$garage_root/bin/garage" ]; then
    echo "test.sh: building Garage 2.5.0 into $garage_root (once)" >&2
    cargo install garage --version 2.5.0 --locked --root "$garage_root"
fi
export STOWAGE_GARAGE="$garage_root/bin/garage"

# rustfmt and clippy come with rustup's default profile, not its minimal one.
for component in rustfmt clippy; do
    rustup component list --installed 2>/dev/null | grep -q "^$component" || rustup component add "$component"
done
cargo fmt --all -- --check
# No panic reachable from input: unwrap, expect, panic and unchecked indexing are denied outside
# tests (Cargo.toml [lints.clippy], clippy.toml), and every other clippy warning fails too.
cargo clippy --locked --workspace --all-targets -- -D warnings
# A provisioner depends on stowage-client alone: none of the server's heavy crates may reach it.
if server_crates=$(cargo tree --locked -p stowage-client -e normal --prefix none | grep -E '^(sled|etcd-client|tonic|prost|gix|object_store) '); then
    echo "test.sh: stowage-client depends on server crates:" >&2
    echo "$server_crates" >&2
    exit 1
fi
# The provisioner example is run by the conformance suite as the program a user would run.
cargo build --locked --examples
cargo test --locked --workspace --all-targets
