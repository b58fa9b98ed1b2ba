#!/usr/bin/env python3
"""Turns the measurements scripts/bench.sh collected into Markdown tables.

Input (argv[1]): tab-separated lines `section, figure, unit, value[, target]`, one per measurement
and run. Figures keep the order of their first appearance; every figure gets min / median / max
over its runs. Units: bytes, `bytes:RAW` (bytes, also shown as % of RAW), %, x (a ratio), MB/s,
MiB, s, count. `target` is `<=X` or `<X` (for `bytes:RAW`, in % of RAW) and is judged on the worst
run: it is "met" only if every run meets it.
"""

import statistics
import sys
from collections import OrderedDict


def fmt(value, unit):
    if unit.startswith("bytes:"):
        return f"{fmt(value, 'bytes')} ({value / float(unit[6:]) * 100:.2f} %)"
    if unit == "bytes":
        if abs(value) >= 1e6:
            return f"{value / 1e6:,.2f} MB"
        if abs(value) >= 1e3:
            return f"{value / 1e3:,.1f} kB"
        return f"{value:,.0f} B"
    if unit == "%":
        return f"{value:.2f} %"
    if unit == "x":
        return f"{value:.2f}×"
    if unit == "MB/s":
        return f"{value:,.0f} MB/s"
    if unit == "MiB":
        return f"{value:,.1f} MiB"
    if unit == "s":
        return f"{value:,.1f} s"
    if unit == "count":
        return f"{value:,.0f}"
    return f"{value:g} {unit}"


def verdict(values, unit, target):
    """`target` in the figure's unit; for `bytes:RAW` figures, in % of RAW."""
    if not target:
        return ""
    if unit.startswith("bytes:"):
        values = [v / float(unit[6:]) * 100 for v in values]
        suffix = " %"
    else:
        suffix = {"x": "×", "MiB": " MiB", "MB/s": " MB/s", "%": " %"}.get(unit, "")
    if target.startswith("<="):
        limit = float(target[2:])
        ok = all(v <= limit for v in values)
        shown = f"≤ {target[2:]}{suffix}"
    elif target.startswith("<"):
        limit = float(target[1:])
        ok = all(v < limit for v in values)
        shown = f"< {target[1:]}{suffix}"
    else:
        raise SystemExit(f"unknown target {target!r}")
    return f"{shown}: **{'met' if ok else 'not met'}**"


def main():
    sections = OrderedDict()
    with open(sys.argv[1], encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line:
                continue
            parts = line.split("\t")
            section, figure, unit, value = parts[:4]
            target = parts[4] if len(parts) > 4 else ""
            entry = sections.setdefault(section, OrderedDict()).setdefault(
                figure, {"unit": unit, "values": [], "target": target}
            )
            entry["values"].append(float(value))
            if target:
                entry["target"] = target
    for section, figures in sections.items():
        print(f"### {section}")
        print()
        print("| Figure | median | min | max | runs | target |")
        print("|---|---:|---:|---:|---:|---|")
        for figure, e in figures.items():
            v, u = e["values"], e["unit"]
            print(
                f"| {figure} | {fmt(statistics.median(v), u)} | {fmt(min(v), u)} | {fmt(max(v), u)} "
                f"| {len(v)} | {verdict(v, u, e['target'])} |"
            )
        print()


if __name__ == "__main__":
    main()
