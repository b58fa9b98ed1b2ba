# The replicated store mode of scripts/bench.sh (sourced): `stowage serve` replicas on a real etcd
# (Debian's) and a real single-node Garage (S3), 1 replica (measured directly, as the embedded
# store is) and 3 replicas behind Debian's haproxy in TCP mode as a Service would put them, side
# by side in one run, with the embedded store (as bench/api.sh starts it) for reference. Figures:
# Bundle GET/LIST (examples/loadgen.rs) and content download (curl), the ratios 1 replica /
# embedded and 3 replicas / 1 replica of each, and how
# long a SIGKILLed replica takes to be marked DOWN by haproxy and to stop costing failed requests.
#
# Read the ratios with the machine in mind: on a 2-core machine all replicas, etcd, Garage, haproxy
# and the client share the two cores, so 3 replicas cannot be faster than 1 here. The ratio shows
# what more replicas cost (more connections, etcd watches and leases, a cold cache on each replica,
# compare-and-swap conflicts between writers) and what the machine limits, not how replicas scale
# on separate nodes.
#
# Needs etcd (etcd-server) and haproxy (installed if missing) and the Garage binary at
# $STOWAGE_GARAGE or ~/.cache/stowage-tools/garage-2.5.0/bin/garage (scripts/test.sh builds it).
# shellcheck shell=bash

REPL_OBJECTS="${BENCH_REPL_OBJECTS:-2000}"
REPL_DOWNLOADS="${BENCH_REPL_DOWNLOADS:-20}"
REPL_GARAGE="${STOWAGE_GARAGE:-$HOME/.cache/stowage-tools/garage-2.5.0/bin/garage}"
REPL_KPS_VERSION=88.5.3
# Which clusters to measure: 1 and/or 3 replicas (the failover needs 3).
REPL_SETS="${BENCH_REPL_SETS:-1 3}"
# The binary the replicas run (BENCH_BEFORE_BIN's 1-replica cluster runs that one).
REPL_BIN=""
# Extra flags for the replicas of BENCH_BIN (e.g. "--object-cache-bytes 268435456").
REPL_NEW_ARGS="${BENCH_REPL_ARGS:-}"
REPL_EXTRA_ARGS=""

# The processes of the current run (empty when not running) and where they listen.
REPL_ETCD_PID=""
REPL_ETCD_URL=""
REPL_GARAGE_PID=""
REPL_GARAGE_CONF=""
REPL_S3_URL=""
REPL_CREDS=""
REPL_HAPROXY_PID=""
REPL_SOCK=""
REPL_PIDS=()
REPL_PORTS=()
REPL_DIRS=()
REPL_USED_PORTS=" "
# Throughput per target and figure ("1:get32" → req/s), for the ratios.
declare -A REPL_RATE=()

# repl_cleanup: ends whatever this scenario still runs (on any exit, before lib.sh's cleanup).
repl_cleanup() {
    local pid
    for pid in "$REPL_HAPROXY_PID" "${REPL_PIDS[@]}"; do
        if [ -n "$pid" ]; then kill -KILL "$pid" 2>/dev/null || true; fi
    done
    for pid in "$REPL_GARAGE_PID" "$REPL_ETCD_PID"; do
        if [ -n "$pid" ]; then kill -TERM "$pid" 2>/dev/null || true; fi
    done
    for pid in "$REPL_HAPROXY_PID" "${REPL_PIDS[@]}" "$REPL_GARAGE_PID" "$REPL_ETCD_PID"; do
        if [ -n "$pid" ]; then wait "$pid" 2>/dev/null || true; fi
    done
}

# repl_port: a free loopback port below the kernel's ephemeral range (as the replicated tests take
# them), not handed out before in this run.
repl_port() {
    local port
    while :; do
        port="$(python3 -c 'import random, socket
low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
while True:
    p = random.randrange(10000, max(low, 10001))
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", p))
    except OSError:
        continue
    print(p)
    break')"
        [[ "$REPL_USED_PORTS" == *" $port "* ]] || break
    done
    REPL_USED_PORTS+="$port "
    echo "$port"
}

# repl_stop PID [SECONDS]: SIGTERM, SIGKILL if still running after SECONDS (default 20); waits.
repl_stop() {
    local pid="$1" limit="${2:-20}" deadline
    [ -n "$pid" ] || return 0
    kill -TERM "$pid" 2>/dev/null || true
    deadline=$((SECONDS + limit))
    while kill -0 "$pid" 2>/dev/null && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}

