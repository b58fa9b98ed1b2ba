#!/usr/bin/env bash
# Builds the stowage server image with no base image: the release binary, the shared libraries it
# loads, CA roots, /etc/passwd for uid 65532 and an empty /tmp, committed with buildah from
# `scratch`. The image goes into the local image store (podman and buildah share it) as
# localhost/stowage:VERSION (the crate's version; the commit is the label
# org.opencontainers.image.revision) and into target/image/stowage-VERSION.oci.tar, an OCI archive
# that `podman load`, `ctr images import` and `skopeo copy oci-archive:…` take. The same binary at
# the same commit gives the same image digest: every timestamp is 0 and nothing of the build host
# but the binary, its libraries and the CA roots goes in.
#
#   scripts/image.sh                        cargo build --release, then the image
#   scripts/image.sh --binary PATH          an image of an already built binary (CI: the test build)
#   scripts/image.sh --tag NAME:TAG         another name in the local store (the archive keeps it)
#   scripts/image.sh --out DIR              where the OCI archive goes (default target/image)
#   scripts/image.sh --print-ref            print the reference it would tag, build nothing
set -euo pipefail

cd "$(dirname "$0")/.."
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n1)
ref="localhost/stowage:$version"
binary=""
out="target/image"
while [ $# -gt 0 ]; do
    case "$1" in
        --binary) binary="$2"; shift 2 ;;
        --tag) ref="$2"; shift 2 ;;
        --out) out="$2"; shift 2 ;;
        --print-ref) echo "$ref"; exit 0 ;;
        -h|--help) sed -n '2,16s/^# \{0,1\}//p' "$0"; exit 0 ;;
        *) echo "image.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done

for tool in buildah ldd strip; do
    command -v "$tool" >/dev/null || {
        echo "image.sh: $tool not found (Debian: apt-get install buildah binutils)" >&2
        exit 1
    }
done
started=$(date +%s)
if [ -z "$binary" ]; then
    cargo build --release --locked --bin stowage
    binary=target/release/stowage
fi
[ -x "$binary" ] || { echo "image.sh: no executable at $binary" >&2; exit 1; }

work=$(mktemp -d "${TMPDIR:-/tmp}/stowage-image.XXXXXX")
container=""
cleanup() {
    [ -n "$container" ] && buildah rm "$container" >/dev/null 2>&1
    rm -rf "$work"
}
trap cleanup EXIT

# The root filesystem, owned by root; beside it the two directories the server writes, owned by
# 65532 (`buildah copy --chown` sets the owner of what it copies, not of the directory it copies into).
root="$work/root"
owned="$work/owned"
mkdir -p "$root/usr/local/bin" "$root/etc/ssl/certs" "$root/tmp" "$root/var/lib" "$root/home" \
    "$owned/var/lib/stowage" "$owned/home/nonroot"
# A copy without symbols (the release profile strips already; a test build does not).
strip --strip-all -o "$root/usr/local/bin/stowage" "$binary"
chmod 0755 "$root/usr/local/bin/stowage"
# Every library the loader maps, at the path it asks for (the loader itself included).
ldd "$binary" | sed -n 's/.*=> \(\/[^ ]*\) .*/\1/p; s/^[[:space:]]*\(\/[^ ]*\) .*/\1/p' | sort -u |
    while read -r lib; do
        mkdir -p "$root$(dirname "$lib")"
        cp -L "$lib" "$root$lib"
    done
cp -L /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' \
    > "$root/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' > "$root/etc/group"
printf 'hosts: files dns\n' > "$root/etc/nsswitch.conf"
chmod 1777 "$root/tmp"
chmod 0750 "$owned/var/lib/stowage" "$owned/home/nonroot"
find "$root" "$owned" -exec touch -h -d @0 {} +

commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)
git diff --quiet HEAD 2>/dev/null || commit="$commit-dirty"
container=$(buildah from --quiet scratch)
buildah copy --quiet "$container" "$root" / >/dev/null
# The two writable directories: a volume mounted there without fsGroup is still the server's.
buildah copy --quiet --chown 65532:65532 "$container" "$owned/var/lib" /var/lib >/dev/null
buildah copy --quiet --chown 65532:65532 "$container" "$owned/home" /home >/dev/null
buildah config \
    --user 65532:65532 \
    --workingdir / \
    --env HOME=/home/nonroot \
    --env TMPDIR=/tmp \
    --env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
    --port 8443/tcp \
    --volume /var/lib/stowage \
    --entrypoint '["/usr/local/bin/stowage"]' \
    --cmd '["serve", "--data-dir", "/var/lib/stowage", "--listen", "0.0.0.0:8443"]' \
    --label org.opencontainers.image.title=stowage \
    --label org.opencontainers.image.version="$version" \
    --label org.opencontainers.image.revision="$commit" \
    --label org.opencontainers.image.licenses=Apache-2.0 \
    "$container"
# --timestamp 0: the config's dates and every file's mtime, so the digest is the content's.
buildah commit --quiet --format oci --timestamp 0 --rm "$container" "$ref" >/dev/null
container=""

mkdir -p "$out"
archive="$out/stowage-$version.oci.tar"
[ "$ref" = "localhost/stowage:$version" ] || archive="$out/$(echo "${ref##*/}" | tr ':' '-').oci.tar"
rm -f "$archive"
buildah push --quiet "$ref" "oci-archive:$archive:$ref" >/dev/null
digest=$(tar -xOf "$archive" index.json | sed -n 's/.*"digest":"\(sha256:[0-9a-f]*\)".*/\1/p')
id=$(buildah images --noheading --no-trunc --format '{{.ID}}' "$ref" | head -n1)
echo "image.sh: $ref (manifest $digest, image id ${id#sha256:})"
echo "image.sh: $archive, $(du -m "$archive" | cut -f1) MB compressed; binary $(du -m "$root/usr/local/bin/stowage" | cut -f1) MB, root filesystem $(du -sm "$root" "$owned" | awk '{n += $1} END {print n}') MB; built in $(( $(date +%s) - started )) s"
