#!/usr/bin/env bash
# Benchmarks of the content store (see docs/benchmarks.md): the kube-prometheus-stack five-version
# footprint, space amplification under upload/delete churn, and 1 GiB upload/download throughput
# with the server's peak memory; and, with `scripts/bench.sh api`, the Bundle API (GET/LIST
# throughput and latency with 10,000 Bundles stored, watch fan-out to 200 watchers, peak memory),
# driven by examples/loadgen.rs; and, with `scripts/bench.sh unpack`, Bundles unpacked from a local
# registry (kube-prometheus-stack chart image, 1 GiB four-layer image) beside skopeo copy + tar -x. Builds the release binary, starts a fresh `stowage serve` in a
# temporary directory for every scenario and run, and prints Markdown (progress goes to stderr).
#
# Usage: scripts/bench.sh [SCENARIO...]   (arguments replace BENCH_SCENARIOS)
#
# Environment:
#   BENCH_RUNS      runs of every scenario (default 3); tables show min / median / max
#   BENCH_SCENARIOS which scenarios to run, a subset of "footprint churn throughput api unpack"
#                   (default: "footprint churn throughput")
#   BENCH_API_OBJECTS   api: Bundles stored (default 10000)
#   BENCH_API_WATCHERS  api: concurrent watches (default 200)
#   BENCH_API_EVENTS    api: writes each watcher must see (default 1000)
#   BENCH_API_SECONDS   api: duration of every GET/LIST measurement (default 10)
#   BENCH_ROUNDS    churn rounds (default 20)
#   BENCH_TMPDIR    where the temporary files go (default: $TMPDIR or /tmp); needs ~4 GiB free
#   BENCH_KEEP=1    keep the temporary directory
#   STOWAGE_CORPUS  the corpus (default: ../shared/corpus beside the repository)
set -euo pipefail

cd "$(dirname "$0")/.."
repo=$PWD

RUNS="${BENCH_RUNS:-3}"
SCENARIOS="${BENCH_SCENARIOS:-footprint churn throughput}"
if [ "$#" -gt 0 ]; then SCENARIOS="$*"; fi
API_OBJECTS="${BENCH_API_OBJECTS:-10000}"
API_WATCHERS="${BENCH_API_WATCHERS:-200}"
API_EVENTS="${BENCH_API_EVENTS:-1000}"
API_SECONDS="${BENCH_API_SECONDS:-10}"
ROUNDS="${BENCH_ROUNDS:-20}"
corpus="${STOWAGE_CORPUS:-$repo/../shared/corpus}"
KPS_VERSIONS=(88.4.0 88.5.0 88.5.1 88.5.2 88.5.3)
NS=bench
API=/apis/content.stowage.dev/v1alpha1

log() { echo "bench: $*" >&2; }
die() {
    log "ERROR: $*"
    if [ -n "${SERVER_DIR:-}" ] && [ -f "$SERVER_DIR.log" ]; then
        log "last lines of the server log ($SERVER_DIR.log):"
        tail -n 40 "$SERVER_DIR.log" >&2
    fi
    exit 1
}

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

# ------------------------------------------------------------------------------------------------
# Tools

declare -A needed=(
    [curl]=curl
    [tar]=tar
    [gzip]=gzip
    [zstd]=zstd
    [sha256sum]=coreutils
    [find]=findutils
    [python3]=python3
    [docker-registry]=docker-registry
    [skopeo]=skopeo
    [/usr/bin/time]=time
)
missing=()
for cmd in "${!needed[@]}"; do
    command -v "$cmd" >/dev/null 2>&1 || missing+=("${needed[$cmd]}")
done
if [ "${#missing[@]}" -gt 0 ]; then
    log "installing ${missing[*]}"
    as_root apt-get update
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
fi

if [[ " $SCENARIOS " == *" footprint "* || " $SCENARIOS " == *" churn "* || " $SCENARIOS " == *" unpack "* ]]; then
    [ -d "$corpus/kube-prometheus-stack" ] && [ -d "$corpus/operator-registry" ] \
        && [ -d "$corpus/rukpak-testdata" ] || die "corpus not found at $corpus (set STOWAGE_CORPUS)"
    corpus="$(cd "$corpus" && pwd)"
fi

