#!/usr/bin/env bash
# bench/ingest_threads.sh BIN DATA_DIR: one upload of $TAR (default /tmp/ingest/gib.tar, made by
# bench/yaml_tar.py) into a fresh `BIN serve`; prints MB/s, peak RSS, the server's CPU time per thread
# and curl's (CURLOPTS=--http1.1 for HTTP/1.1, third argument `perf` to record a profile). A helper
# for the per-thread figures of docs/benchmarks.md (parallel ingest), not part of scripts/bench.sh.
set -euo pipefail
BIN=$1 DATA=$2
TAR="${TAR:-/tmp/ingest/gib.tar}"
OUT="$(mktemp -d)"
rm -rf "$DATA"; mkdir -p "$DATA"
NO_COLOR=1 "$BIN" serve --data-dir "$DATA" --listen 127.0.0.1:0 > "$DATA.log" 2>&1 &
PID=$!
URL=""
while [ -z "$URL" ]; do sleep 0.2; URL="$(grep -o 'stowage ready on https://127\.0\.0\.1:[0-9]*' "$DATA.log" | grep -o 'https.*' || true)"; done
c() { curl -sS --fail-with-body --cacert "$DATA/pki/ca.crt" --cert "$DATA/pki/admin.crt" --key "$DATA/pki/admin.key" "$@"; }
API=/apis/content.stowage.dev/v1alpha1
c -X POST -H 'Content-Type: application/json' -o /dev/null -d '{"apiVersion":"content.stowage.dev/v1alpha1","kind":"Bundle","metadata":{"name":"g"},"spec":{"sources":[{"upload":{}}]}}' "$URL$API/namespaces/bench/bundles" || c -X POST -H 'Content-Type: application/json' -d '{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"bench"}}' "$URL/api/v1/namespaces"
if [ "${3:-}" = top ]; then (sleep 4; top -H -b -n 2 -d 3 -p $PID | tail -15 > $OUT/top.txt) & fi
if [ "${3:-}" = perf ]; then perf record -F 999 -g -p $PID -o $OUT/perf.data 2>/dev/null & PERF=$!; sleep 1; fi
uptime
out=$(/usr/bin/time -f 'curl %U user %S sys %e wall' -o $OUT/curltime curl -sS --fail-with-body --cacert "$DATA/pki/ca.crt" --cert "$DATA/pki/admin.crt" --key "$DATA/pki/admin.key" ${CURLOPTS:-} -X PUT -T "$TAR" -H 'Content-Type: application/x-tar' -o $OUT/put.json -w '%{http_code} %{time_total}' "$URL$API/namespaces/bench/bundles/g/content")
read -r code secs <<<"$out"; cat $OUT/curltime
if [ "${3:-}" = perf ]; then kill -INT $PERF; wait $PERF || true; fi
echo "code $code secs $secs MB/s $(python3 -c "print($(stat -c %s "$TAR")/1e6/$secs)") HWM $(grep VmHWM /proc/$PID/status)"
awk "{print \"server cpu s\", (\$14+\$15)/100}" /proc/$PID/stat
for t in /proc/$PID/task/*; do echo "$(cat $t/comm) $(awk '{print ($14+$15)/100}' $t/stat)"; done | sort | awk '$2>0.05'
python3 -c 'import json,sys;print(json.load(open(sys.argv[1]))["status"]["digest"])' "$OUT/put.json"
echo "outputs (perf.data, top.txt) in $OUT"
c "$URL/metrics" | grep -E "^stowage_chunk" ; kill $PID; wait $PID || true
du -sh "$DATA/store"
