# The unpack scenario of scripts/bench.sh (sourced): Bundles from a local registry beside skopeo + tar.
# shellcheck shell=bash

# ------------------------------------------------------------------------------------------------
# 5. Unpacking images from a registry, beside skopeo copy + tar -x

# start_registry [CERT KEY]: a docker-registry on a free port, storage under $WORK/registry; sets
# REGISTRY. With CERT and KEY it serves HTTPS with them (the registry scenario, so both registries
# pay the same TLS), else plain HTTP.
start_registry() {
    local port tls="" scheme=http check=()
    port="$(free_port)"
    REGISTRY="127.0.0.1:$port"
    if [ "$#" -eq 2 ]; then
        tls=", tls: {certificate: $1, key: $2}"
        scheme=https
        check=(--cacert "$SERVER_DIR/pki/ca.crt")
    fi
    mkdir -p "$WORK/registry"
    cat >"$WORK/registry.yml" <<YAML
version: 0.1
log: {level: error}
storage: {filesystem: {rootdirectory: $WORK/registry}, delete: {enabled: true}}
http: {addr: $REGISTRY$tls}
YAML
    docker-registry serve "$WORK/registry.yml" >"$WORK/registry.log" 2>&1 &
    REGISTRY_PID=$!
    local deadline=$((SECONDS + 30))
    until curl -sf "${check[@]}" "$scheme://$REGISTRY/v2/" >/dev/null; do
        [ "$SECONDS" -lt "$deadline" ] || die "registry not ready"
        sleep 0.2
    done
}

# push_image NAME LAYER...: builds an OCI layout with examples/ociimage and pushes it as NAME:v1.
push_image() {
    local name="$1"
    shift
    rm -rf "$WORK/layout-$name"
    "$OCIIMAGE" "$WORK/layout-$name" v1 "$@"
    skopeo copy -q --dest-tls-verify=false "oci:$WORK/layout-$name:v1" "docker://$REGISTRY/$name:v1" >&2
}

# wait_unpacked NAME: polls the Bundle until Unpacked=True (dies on a failure reason).
wait_unpacked() {
    local deadline=$((SECONDS + 900)) state
    while :; do
        state="$(api "$API/namespaces/$NS/bundles/$1" | python3 -c 'import json,sys
c=[x for x in json.load(sys.stdin).get("status",{}).get("conditions",[]) if x["type"]=="Unpacked"]
print(c[0]["status"]+" "+c[0]["reason"]+" "+c[0].get("message","") if c else "none")')"
        case "$state" in
            True*) return 0 ;;
            "False Pending"* | "False Unpacking"* | none) ;;
            *) die "bundle $1: $state" ;;
        esac
        [ "$SECONDS" -lt "$deadline" ] || die "bundle $1 not unpacked after 900 s"
        sleep 0.05
    done
}

# baseline NAME: skopeo copy to an OCI layout, then tar -x of every layer in order; sets B_SECS
# and B_RSS_MIB (the larger peak of the two tools).
baseline() {
    local dir="$WORK/pull-$1" out="$WORK/extract-$1" t0 rss1 rss2 layer
    rm -rf "$dir" "$out"
    mkdir -p "$out"
    t0="$(now)"
    rss1="$(/usr/bin/time -f %M skopeo copy -q --src-tls-verify=false "docker://$REGISTRY/$1:v1" "oci:$dir:v1" 2>&1 >/dev/null | tail -n 1)"
    rss2=0
    for layer in $(python3 - "$dir" <<'PY'
import json, sys
d = sys.argv[1]
index = json.load(open(f"{d}/index.json"))
digest = index["manifests"][0]["digest"].split(":")[1]
manifest = json.load(open(f"{d}/blobs/sha256/{digest}"))
for layer in manifest["layers"]:
    print(f"{d}/blobs/sha256/" + layer["digest"].split(":")[1])
PY
    ); do
        local r
        r="$(/usr/bin/time -f %M tar -xzf "$layer" -C "$out" 2>&1 | tail -n 1)"
        [ "$r" -gt "$rss2" ] && rss2="$r"
    done
    B_SECS="$(calc "$(now) - $t0")"
    B_RSS_MIB="$(calc "max($rss1, $rss2) / 1024")"
    rm -rf "$dir" "$out"
}

scenario_unpack() {
    start_registry
    log "building and pushing images"
    push_image kps "dir:$corpus/kube-prometheus-stack/88.5.3"
    # 1 GiB in four layers of 64 files × 4 MiB (incompressible), over a small plain bundle.
    push_image big "dir:$corpus/rukpak-testdata/plain-v0/valid" random:64:4194304 random:64:4194304 \
        random:64:4194304 random:64:4194304
    SERVER_ARGS=(--insecure-registry "$REGISTRY")
    local run image section
    for run in $(seq "$RUNS"); do
        for image in kps big; do
            section="unpack from a local registry: $image image"
            [ "$image" = big ] && section="unpack from a local registry: 1 GiB, 4 layers"
            [ "$image" = kps ] && section="unpack from a local registry: kube-prometheus-stack 88.5.3 chart image"
            log "unpack $image, run $run"
            local data="$WORK/unpack-$image-$run" t0 secs
            start_server "$data"
            t0="$(now)"
            api -X POST -H 'Content-Type: application/json' -o /dev/null \
                -d "{\"apiVersion\":\"content.stowage.dev/v1alpha1\",\"kind\":\"Bundle\",\"metadata\":{\"name\":\"$image\"},\"spec\":{\"sources\":[{\"image\":{\"ref\":\"$REGISTRY/$image:v1\"}}]}}" \
                "$API/namespaces/$NS/bundles"
            wait_unpacked "$image"
            secs="$(calc "$(now) - $t0")"
            record "$section" "**stowage: Bundle created → Unpacked**" s "$secs"
            record "$section" "stowage: server peak RSS (VmHWM)" MiB "$(calc "$(peak_rss_kib) / 1024")"
            stop_server
            rm -rf "$data"
            baseline "$image"
            record "$section" "skopeo copy + tar -x (plain tools)" s "$B_SECS"
            record "$section" "plain tools: peak RSS of skopeo / tar" MiB "$B_RSS_MIB"
            record "$section" "**ratio stowage / plain tools**" x "$(calc "$secs / $B_SECS")"
        done
    done
    SERVER_ARGS=()
}

