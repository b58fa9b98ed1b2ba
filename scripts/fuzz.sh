#!/usr/bin/env bash
# Runs every fuzz target (fuzz/fuzz_targets) for a bounded time, one after the other, and prints
# a summary. Stops at the first crash, printing the input that caused it. Not part of CI (the
# corpus and past crashes are replayed there by tests/fuzz_regressions.rs).
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]     (default: 60 seconds, every target)
#
# New interesting inputs are added to fuzz/corpus/TARGET; minimise before committing with
# `cargo fuzz cmin TARGET` (see fuzz/README.md). Environment: FUZZ_SANITIZER (address, or none
# for a faster build), FUZZ_RSS_LIMIT_MB (default 2048), FUZZ_TIMEOUT (seconds per input, 10).
set -euo pipefail

cd "$(dirname "$0")/.."
seconds=${1:-60}
shift || true
rss_limit=${FUZZ_RSS_LIMIT_MB:-2048}
timeout=${FUZZ_TIMEOUT:-10}

if ! command -v cargo-fuzz >/dev/null; then
    cargo install cargo-fuzz --locked
fi

# cargo-fuzz needs nightly flags; on a machine with only stable, RUSTC_BOOTSTRAP lets stable
# accept them, and the sanitizer is dropped (stable ships no sanitizer runtimes).
if rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
    toolchain=(+nightly)
    sanitizer=${FUZZ_SANITIZER:-address}
else
    toolchain=()
    export RUSTC_BOOTSTRAP=1
    sanitizer=${FUZZ_SANITIZER:-none}
fi
fuzz=(cargo "${toolchain[@]}" fuzz)

if [ $# -gt 0 ]; then
    targets=("$@")
else
    mapfile -t targets < <("${fuzz[@]}" list)
fi

echo "building ${#targets[@]} targets (sanitizer: $sanitizer)"
"${fuzz[@]}" build --sanitizer "$sanitizer"

summary=()
logs=fuzz/target/logs
mkdir -p "$logs"
for target in "${targets[@]}"; do
    corpus=fuzz/corpus/$target
    mkdir -p "$corpus"
    inputs=("$corpus")
    [ -d "fuzz/regressions/$target" ] && inputs+=("fuzz/regressions/$target")
    log=$logs/$target.log
    echo "== $target: ${seconds}s"
    status=0
    "${fuzz[@]}" run --sanitizer "$sanitizer" "$target" "${inputs[@]}" -- \
        -max_total_time="$seconds" -rss_limit_mb="$rss_limit" -timeout="$timeout" -print_final_stats=1 \
        >"$log" 2>&1 || status=$?
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
    files=$(find "$corpus" -type f | wc -l)
    if [ "$status" -ne 0 ]; then
        artifact=$(grep -o 'Test unit written to .*' "$log" | sed 's/Test unit written to //' | tail -1)
        grep -E 'panicked at|ERROR: libFuzzer|SUMMARY' "$log" | head -5 || true
        summary+=("$(printf '%-15s %12s %8s  CRASH %s' "$target" "${runs:-?}" "$files" "$artifact")")
        printf '%s\n' "target          runs         corpus  result" "${summary[@]}"
        echo "log: $log"
        exit 1
    fi
    summary+=("$(printf '%-15s %12s %8s  ok' "$target" "${runs:-?}" "$files")")
done
printf '%s\n' "target          runs         corpus  result" "${summary[@]}"