# repl_helper ARGS...: the Python side (haproxy's stats socket, the failover probe).
repl_helper() { python3 "$WORK/replicas.py" "$@"; }

repl_write_helper() {
    cat >"$WORK/replicas.py" <<'PY'
"""haproxy's view of the backends, and the failover measurement of bench/replicas.sh."""
import http.client
import json
import os
import signal
import socket
import ssl
import sys
import threading
import time
from urllib.parse import urlsplit


def show_stat(sock):
    """Server name -> status (UP, DOWN, "UP 1/2", ...) of backend `replicas`."""
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(2)
    s.connect(sock)
    s.sendall(b"show stat\n")
    data = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    s.close()
    lines = data.decode().splitlines()
    header = lines[0].removeprefix("# ").split(",")
    px, sv, st = header.index("pxname"), header.index("svname"), header.index("status")
    out = {}
    for line in lines[1:]:
        f = line.split(",")
        if len(f) > st and f[px] == "replicas" and f[sv] != "BACKEND":
            out[f[sv]] = f[st]
    return out


def wait_up(sock, count, timeout):
    """Waits until COUNT servers are fully UP."""
    deadline = time.monotonic() + float(timeout)
    while True:
        try:
            status = show_stat(sock)
        except (OSError, IndexError, ValueError) as e:
            status = {"error": str(e)}
        if sum(1 for v in status.values() if v == "UP") >= int(count):
            return
        if time.monotonic() > deadline:
            sys.exit(f"haproxy: not {count} servers UP within {timeout} s: {status}")
        time.sleep(0.1)


def failover(sock, name, pid, url, ca, cert, key, timeout):
    """GETs URL on a new connection every 20 ms; once 20 in a row succeeded, SIGKILLs PID (haproxy's
    server NAME) and polls haproxy's stats every 50 ms. Prints, as JSON, the ms from the kill until
    haproxy showed NAME DOWN, the ms until the first of 20 consecutive successful GETs, and how
    many GETs failed after the kill."""
    ctx = ssl.create_default_context(cafile=ca)
    ctx.load_cert_chain(cert, key)
    parts = urlsplit(url)
    path = parts.path + (f"?{parts.query}" if parts.query else "")
    probes = []  # (start, end, ok), in order: one request at a time
    lock, stop = threading.Lock(), threading.Event()

    def probe():
        due = time.monotonic()
        while not stop.is_set():
            start, ok = time.monotonic(), False
            try:
                conn = http.client.HTTPSConnection(parts.hostname, parts.port, context=ctx, timeout=2)
                conn.request("GET", path)
                resp = conn.getresponse()
                resp.read()
                ok = resp.status == 200
                conn.close()
            except (OSError, http.client.HTTPException):
                pass
            with lock:
                probes.append((start, time.monotonic(), ok))
            due = max(due + 0.02, time.monotonic())
            time.sleep(max(0.0, due - time.monotonic()))

    def streak(after):
        """Index of the first probe ending after AFTER that starts 20 successes in a row."""
        with lock:
            seen = list(probes)
        first = next((i for i, p in enumerate(seen) if p[1] >= after), None)
        if first is None:
            return None, seen
        run = 0
        for i in range(first, len(seen)):
            run = run + 1 if seen[i][2] else 0
            if run == 20:
                return i - 19, seen
        return None, seen

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while streak(0)[0] is None:
        if time.monotonic() > deadline:
            sys.exit("failover: GETs through haproxy did not succeed 20 times in a row before the kill")
        time.sleep(0.05)

    killed = time.monotonic()
    os.kill(int(pid), signal.SIGKILL)
    down_at, recovered, last = None, None, {}
    deadline = killed + float(timeout)
    while down_at is None or recovered is None:
        now = time.monotonic()
        if now > deadline:
            stop.set()
            sys.exit(f"failover: within {timeout} s: DOWN after {down_at}, recovered {recovered}; haproxy: {last}")
        if down_at is None:
            try:
                last = show_stat(sock)
                if last.get(name, "").startswith("DOWN"):
                    down_at = now
            except (OSError, IndexError, ValueError) as e:
                last = {"error": str(e)}
        if recovered is None:
            i, seen = streak(killed)
            if i is not None:
                recovered = max(0.0, seen[i][0] - killed)
        time.sleep(max(0.0, now + 0.05 - time.monotonic()))
    stop.set()
    thread.join()
    after = [p for p in probes if p[1] >= killed]
    print(json.dumps({
        "down_ms": round((down_at - killed) * 1000),
        "recovered_ms": round(recovered * 1000),
        "failed": sum(1 for p in after if not p[2]),
        "probes": len(after),
    }))


if __name__ == "__main__":
    command, args = sys.argv[1], sys.argv[2:]
    {"wait-up": wait_up, "failover": failover}[command](*args)
PY
}