# ------------------------------------------------------------------------------------------------
# Build (others may be mid-edit: retry a few times)

for attempt in 1 2 3 4 5; do
    log "cargo build --release (attempt $attempt)"
    if cargo build --release >&2 && cargo build --release --example loadgen --example ociimage >&2; then break; fi
    [ "$attempt" -eq 5 ] && die "cargo build --release failed"
    sleep 60
done
BIN="$repo/target/release/stowage"
[ -x "$BIN" ] || die "no binary at $BIN"

# ------------------------------------------------------------------------------------------------
# Scratch space, results, cleanup

base_tmp="${BENCH_TMPDIR:-${TMPDIR:-/tmp}}"
WORK="$(mktemp -d "$base_tmp/stowage-bench.XXXXXX")"
RESULTS="$WORK/results.tsv"
# A private copy under a neutral name: others may rebuild target/release, or stop `stowage`
# processes by name, while this runs.
cp "$BIN" "$WORK/bench-server"
BIN="$WORK/bench-server"
LOADGEN="$WORK/bench-loadgen"
cp "$repo/target/release/examples/loadgen" "$LOADGEN"
OCIIMAGE="$WORK/bench-ociimage"
cp "$repo/target/release/examples/ociimage" "$OCIIMAGE"
: >"$RESULTS"
SERVER_PID=""
SERVER_DIR=""
SERVER_ARGS=()
URL=""
REGISTRY_PID=""

cleanup() {
    if [ -n "$REGISTRY_PID" ]; then kill "$REGISTRY_PID" 2>/dev/null || true; fi
    if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
        kill -TERM "$SERVER_PID" 2>/dev/null || true
        wait "$SERVER_PID" 2>/dev/null || true
    fi
    if [ "${BENCH_KEEP:-0}" = 1 ]; then
        log "kept $WORK"
    else
        rm -rf "$WORK"
    fi
}
trap cleanup EXIT

# record SECTION FIGURE UNIT VALUE [TARGET]
record() {
    printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "${5:-}" >>"$RESULTS"
}

now() { date +%s.%N; }
# calc EXPR: floating-point arithmetic
calc() { python3 -c "print($1)"; }

# Sum of the sizes of the regular files under the given paths (apparent size).
file_bytes() { find "$@" -type f -printf '%s\n' | awk '{s += $1} END {printf "%d\n", s}'; }
# Allocated blocks (what the filesystem actually uses), in bytes.
alloc_bytes() { du -B1 -s "$1" | cut -f1; }

# ------------------------------------------------------------------------------------------------
# The server

# start_server DATA_DIR: starts `stowage serve` and waits for its ready line.
start_server() {
    SERVER_DIR="$1"
    mkdir -p "$SERVER_DIR"
    local logf="$SERVER_DIR.log" skip=0
    touch "$logf"
    skip="$(wc -l <"$logf")"
    NO_COLOR=1 "$BIN" serve --data-dir "$SERVER_DIR" --listen 127.0.0.1:0 "${SERVER_ARGS[@]}" >>"$logf" 2>&1 &
    SERVER_PID=$!
    local deadline=$((SECONDS + 120))
    URL=""
    while [ -z "$URL" ]; do
        kill -0 "$SERVER_PID" 2>/dev/null || { tail -n 30 "$logf" >&2; die "server exited during start"; }
        [ "$SECONDS" -lt "$deadline" ] || die "server not ready after 120 s"
        URL="$(tail -n "+$((skip + 1))" "$logf" | grep 'stowage ready on' | tail -n 1 | grep -o 'https://127\.0\.0\.1:[0-9]*' || true)"
        [ -n "$URL" ] || sleep 0.2
    done
}

# stop_server: SIGTERM, then wait for the process to end.
stop_server() {
    kill -TERM "$SERVER_PID"
    wait "$SERVER_PID" || true
    SERVER_PID=""
}

peak_rss_kib() { awk '/^VmHWM:/ {print $2}' "/proc/$SERVER_PID/status"; }
rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/$SERVER_PID/status"; }

# api [curl args...] PATH: a request with the admin client certificate; fails on HTTP errors.
api() {
    local path="${*: -1}"
    curl -sS --fail-with-body --cacert "$SERVER_DIR/pki/ca.crt" --cert "$SERVER_DIR/pki/admin.crt" \
        --key "$SERVER_DIR/pki/admin.key" "${@:1:$#-1}" "$URL$path" \
        || die "request to $path failed (server $(kill -0 "$SERVER_PID" 2>/dev/null && echo running || echo gone))"
}

