# Shared by the scenarios of scripts/bench.sh (sourced, not run): tools, the release build, scratch
# space, the server under test, requests with the admin certificate, and recording results.
# shellcheck shell=bash

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

# Debian puts nginx and docker-registry in /usr/sbin.
export PATH="$PATH:/usr/sbin:/sbin"

declare -A needed=(
    [curl]=curl
    [tar]=tar
    [gzip]=gzip
    [zstd]=zstd
    [b3sum]=b3sum
    [sha256sum]=coreutils
    [find]=findutils
    [python3]=python3
    [docker-registry]=docker-registry
    [skopeo]=skopeo
    [/usr/bin/time]=time
    [nginx]=nginx
    [wrk]=wrk
)
missing=()
for cmd in "${!needed[@]}"; do
    command -v "$cmd" >/dev/null 2>&1 || missing+=("${needed[$cmd]}")
done
if [ "${#missing[@]}" -gt 0 ]; then
    log "installing ${missing[*]}"
    as_root apt-get update >&2
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" >&2
fi

if [[ " $SCENARIOS " =~ \ (footprint|churn|unpack|registry|corpus|download|ingest)\  ]]; then
    [ -d "$corpus/kube-prometheus-stack" ] && [ -d "$corpus/operator-registry" ] \
        && [ -d "$corpus/rukpak-testdata" ] || die "corpus not found at $corpus (set STOWAGE_CORPUS)"
    corpus="$(cd "$corpus" && pwd)"
fi

# ------------------------------------------------------------------------------------------------
# Build (others may be mid-edit: retry a few times)

if [ -n "${BENCH_BIN:-}" ]; then
    # A binary built elsewhere (scenarios that need neither loadgen nor ociimage).
    BIN="$BENCH_BIN"
else
    for attempt in 1 2 3 4 5; do
        log "cargo build --release (attempt $attempt)"
        if cargo build --release >&2 && cargo build --release --example loadgen --example ociimage >&2; then break; fi
        [ "$attempt" -eq 5 ] && die "cargo build --release failed"
        sleep 60
    done
    BIN="$repo/target/release/stowage"
fi
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
OCIIMAGE="$WORK/bench-ociimage"
if [ -z "${BENCH_BIN:-}" ]; then
    cp "$repo/target/release/examples/loadgen" "$LOADGEN"
    cp "$repo/target/release/examples/ociimage" "$OCIIMAGE"
elif [ -x "$repo/target/release/examples/ociimage" ]; then
    # The image builder is the same whichever server runs: the last release build of it will do.
    cp "$repo/target/release/examples/ociimage" "$OCIIMAGE"
fi
if [ -n "${BENCH_LOADGEN:-}" ]; then cp "$BENCH_LOADGEN" "$LOADGEN"; fi
# The kubectl plugin of the same build (ingest: `kubectl stowage push`): BENCH_PLUGIN, else the one
# beside BENCH_BIN, else the release build's.
PLUGIN="$WORK/bench-kubectl-stowage"
for candidate in "${BENCH_PLUGIN:-}" "$(dirname "${BENCH_BIN:-.}")/kubectl-stowage" "$repo/target/release/kubectl-stowage"; do
    if [ -n "$candidate" ] && [ -x "$candidate" ]; then
        cp "$candidate" "$PLUGIN"
        break
    fi
done
: >"$RESULTS"
SERVER_PID=""
SERVER_DIR=""
SERVER_ARGS=()
URL=""
REGISTRY_PID=""
NGINX_PID=""
NGINX_URL=""

