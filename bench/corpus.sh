# The corpus scenario of scripts/bench.sh (sourced): every bundle and chart of the corpus stored as
# one revision each, beside what the plain alternatives keep for the same revisions: the unpacked
# trees, one .tar.gz per revision (a file-based artifact store), base64 in ConfigMaps.
# shellcheck shell=bash

scenario_corpus() {
    local bundles=()
    mapfile -t bundles < <(corpus_bundles)
    local section="storage footprint: the corpus, ${#bundles[@]} revisions (every bundle and chart version)"
    local raw raw_alloc targz=0 n d cms cm_bytes
    raw="$(file_bytes "${bundles[@]}")"
    raw_alloc="$(du -B1 -s -c "${bundles[@]}" | tail -n 1 | cut -f1)"
    for d in "${bundles[@]}"; do
        n="$(tar -C "$d" -cf - . | gzip | wc -c)"
        targz=$((targz + n))
    done
    read -r cms cm_bytes < <(python3 "$repo/bench/configmaps.py" "${bundles[@]}")
    local u="bytes:$raw" run i
    for run in $(seq "$RUNS"); do
        log "corpus: run $run/$RUNS"
        local data="$WORK/corpus-$run"
        start_server "$data"
        for i in "${!bundles[@]}"; do upload_dir "c$i" "${bundles[$i]}"; done
        settle
        stop_server
        local stored
        stored="$(alloc_bytes "$data/store")"
        record "$section" "raw tree: sum of file sizes" "$u" "$raw"
        record "$section" "raw tree on disk (du)" "$u" "$raw_alloc"
        record "$section" "one .tar.gz per revision (gzip -6)" "$u" "$targz"
        record "$section" "base64 in ConfigMaps (keys + values)" "$u" "$cm_bytes"
        record "$section" "ConfigMaps needed (≤ 1 MiB of data each)" count "$cms"
        record "$section" "**stowage store on disk (du: packs + sled)**" "$u" "$stored"
        record "$section" "**ratio stowage / raw tree on disk**" x "$(calc "$stored / $raw_alloc")"
        record "$section" "**ratio stowage / .tar.gz per revision**" x "$(calc "$stored / $targz")"
        record "$section" "**ratio stowage / ConfigMaps**" x "$(calc "$stored / $cm_bytes")"
        rm -rf "$data"
    done
}