# ------------------------------------------------------------------------------------------------
# etcd, Garage, haproxy, replicas

# repl_start_etcd DIR: a single-member etcd on loopback ports, its data in DIR.
repl_start_etcd() {
    local dir="$1" client peer
    client="$(repl_port)"
    peer="$(repl_port)"
    mkdir -p "$dir"
    REPL_ETCD_URL="http://127.0.0.1:$client"
    etcd --name bench --data-dir "$dir/data" \
        --listen-client-urls "$REPL_ETCD_URL" --advertise-client-urls "$REPL_ETCD_URL" \
        --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
        --initial-cluster "bench=http://127.0.0.1:$peer" --initial-cluster-state new \
        --logger zap --log-level warn --quota-backend-bytes $((2 << 30)) >"$dir.log" 2>&1 &
    REPL_ETCD_PID=$!
    local deadline=$((SECONDS + 30))
    until curl -sf "$REPL_ETCD_URL/health" 2>/dev/null | grep -q '"health":"true"'; do
        kill -0 "$REPL_ETCD_PID" 2>/dev/null || die "etcd exited: $(tail -n 20 "$dir.log")"
        [ "$SECONDS" -lt "$deadline" ] || die "etcd not healthy after 30 s: $(tail -n 20 "$dir.log")"
        sleep 0.2
    done
}

# repl_garage ARGS...: the Garage CLI on the running server.
repl_garage() { RUST_LOG=warn "$REPL_GARAGE" -c "$REPL_GARAGE_CONF" "$@"; }

# repl_start_garage DIR: a single-node Garage (tests/conformance/replicated/garage.rs), a key
# `stowage-bench`, and its credentials file for --s3-credentials-file.
repl_start_garage() {
    local dir="$1" rpc s3 admin secret token
    rpc="$(repl_port)"
    s3="$(repl_port)"
    admin="$(repl_port)"
    secret="$(python3 -c 'import secrets; print(secrets.token_hex(32))')"
    token="$(python3 -c 'import secrets; print(secrets.token_hex(16))')"
    mkdir -p "$dir"
    REPL_GARAGE_CONF="$dir/garage.toml"
    cat >"$REPL_GARAGE_CONF" <<TOML
metadata_dir = "$dir/meta"
data_dir = "$dir/data"
db_engine = "sqlite"
replication_factor = 1
rpc_bind_addr = "127.0.0.1:$rpc"
rpc_public_addr = "127.0.0.1:$rpc"
rpc_secret = "$secret"

[s3_api]
s3_region = "garage"
api_bind_addr = "127.0.0.1:$s3"
root_domain = ".s3.garage.localhost"

[admin]
api_bind_addr = "127.0.0.1:$admin"
admin_token = "$token"
TOML
    RUST_LOG=garage=warn "$REPL_GARAGE" -c "$REPL_GARAGE_CONF" server >"$dir.log" 2>&1 &
    REPL_GARAGE_PID=$!
    REPL_S3_URL="http://127.0.0.1:$s3"
    # The CLI talks to the server over RPC, which answers a moment after the S3 port opens.
    local deadline=$((SECONDS + 30)) node=""
    until node="$(repl_garage node id -q 2>/dev/null)"; do
        kill -0 "$REPL_GARAGE_PID" 2>/dev/null || die "garage exited: $(tail -n 20 "$dir.log")"
        [ "$SECONDS" -lt "$deadline" ] || die "garage not answering after 30 s: $(tail -n 20 "$dir.log")"
        sleep 0.2
    done
    node="${node%%@*}"
    repl_garage layout assign -z dc1 -c 1G "$node" >/dev/null || die "garage layout assign failed"
    repl_garage layout apply --version 1 >/dev/null || die "garage layout apply failed"
    local created key_id key_secret
    created="$(repl_garage key create stowage-bench)" || die "garage key create failed"
    key_id="$(sed -n 's/^ *Key ID: *//p' <<<"$created" | head -n 1)"
    key_secret="$(sed -n 's/^ *Secret key: *//p' <<<"$created" | head -n 1)"
    if [ -z "$key_id" ] || [ -z "$key_secret" ]; then die "no key in \`garage key create\` output: $created"; fi
    REPL_CREDS="$dir/credentials"
    printf '[default]\naws_access_key_id = %s\naws_secret_access_key = %s\n' "$key_id" "$key_secret" >"$REPL_CREDS"
    chmod 600 "$REPL_CREDS"
}

