# The ingest scenario of scripts/bench.sh (sourced): a 1 GiB YAML-heavy upload (bench/yaml_tar.py:
# the corpus's text files copied with changes throughout, so chunks do not deduplicate), its MB/s and
# the server's peak RSS, beside what `zstd -3 -T2` and `b3sum` reach on the same tar in the same run:
# the work an upload cannot avoid (compress every byte, hash every byte). With BENCH_BEFORE_BIN, the
# same upload into another stowage binary (an older build), side by side. Both builds must serve the
# same tar: their status.digest must agree. Each upload twice, over HTTP/2 (curl's default over TLS)
# and HTTP/1.1, each into a fresh server. The tar lists its files in path order (as `kubectl stowage
# push` and `git archive` do: the server lays it out as it arrives); the same files in the order
# the tree was walked (spooled, laid out by finalize) are uploaded too, over HTTP/1.1. And what a
# user of the kubectl plugin gets (this build only): `kubectl stowage push` of the tar file, and of
# the tree it holds (packed by the plugin as tar.zst), each in 16 MiB pieces and a commit.
# shellcheck shell=bash

INGEST_BYTES="${BENCH_INGEST_BYTES:-1073741824}"

scenario_ingest() {
    local section="Ingest: 1 GiB YAML upload beside zstd -3 -T2 and b3sum"
    local tarf="$WORK/ingest.tar" walkf="$WORK/ingest-walk.tar"
    log "ingest: building the tars ($INGEST_BYTES bytes of copies of $corpus, in path and walk order)"
    python3 "$repo/bench/yaml_tar.py" "$corpus" "$tarf" "$INGEST_BYTES" >&2
    BENCH_TAR_ORDER=walk python3 "$repo/bench/yaml_tar.py" "$corpus" "$walkf" "$INGEST_BYTES" >&2
    # Written back now, not during the first uploads (2 GiB of dirty pages took CPU from them).
    sync
    local size
    size="$(stat -c %s "$tarf")"
    local builds=("this build=$BIN")
    if [ -n "${BENCH_BEFORE_BIN:-}" ]; then
        cp "$BENCH_BEFORE_BIN" "$WORK/bench-server-before"
        builds=("before=$WORK/bench-server-before" "${builds[@]}")
    fi
    local run build label bin out code secs t0 t1 digest first_digest="" upload order
    for run in $(seq 1 "$RUNS"); do
        cat "$tarf" "$walkf" >/dev/null
        record "$section" "tar size" bytes "$size"
        # The limit: compress every byte (zstd's own threads) and hash every byte (b3sum's).
        t0="$(now)"
        zstd -q -3 -T2 -c "$tarf" >/dev/null
        t1="$(now)"
        local zsecs bsecs
        zsecs="$(calc "$t1 - $t0")"
        t0="$(now)"
        b3sum "$tarf" >/dev/null
        t1="$(now)"
        bsecs="$(calc "$t1 - $t0")"
        record "$section" "zstd -3 -T2 -c tar >/dev/null" MB/s "$(calc "$size / 1e6 / $zsecs")"
        record "$section" "b3sum tar" MB/s "$(calc "$size / 1e6 / $bsecs")"
        record "$section" "**limit: zstd -3 -T2, then b3sum (size / sum of both times)**" MB/s \
            "$(calc "$size / 1e6 / ($zsecs + $bsecs)")"
        for build in "${builds[@]}"; do
            # curl's default over TLS is HTTP/2 (as kubectl's client-go); HTTP/1.1 shows what the
            # store takes when the transport is not the bottleneck (see docs/benchmarks.md).
            for upload in http2 http1.1 walk; do
                label="${build%%=*}" bin="${build#*=}"
                proto="${upload/walk/http1.1}" order=""
                [ "$upload" = walk ] && order=", files in walk order"
                log "ingest: run $run/$RUNS, $label, $proto$order"
                local data="$WORK/ingest-$run-${label// /-}-$upload"
                BIN="$bin" start_server "$data"
                create_bundle ingest
                record "$section" "load average before the upload ($label, $proto)" count "$(cut -d' ' -f1 /proc/loadavg)"
                out="$(api "--$proto" -X PUT -T "$([ "$upload" = walk ] && echo "$walkf" || echo "$tarf")" -H 'Content-Type: application/x-tar' -o "$WORK/put.json" \
                    -w '%{http_code} %{time_total}' "$API/namespaces/$NS/bundles/ingest/content")"
                read -r code secs <<<"$out"
                [ "$code" = 200 ] || die "upload returned $code"
                record "$section" "**upload ($label, curl -T file, $proto$order)**" MB/s "$(calc "$size / 1e6 / $secs")"
                record "$section" "server CPU time of the upload ($label, $proto$order)" s \
                    "$(awk '{print ($14 + $15) / 100}' "/proc/$SERVER_PID/stat")"
                record "$section" "server peak RSS ($label, $proto$order, VmHWM)" MiB "$(calc "$(peak_rss_kib) / 1024")" "<150"
                digest="$(json_field status.digest <"$WORK/put.json")"
                [ -n "$first_digest" ] || first_digest="$digest"
                [ "$digest" = "$first_digest" ] || die "$label serves $digest, not $first_digest"
                if [ "$run" = 1 ] && [ "$proto" = http2 ]; then
                    local sum
                    sum="$(api "$API/namespaces/$NS/bundles/ingest/content" | sha256sum | cut -d' ' -f1)"
                    [ "sha256:$sum" = "$digest" ] || die "$label: downloaded tar sha256:$sum != status.digest $digest"
                fi
                stop_server
                record "$section" "store on disk ($label, $proto$order, du)" bytes "$(alloc_bytes "$data/store")"
                rm -rf "$data"
            done
        done
    done
    push_figures "$section" "$tarf" "$size"
    rm -f "$tarf" "$walkf"
}

# push_figures SECTION TAR SIZE: `kubectl stowage push` of TAR and of the tree it holds, each into a
# fresh server, MB/s of SIZE (the tree's served tar adds only its directory entries).
push_figures() {
    local section="$1" tarf="$2" size="$3" tree="$WORK/ingest-tree" run what src t0 secs
    [ -x "$PLUGIN" ] || die "no kubectl-stowage binary (build it, or set BENCH_PLUGIN)"
    mkdir -p "$tree"
    tar -C "$tree" -xf "$tarf"
    sync
    for run in $(seq 1 "$RUNS"); do
        for what in file directory; do
            src="$tarf"
            [ "$what" = directory ] && src="$tree"
            log "ingest: run $run/$RUNS, kubectl stowage push of the $what"
            local data="$WORK/push-$run-$what"
            start_server "$data"
            t0="$(now)"
            "$PLUGIN" push --kubeconfig "$data/admin.kubeconfig" -n "$NS" --create pushed "$src" >"$WORK/push.out" 2>&1 \
                || { cat "$WORK/push.out" >&2; die "kubectl stowage push of the $what failed"; }
            secs="$(calc "$(now) - $t0")"
            record "$section" "**kubectl stowage push of the $what (this build)**" MB/s "$(calc "$size / 1e6 / $secs")"
            record "$section" "server CPU time of the push of the $what" s \
                "$(awk '{print ($14 + $15) / 100}' "/proc/$SERVER_PID/stat")"
            record "$section" "server peak RSS (push of the $what, VmHWM)" MiB "$(calc "$(peak_rss_kib) / 1024")" "<150"
            stop_server
            rm -rf "$data"
        done
    done
    rm -rf "$tree"
}
