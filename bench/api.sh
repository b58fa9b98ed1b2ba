# The Bundle API scenario of scripts/bench.sh (sourced), driven by examples/loadgen.rs.
# shellcheck shell=bash

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

# The bearer token wrk sends (wrk cannot present a client certificate); its user is in
# system:masters, as the admin certificate's is.
API_TOKEN="bench-token-$RANDOM$RANDOM"

# wrk_json ARGS... URL: runs wrk (HTTP/1.1, a keep-alive connection per -c) with the bearer token;
# prints one JSON line (rps, p50_ms, p99_ms, errors, bytes_per_response).
wrk_json() {
    local script="$WORK/wrk-report.lua"
    [ -f "$script" ] || cat >"$script" <<'LUA'
-- GET of a random Bundle when WRK_NAMES is set (names PREFIX00000…), else of the URL as given.
local count = tonumber(os.getenv("WRK_NAMES") or "0")
local base = os.getenv("WRK_BASE") or ""
local prefix = os.getenv("WRK_PREFIX") or "b"
if count > 0 then
    request = function()
        return wrk.format("GET", string.format("%s/%s%05d", base, prefix, math.random(0, count - 1)))
    end
end
done = function(summary, latency, requests)
    local e = summary.errors
    local n = math.max(summary.requests, 1)
    io.write(string.format(
        '{"rps":%.1f,"p50_ms":%.3f,"p99_ms":%.3f,"errors":%d,"bytes_per_response":%d}\n',
        summary.requests / (summary.duration / 1e6), latency:percentile(50) / 1000,
        latency:percentile(99) / 1000, e.connect + e.read + e.write + e.status + e.timeout,
        math.floor(summary.bytes / n)))
end
LUA
    wrk --timeout 10s -H "Authorization: Bearer $API_TOKEN" -s "$script" "$@" | grep '^{' \
        || die "wrk $* failed"
}

# wrk_figures SECTION LABEL: the issue's two wrk figures against the current server (10,000
# Bundles seeded): the whole list with one connection, and GETs of random Bundles with 32.
wrk_figures() {
    local section="$1" label="$2" out
    local list_url="$URL$API/namespaces/$NS/bundles"
    out="$(wrk_json -t1 -c1 -d"${API_SECONDS}s" "$list_url")"
    log "wrk LIST ($label): $out"
    record_requests "$section" "**wrk: LIST all $API_OBJECTS, 1 connection** ($label)" "$out"
    out="$(WRK_NAMES="$API_OBJECTS" WRK_BASE="$API/namespaces/$NS/bundles" wrk_json -t2 -c32 -d"${API_SECONDS}s" "$URL")"
    log "wrk GET ($label): $out"
    record_requests "$section" "**wrk: GET one of $API_OBJECTS, 32 connections** ($label)" "$out"
}

scenario_api() {
    [ -x "$LOADGEN" ] || die "no load generator: run without BENCH_BIN, or set BENCH_LOADGEN"
    local section="Bundle API: $API_OBJECTS Bundles stored, $API_WATCHERS watchers"
    local secs="$API_SECONDS" run out
    echo "$API_TOKEN,bench-admin,1000,\"system:masters\"" >"$WORK/tokens.csv"
    SERVER_ARGS=(--token-auth-file "$WORK/tokens.csv")
    for run in $(seq 1 "$RUNS"); do
        local data="$WORK/api-$run"
        if [ -n "${BENCH_BEFORE_BIN:-}" ]; then
            api_before "$section" "$run"
        fi
        start_server "$data"
        log "api: run $run/$RUNS: seed $API_OBJECTS Bundles"
        out="$(loadgen seed "$API_OBJECTS" --concurrency 32)"
        log "$out"
        record_requests "$section" "seed: create (POST), 32 concurrent" "$out"
        record "$section" "server RSS after seeding" MiB "$(calc "$(rss_kib) / 1024")"
        record "$section" "store size after seeding (du of the data directory)" MiB "$(calc "$(alloc_bytes "$data") / 1048576")"
        wrk_figures "$section" "this build"

        log "api: GET"
        out="$(loadgen get --concurrency 1 --duration "$secs")"
        log "$out"
        record_requests "$section" "GET bundle, 1 client" "$out"
        out="$(loadgen get --concurrency 32 --duration "$secs")"
        log "$out"
        record_requests "$section" "**GET bundle, 32 concurrent**" "$out"
        local get_rps list_rps
        get_rps="$(jfield "$out" rps)"

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
        list_rps="$(jfield "$out" rps)"
        out="$(loadgen list --limit 500 --concurrency 4 --duration "$secs")"
        log "$out"
        record_requests "$section" "LIST ?limit=500, 4 concurrent" "$out"
        record "$section" "LIST ?limit=500: items in the first page" count "$(jfield "$out" items_per_response)"
        record "$section" "**server peak RSS (VmHWM), end of run**" MiB "$(calc "$(peak_rss_kib) / 1024")"
        api_beside_nginx "$section" "$run" "$get_rps" "$list_rps"
        stop_server
        rm -rf "$data"
    done
    SERVER_ARGS=()
}

