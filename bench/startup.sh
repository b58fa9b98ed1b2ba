# The startup scenario of scripts/bench.sh (sourced): from `stowage serve` to ready after a kill -9,
# on stores of many revisions (BENCH_STARTUP_REVISIONS, each Bundle with content of its own), and how
# long the collection owed since open then takes in the background. With BENCH_BEFORE_BIN, the same
# restarts of another build on the same store, side by side.
# shellcheck shell=bash

STARTUP_REVISIONS="${BENCH_STARTUP_REVISIONS:-2000 20000}"

# restart_timed BIN: kill -9 of the running server, then BIN started on the same data directory;
# sets READY and RECOVERED to the seconds until /readyz answered 200 and until the recovery gauge
# read 0 (not in a subshell: SERVER_PID changes).
restart_timed() {
    local bin="$1" data="$SERVER_DIR" t0 ready="" recovered=""
    kill -KILL "$SERVER_PID"
    wait "$SERVER_PID" 2>/dev/null || true
    local logf="$data.log" skip
    skip="$(wc -l <"$logf")"
    t0="$(now)"
    NO_COLOR=1 "$bin" serve --data-dir "$data" --listen 127.0.0.1:0 >>"$logf" 2>&1 &
    SERVER_PID=$!
    local deadline=$((SECONDS + 300))
    URL=""
    while [ -z "$ready" ]; do
        kill -0 "$SERVER_PID" 2>/dev/null || { tail -n 30 "$logf" >&2; die "server exited during start"; }
        [ "$SECONDS" -lt "$deadline" ] || die "server not ready after 300 s"
        if [ -z "$URL" ]; then
            URL="$(tail -n "+$((skip + 1))" "$logf" | grep -o 'stowage ready on https://127\.0\.0\.1:[0-9]*' | grep -o 'https.*' || true)"
        fi
        # Not `api`: a 503 while not ready is expected here, not a failure.
        if [ -n "$URL" ] && [ "$(curl -s --cacert "$data/pki/ca.crt" --cert "$data/pki/admin.crt" \
            --key "$data/pki/admin.key" -o /dev/null -w '%{http_code}' "$URL/readyz" || true)" = 200 ]; then
            ready="$(calc "$(now) - $t0")"
        else
            sleep 0.01
        fi
    done
    # The build before background recovery has no gauge: it recovered before it was ready.
    while [ -z "$recovered" ]; do
        [ "$SECONDS" -lt "$deadline" ] || die "recovery not finished after 300 s"
        local gauge
        gauge="$(api /metrics | awk '$1 == "stowage_store_recovering" {print $2}')"
        if [ "${gauge:-0}" = 0 ]; then recovered="$(calc "$(now) - $t0")"; else sleep 0.05; fi
    done
    READY="$ready" RECOVERED="$recovered"
}

scenario_startup() {
    local builds=("this build=$BIN")
    if [ -n "${BENCH_BEFORE_BIN:-}" ]; then
        cp "$BENCH_BEFORE_BIN" "$WORK/bench-server-before"
        builds+=("before=$WORK/bench-server-before")
    fi
    local n run build label bin out
    for n in $STARTUP_REVISIONS; do
        local section="Start to ready after kill -9: $n revisions"
        local data="$WORK/startup-$n"
        start_server "$data"
        log "startup: storing $n Bundles with content of their own"
        out="$(loadgen seed "$n" --upload --concurrency 32 --prefix s)"
        log "$out"
        record "$section" "Bundles created and uploaded (2 requests each)" "req/s" "$(jfield "$out" rps)"
        record "$section" "data directory" MB "$(calc "$(alloc_bytes "$data/store") / 1e6")"
        for run in $(seq 1 "$RUNS"); do
            for build in "${builds[@]}"; do
                label="${build%%=*}" bin="${build#*=}"
                log "startup: $n revisions, run $run/$RUNS, $label"
                restart_timed "$bin"
                record "$section" "**kill -9, then start to /readyz 200 ($label)**" s "$READY" "$([ "$label" = "this build" ] && echo "<=0.5")"
                record "$section" "start to the collection owed since open finished ($label)" s "$RECOVERED"
            done
        done
        record "$section" "server RSS after recovery" MiB "$(calc "$(rss_kib) / 1024")"
        stop_server
        rm -rf "$data" "$data.log"
    done
}
