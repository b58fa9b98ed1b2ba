#!/usr/bin/env python3
"""yaml_tar.py CORPUS OUT BYTES: a tar of about BYTES built from the corpus's text files (YAML-heavy
bundle content), copied again and again under copy-K/ until it is large enough. Every copy differs
throughout, so it cannot be deduplicated chunk by chunk: a comment line naming the copy starts
every file and follows every 24th line (a 32 KiB chunk never repeats), and digits are rotated by K (versions, ports,
sizes change as between releases). Entries go in path order unless BENCH_TAR_ORDER=walk.
Deterministic: the same arguments give the same bytes."""
import io
import os
import sys
import tarfile

corpus, out, target = sys.argv[1], sys.argv[2], int(sys.argv[3])
files = []
for root, dirs, names in os.walk(corpus):
    dirs.sort()
    for name in sorted(names):
        path = os.path.join(root, name)
        if os.path.isfile(path) and not os.path.islink(path):
            with open(path, "rb") as f:
                data = f.read()
            try:
                files.append((os.path.relpath(path, corpus), data.decode("utf-8")))
            except UnicodeDecodeError:
                pass
if not files:
    sys.exit(f"no text files under {corpus}")

def copy_of(k, text):
    rotate = str.maketrans("0123456789", "".join(str((d + k) % 10) for d in range(10)))
    lines = text.translate(rotate).splitlines(keepends=True)
    for i in range(len(lines) // 24, -1, -1):
        lines.insert(i * 24, f"# bench copy {k}\n")
    return "".join(lines).encode()


# Which (copy, file) pairs make up the tar: a copy's size does not depend on K except through the
# digits of its comment line, so measure each one.
chosen = []
written = 0
k = 0
while written < target:
    for index, (rel, text) in enumerate(files):
        size = len(copy_of(k, text))
        chosen.append((f"copy-{k}/{rel}", k, index))
        written += size + 512
        if written >= target:
            break
    k += 1
# Written in path order (byte order of the names), as `kubectl stowage push` and `git archive`
# write a tree; BENCH_TAR_ORDER=walk keeps the order they were made in (the tree walked, copy
# after copy).
if os.environ.get("BENCH_TAR_ORDER", "path") == "path":
    chosen.sort(key=lambda c: c[0].encode())
with open(out, "wb") as raw, tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as tar:
    for name, copy, index in chosen:
        data = copy_of(copy, files[index][1])
        info = tarfile.TarInfo(name)
        info.size, info.mode, info.mtime = len(data), 0o644, 0
        tar.addfile(info, io.BytesIO(data))
print(f"{out}: {os.path.getsize(out)} bytes, {k} copies of {len(files)} text files")
