# The object-write scenario of scripts/bench.sh (sourced): create throughput and latency, one writer
# and 32 concurrent, on this machine's disk and on a disk whose every flush waits (bench/slow_fsync.c,
# like a network block volume). With BENCH_BEFORE_BIN, the same runs of another stowage binary (an
# older build) side by side.
# shellcheck shell=bash

SLOW_FSYNC_US="${BENCH_SLOW_FSYNC_US:-2000}"

scenario_writes() {
    local shim="$WORK/slow_fsync.so"
    cc -shared -fPIC -O2 -o "$shim" "$repo/bench/slow_fsync.c" -ldl || die "cannot build bench/slow_fsync.c"
    local builds=("this build=$BIN")
    if [ -n "${BENCH_BEFORE_BIN:-}" ]; then
        cp "$BENCH_BEFORE_BIN" "$WORK/bench-server-before"
        builds+=("before=$WORK/bench-server-before")
    fi
    local run build label bin disk preload out
    for run in $(seq 1 "$RUNS"); do
        for build in "${builds[@]}"; do
            label="${build%%=*}" bin="${build#*=}"
            for disk in local slow; do
                preload=""
                [ "$disk" = slow ] && preload="$shim"
                local section="Object writes ($label), $([ "$disk" = slow ] && echo "every fsync +$((SLOW_FSYNC_US / 1000)) ms" || echo "local disk")"
                local data="$WORK/writes-$run-${label// /-}-$disk"
                BIN="$bin" LD_PRELOAD="$preload" SLOW_FSYNC_US="$SLOW_FSYNC_US" start_server "$data"
                log "writes: run $run/$RUNS, $label, $disk disk"
                local cpu_before
                cpu_before="$(cpu_ms)"
                out="$(loadgen seed "$WRITES_ONE" --concurrency 1 --prefix one)"
                log "$out"
                record_requests "$section" "create (POST), 1 writer" "$out"
                record "$section" "server CPU per create, 1 writer" ms "$(calc "($(cpu_ms) - $cpu_before) / $WRITES_ONE")"
                cpu_before="$(cpu_ms)"
                out="$(loadgen seed "$WRITES_MANY" --concurrency 32 --prefix many)"
                log "$out"
                record_requests "$section" "**create (POST), 32 concurrent**" "$out"
                record "$section" "**server CPU per create, 32 concurrent**" ms \
                    "$(calc "($(cpu_ms) - $cpu_before) / $WRITES_MANY")" "<=0.75"
                stop_server
                rm -rf "$data"
            done
        done
    done
}
