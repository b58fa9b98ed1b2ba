# The registry scenario of scripts/bench.sh (sourced): pulls from stowage's OCI registry view
# (/v2/, docs/registry.md) beside the same images pulled from Debian's docker-registry, both over
# TLS with the same certificates, by the same client (skopeo copy to an OCI layout).
# shellcheck shell=bash

# pull_secs REGISTRY REPO CERT_DIR: seconds `skopeo copy` takes to pull REPO:latest into a fresh
# OCI layout (digests kept, so skopeo verifies every blob against the manifest and stores it as
# served); the layout is removed afterwards.
pull_secs() {
    local dir="$WORK/pulled" t0
    rm -rf "$dir"
    t0="$(now)"
    skopeo copy -q --preserve-digests --src-cert-dir "$3" "docker://$1/$2:latest" "oci:$dir:latest" >&2 \
        || die "skopeo copy from $1/$2 failed"
    calc "$(now) - $t0"
    rm -rf "$dir"
}

# manifest REGISTRY REPO CERT_DIR: the manifest REPO:latest as served.
manifest() {
    skopeo inspect --raw --cert-dir "$3" "docker://$1/$2:latest"
}

scenario_registry() {
    local data="$WORK/registry-view" certs="$WORK/registry-certs" gib="$WORK/registry-gib"
    start_server "$data"
    # The chart is detected as Helm content (the chart artifact); the 1 GiB tree as plain (an
    # image whose layer is the served tar).
    log "registry: storing the chart and the 1 GiB tree"
    upload_dir kps "$corpus/kube-prometheus-stack/88.5.3"
    gib_tree "$gib"
    upload_dir gib "$gib"
    rm -rf "$gib"
    # skopeo's certificate directory: the CA both servers' certificates chain to (*.crt), and the
    # admin client certificate (*.cert + *.key) that authenticates to stowage; docker-registry
    # ignores it (it asks for no client certificate).
    mkdir -p "$certs"
    cp "$SERVER_DIR/pki/ca.crt" "$certs/ca.crt"
    cp "$SERVER_DIR/pki/admin.crt" "$certs/admin.cert"
    cp "$SERVER_DIR/pki/admin.key" "$certs/admin.key"
    start_registry "$SERVER_DIR/pki/serving.crt" "$SERVER_DIR/pki/serving.key"
    local stowage="${URL#https://}" image served
    local -A layer_bytes
    for image in kps gib; do
        log "registry: copying $NS/$image into docker-registry"
        skopeo copy -q --preserve-digests --src-cert-dir "$certs" --dest-cert-dir "$certs" \
            "docker://$stowage/$NS/$image:latest" "docker://$REGISTRY/$NS/$image:latest" >&2 \
            || die "skopeo copy into docker-registry failed"
        # Same manifest, so both pulls move the same blobs.
        served="$(manifest "$stowage" "$NS/$image" "$certs")"
        [ "$served" = "$(manifest "$REGISTRY" "$NS/$image" "$certs")" ] \
            || die "docker-registry holds another manifest for $NS/$image"
        layer_bytes[$image]="$(json_field layers.0.size <<<"$served")"
    done
    local run s r section bytes
    for run in $(seq "$RUNS"); do
        for image in kps gib; do
            section="registry view: skopeo copy of a 1 GiB tree (plain image, one tar layer)"
            [ "$image" = kps ] && section="registry view: skopeo copy of the kube-prometheus-stack 88.5.3 chart (Helm chart artifact, one gzip layer)"
            bytes="${layer_bytes[$image]}"
            log "registry $image: run $run/$RUNS"
            s="$(pull_secs "$stowage" "$NS/$image" "$certs")"
            r="$(pull_secs "$REGISTRY" "$NS/$image" "$certs")"
            record "$section" "layer size" bytes "$bytes"
            record "$section" "stowage /v2/ (client certificate)" MB/s "$(calc "$bytes / 1e6 / $s")"
            record "$section" "docker-registry, the same blobs from its filesystem" MB/s "$(calc "$bytes / 1e6 / $r")"
            record "$section" "**ratio stowage / docker-registry** (throughput)" x "$(calc "$r / $s")"
        done
    done
    record "registry view: memory" "stowage peak RSS (VmHWM), store + all pulls" MiB "$(calc "$(peak_rss_kib) / 1024")"
    record "registry view: memory" "docker-registry peak RSS (VmHWM)" MiB \
        "$(calc "$(awk '/^VmHWM:/ {print $2}' "/proc/$REGISTRY_PID/status") / 1024")"
    kill "$REGISTRY_PID" 2>/dev/null || true
    wait "$REGISTRY_PID" 2>/dev/null || true
    REGISTRY_PID=""
    stop_server
    rm -rf "$data" "$WORK/registry"
}
