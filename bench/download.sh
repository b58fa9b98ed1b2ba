# The download scenario of scripts/bench.sh (sourced): GET of a Bundle's content from stowage beside
# nginx serving the very same tar from disk over TLS, with and without zstd on the wire.
# shellcheck shell=bash

# timed_gets TIMES URL [curl args...]: downloads URL TIMES times, one after another, to /dev/null;
# prints the seconds all took and the bytes of one response as it came over the wire. With
# GET_MODE=kept the GETs go over one kept-alive connection (one curl for all of them: the seconds
# are its wall time, one handshake included), else each GET opens its own connection.
GET_MODE=each
timed_gets() {
    local times="$1" url="$2" i out bytes total=0
    shift 2
    if [ "$GET_MODE" = kept ]; then
        local outputs=() t0
        for i in $(seq "$times"); do outputs+=(-o /dev/null "$url"); done
        t0="$(now)"
        out="$(curl -sS --fail --cacert "$SERVER_DIR/pki/ca.crt" -w '%{size_download} %{num_connects}\n' \
            "$@" "${outputs[@]}")" || die "GET $url failed"
        total="$(calc "$(now) - $t0")"
        [ "$(awk '{n += $2} END {print n}' <<<"$out")" = 1 ] || die "curl opened more than one connection to $url"
        bytes="$(tail -n 1 <<<"$out" | cut -d' ' -f1)"
        echo "$total $bytes"
        return
    fi
    for i in $(seq "$times"); do
        out="$(curl -sS --fail --cacert "$SERVER_DIR/pki/ca.crt" -o /dev/null \
            -w '%{size_download} %{time_total}' "$@" "$url")" || die "GET $url failed"
        read -r bytes secs <<<"$out"
        total="$(calc "$total + $secs")"
    done
    echo "$total $bytes"
}

