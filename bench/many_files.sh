# The many-files scenario of scripts/bench.sh (sourced): a 7 MB gzip tar of 999,999 empty files and
# one `../escape` entry, refused (422) at its last entry, and 1,000,000 empty files uploaded and then
# deleted with their Bundle. Peak RSS while refusing / uploading / deleting, RSS once released, and
# the idle RSS before (issue 13: peak < 300 MiB, back near idle after). With BENCH_BEFORE_BIN, the
# same runs of another stowage binary (an older build) side by side.
# shellcheck shell=bash

MANY_FILES="${BENCH_MANY_FILES:-1000000}"

# many_files_tar OUT FILES EVIL: a gzip tar of FILES empty files f/0000000…, then `../escape` if EVIL.
many_files_tar() {
    python3 - "$1" "$2" "$3" <<'PY'
import gzip, sys, tarfile
out, files, evil = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
with gzip.open(out, "wb", compresslevel=1) as gz, tarfile.open(fileobj=gz, mode="w|", format=tarfile.USTAR_FORMAT) as tar:
    names = [f"f/{i:07}" for i in range(files - 1 if evil else files)]
    if evil:
        names.append("../escape")
    for name in names:
        info = tarfile.TarInfo(name)
        info.mode = 0o644
        tar.addfile(info)
PY
}

# reset_peak: starts VmHWM over from the current RSS (Linux ≥ 4.0).
reset_peak() { echo 5 >"/proc/$SERVER_PID/clear_refs"; }

scenario_many_files() {
    local evil="$WORK/many-evil.tar.gz" good="$WORK/many-good.tar.gz"
    log "many files: building the archives ($MANY_FILES entries each)"
    many_files_tar "$evil" "$MANY_FILES" 1
    many_files_tar "$good" "$MANY_FILES" 0
    local builds=("this build=$BIN")
    if [ -n "${BENCH_BEFORE_BIN:-}" ]; then
        cp "$BENCH_BEFORE_BIN" "$WORK/bench-server-before"
        builds+=("before=$WORK/bench-server-before")
    fi
    local run build label bin out code secs
    for run in $(seq 1 "$RUNS"); do
        for build in "${builds[@]}"; do
            label="${build%%=*}" bin="${build#*=}"
            local section="$MANY_FILES empty files ($label): server memory"
            local data="$WORK/many-$run-${label// /-}"
            BIN="$bin" start_server "$data"
            log "many files: run $run/$RUNS, $label"
            create_bundle refused
            create_bundle deleted
            settle
            record "$section" "gzip tar size" bytes "$(stat -c %s "$evil")"
            record "$section" "idle RSS before" MiB "$(calc "$(rss_kib) / 1024")"

            reset_peak
            out="$(curl -sS --cacert "$SERVER_DIR/pki/ca.crt" --cert "$SERVER_DIR/pki/admin.crt" \
                --key "$SERVER_DIR/pki/admin.key" -X PUT -T "$evil" -H 'Content-Type: application/x-tar' \
                -H 'Content-Encoding: gzip' -o "$WORK/refused.json" -w '%{http_code} %{time_total}' \
                "$URL$API/namespaces/$NS/bundles/refused/content")"
            read -r code secs <<<"$out"
            [ "$code" = 422 ] || die "the ../ upload returned $code, not 422: $(head -c 500 "$WORK/refused.json")"
            record "$section" "refusal: time to the 422" s "$secs"
            settle
            record "$section" "**refusal: peak RSS (VmHWM)**" MiB "$(calc "$(peak_rss_kib) / 1024")" "<300"
            record "$section" "refusal: RSS once released" MiB "$(calc "$(rss_kib) / 1024")"

            reset_peak
            out="$(api -X PUT -T "$good" -H 'Content-Type: application/x-tar' -H 'Content-Encoding: gzip' \
                -o /dev/null -w '%{time_total}' "$API/namespaces/$NS/bundles/deleted/content")"
            record "$section" "upload: time to the 200" s "$out"
            settle
            record "$section" "upload: peak RSS (VmHWM)" MiB "$(calc "$(peak_rss_kib) / 1024")"
            reset_peak
            local t0 t1
            t0="$(now)"
            delete_bundle deleted
            until [ "$(api "$API/namespaces/$NS/bundlecontents" | json_field items | wc -c)" -le 3 ]; do
                sleep 0.5
            done
            settle
            t1="$(now)"
            record "$section" "delete: time until the revision is collected" s "$(calc "$t1 - $t0 - 3")"
            record "$section" "**delete: peak RSS (VmHWM)**" MiB "$(calc "$(peak_rss_kib) / 1024")" "<300"
            record "$section" "delete: RSS once released" MiB "$(calc "$(rss_kib) / 1024")"
            stop_server
            rm -rf "$data"
        done
    done
    rm -f "$evil" "$good"
}
