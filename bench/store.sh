# Store scenarios of scripts/bench.sh (sourced): footprint, churn and 1 GiB throughput.
# shellcheck shell=bash

# ------------------------------------------------------------------------------------------------
# 1. kube-prometheus-stack: five consecutive versions

scenario_footprint() {
    local section="kube-prometheus-stack ${KPS_VERSIONS[0]}…${KPS_VERSIONS[-1]}: five versions stored (% of raw)"
    local dirs=() v
    for v in "${KPS_VERSIONS[@]}"; do
        [ -d "$corpus/kube-prometheus-stack/$v" ] || die "missing $corpus/kube-prometheus-stack/$v"
        dirs+=("$corpus/kube-prometheus-stack/$v")
    done
    local raw
    raw="$(file_bytes "${dirs[@]}")"
    local u="bytes:$raw"

    # Reference points; deterministic, so computed once.
    log "footprint: reference compressors"
    local targz=0 n
    for v in "${dirs[@]}"; do
        n="$(tar -C "$v" -cf - . | gzip | wc -c)"
        targz=$((targz + n))
    done
    local zall
    zall="$(for v in "${dirs[@]}"; do tar -C "$v" -cf - .; done | zstd -q -19 --long=27 -c | wc -c)"

    # Baseline: what an empty store takes (fresh start, settle, stop).
    start_server "$WORK/empty"
    settle
    stop_server
    local empty_sled empty_packs
    empty_sled="$(file_bytes "$WORK/empty/store/db")"
    empty_packs="$(file_bytes "$WORK/empty/store/packs")"

    local run
    for run in $(seq 1 "$RUNS"); do
        log "footprint: run $run/$RUNS"
        local data="$WORK/footprint-$run"
        start_server "$data"
        local t0 t1
        t0="$(now)"
        for v in "${KPS_VERSIONS[@]}"; do
            upload_dir "kps-${v//./-}" "$corpus/kube-prometheus-stack/$v"
        done
        t1="$(now)"
        settle
        local stored="$M_STORED" chunk_raw="$M_RAW" chunks="$M_CHUNKS" disk_metric="$M_DISK"
        stop_server
        local store="$data/store"
        local pack_app sled_app pack_alloc sled_alloc
        pack_app="$(file_bytes "$store/packs")"
        sled_app="$(file_bytes "$store/db")"
        pack_alloc="$(alloc_bytes "$store/packs")"
        sled_alloc="$(alloc_bytes "$store/db")"

        record "$section" "raw bytes (sum of file sizes, 5 trees)" "$u" "$raw"
        record "$section" "distinct chunk bytes after dedup, uncompressed" "$u" "$chunk_raw"
        record "$section" "distinct chunks" count "$chunks"
        record "$section" "live compressed chunk bytes" "$u" "$stored"
        record "$section" "pack files, apparent" "$u" "$pack_app"
        record "$section" "sled dir, apparent" "$u" "$sled_app" "<=1"
        record "$section" "**total on disk, apparent** (packs + sled)" "$u" "$((pack_app + sled_app))" "<=3"
        record "$section" "pack files, allocated (du)" "$u" "$pack_alloc"
        record "$section" "sled dir, allocated (du)" "$u" "$sled_alloc"
        record "$section" "**total on disk, allocated** (du)" "$u" "$((pack_alloc + sled_alloc))" "<=3"
        record "$section" "stowage_disk_bytes before stop" "$u" "$disk_metric"
        record "$section" "baseline: empty store, sled + packs (apparent)" "$u" "$((empty_sled + empty_packs))"
        record "$section" "compare: one tar.gz per version (gzip -6), sum of 5" "$u" "$targz"
        record "$section" "compare: 5 tars concatenated, zstd -19 --long=27" "$u" "$zall"
        record "$section" "time to upload the 5 versions" s "$(calc "$t1 - $t0")"
    done
}

# ------------------------------------------------------------------------------------------------
# 2. Space amplification under churn