# api_before SECTION RUN: with BENCH_BEFORE_BIN, the same seed, store size and wrk figures from that
# binary (an older build), in the same run, labelled "before".
api_before() {
    local section="$1" data="$WORK/api-before-$2" out
    cp "$BENCH_BEFORE_BIN" "$WORK/bench-server-before"
    BIN="$WORK/bench-server-before" start_server "$data"
    log "api: run $2/$RUNS, before: seed $API_OBJECTS Bundles"
    out="$(loadgen seed "$API_OBJECTS" --concurrency 32)"
    log "$out"
    record_requests "$section" "seed: create (POST), 32 concurrent (before)" "$out"
    record "$section" "store size after seeding (du of the data directory) (before)" MiB "$(calc "$(alloc_bytes "$data") / 1048576")"
    wrk_figures "$section" "before"
    record "$section" "server peak RSS (VmHWM) (before)" MiB "$(calc "$(peak_rss_kib) / 1024")"
    stop_server
    rm -rf "$data"
}


# api_beside_nginx SECTION RUN GET_RPS LIST_RPS: nginx serving the same JSON from files at the same
# paths (one file per Bundle, the whole list as one file), driven by the same load generator with
# the same concurrency; records stowage's throughput as a fraction of nginx's.
api_beside_nginx() {
    local section="$1" web="$WORK/api-web-$2" secs="$API_SECONDS" out
    local dir="$web$API/namespaces/$NS/bundles"
    mkdir -p "$dir"
    api "$API/namespaces/$NS/bundles" >"$web/list.json"
    python3 - "$web/list.json" "$dir" <<'PY'
import json, sys
for item in json.load(open(sys.argv[1]))["items"]:
    with open(f"{sys.argv[2]}/{item['metadata']['name']}", "w") as f:
        json.dump(item, f)
PY
    start_nginx "$web" "default_type application/json;
        location = $API/namespaces/$NS/bundles { try_files /list.json =404; }"
    log "api: the same GET and LIST from nginx"
    out="$(loadgen --server "$NGINX_URL" get --concurrency 32 --duration "$secs")"
    log "$out"
    record_requests "$section" "nginx: GET bundle file, 32 concurrent" "$out"
    record "$section" "**ratio stowage / nginx: GET, 32 concurrent** (throughput)" x "$(calc "$3 / $(jfield "$out" rps)")"
    out="$(loadgen --server "$NGINX_URL" list --limit 0 --concurrency 4 --duration "$secs")"
    log "$out"
    record_requests "$section" "nginx: LIST file ($API_OBJECTS items), 4 concurrent" "$out"
    record "$section" "**ratio stowage / nginx: LIST all, 4 concurrent** (throughput)" x "$(calc "$4 / $(jfield "$out" rps)")"
    stop_nginx
    rm -rf "$web"
}

# The watchers scenario: WATCHERS watches (one connection each, like as many controllers) of one
# namespace while Bundles there are patched at a steady rate; every watcher must see every event.
scenario_watchers() {
    [ -x "$LOADGEN" ] || die "no load generator: run without BENCH_BIN, or set BENCH_LOADGEN"
    local watchers="${BENCH_WATCHERS:-1000}" rate="${BENCH_WATCHERS_RATE:-100}" events="${BENCH_WATCHERS_EVENTS:-1000}"
    local section="Watch fan-out: $watchers watchers, $rate writes/s ($events merge PATCHes)" run out
    for run in $(seq 1 "$RUNS"); do
        local data="$WORK/watchers-$run"
        start_server "$data"
        out="$(loadgen seed "$events" --concurrency 32 --prefix w)"
        log "watchers: run $run/$RUNS"
        out="$(loadgen watch --watchers "$watchers" --events "$events" --concurrency 16 --rate "$rate" --pid "$SERVER_PID")"
        log "$out"
        record "$section" "events missing" count "$(jfield "$out" missing)" "<=0"
        record "$section" "writes meanwhile" "req/s" "$(jfield "$out" write_rps)"
        record "$section" "lag write→event p50" ms "$(jfield "$out" lag_p50_ms)"
        record "$section" "**lag write→event p99**" ms "$(jfield "$out" lag_p99_ms)" "<100"
        record "$section" "lag write→event max" ms "$(jfield "$out" lag_max_ms)"
        record "$section" "**server RSS with the watches open, after the writes**" MiB "$(jfield "$out" server_rss_mib_after_writes)" "<300"
        record "$section" "server peak RSS (VmHWM)" MiB "$(calc "$(peak_rss_kib) / 1024")"
        stop_server
        rm -rf "$data"
    done
}
