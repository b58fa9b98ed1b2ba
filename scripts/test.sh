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
    [tar]=tar           # the corpus is tarred the way users do it
    [gzip]=gzip
    [git]=git           # git sources: repositories made with the CLI, served by git http-backend
    [nginx]=nginx       # http sources: a real static file server
    [openssl]=openssl   # htpasswd entries for nginx's auth_basic
    [docker-registry]=docker-registry   # a real OCI registry for the image source tests
    [skopeo]=skopeo
    [curl]=curl         # the README test runs its curl snippets
    [cc]=gcc            # the power-cut suite compiles its LD_PRELOAD shim (it fails, never skips, without)
    [etcd]=etcd-server  # the replicated store's API objects (tests/conformance/replicated)
    [haproxy]=haproxy   # the load balancer in front of the replicas, like a Service
    [protoc]=protobuf-compiler  # etcd-client's build compiles etcd's protos
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

# kubectl is part of the test environment, not something this script installs.
if ! command -v kubectl >/dev/null 2>&1; then
    echo "test.sh: kubectl not found on PATH; the conformance tests drive the real kubectl" >&2
    exit 1
fi

corpus="${STOWAGE_CORPUS:-$PWD/../shared/corpus}"
if [ ! -d "$corpus/kube-prometheus-stack" ] || [ ! -d "$corpus/operator-registry" ] \
    || [ ! -d "$corpus/rukpak-testdata" ]; then
    echo "test.sh: test corpus not found at $corpus (set STOWAGE_CORPUS)" >&2
    exit 1
fi
export STOWAGE_CORPUS="$corpus"

# Garage, the S3-compatible object store of the replicated tests: built from crates.io once (about
# 10 min on 2 cores) and cached outside the repository, so a reused machine skips the build.
garage_root="$HOME/.cache/stowage-tools/garage-2.5.0"
if [ ! -x "$garage_root/bin/garage" ]; then
    echo "test.sh: building Garage 2.5.0 into $garage_root (once)" >&2
    cargo install garage --version 2.5.0 --locked --root "$garage_root"
fi
export STOWAGE_GARAGE="$garage_root/bin/garage"

cargo fmt --all -- --check
# No panic reachable from input: unwrap, expect, panic and unchecked indexing are denied outside
# tests (Cargo.toml [lints.clippy], clippy.toml), and every other clippy warning fails too.
cargo clippy --version >/dev/null 2>&1 || rustup component add clippy
cargo clippy --locked --all-targets -- -D warnings
# The provisioner example is run by the conformance suite as the program a user would run.
cargo build --locked --examples
cargo test --locked --all-targets
