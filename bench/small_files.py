#!/usr/bin/env python3
"""Writes COUNT small, varied text files (YAML-ish, 200 B – 1.5 kB) under DIR/small/, deterministically.

Usage: small_files.py DIR COUNT
"""

import os
import random
import sys

WORDS = (
    "apiVersion kind metadata name namespace labels annotations spec template containers image "
    "resources limits requests cpu memory ports containerPort env value volumeMounts mountPath "
    "replicas selector matchLabels serviceAccountName rules apiGroups verbs get list watch"
).split()


def main():
    root, count = sys.argv[1], int(sys.argv[2])
    rng = random.Random(42)
    for i in range(count):
        sub = os.path.join(root, "small", f"d{i // 500:02d}")
        os.makedirs(sub, exist_ok=True)
        lines = [f"# file {i}"]
        target = rng.randint(200, 1500)
        size = len(lines[0])
        while size < target:
            depth = rng.randint(0, 4)
            line = "  " * depth + f"{rng.choice(WORDS)}: {rng.choice(WORDS)}-{rng.randint(0, 99999)}"
            lines.append(line)
            size += len(line) + 1
        with open(os.path.join(sub, f"f{i:05d}.yaml"), "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
