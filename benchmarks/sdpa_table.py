#!/usr/bin/env python3
"""Dot-product attention without weights against LibTorch's SDPA, as a markdown table.

    python3 benchmarks/sdpa_table.py build-torch2/bench-sdpa-threads1.json [more.json ...]

Reads Google Benchmark JSON from bench_attention's `sdpa*` shapes (names
`<case>/<shape>/threads:<N>`, cases dot_fused_noweights_*, dot_auto_noweights_*, sdpa_*), takes the
median aggregate (or the median of the iteration rows), and prints per shape and thread count the
medians and the ratios against SDPA measured in the same process. Standard library only.
"""

import json
import statistics
import sys
from collections import defaultdict

UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}
CASES = ["dot_fused_noweights", "dot_auto_noweights", "sdpa"]


def read(paths):
    rows = defaultdict(list)   # (case, shape, threads) -> seconds
    peaks = {}
    medians = {}
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        for row in data.get("benchmarks", []):
            parts = row["run_name"].split("/") if "run_name" in row else row["name"].split("/")
            if len(parts) < 3 or not parts[1].startswith("sdpa"):
                continue
            threads = next((int(p.split(":")[1]) for p in parts[2:] if p.startswith("threads:")), 0)
            key = (parts[0], parts[1], threads)
            seconds = row["real_time"] * UNITS[row.get("time_unit", "ns")]
            if row.get("aggregate_name") == "median":
                medians[key] = seconds
            elif row.get("run_type", "iteration") == "iteration":
                rows[key].append(seconds)
            if "peak_rss_delta_bytes" in row:
                peaks[key] = max(peaks.get(key, 0), row["peak_rss_delta_bytes"])
    for key, values in rows.items():
        medians.setdefault(key, statistics.median(values))
    return medians, peaks


def fmt_time(s):
    return f"{s * 1e3:.2f} ms" if s >= 1e-3 else f"{s * 1e6:.0f} µs"


def fmt_bytes(b):
    return f"{b / 2**20:.1f} MiB"


def main(paths):
    medians, peaks = read(paths)
    shapes = sorted({k[1] for k in medians}, key=lambda s: int(s[4:]))
    threads = sorted({k[2] for k in medians})
    print("| threads | shape | pass | fused (no weights) | kAuto | SDPA | fused / SDPA | kAuto / SDPA "
          "| peak Δ fused | peak Δ SDPA |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for t in threads:
        for shape in shapes:
            for pass_ in ("fwd", "fwdbwd"):
                get = lambda case: medians.get((f"{case}_{pass_}", shape, t))
                fused, auto, sdpa = (get(c) for c in CASES)
                if fused is None or sdpa is None:
                    continue
                peak = lambda case: peaks.get((f"{case}_{pass_}", shape, t))
                pf, ps = peak("dot_fused_noweights"), peak("sdpa")
                print(f"| {t} | {shape} | {pass_} | {fmt_time(fused)} | "
                      f"{fmt_time(auto) if auto else '—'} | {fmt_time(sdpa)} | {fused / sdpa:.2f}× | "
                      f"{(auto / sdpa) if auto else float('nan'):.2f}× | "
                      f"{fmt_bytes(pf) if pf is not None else '—'} | "
                      f"{fmt_bytes(ps) if ps is not None else '—'} |")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
