#!/usr/bin/env bash
# Benchmarks (docs/benchmarks.md), each side by side with the plain tool a user would otherwise use,
# in the same run. Builds the release binary, starts a fresh `stowage serve` in a temporary directory
# for every scenario and run, and prints Markdown (progress goes to stderr). Scenarios (bench/*.sh):
#   corpus      storage footprint of the corpus vs the raw trees, one .tar.gz per revision, ConfigMaps
#   download    content download vs nginx serving the same tar over TLS, plain and zstd
#   unpack      image unpack vs skopeo copy + tar -x from the same local registry
#   registry    skopeo pulls from the OCI registry view (/v2/) vs docker-registry holding the same
#               images, over TLS
#   api         GET/LIST/watch with 10,000 Bundles (examples/loadgen.rs; wrk with a bearer token for the
#               issue-19 figures), GET/LIST vs nginx, store size after seeding
#   footprint   five kube-prometheus-stack versions: dedup across versions
#   churn       space amplification under upload/delete churn
#   throughput  1 GiB upload/download and the server's peak memory
#   ingest      1 GiB YAML upload beside zstd -3 -T2 and b3sum on the same tar (BENCH_BEFORE_BIN: also
#               that build's upload), the server's peak memory
#   writes      Bundle creates, 1 and 32 writers, on the local disk and with slow flushes
#   many_files  1,000,000 empty files: a refused upload and a deleted revision, the server's memory
#   startup     start to ready after kill -9 on stores of 2,000 and 20,000 revisions, and the
#               collection owed since open, in the background
#   watchers    1,000 watches of one namespace while its Bundles are patched 100 times a second
#   replicas    replicated mode: 1 and 3 replicas on etcd + Garage behind haproxy vs the embedded
#               store, GET/LIST/download, and failover after kill -9 (not in the default list: it
#               needs Garage, see bench/replicas.sh)
#
# Usage: scripts/bench.sh [SCENARIO...]   (arguments replace BENCH_SCENARIOS)
#
# Environment:
#   BENCH_RUNS      runs of every scenario (default 3); tables show min / median / max
#   BENCH_SCENARIOS which scenarios to run (default: all but replicas, in the order above)
#   BENCH_API_OBJECTS   api: Bundles stored (default 10000)
#   BENCH_API_WATCHERS  api: concurrent watches (default 200)
#   BENCH_API_EVENTS    api: writes each watcher must see (default 1000)
#   BENCH_API_SECONDS   api, replicas: duration of every GET/LIST measurement (default 10)
#   BENCH_REPL_OBJECTS    replicas: Bundles stored (default 2000)
#   BENCH_REPL_DOWNLOADS  replicas: content downloads per figure (default 20)
#   BENCH_LOADGEN   api, replicas: use this loadgen binary (with BENCH_BIN, e.g. for a smoke test with
#                   BENCH_BIN=target/debug/stowage BENCH_LOADGEN=target/debug/examples/loadgen)
#   STOWAGE_GARAGE  replicas: the Garage binary (default ~/.cache/stowage-tools/garage-2.5.0/bin/garage)
#   BENCH_ROUNDS    churn rounds (default 20)
#   BENCH_INGEST_BYTES  ingest: size of the uploaded tar (default 1073741824)
#   BENCH_PLUGIN    ingest: the kubectl-stowage binary to push with (default: the one beside BENCH_BIN,
#                   else target/release/kubectl-stowage)
#   BENCH_WRITES_ONE / _MANY  writes: creates by 1 writer / by 32 writers (default 1000 / 4000)
#   BENCH_SLOW_FSYNC_US  writes: delay added to every fsync on the "slow" disk (default 2000)
#   BENCH_REPL_SETS replicas: which clusters, "1", "3" or "1 3" (default; the failover needs 3)
#   BENCH_REPL_ARGS replicas: extra flags for BENCH_BIN's replicas (e.g. --object-cache-bytes 0 to measure without the object cache)
#   BENCH_BEFORE_BIN     ingest, writes, many_files, startup, api (seed, store size, wrk figures), replicas
#                        (a 1-replica cluster): also measure this stowage
#                        binary (an older build), side by side
#   BENCH_MANY_FILES     many_files: entries per archive (default 1000000)
#   BENCH_STARTUP_REVISIONS  startup: store sizes, in revisions (default "2000 20000")
#   BENCH_WATCHERS / _RATE / _EVENTS  watchers: watches, writes per second, writes (1000 / 100 / 1000)
#   BENCH_BIN       use this stowage binary instead of building the release (scenarios without loadgen;
#                   unpack takes target/release/examples/ociimage when it was built)
#   BENCH_TMPDIR    where the temporary files go (default: $TMPDIR or /tmp); needs ~5 GiB free
#   BENCH_KEEP=1    keep the temporary directory
#   STOWAGE_CORPUS  the corpus (default: ../shared/corpus beside the repository)
set -euo pipefail

cd "$(dirname "$0")/.."
repo=$PWD

RUNS="${BENCH_RUNS:-3}"
SCENARIOS="${BENCH_SCENARIOS:-corpus download unpack registry api footprint churn throughput writes many_files startup watchers}"
if [ "$#" -gt 0 ]; then SCENARIOS="$*"; fi
API_OBJECTS="${BENCH_API_OBJECTS:-10000}"
API_WATCHERS="${BENCH_API_WATCHERS:-200}"
API_EVENTS="${BENCH_API_EVENTS:-1000}"
API_SECONDS="${BENCH_API_SECONDS:-10}"
ROUNDS="${BENCH_ROUNDS:-20}"
WRITES_ONE="${BENCH_WRITES_ONE:-1000}"
WRITES_MANY="${BENCH_WRITES_MANY:-4000}"
corpus="${STOWAGE_CORPUS:-$repo/../shared/corpus}"
KPS_VERSIONS=(88.4.0 88.5.0 88.5.1 88.5.2 88.5.3)
NS=bench
API=/apis/content.stowage.dev/v1alpha1

for part in lib store corpus download unpack registry api writes many_files replicas ingest startup; do
    # shellcheck source=/dev/null
    source "$repo/bench/$part.sh"
done


started=$SECONDS
for s in $SCENARIOS; do
    case "$s" in
        footprint) scenario_footprint ;;
        churn) scenario_churn ;;
        throughput) scenario_throughput ;;
        ingest) scenario_ingest ;;
        api) scenario_api ;;
        unpack) scenario_unpack ;;
        registry) scenario_registry ;;
        corpus) scenario_corpus ;;
        download) scenario_download ;;
        writes) scenario_writes ;;
        many_files) scenario_many_files ;;
        replicas) scenario_replicas ;;
        startup) scenario_startup ;;
        watchers) scenario_watchers ;;
        *) die "unknown scenario $s (corpus download unpack registry api footprint churn throughput ingest writes many_files startup watchers replicas)" ;;
    esac
done
log "done in $((SECONDS - started)) s"

echo "## Results ($(date -u +%Y-%m-%d), scripts/bench.sh, BENCH_RUNS=$RUNS)"
echo
machine
python3 "$repo/bench/summarize.py" "$RESULTS"