# repl_bucket NAME: a bucket the key may read and write.
repl_bucket() {
    repl_garage bucket create "$1" >/dev/null || die "garage bucket create $1 failed"
    repl_garage bucket allow --read --write --owner "$1" --key stowage-bench >/dev/null \
        || die "garage bucket allow $1 failed"
}

# repl_start_replica I PREFIX BUCKET: starts replica I on REPL_PORTS[I] and REPL_DIRS[I], waits for
# its ready line and for /readyz (it reaches etcd and S3).
repl_start_replica() {
    local i="$1" prefix="$2" bucket="$3"
    local dir="${REPL_DIRS[$i]}" port="${REPL_PORTS[$i]}"
    mkdir -p "$dir"
    touch "$dir.log"
    NO_COLOR=1 "${REPL_BIN:-$BIN}" serve --etcd-servers "$REPL_ETCD_URL" --etcd-prefix "$prefix" \
        --s3-endpoint "$REPL_S3_URL" --s3-bucket "$bucket" --s3-region garage --s3-path-style \
        --s3-credentials-file "$REPL_CREDS" --replica-id "r$i" ${REPL_EXTRA_ARGS:-} \
        --data-dir "$dir" --listen "127.0.0.1:$port" >>"$dir.log" 2>&1 &
    REPL_PIDS[i]=$!
    local deadline=$((SECONDS + 120)) code=""
    until grep -q 'stowage ready on' "$dir.log"; do
        kill -0 "${REPL_PIDS[$i]}" 2>/dev/null || die "replica r$i exited during start: $(tail -n 30 "$dir.log")"
        [ "$SECONDS" -lt "$deadline" ] || die "replica r$i not ready after 120 s"
        sleep 0.2
    done
    until [ "$code" = 200 ]; do
        code="$(curl -s --cacert "$dir/pki/ca.crt" -o /dev/null -w '%{http_code}' --max-time 5 \
            "https://127.0.0.1:$port/readyz" || true)"
        [ "$code" = 200 ] && break
        kill -0 "${REPL_PIDS[$i]}" 2>/dev/null || die "replica r$i exited before ready: $(tail -n 30 "$dir.log")"
        [ "$SECONDS" -lt "$deadline" ] || die "replica r$i: /readyz not 200 after 120 s ($code)"
        sleep 0.2
    done
}

# repl_start_haproxy DIR: haproxy in TCP mode in front of every replica (haproxy.rs's config),
# named r0, r1, …; sets URL to it and waits until it shows every replica UP.
repl_start_haproxy() {
    local dir="$1" port i servers=""
    port="$(repl_port)"
    mkdir -p "$dir"
    REPL_SOCK="$dir/admin.sock"
    for i in "${!REPL_PORTS[@]}"; do
        servers+="    server r$i 127.0.0.1:${REPL_PORTS[$i]}"$'\n'
    done
    cat >"$dir/haproxy.cfg" <<CFG
global
    stats socket $REPL_SOCK mode 600 level admin
    maxconn 4096

defaults
    mode tcp
    timeout connect 2s
    timeout client 15m
    timeout server 15m
    timeout check 2s
    retries 2
    option redispatch

frontend api
    bind 127.0.0.1:$port
    default_backend replicas

backend replicas
    balance roundrobin
    option httpchk GET /readyz
    default-server check check-ssl verify none inter 500ms fall 2 rise 1
$servers
CFG
    haproxy -f "$dir/haproxy.cfg" -db >"$dir.log" 2>&1 &
    REPL_HAPROXY_PID=$!
    URL="https://127.0.0.1:$port"
    local deadline=$((SECONDS + 10))
    until [ -S "$REPL_SOCK" ]; do
        kill -0 "$REPL_HAPROXY_PID" 2>/dev/null || die "haproxy exited: $(cat "$dir.log")"
        [ "$SECONDS" -lt "$deadline" ] || die "haproxy: no stats socket after 10 s"
        sleep 0.1
    done
    repl_helper wait-up "$REPL_SOCK" "${#REPL_PORTS[@]}" 20 || die "haproxy does not see the replicas up"
}