corpus_bundles() {
    local d
    for d in "$corpus"/rukpak-testdata/*/* "$corpus"/operator-registry/* "$corpus"/kube-prometheus-stack/*; do
        [ -d "$d" ] && echo "$d"
    done
}

# record_disk_vs_live SECTION LABEL DATA: the store's live bytes, its files and disk / live, from
# the last `metrics` and DATA/store.
record_disk_vs_live() {
    local section="$1" label="$2" store="$3/store"
    record "$section" "$label: live compressed chunk bytes" bytes "$M_STORED"
    record "$section" "$label: stowage_disk_bytes (apparent)" bytes "$M_DISK"
    local packs
    packs="$(file_bytes "$store/packs")"
    record "$section" "$label: pack files (apparent)" bytes "$packs"
    record "$section" "$label: dead share of the pack files" % "$(calc "100 * ($packs - $M_STORED) / $packs")" "<20"
    record "$section" "$label: sled dir (apparent)" bytes "$(file_bytes "$store/db")"
    record "$section" "**$label: disk / live**" x "$(calc "$M_DISK / $M_STORED")" "<=2"
    record "$section" "$label: allocated (du) / live" x "$(calc "$(alloc_bytes "$store") / $M_STORED")"
}

scenario_churn() {
    local section="Space amplification: $ROUNDS rounds of upload-all-corpus / delete-previous-round"
    local bundles=()
    mapfile -t bundles < <(corpus_bundles)
    # What a fresh store takes, to compare an emptied one with.
    start_server "$WORK/churn-fresh"
    settle
    stop_server
    local fresh
    fresh="$(file_bytes "$WORK/churn-fresh/store")"
    local run
    for run in $(seq 1 "$RUNS"); do
        log "churn: run $run/$RUNS (${#bundles[@]} bundles × $ROUNDS rounds)"
        local data="$WORK/churn-$run"
        start_server "$data"
        local t0 r i
        t0="$(now)"
        for r in $(seq 1 "$ROUNDS"); do
            for i in "${!bundles[@]}"; do
                upload_dir "r$r-b$i" "${bundles[$i]}"
            done
            if [ "$r" -gt 1 ]; then
                for i in "${!bundles[@]}"; do delete_bundle "r$((r - 1))-b$i"; done
            fi
        done
        local churn_time
        churn_time="$(calc "$(now) - $t0")"
        settle
        record "$section" "uploads (bundles × rounds)" count "$((${#bundles[@]} * ROUNDS))"
        record "$section" "churn time" s "$churn_time"
        record_disk_vs_live "$section" "after churn" "$data"

        log "churn: restart"
        stop_server
        start_server "$data"
        settle
        record_disk_vs_live "$section" "after restart" "$data"

        log "churn: delete everything"
        for i in "${!bundles[@]}"; do delete_bundle "r$ROUNDS-b$i"; done
        settle
        [ "$M_COMMITTED" = 0 ] || die "revisions left after deleting every bundle: $M_COMMITTED"
        record "$section" "all deleted: live compressed chunk bytes" bytes "$M_STORED"
        record "$section" "all deleted: stowage_disk_bytes (apparent)" bytes "$M_DISK"
        record "$section" "all deleted: pack files (apparent)" bytes "$(file_bytes "$data/store/packs")"
        record "$section" "all deleted: sled dir (apparent)" bytes "$(file_bytes "$data/store/db")"
        record "$section" "all deleted: allocated (du)" bytes "$(alloc_bytes "$data/store")"
        stop_server
        start_server "$data"
        settle
        record "$section" "all deleted, after restart: stowage_disk_bytes (apparent)" bytes "$M_DISK"
        record "$section" "all deleted, after restart: pack files (apparent)" bytes "$(file_bytes "$data/store/packs")"
        record "$section" "all deleted, after restart: sled dir (apparent)" bytes "$(file_bytes "$data/store/db")"
        record "$section" "all deleted, after restart: allocated (du)" bytes "$(alloc_bytes "$data/store")"
        record "$section" "**all deleted, after restart: store dir beyond a fresh one's** ($fresh bytes)" bytes \
            "$(($(file_bytes "$data/store") - fresh))" "<=1048576"
        stop_server
        rm -rf "$data"
    done
}

# ------------------------------------------------------------------------------------------------
# 3. 1 GiB throughput

# gib_tree DIR: 1 GiB of files: 5000 small text files and four random (incompressible) files.
gib_tree() {
    log "generating the 1 GiB tree (4 random files + 5000 small text files) in $1"
    mkdir -p "$1"
    python3 "$repo/bench/small_files.py" "$1" 5000
    local small big i
    small="$(file_bytes "$1")"
    big=$(((1073741824 - small) / 4))
    for i in 1 2 3 4; do head -c "$big" /dev/urandom >"$1/random-$i.bin"; done
}

scenario_throughput() {
    local section="1 GiB bundle: throughput and server memory"
    local src="$WORK/gib-src" tarf="$WORK/gib.tar"
    gib_tree "$src"
    local files_total
    files_total="$(file_bytes "$src")"
    tar -C "$src" -cf "$tarf" .
    rm -rf "$src"
    local size
    size="$(stat -c %s "$tarf")"
    log "throughput: tar is $size bytes ($files_total bytes of files)"

    local run
    for run in $(seq 1 "$RUNS"); do
        log "throughput: run $run/$RUNS"
        local data="$WORK/gib-$run"
        start_server "$data"
        create_bundle gib
        local out code secs
        out="$(api -X PUT -T "$tarf" -H 'Content-Type: application/x-tar' -o "$WORK/put.json" \
            -w '%{http_code} %{time_total}' "$API/namespaces/$NS/bundles/gib/content")"
        read -r code secs <<<"$out"
        [ "$code" = 200 ] || die "upload returned $code"
        record "$section" "tar size" bytes "$size"
        record "$section" "upload (curl -T file)" MB/s "$(calc "$size / 1e6 / $secs")"
        local digest
        digest="$(api "$API/namespaces/$NS/bundles/gib" | json_field status.digest)"

        out="$(api -o /dev/null -w '%{size_download} %{time_total}' "$API/namespaces/$NS/bundles/gib/content")"
        local got
        read -r got secs <<<"$out"
        record "$section" "download to /dev/null" MB/s "$(calc "$got / 1e6 / $secs")"

        local t0 t1 sum
        t0="$(now)"
        sum="$(api "$API/namespaces/$NS/bundles/gib/content" | sha256sum | cut -d' ' -f1)"
        t1="$(now)"
        [ "sha256:$sum" = "$digest" ] || die "downloaded tar sha256:$sum != status.digest $digest"
        record "$section" "download \| sha256sum (digest = status.digest)" MB/s "$(calc "$got / 1e6 / ($t1 - $t0)")"
        record "$section" "**server peak RSS (VmHWM)**" MiB "$(calc "$(peak_rss_kib) / 1024")" "<150"
        record "$section" "served tar size" bytes "$got"
        stop_server
        record "$section" "store on disk, allocated (du)" bytes "$(alloc_bytes "$data/store")"
        rm -rf "$data"

        # Context: the same bytes through local tools (the tar file is in the page cache).
        local x="$WORK/extract"
        mkdir -p "$x"
        t0="$(now)"
        tar -C "$x" -xf "$tarf"
        sync -f "$x"
        t1="$(now)"
        record "$section" "context: tar -x + sync of the same file" MB/s "$(calc "$size / 1e6 / ($t1 - $t0)")"
        rm -rf "$x"
        t0="$(now)"
        sha256sum "$tarf" >/dev/null
        t1="$(now)"
        record "$section" "context: sha256sum of the tar file" MB/s "$(calc "$size / 1e6 / ($t1 - $t0)")"
    done
    rm -f "$tarf"
}