# download_tree NAME DIR TIMES: stores DIR as Bundle NAME, then, in alternation per run, downloads
# its tar from stowage and from nginx, plain and zstd, over connections as GET_MODE says.
download_tree() {
    local name="$1" src="$2" times="$3" connections="one connection each"
    [ "$GET_MODE" = kept ] && connections="one kept-alive connection"
    local section="content download: $name ($times GETs per figure, $connections, HTTP/2, TLS 1.3, client certificate)"
    local data="$WORK/download-$name" web="$WORK/web-$name"
    start_server "$data"
    upload_dir "$name" "$src"
    local path="$API/namespaces/$NS/bundles/$name/content" tar_bytes
    mkdir -p "$web"
    # nginx serves the bytes stowage serves: the same tar, and that tar as zstd at zstd's default
    # level, precompressed on disk (nginx has no zstd module; a file-based artifact store keeps
    # the compressed file).
    api -o "$web/content.tar" "$path"
    zstd -q -f "$web/content.tar" -o "$web/content.tar.zst"
    tar_bytes="$(stat -c %s "$web/content.tar")"
    # Both authenticate the client by the same certificate (stowage's admin one, checked against its
    # CA): a client of either pays the same handshake, including the ~1.6 ms curl takes to load its
    # key on every connection, so what differs is what happens after it.
    start_nginx "$web" "ssl_verify_client on; ssl_client_certificate $SERVER_DIR/pki/ca.crt;"
    local admin=(--cert "$SERVER_DIR/pki/admin.crt" --key "$SERVER_DIR/pki/admin.key")
    local run s n
    for run in $(seq "$RUNS"); do
        log "download $name: run $run/$RUNS"
        read -r s _ < <(timed_gets "$times" "$URL$path" "${admin[@]}")
        read -r n _ < <(timed_gets "$times" "$NGINX_URL/content.tar" "${admin[@]}")
        record "$section" "stowage, identity" MB/s "$(calc "$times * $tar_bytes / 1e6 / $s")"
        record "$section" "nginx, the tar file" MB/s "$(calc "$times * $tar_bytes / 1e6 / $n")"
        record "$section" "**ratio stowage / nginx, identity** (throughput)" x "$(calc "$n / $s")"
        local sz nz sbytes nbytes
        read -r sz sbytes < <(timed_gets "$times" "$URL$path" "${admin[@]}" -H 'Accept-Encoding: zstd')
        read -r nz nbytes < <(timed_gets "$times" "$NGINX_URL/content.tar.zst" "${admin[@]}")
        record "$section" "stowage, Accept-Encoding: zstd (tar MB/s)" MB/s "$(calc "$times * $tar_bytes / 1e6 / $sz")"
        record "$section" "nginx, the .tar.zst file (tar MB/s)" MB/s "$(calc "$times * $tar_bytes / 1e6 / $nz")"
        record "$section" "**ratio stowage / nginx, zstd** (throughput)" x "$(calc "$nz / $sz")"
        record "$section" "bytes on the wire, stowage zstd (stored frames; cached fresh ones between)" bytes:"$tar_bytes" "$sbytes"
        record "$section" "bytes on the wire, nginx .tar.zst (level 3, precompressed)" bytes:"$tar_bytes" "$nbytes"
    done
    record "$section" "stowage peak RSS (VmHWM)" MiB "$(calc "$(peak_rss_kib) / 1024")"
    stop_server
    if [ -n "${BENCH_BEFORE_BIN:-}" ]; then
        # The same figures from an earlier binary, in the same run (same load, same nginx).
        local now_bin="$BIN"
        cp "$BENCH_BEFORE_BIN" "$WORK/bench-server-before"
        BIN="$WORK/bench-server-before"
        start_server "$data-before"
        # That server made its own CA and admin certificate.
        admin=(--cert "$SERVER_DIR/pki/admin.crt" --key "$SERVER_DIR/pki/admin.key")
        upload_dir "$name" "$src"
        for run in $(seq "$RUNS"); do
            log "download $name, before: run $run/$RUNS"
            read -r s _ < <(timed_gets "$times" "$URL$path" "${admin[@]}")
            record "$section" "before: stowage, identity" MB/s "$(calc "$times * $tar_bytes / 1e6 / $s")"
            read -r sz sbytes < <(timed_gets "$times" "$URL$path" "${admin[@]}" -H 'Accept-Encoding: zstd')
            record "$section" "before: stowage, Accept-Encoding: zstd (tar MB/s)" MB/s "$(calc "$times * $tar_bytes / 1e6 / $sz")"
            record "$section" "before: bytes on the wire, stowage zstd" bytes:"$tar_bytes" "$sbytes"
        done
        record "$section" "before: stowage peak RSS (VmHWM)" MiB "$(calc "$(peak_rss_kib) / 1024")"
        stop_server
        rm -rf "$data-before"
        BIN="$now_bin"
    fi
    stop_nginx
    rm -rf "$data" "$web"
}

scenario_download() {
    local trees=" ${BENCH_DOWNLOAD_TREES:-kps corpus gib} " tree
    # One chart (kube-prometheus-stack, a 6.8 MB tar) fetched again and again, as provisioners
    # do: over one kept-alive connection, and with a new connection per GET.
    if [[ "$trees" == *" kps "* ]]; then
        GET_MODE=kept download_tree kps "$corpus/kube-prometheus-stack/88.5.3" 40
        GET_MODE=each download_tree kps "$corpus/kube-prometheus-stack/88.5.3" 40
    fi
    # The whole corpus as one tree: YAML, charts and bundles, compressible.
    if [[ "$trees" == *" corpus "* ]]; then
        tree="$WORK/corpus-tree"
        mkdir -p "$tree"
        cp -r "$corpus"/kube-prometheus-stack "$corpus"/operator-registry "$corpus"/rukpak-testdata "$tree"/
        download_tree corpus "$tree" 10
        rm -rf "$tree"
    fi
    # 1 GiB, mostly incompressible (four random files and 5000 small text files).
    if [[ "$trees" == *" gib "* ]]; then
        tree="$WORK/gib-tree"
        gib_tree "$tree"
        download_tree gib "$tree" 2
        rm -rf "$tree"
    fi
}