cleanup() {
    if [ -n "$NGINX_PID" ]; then kill "$NGINX_PID" 2>/dev/null || true; fi
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

# free_port: a TCP port free on 127.0.0.1 right now.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

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

# cpu_ms: CPU time (user + system) the server has used so far, in milliseconds.
cpu_ms() { awk -v hz="$(getconf CLK_TCK)" '{print ($14 + $15) * 1000 / hz}' "/proc/$SERVER_PID/stat"; }
peak_rss_kib() { awk '/^VmHWM:/ {print $2}' "/proc/$SERVER_PID/status"; }
rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/$SERVER_PID/status"; }

# start_nginx ROOT [DIRECTIVES]: Debian's nginx serving ROOT over TLS 1.3 and HTTP/2 (as client-go
# talks to an API server), with the stowage server's own serving certificate, so both sides pay the
# same handshake and cipher; DIRECTIVES go into its server block. Sets NGINX_URL.
start_nginx() {
    local root="$1" extra="${2:-}" port prefix="$WORK/nginx"
    port="$(free_port)"
    mkdir -p "$prefix/tmp"
    # Started as root, nginx's workers run as nobody: they must be able to reach ROOT.
    chmod a+rx "$WORK"
    cat >"$prefix/nginx.conf" <<CONF
daemon off;
worker_processes auto;
pid $prefix/nginx.pid;
error_log $prefix/error.log warn;
events { worker_connections 1024; }
http {
    access_log off;
    sendfile on;
    # nginx ends a connection after 1000 requests by default (a GOAWAY on HTTP/2, which stalled
    # the load generator's multiplexed connection); stowage sets no such limit.
    keepalive_requests 100000000;
    client_body_temp_path $prefix/tmp/body;
    proxy_temp_path $prefix/tmp/proxy;
    fastcgi_temp_path $prefix/tmp/fastcgi;
    uwsgi_temp_path $prefix/tmp/uwsgi;
    scgi_temp_path $prefix/tmp/scgi;
    types { application/x-tar tar; application/zstd zst; application/json json; }
    server {
        listen 127.0.0.1:$port ssl http2;
        ssl_certificate $SERVER_DIR/pki/serving.crt;
        ssl_certificate_key $SERVER_DIR/pki/serving.key;
        ssl_protocols TLSv1.3;
        root $root;
        $extra
    }
}
CONF
    nginx -p "$prefix" -c "$prefix/nginx.conf" >"$prefix/stdout.log" 2>&1 &
    NGINX_PID=$!
    NGINX_URL="https://127.0.0.1:$port"
    local deadline=$((SECONDS + 30))
    until curl -s --cacert "$SERVER_DIR/pki/ca.crt" -o /dev/null "$NGINX_URL/"; do
        kill -0 "$NGINX_PID" 2>/dev/null || die "nginx exited: $(cat "$prefix/error.log" "$prefix/stdout.log")"
        [ "$SECONDS" -lt "$deadline" ] || die "nginx not ready"
        sleep 0.2
    done
}

stop_nginx() {
    kill -QUIT "$NGINX_PID" 2>/dev/null || true
    wait "$NGINX_PID" 2>/dev/null || true
    NGINX_PID=""
}

# api [curl args...] PATH: a request with the admin client certificate; fails on HTTP errors.
api() {
    local path="${*: -1}"
    curl -sS --fail-with-body --cacert "$SERVER_DIR/pki/ca.crt" --cert "$SERVER_DIR/pki/admin.crt" \
        --key "$SERVER_DIR/pki/admin.key" "${@:1:$#-1}" "$URL$path" \
        || die "request to $path failed (server $(kill -0 "$SERVER_PID" 2>/dev/null && echo running || echo gone))"
}

# json_field A.B.0.C: a field of the JSON on stdin (a number indexes a list).
json_field() { python3 -c 'import json,sys; v=json.load(sys.stdin)
for k in sys.argv[1].split("."): v=v[int(k)] if isinstance(v, list) else v[k]
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
    M_REPACKING="$(m stowage_revisions_repack_pending)"
}

# settle: polls /metrics until no revision is staging or deleting and the figures have not
# changed for 3 s (background collection and compaction are done).
settle() {
    local deadline=$((SECONDS + 600)) last="" same=0 cur
    while :; do
        metrics
        cur="$M_CHUNKS $M_STORED $M_DISK $M_COMMITTED $M_STAGING $M_DELETING $M_REPACKING"
        # A build without the repacker's gauge has nothing to wait for.
        if [ "$M_STAGING" = 0 ] && [ "$M_DELETING" = 0 ] && [ "${M_REPACKING:-0}" = 0 ] && [ "$cur" = "$last" ]; then
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
