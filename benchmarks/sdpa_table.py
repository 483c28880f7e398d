#!/usr/bin/env python3
"""Dot-product attention without weights against LibTorch's SDPA, as a markdown table.

    python3 benchmarks/sdpa_table.py build-torch2/bench-sdpa-threads1.json [more.json ...]

Reads Google Benchmark JSON from bench_attention's `sdpa*` shapes (names
`<case>/<shape>/threads:<N>`, cases dot_fused_noweights_* (the flash kernel), dot_fused_weights_*
(the same with the (B, n, m) weights written and returned), dot_unfused_* (bmm, the fused
masked-softmax kernel, bmm: the path the flash kernel replaced) and sdpa_*), takes the
median aggregate (or the median of the iteration rows), and prints per shape and thread count the
medians and the ratios against SDPA measured in the same process, and each one's peak memory over one
call: the heap's high-water mark above its level at the call's start (`peak_heap_delta_bytes`,
counted exactly by benchmarks/heap_peak.cpp), or where that is missing the resident set's
(`peak_rss_delta_bytes`, which misses memory the allocator reuses). The largest over repetitions.
Standard library only.
"""

import re
import sys

from report_io import benchmark_rows, medians
CASES = ["dot_fused_noweights", "sdpa", "dot_fused_weights", "dot_unfused"]


def read(paths):
    peaks = {"peak_heap_delta_bytes": {}, "peak_rss_delta_bytes": {}}
    keyed = []
    for parts, row, seconds in benchmark_rows(paths):
        if len(parts) < 3 or not parts[1].startswith("sdpa"):
            continue
        threads = next((int(p.split(":")[1]) for p in parts[2:] if p.startswith("threads:")), 0)
        key = (parts[0], parts[1], threads)
        keyed.append((key, row, seconds))
        for field, seen in peaks.items():
            if field in row:
                seen[key] = max(seen.get(key, 0), row[field])
    field = "peak_heap_delta_bytes" if peaks["peak_heap_delta_bytes"] else "peak_rss_delta_bytes"
    return medians(keyed), peaks[field], "heap" if field == "peak_heap_delta_bytes" else "RSS"


def fmt_time(s):
    return f"{s * 1e3:.2f} ms" if s >= 1e-3 else f"{s * 1e6:.0f} µs"


def fmt_bytes(b):
    return f"{b / 2**20:.1f} MiB"


def shape_order(name):
    """sdpa<m>[q<n>][full]: n = m shapes first, then one-query (decoding) shapes; masked before
    unmasked; by keys."""
    match = re.fullmatch(r"sdpa(\d+)(q\d+)?(full)?", name)
    if match is None:
        return (2, False, 0, name)
    return (1 if match.group(2) else 0, match.group(3) is not None, int(match.group(1)), name)


def main(paths):
    medians, peaks, kind = read(paths)
    shapes = sorted({k[1] for k in medians}, key=shape_order)
    threads = sorted({k[2] for k in medians})
    print("| threads | shape | pass | flash | SDPA | flash / SDPA | with weights | "
          "its time / flash | bmm + softmax + bmm | its time / flash | "
          f"peak {kind} Δ flash | peak {kind} Δ SDPA |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for t in threads:
        for shape in shapes:
            for pass_ in ("fwd", "fwdbwd"):
                get = lambda case: medians.get((f"{case}_{pass_}", shape, t))
                flash, sdpa, softmax, unfused = (get(c) for c in CASES)
                if flash is None:
                    continue
                peak = lambda case: peaks.get((f"{case}_{pass_}", shape, t))
                pf, ps = peak("dot_fused_noweights"), peak("sdpa")
                cells = [str(t), shape, pass_, fmt_time(flash),
                         fmt_time(sdpa) if sdpa else "—",
                         f"{flash / sdpa:.2f}×" if sdpa else "—",
                         fmt_time(softmax) if softmax else "—",
                         f"{softmax / flash:.2f}×" if softmax else "—",
                         fmt_time(unfused) if unfused else "—",
                         f"{unfused / flash:.2f}×" if unfused else "—",
                         fmt_bytes(pf) if pf is not None else "—",
                         fmt_bytes(ps) if ps is not None else "—"]
                print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
