#!/usr/bin/env python3
"""What storing bundle trees as base64 in ConfigMaps would take (scripts/bench.sh corpus).

Usage: configmaps.py DIR... ; prints `<configmaps> <bytes>`: every file of each DIR goes into the
`binaryData` of ConfigMaps of that revision (base64; the key is the path with `/` as `.`-safe
`__`, since keys must match [-._a-zA-Z0-9]+), first-fit in file order, at most 1 MiB of data per
ConfigMap (the API server's limit); a file whose encoding is larger is split into 1 MiB parts,
one ConfigMap each. Bytes are keys plus base64 values: what etcd holds for the data, before
object metadata and before MVCC keeps older versions.
"""

import base64
import os
import sys

LIMIT = 1 << 20  # ConfigMap data limit: 1 MiB.


def files(root):
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            if os.path.isfile(path) and not os.path.islink(path):
                yield os.path.relpath(path, root), path


def revision(root):
    """(configmaps, bytes) for one tree."""
    count, used, total = 0, LIMIT, 0  # `used = LIMIT`: the first file opens a ConfigMap.
    for rel, path in files(root):
        key = rel.replace("/", "__")
        with open(path, "rb") as f:
            size = len(key) + len(base64.b64encode(f.read()))
        total += size
        if size > LIMIT:
            count += -(-size // LIMIT)
            used = LIMIT
        elif used + size > LIMIT:
            count, used = count + 1, size
        else:
            used += size
    return max(count, 1), total


def main():
    count = total = 0
    for root in sys.argv[1:]:
        c, t = revision(root)
        count, total = count + c, total + t
    print(count, total)


if __name__ == "__main__":
    main()