# repl_start_cluster N RUN: N replicas on prefix /bench-N and bucket bench-N of this run's etcd and
# Garage, sharing replica 0's certificates (as replicas of one Deployment share one Secret), and
# haproxy in front. Sets URL (haproxy) and SERVER_DIR (replica 0's, for the admin identity).
repl_start_cluster() {
    local n="$1" base="$WORK/repl-$2/replicas-$1" name="$1${3:-}" i
    REPL_PIDS=()
    REPL_PORTS=()
    REPL_DIRS=()
    for ((i = 0; i < n; i++)); do
        REPL_PORTS[i]="$(repl_port)"
        REPL_DIRS[i]="$base/r$i"
    done
    repl_bucket "bench-$name"
    log "replicas: starting $n replica(s) of ${REPL_BIN:-$BIN}"
    repl_start_replica 0 "/bench-$name" "bench-$name"
    for ((i = 1; i < n; i++)); do
        mkdir -p "${REPL_DIRS[$i]}/pki"
        chmod 700 "${REPL_DIRS[$i]}/pki"
        cp -p "${REPL_DIRS[0]}"/pki/* "${REPL_DIRS[$i]}/pki/"
        repl_start_replica "$i" "/bench-$name" "bench-$name"
    done
    SERVER_DIR="${REPL_DIRS[0]}"
    # One replica is measured directly, as the embedded store is (a Service's kube-proxy does not
    # copy the bytes through a process, as haproxy does); several through haproxy.
    if [ "$n" -gt 1 ]; then
        repl_start_haproxy "$base/haproxy"
    else
        URL="https://127.0.0.1:${REPL_PORTS[0]}"
    fi
}

# repl_stop_cluster: haproxy, then every replica still running (SIGTERM).
repl_stop_cluster() {
    repl_stop "$REPL_HAPROXY_PID" 5
    REPL_HAPROXY_PID=""
    local pid
    for pid in "${REPL_PIDS[@]}"; do repl_stop "$pid"; done
    REPL_PIDS=()
}

# ------------------------------------------------------------------------------------------------
# Measurements

# repl_loadgen ARGS...: the load generator against URL (haproxy, or the embedded server), with the
# admin identity of SERVER_DIR.
repl_loadgen() {
    "$LOADGEN" --kubeconfig "$SERVER_DIR/admin.kubeconfig" --namespace "$NS" --server "$URL" "$@" \
        || die "loadgen $* against $URL failed"
}

# repl_record SECTION FIGURE JSON TARGET KEY: throughput, p99 and errors of a loadgen result; keeps
# the throughput as REPL_RATE[TARGET:KEY].
repl_record() {
    record "$1" "$2: throughput" "req/s" "$(jfield "$3" rps)"
    record "$1" "$2: p99 latency" ms "$(jfield "$3" p99_ms)"
    record "$1" "$2: errors" count "$(jfield "$3" errors)" "<=0"
    REPL_RATE["$4:$5"]="$(jfield "$3" rps)"
}

# repl_measure SECTION TARGET TREE: seeds the Bundles, GETs and LISTs them, uploads TREE and
# downloads it REPL_DOWNLOADS times (curl, a new connection each: round robin over the replicas).
repl_measure() {
    local section="$1" target="$2" tree="$3" secs="$API_SECONDS" out
    log "replicas: $target: seed $REPL_OBJECTS Bundles"
    out="$(repl_loadgen seed "$REPL_OBJECTS" --concurrency 32)"
    log "$out"
    repl_record "$section" "seed: create (POST), 32 concurrent" "$out" "$target" seed
    log "replicas: $target: GET and LIST"
    out="$(repl_loadgen get --concurrency 32 --duration "$secs")"
    log "$out"
    repl_record "$section" "**GET bundle, 32 concurrent**" "$out" "$target" get32
    out="$(repl_loadgen list --limit 0 --concurrency 1 --duration "$secs")"
    log "$out"
    repl_record "$section" "LIST all $REPL_OBJECTS, 1 client" "$out" "$target" list1
    out="$(repl_loadgen list --limit 0 --concurrency 4 --duration "$secs")"
    log "$out"
    repl_record "$section" "**LIST all $REPL_OBJECTS, 4 concurrent**" "$out" "$target" list4
    out="$(repl_loadgen list --limit 500 --concurrency 4 --duration "$secs")"
    log "$out"
    repl_record "$section" "LIST ?limit=500, 4 concurrent" "$out" "$target" page4

    log "replicas: $target: content upload and $REPL_DOWNLOADS downloads"
    local name="kps" started took bytes
    local path="$API/namespaces/$NS/bundles/$name/content"
    started="$(now)"
    upload_dir "$name" "$tree"
    took="$(calc "$(now) - $started")"
    out="$(timed_gets "$REPL_DOWNLOADS" "$URL$path" --cert "$SERVER_DIR/pki/admin.crt" --key "$SERVER_DIR/pki/admin.key")"
    read -r secs bytes <<<"$out"
    record "$section" "content upload (PUT tar, one Bundle)" MB/s "$(calc "$bytes / 1e6 / $took")"
    REPL_RATE["$target:download"]="$(calc "$REPL_DOWNLOADS * $bytes / 1e6 / $secs")"
    record "$section" "**content download, $REPL_DOWNLOADS GETs one after another** (curl, a connection each)" \
        MB/s "${REPL_RATE[$target:download]}"
}

# repl_ratios SECTION A B TITLE: A's throughput / B's, figure by figure.
repl_ratios() {
    local section="$1" a="$2" b="$3" title="$4" key
    declare -A what=(
        [seed]="seed: create (POST), 32 concurrent"
        [get32]="**GET bundle, 32 concurrent**"
        [list1]="LIST all, 1 client"
        [list4]="**LIST all, 4 concurrent**"
        [page4]="LIST ?limit=500, 4 concurrent"
        [download]="content download"
    )
    for key in seed get32 list1 list4 page4 download; do
        record "$section" "$title: ${what[$key]}" x "$(calc "${REPL_RATE[$a:$key]} / ${REPL_RATE[$b:$key]}")"
    done
}

# repl_failover SECTION RUN: with GET load on the 3 replicas (loadgen, 3 connections: one per
# replica by round robin, and a new-connection GET every 20 ms), SIGKILLs the last replica; records
# when haproxy showed it DOWN and when GETs stopped failing.
repl_failover() {
    local section="$1" run="$2" victim=$((${#REPL_PIDS[@]} - 1)) secs load_pid out
    # Long enough to hold the kill, haproxy's detection and the recovery of the GETs.
    secs=$((API_SECONDS > 8 ? API_SECONDS : 8))
    log "replicas: failover: GET load for $secs s, SIGKILL of r$victim after ~1 s"
    "$LOADGEN" --kubeconfig "$SERVER_DIR/admin.kubeconfig" --namespace "$NS" --server "$URL" --connections 3 \
        get --concurrency 3 --duration "$secs" >"$WORK/failover-$run.json" 2>"$WORK/failover-$run.err" &
    load_pid=$!
    sleep 1
    out="$(repl_helper failover "$REPL_SOCK" "r$victim" "${REPL_PIDS[$victim]}" \
        "$URL$API/namespaces/$NS/bundles/b00000" "$SERVER_DIR/pki/ca.crt" \
        "$SERVER_DIR/pki/admin.crt" "$SERVER_DIR/pki/admin.key" 30)" || {
        kill "$load_pid" 2>/dev/null || true
        die "failover measurement failed"
    }
    wait "${REPL_PIDS[$victim]}" 2>/dev/null || true
    REPL_PIDS[victim]=""
    wait "$load_pid" || die "loadgen during the failover failed: $(cat "$WORK/failover-$run.err")"
    log "$out"
    local load
    load="$(cat "$WORK/failover-$run.json")"
    log "$load"
    record "$section" "**kill -9 → haproxy shows it DOWN** (stats polled every 50 ms)" ms "$(jfield "$out" down_ms)"
    record "$section" "**kill -9 → first of 20 consecutive successful GETs** (new connection every 20 ms)" \
        ms "$(jfield "$out" recovered_ms)"
    record "$section" "GETs every 20 ms: failed after the kill" count "$(jfield "$out" failed)"
    record "$section" "GETs every 20 ms: sent after the kill (until DOWN and recovered)" count "$(jfield "$out" probes)"
    record "$section" "loadgen GET (3 connections, 3 concurrent, $secs s): failed requests" count "$(jfield "$load" errors)"
    record "$section" "loadgen GET (3 connections, 3 concurrent, $secs s): throughput" req/s "$(jfield "$load" rps)"
}

# ------------------------------------------------------------------------------------------------

scenario_replicas() {
    if ! command -v etcd >/dev/null 2>&1 || ! command -v haproxy >/dev/null 2>&1; then
        log "installing etcd-server haproxy"
        as_root apt-get update
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends etcd-server haproxy
    fi
    [ -x "$REPL_GARAGE" ] || die "Garage not found at $REPL_GARAGE (set STOWAGE_GARAGE; scripts/test.sh builds it)"
    [ -x "$LOADGEN" ] || die "no load generator: run without BENCH_BIN, or set BENCH_LOADGEN"
    # shellcheck disable=SC2154 # corpus is scripts/bench.sh's
    local tree_src="$corpus/kube-prometheus-stack/$REPL_KPS_VERSION"
    [ -d "$tree_src" ] || die "corpus not found at $corpus (set STOWAGE_CORPUS)"
    repl_write_helper
    trap 'repl_cleanup; cleanup' EXIT
    trap 'exit 130' INT TERM

    local versions
    versions="etcd $(etcd --version | awk '/^etcd Version/ {print $3}'), Garage $("$REPL_GARAGE" --version | awk 'NR == 1 {sub(/.*:/, "", $2); print $2}'), haproxy $(haproxy -v | awk 'NR == 1 {print $3}')"
    local sizes="$REPL_OBJECTS Bundles, kube-prometheus-stack $REPL_KPS_VERSION as content" cores
    cores="$(nproc)"
    local s_emb="Replicated mode ($sizes): embedded store, direct (reference)"
    local s_one="Replicated mode ($sizes): 1 replica on etcd + Garage, direct (as the embedded store)"
    local s_three="Replicated mode ($sizes): 3 replicas on etcd + Garage, behind haproxy"
    local s_before="Replicated mode ($sizes): 1 replica of BENCH_BEFORE_BIN on etcd + Garage, direct"
    local s_ratio="Replicated mode: ratios of throughput ($cores cores shared by every process: the overhead, not scaling)"
    local s_fail="Replicated mode: failover, 3 replicas, one killed with SIGKILL (haproxy checks /readyz every 500 ms, fall 2; $versions)"
    local run
    for run in $(seq 1 "$RUNS"); do
        local dir="$WORK/repl-$run"
        mkdir -p "$dir"
        log "replicas: run $run/$RUNS: embedded store"
        start_server "$dir/embedded"
        repl_measure "$s_emb" 0 "$tree_src"
        stop_server
        rm -rf "$dir/embedded"

        log "replicas: run $run/$RUNS: etcd and Garage"
        repl_start_etcd "$dir/etcd"
        repl_start_garage "$dir/garage"

        REPL_EXTRA_ARGS="$REPL_NEW_ARGS"
        if [[ " $REPL_SETS " == *" 1 "* ]]; then
            repl_start_cluster 1 "$run"
            repl_measure "$s_one" 1 "$tree_src"
            repl_stop_cluster
            repl_ratios "$s_ratio" 1 0 "1 replica / embedded"
        fi
        if [ -n "${BENCH_BEFORE_BIN:-}" ]; then
            REPL_BIN="$BENCH_BEFORE_BIN"
            REPL_EXTRA_ARGS=""
            repl_start_cluster 1 "$run-before" before
            repl_measure "$s_before" b "$tree_src"
            repl_stop_cluster
            REPL_BIN=""
            REPL_EXTRA_ARGS="$REPL_NEW_ARGS"
            repl_ratios "$s_ratio" b 0 "1 replica of BENCH_BEFORE_BIN / embedded"
        fi
        if [[ " $REPL_SETS " == *" 3 "* ]]; then
            repl_start_cluster 3 "$run"
            repl_measure "$s_three" 3 "$tree_src"
            repl_ratios "$s_ratio" 3 1 "3 replicas / 1 replica"
            repl_failover "$s_fail" "$run"
            repl_stop_cluster
        fi

        repl_stop "$REPL_GARAGE_PID"
        REPL_GARAGE_PID=""
        repl_stop "$REPL_ETCD_PID"
        REPL_ETCD_PID=""
        SERVER_DIR=""
        rm -rf "$dir"
    done
    trap cleanup EXIT
    trap - INT TERM
}