json_field() { python3 -c 'import json,sys; v=json.load(sys.stdin)
for k in sys.argv[1].split("."): v=v[k]
print(v)' "$1"; }

create_bundle() {
    api -X POST -H 'Content-Type: application/json' -o /dev/null \
        -d "{\"apiVersion\":\"content.stowage.dev/v1alpha1\",\"kind\":\"Bundle\",\"metadata\":{\"name\":\"$1\"},\"spec\":{\"sources\":[{\"upload\":{}}]}}" \
        "$API/namespaces/$NS/bundles"
}

# upload_dir NAME DIR: creates Bundle NAME and PUTs DIR as a tar; checks it was unpacked.
upload_dir() {
    create_bundle "$1"
    local digest
    digest="$(tar -C "$2" -cf - . | api -X PUT -T - -H 'Content-Type: application/x-tar' \
        "$API/namespaces/$NS/bundles/$1/content" | json_field status.digest)"
    [[ "$digest" == sha256:* ]] || die "upload of $2 as $1 gave no digest"
}

delete_bundle() { api -X DELETE -o /dev/null "$API/namespaces/$NS/bundles/$1"; }

# metrics: fetches /metrics into M_* variables.
metrics() {
    local text
    text="$(api /metrics)"
    m() { awk -v n="$1" '$1 == n {print $2}' <<<"$text"; }
    M_CHUNKS="$(m stowage_chunks)"
    M_STORED="$(m stowage_chunk_stored_bytes)"
    M_RAW="$(m stowage_chunk_raw_bytes)"
    M_DISK="$(m stowage_disk_bytes)"
    M_COMMITTED="$(m 'stowage_revisions{state="committed"}')"
    M_STAGING="$(m 'stowage_revisions{state="staging"}')"
    M_DELETING="$(m 'stowage_revisions{state="deleting"}')"
}

# settle: polls /metrics until no revision is staging or deleting and the figures have not
# changed for 3 s (background collection and compaction are done).
settle() {
    local deadline=$((SECONDS + 600)) last="" same=0 cur
    while :; do
        metrics
        cur="$M_CHUNKS $M_STORED $M_DISK $M_COMMITTED $M_STAGING $M_DELETING"
        if [ "$M_STAGING" = 0 ] && [ "$M_DELETING" = 0 ] && [ "$cur" = "$last" ]; then
            same=$((same + 1))
            [ "$same" -ge 3 ] && return 0
        else
            same=0
        fi
        last="$cur"
        [ "$SECONDS" -lt "$deadline" ] || die "store did not settle within 600 s ($cur)"
        sleep 1
    done
}

# ------------------------------------------------------------------------------------------------
# 1. kube-prometheus-stack: five consecutive versions

scenario_footprint() {
    local section="kube-prometheus-stack ${KPS_VERSIONS[0]}…${KPS_VERSIONS[-1]}: five versions stored (% of raw)"
    local dirs=() v
    for v in "${KPS_VERSIONS[@]}"; do
        [ -d "$corpus/kube-prometheus-stack/$v" ] || die "missing $corpus/kube-prometheus-stack/$v"
        dirs+=("$corpus/kube-prometheus-stack/$v")
    done
    local raw
    raw="$(file_bytes "${dirs[@]}")"
    local u="bytes:$raw"

    # Reference points; deterministic, so computed once.
    log "footprint: reference compressors"
    local targz=0 n
    for v in "${dirs[@]}"; do
        n="$(tar -C "$v" -cf - . | gzip | wc -c)"
        targz=$((targz + n))
    done
    local zall
    zall="$(for v in "${dirs[@]}"; do tar -C "$v" -cf - .; done | zstd -q -19 --long=27 -c | wc -c)"

    # Baseline: what an empty store takes (fresh start, settle, stop).
    start_server "$WORK/empty"
    settle
    stop_server
    local empty_sled empty_packs
    empty_sled="$(file_bytes "$WORK/empty/store/db")"
    empty_packs="$(file_bytes "$WORK/empty/store/packs")"

    local run
    for run in $(seq 1 "$RUNS"); do
        log "footprint: run $run/$RUNS"
        local data="$WORK/footprint-$run"
        start_server "$data"
        local t0 t1
        t0="$(now)"
        for v in "${KPS_VERSIONS[@]}"; do
            upload_dir "kps-${v//./-}" "$corpus/kube-prometheus-stack/$v"
        done
        t1="$(now)"
        settle
        local stored="$M_STORED" chunk_raw="$M_RAW" chunks="$M_CHUNKS" disk_metric="$M_DISK"
        stop_server
        local store="$data/store"
        local pack_app sled_app pack_alloc sled_alloc
        pack_app="$(file_bytes "$store/packs")"
        sled_app="$(file_bytes "$store/db")"
        pack_alloc="$(alloc_bytes "$store/packs")"
        sled_alloc="$(alloc_bytes "$store/db")"

        record "$section" "raw bytes (sum of file sizes, 5 trees)" "$u" "$raw"
        record "$section" "distinct chunk bytes after dedup, uncompressed" "$u" "$chunk_raw"
        record "$section" "distinct chunks" count "$chunks"
        record "$section" "live compressed chunk bytes" "$u" "$stored"
        record "$section" "pack files, apparent" "$u" "$pack_app"
        record "$section" "sled dir, apparent" "$u" "$sled_app"
        record "$section" "**total on disk, apparent** (packs + sled)" "$u" "$((pack_app + sled_app))" "<=3"
        record "$section" "pack files, allocated (du)" "$u" "$pack_alloc"
        record "$section" "sled dir, allocated (du)" "$u" "$sled_alloc"
        record "$section" "**total on disk, allocated** (du)" "$u" "$((pack_alloc + sled_alloc))" "<=3"
        record "$section" "stowage_disk_bytes before stop" "$u" "$disk_metric"
        record "$section" "baseline: empty store, sled + packs (apparent)" "$u" "$((empty_sled + empty_packs))"
        record "$section" "compare: one tar.gz per version (gzip -6), sum of 5" "$u" "$targz"
        record "$section" "compare: 5 tars concatenated, zstd -19 --long=27" "$u" "$zall"
        record "$section" "time to upload the 5 versions" s "$(calc "$t1 - $t0")"
    done
}

# ------------------------------------------------------------------------------------------------
# 2. Space amplification under churn

corpus_bundles() {
    local d
    for d in "$corpus"/rukpak-testdata/*/* "$corpus"/operator-registry/* "$corpus"/kube-prometheus-stack/*; do
        [ -d "$d" ] && echo "$d"
    done
}

scenario_churn() {
    local section="Space amplification: $ROUNDS rounds of upload-all-corpus / delete-previous-round"
    local bundles=()
    mapfile -t bundles < <(corpus_bundles)
    local run
    for run in $(seq 1 "$RUNS"); do
        log "churn: run $run/$RUNS (${#bundles[@]} bundles × $ROUNDS rounds)"
        local data="$WORK/churn-$run"
        start_server "$data"
        local t0 r i
        t0="$(now)"
        for r in $(seq 1 "$ROUNDS"); do
            for i in "${!bundles[@]}"; do
                upload_dir "r$r-b$i" "${bundles[$i]}"
            done
            if [ "$r" -gt 1 ]; then
                for i in "${!bundles[@]}"; do delete_bundle "r$((r - 1))-b$i"; done
            fi
        done
        local churn_time
        churn_time="$(calc "$(now) - $t0")"
        settle
        record "$section" "uploads (bundles × rounds)" count "$((${#bundles[@]} * ROUNDS))"
        record "$section" "churn time" s "$churn_time"
        record "$section" "after churn: live compressed chunk bytes" bytes "$M_STORED"
        record "$section" "after churn: stowage_disk_bytes (apparent)" bytes "$M_DISK"
        record "$section" "after churn: pack files (apparent)" bytes "$(file_bytes "$data/store/packs")"
        record "$section" "after churn: sled dir (apparent)" bytes "$(file_bytes "$data/store/db")"
        record "$section" "**after churn: disk / live**" x "$(calc "$M_DISK / $M_STORED")" "<=2"
        record "$section" "after churn: allocated (du) / live" x "$(calc "$(alloc_bytes "$data/store") / $M_STORED")"

        log "churn: restart"
        stop_server
        start_server "$data"
        settle
        record "$section" "after restart: live compressed chunk bytes" bytes "$M_STORED"
        record "$section" "after restart: stowage_disk_bytes (apparent)" bytes "$M_DISK"
        record "$section" "after restart: pack files (apparent)" bytes "$(file_bytes "$data/store/packs")"
        record "$section" "after restart: sled dir (apparent)" bytes "$(file_bytes "$data/store/db")"
        record "$section" "**after restart: disk / live**" x "$(calc "$M_DISK / $M_STORED")" "<=2"
        record "$section" "after restart: allocated (du) / live" x "$(calc "$(alloc_bytes "$data/store") / $M_STORED")"

        log "churn: delete everything"
        for i in "${!bundles[@]}"; do delete_bundle "r$ROUNDS-b$i"; done
        settle
        [ "$M_COMMITTED" = 0 ] || die "revisions left after deleting every bundle: $M_COMMITTED"
        record "$section" "all deleted: live compressed chunk bytes" bytes "$M_STORED"
        record "$section" "all deleted: stowage_disk_bytes (apparent)" bytes "$M_DISK"
        record "$section" "all deleted: pack files (apparent)" bytes "$(file_bytes "$data/store/packs")"
        record "$section" "all deleted: sled dir (apparent)" bytes "$(file_bytes "$data/store/db")"
        record "$section" "all deleted: allocated (du)" bytes "$(alloc_bytes "$data/store")"
        stop_server
        start_server "$data"
        settle
        record "$section" "all deleted, after restart: stowage_disk_bytes (apparent)" bytes "$M_DISK"
        record "$section" "all deleted, after restart: pack files (apparent)" bytes "$(file_bytes "$data/store/packs")"
        record "$section" "all deleted, after restart: sled dir (apparent)" bytes "$(file_bytes "$data/store/db")"
        record "$section" "all deleted, after restart: allocated (du)" bytes "$(alloc_bytes "$data/store")"
        stop_server
        rm -rf "$data"
    done
}

# ------------------------------------------------------------------------------------------------
# 3. 1 GiB throughput

scenario_throughput() {
    local section="1 GiB bundle: throughput and server memory"
    local src="$WORK/gib-src" tarf="$WORK/gib.tar"
    log "throughput: generating the 1 GiB tree (4 random files + 5000 small text files)"
    mkdir -p "$src"
    python3 "$repo/bench/small_files.py" "$src" 5000
    local small big i
    small="$(file_bytes "$src")"
    big=$(((1073741824 - small) / 4))
    for i in 1 2 3 4; do head -c "$big" /dev/urandom >"$src/random-$i.bin"; done
    local files_total
    files_total="$(file_bytes "$src")"
    tar -C "$src" -cf "$tarf" .
    rm -rf "$src"
    local size
    size="$(stat -c %s "$tarf")"
    log "throughput: tar is $size bytes ($files_total bytes of files)"

    local run
    for run in $(seq 1 "$RUNS"); do
        log "throughput: run $run/$RUNS"
        local data="$WORK/gib-$run"
        start_server "$data"
        create_bundle gib
        local out code secs
        out="$(api -X PUT -T "$tarf" -H 'Content-Type: application/x-tar' -o "$WORK/put.json" \
            -w '%{http_code} %{time_total}' "$API/namespaces/$NS/bundles/gib/content")"
        read -r code secs <<<"$out"
        [ "$code" = 200 ] || die "upload returned $code"
        record "$section" "tar size" bytes "$size"
        record "$section" "upload (curl -T file)" MB/s "$(calc "$size / 1e6 / $secs")"
        local digest
        digest="$(api "$API/namespaces/$NS/bundles/gib" | json_field status.digest)"

        out="$(api -o /dev/null -w '%{size_download} %{time_total}' "$API/namespaces/$NS/bundles/gib/content")"
        local got
        read -r got secs <<<"$out"
        record "$section" "download to /dev/null" MB/s "$(calc "$got / 1e6 / $secs")"

        local t0 t1 sum
        t0="$(now)"
        sum="$(api "$API/namespaces/$NS/bundles/gib/content" | sha256sum | cut -d' ' -f1)"
        t1="$(now)"
        [ "sha256:$sum" = "$digest" ] || die "downloaded tar sha256:$sum != status.digest $digest"
        record "$section" "download \| sha256sum (digest = status.digest)" MB/s "$(calc "$got / 1e6 / ($t1 - $t0)")"
        record "$section" "**server peak RSS (VmHWM)**" MiB "$(calc "$(peak_rss_kib) / 1024")" "<150"
        record "$section" "served tar size" bytes "$got"
        stop_server
        record "$section" "store on disk, allocated (du)" bytes "$(alloc_bytes "$data/store")"
        rm -rf "$data"

        # Context: the same bytes through local tools (the tar file is in the page cache).
        local x="$WORK/extract"
        mkdir -p "$x"
        t0="$(now)"
        tar -C "$x" -xf "$tarf"
        sync -f "$x"
        t1="$(now)"
        record "$section" "context: tar -x + sync of the same file" MB/s "$(calc "$size / 1e6 / ($t1 - $t0)")"
        rm -rf "$x"
        t0="$(now)"
        sha256sum "$tarf" >/dev/null
        t1="$(now)"
        record "$section" "context: sha256sum of the tar file" MB/s "$(calc "$size / 1e6 / ($t1 - $t0)")"
    done
    rm -f "$tarf"
}

# ------------------------------------------------------------------------------------------------
# 4. The Bundle API under load (examples/loadgen.rs; one JSON line per measurement)

# loadgen ARGS...: runs the load generator against the current server; fails on a non-zero exit.
loadgen() {
    "$LOADGEN" --kubeconfig "$SERVER_DIR/admin.kubeconfig" --namespace "$NS" "$@" \
        || die "loadgen $* failed (server $(kill -0 "$SERVER_PID" 2>/dev/null && echo running || echo gone))"
}

# jfield JSON KEY: a top-level field of a loadgen result.
jfield() { python3 -c 'import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$1" "$2"; }

# record_requests SECTION LABEL JSON: throughput, latency and errors of a loadgen result.
record_requests() {
    record "$1" "$2: throughput" "req/s" "$(jfield "$3" rps)"
    record "$1" "$2: p50 latency" ms "$(jfield "$3" p50_ms)"
    record "$1" "$2: p99 latency" ms "$(jfield "$3" p99_ms)"
    record "$1" "$2: errors" count "$(jfield "$3" errors)" "<=0"
}

scenario_api() {
    local section="Bundle API: $API_OBJECTS Bundles stored, $API_WATCHERS watchers"
    local secs="$API_SECONDS" run out
    for run in $(seq 1 "$RUNS"); do
        local data="$WORK/api-$run"
        start_server "$data"
        log "api: run $run/$RUNS: seed $API_OBJECTS Bundles"
        out="$(loadgen seed "$API_OBJECTS" --concurrency 32)"
        log "$out"
        record_requests "$section" "seed: create (POST), 32 concurrent" "$out"
        record "$section" "server RSS after seeding" MiB "$(calc "$(rss_kib) / 1024")"

        log "api: GET"
        out="$(loadgen get --concurrency 1 --duration "$secs")"
        log "$out"
        record_requests "$section" "GET bundle, 1 client" "$out"
        out="$(loadgen get --concurrency 32 --duration "$secs")"
        log "$out"
        record_requests "$section" "**GET bundle, 32 concurrent**" "$out"

        log "api: watch fan-out ($API_WATCHERS watchers, $API_EVENTS writes)"
        out="$(loadgen watch --watchers "$API_WATCHERS" --events "$API_EVENTS" --concurrency 16 --pid "$SERVER_PID")"
        log "$out"
        record "$section" "**watch: events delivered per second** (all watchers)" "events/s" "$(jfield "$out" events_per_s)"
        record "$section" "watch: events missing" count "$(jfield "$out" missing)" "<=0"
        record "$section" "watch: lag write→event p50" ms "$(jfield "$out" lag_p50_ms)"
        record "$section" "watch: lag write→event p99" ms "$(jfield "$out" lag_p99_ms)"
        record "$section" "watch: lag write→event max" ms "$(jfield "$out" lag_max_ms)"
        record "$section" "watch: writes (merge PATCH, 16 concurrent) meanwhile" "req/s" "$(jfield "$out" write_rps)"
        record "$section" "watch: server RSS with $API_WATCHERS watches open" MiB "$(jfield "$out" server_rss_mib_watches_open)"
        record "$section" "server peak RSS (VmHWM) after seed, GETs and watch" MiB "$(calc "$(peak_rss_kib) / 1024")"

        log "api: LIST"
        out="$(loadgen list --limit 0 --concurrency 1 --duration "$secs")"
        log "$out"
        record_requests "$section" "LIST all $API_OBJECTS, 1 client" "$out"
        record "$section" "LIST all: response size" bytes "$(jfield "$out" bytes_per_response)"
        out="$(loadgen list --limit 0 --concurrency 4 --duration "$secs")"
        log "$out"
        record_requests "$section" "**LIST all $API_OBJECTS, 4 concurrent**" "$out"
        out="$(loadgen list --limit 500 --concurrency 4 --duration "$secs")"
        log "$out"
        record_requests "$section" "LIST ?limit=500, 4 concurrent" "$out"
        record "$section" "LIST ?limit=500: items in the first page" count "$(jfield "$out" items_per_response)"
        record "$section" "**server peak RSS (VmHWM), end of run**" MiB "$(calc "$(peak_rss_kib) / 1024")"
        stop_server
        rm -rf "$data"
    done
}

# ------------------------------------------------------------------------------------------------
# 5. Unpacking images from a registry, beside skopeo copy + tar -x

# start_registry: a docker-registry on a free port, storage under $WORK/registry; sets REGISTRY.
start_registry() {
    local port
    port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
    REGISTRY="127.0.0.1:$port"
    mkdir -p "$WORK/registry"
    cat >"$WORK/registry.yml" <<YAML
version: 0.1
log: {level: error}
storage: {filesystem: {rootdirectory: $WORK/registry}, delete: {enabled: true}}
http: {addr: $REGISTRY}
YAML
    docker-registry serve "$WORK/registry.yml" >"$WORK/registry.log" 2>&1 &
    REGISTRY_PID=$!
    local deadline=$((SECONDS + 30))
    until curl -sf "http://$REGISTRY/v2/" >/dev/null; do
        [ "$SECONDS" -lt "$deadline" ] || die "registry not ready"
        sleep 0.2
    done
}

# push_image NAME LAYER...: builds an OCI layout with examples/ociimage and pushes it as NAME:v1.
push_image() {
    local name="$1"
    shift
    rm -rf "$WORK/layout-$name"
    "$OCIIMAGE" "$WORK/layout-$name" v1 "$@"
    skopeo copy -q --dest-tls-verify=false "oci:$WORK/layout-$name:v1" "docker://$REGISTRY/$name:v1" >&2
}

# wait_unpacked NAME: polls the Bundle until Unpacked=True (dies on a failure reason).
wait_unpacked() {
    local deadline=$((SECONDS + 900)) state
    while :; do
        state="$(api "$API/namespaces/$NS/bundles/$1" | python3 -c 'import json,sys
c=[x for x in json.load(sys.stdin).get("status",{}).get("conditions",[]) if x["type"]=="Unpacked"]
print(c[0]["status"]+" "+c[0]["reason"]+" "+c[0].get("message","") if c else "none")')"
        case "$state" in
            True*) return 0 ;;
            "False Pending"* | "False Unpacking"* | none) ;;
            *) die "bundle $1: $state" ;;
        esac
        [ "$SECONDS" -lt "$deadline" ] || die "bundle $1 not unpacked after 900 s"
        sleep 0.05
    done
}

# baseline NAME: skopeo copy to an OCI layout, then tar -x of every layer in order; sets B_SECS
# and B_RSS_MIB (the larger peak of the two tools).
baseline() {
    local dir="$WORK/pull-$1" out="$WORK/extract-$1" t0 rss1 rss2 layer
    rm -rf "$dir" "$out"
    mkdir -p "$out"
    t0="$(now)"
    rss1="$(/usr/bin/time -f %M skopeo copy -q --src-tls-verify=false "docker://$REGISTRY/$1:v1" "oci:$dir:v1" 2>&1 >/dev/null | tail -n 1)"
    rss2=0
    for layer in $(python3 - "$dir" <<'PY'
import json, sys
d = sys.argv[1]
index = json.load(open(f"{d}/index.json"))
digest = index["manifests"][0]["digest"].split(":")[1]
manifest = json.load(open(f"{d}/blobs/sha256/{digest}"))
for layer in manifest["layers"]:
    print(f"{d}/blobs/sha256/" + layer["digest"].split(":")[1])
PY
    ); do
        local r
        r="$(/usr/bin/time -f %M tar -xzf "$layer" -C "$out" 2>&1 | tail -n 1)"
        [ "$r" -gt "$rss2" ] && rss2="$r"
    done
    B_SECS="$(calc "$(now) - $t0")"
    B_RSS_MIB="$(calc "max($rss1, $rss2) / 1024")"
    rm -rf "$dir" "$out"
}

scenario_unpack() {
    start_registry
    log "building and pushing images"
    push_image kps "dir:$corpus/kube-prometheus-stack/88.5.3"
    # 1 GiB in four layers of 64 files × 4 MiB (incompressible), over a small plain bundle.
    push_image big "dir:$corpus/rukpak-testdata/plain-v0/valid" random:64:4194304 random:64:4194304 \
        random:64:4194304 random:64:4194304
    SERVER_ARGS=(--insecure-registry "$REGISTRY")
    local run image section
    for run in $(seq "$RUNS"); do
        for image in kps big; do
            section="unpack from a local registry: $image image"
            [ "$image" = big ] && section="unpack from a local registry: 1 GiB, 4 layers"
            [ "$image" = kps ] && section="unpack from a local registry: kube-prometheus-stack 88.5.3 chart image"
            log "unpack $image, run $run"
            local data="$WORK/unpack-$image-$run" t0 secs
            start_server "$data"
            t0="$(now)"
            api -X POST -H 'Content-Type: application/json' -o /dev/null \
                -d "{\"apiVersion\":\"content.stowage.dev/v1alpha1\",\"kind\":\"Bundle\",\"metadata\":{\"name\":\"$image\"},\"spec\":{\"sources\":[{\"image\":{\"ref\":\"$REGISTRY/$image:v1\"}}]}}" \
                "$API/namespaces/$NS/bundles"
            wait_unpacked "$image"
            secs="$(calc "$(now) - $t0")"
            record "$section" "**stowage: Bundle created → Unpacked**" s "$secs"
            record "$section" "stowage: server peak RSS (VmHWM)" MiB "$(calc "$(peak_rss_kib) / 1024")"
            stop_server
            rm -rf "$data"
            baseline "$image"
            record "$section" "skopeo copy + tar -x (plain tools)" s "$B_SECS"
            record "$section" "plain tools: peak RSS of skopeo / tar" MiB "$B_RSS_MIB"
            record "$section" "**ratio stowage / plain tools**" x "$(calc "$secs / $B_SECS")"
        done
    done
    SERVER_ARGS=()
}

# ------------------------------------------------------------------------------------------------

machine() {
    echo "### Machine"
    echo
    echo "| | |"
    echo "|---|---|"
    echo "| CPU | $(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo) |"
    echo "| nproc | $(nproc) |"
    echo "| memory (free -h total) | $(free -h | awk '/^Mem:/ {print $2}') |"
    echo "| kernel | $(uname -sr) |"
    echo "| temp filesystem (df -T $base_tmp) | $(df -T "$WORK" | awk 'NR == 2 {print $2 " on " $1 ", " $3 / 1048576 " GiB"}') |"
    echo "| stowage | $(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$repo" diff --quiet 2>/dev/null || echo ' + uncommitted changes') |"
    echo "| runs | $RUNS per scenario |"
    echo
}

started=$SECONDS
for s in $SCENARIOS; do
    case "$s" in
        footprint) scenario_footprint ;;
        churn) scenario_churn ;;
        throughput) scenario_throughput ;;
        api) scenario_api ;;
        unpack) scenario_unpack ;;
        *) die "unknown scenario $s (footprint, churn, throughput, api, unpack)" ;;
    esac
done
log "done in $((SECONDS - started)) s"

echo "## Results ($(date -u +%Y-%m-%d), scripts/bench.sh, BENCH_RUNS=$RUNS)"
echo
machine
python3 "$repo/bench/summarize.py" "$RESULTS"
