#!/usr/bin/env python3
"""Dot-product attention without weights against LibTorch's SDPA, as a markdown table.

    python3 benchmarks/sdpa_table.py [--cpu-time] build-torch2/bench-sdpa-threads1.json [more.json ...]

Reads Google Benchmark JSON from bench_attention's `sdpa*` shapes (names
`<case>/<shape>/threads:<N>`, cases dot_fused_noweights_* (the flash kernel), dot_fused_weights_*
(the same with the (B, n, m) weights written and returned), dot_unfused_* (bmm, the fused
masked-softmax kernel, bmm: the path the flash kernel replaced) and sdpa_*), takes the
median aggregate (or the median of the iteration rows), and prints per shape and thread count the
medians and the ratios against SDPA measured in the same process, and each one's peak memory over one
call: the heap's high-water mark above its level at the call's start (`peak_heap_delta_bytes`,
counted exactly by benchmarks/heap_peak.cpp), or where that is missing the resident set's
(`peak_rss_delta_bytes`, which misses memory the allocator reuses). The largest over repetitions.

bfloat16 (cases dot_fused_noweights_bf16_* and sdpa_bf16_*, the same inputs rounded to bfloat16)
gets a second table beside float32 (dot_fused_noweights_*): times, ratios, the useful rate (the
`useful_flop` counter: Q Kᵀ and P V over valid keys, 3.5 times that forward and backward) and its
fractions of the limits, which the `limits` shape measures in the same files (`fma_peak`: one
core's float32 FMA peak; `dpbf16_peak`: its VDPBF16PS peak; `mm_fp32`, `mm_bf16`: LibTorch's own
2048² torch::mm). Peaks are one core's: at N threads a fraction is of N times the peak. A header
line says the host, the date, the load and the LibTorch the files were measured with.
--cpu-time reads the process's CPU time instead of the real time: on a machine that other programs
load beyond its cores, the real time of a 1-thread case counts their turns too.
Standard library only.
"""

import json
import re
import sys

from report_io import benchmark_rows, medians
CASES = ["dot_fused_noweights", "sdpa", "dot_fused_weights", "dot_unfused"]
BF16_CASES = ["dot_fused_noweights_bf16", "sdpa_bf16", "dot_fused_noweights"]
LIMITS = ["fma_peak", "dpbf16_peak", "mm_fp32", "mm_bf16"]


def read(paths, flops=None, time="real_time"):
    """Medians {(case, shape, threads): seconds} of the sdpa* and limits rows, the peaks of
    memory and which kind they are; with `flops` (a dict) also each key's flop count per call
    (counters `useful_flop` and `flop`)."""
    peaks = {"peak_heap_delta_bytes": {}, "peak_rss_delta_bytes": {}}
    keyed = []
    for parts, row, seconds in benchmark_rows(paths, time):
        if len(parts) < 3 or not (parts[1].startswith("sdpa") or parts[1] == "limits"):
            continue
        threads = next((int(p.split(":")[1]) for p in parts[2:] if p.startswith("threads:")), 0)
        key = (parts[0], parts[1], threads)
        keyed.append((key, row, seconds))
        for field, seen in peaks.items():
            if field in row:
                seen[key] = max(seen.get(key, 0), row[field])
        if flops is not None:
            # The same on every row; the stddev and cv aggregates hold 0.
            for counter in ("useful_flop", "flop"):
                if counter in row:
                    flops[key] = max(flops.get(key, 0), row[counter])
    field = "peak_heap_delta_bytes" if peaks["peak_heap_delta_bytes"] else "peak_rss_delta_bytes"
    return medians(keyed), peaks[field], "heap" if field == "peak_heap_delta_bytes" else "RSS"


def context(paths):
    """The first file's Google Benchmark context: date, host, our custom keys."""
    with open(paths[0]) as f:
        return json.load(f).get("context", {})


def cpu_model():
    """This machine's CPU model and its bfloat16 engines, from /proc/cpuinfo ("" elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
    except OSError:
        return ""
    field = lambda name: (re.search(r"^%s\s*:\s*(.*)$" % name, text, re.M) or [None, "?"])[1]
    have = set(field("flags").split())
    engines = [f for f in ("avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile")
               if f in have]
    return (f"{field('model name')} (family {field('cpu family')} model {field('model')}; "
            + (", ".join(engines) or "no AVX-512") + ")")


def fmt_rate(flop, seconds):
    return f"{flop / seconds / 1e9:.0f}" if flop and seconds else "—"


def fmt_fraction(flop, seconds, limit):
    return f"{flop / seconds / limit:.2f}" if flop and seconds and limit else "—"


def limit_rate(medians, flops, case, threads):
    """FLOP/s of a `limits` row (fma_peak, dpbf16_peak, mm_fp32, mm_bf16), or None where it did
    not run."""
    key = (case, "limits", threads)
    return flops[key] / medians[key] if key in medians and key in flops else None


def bf16_table(medians, flops, threads, shapes):
    """The bfloat16 rows: ours (the bfloat16 kernel or the widened one) against SDPA in bfloat16
    and our float32, with the useful rates and their fractions of both limits."""
    limit = lambda case, t: limit_rate(medians, flops, case, t)
    fma, dp = limit("fma_peak", 1), limit("dpbf16_peak", 1)
    lines = []
    parts = [f"float32 FMA peak {fma / 1e9:.0f} GFLOP/s" if fma else None,
             f"VDPBF16PS peak {dp / 1e9:.0f} GFLOP/s" if dp else None]
    for t in threads:
        mm32, mm16 = limit("mm_fp32", t), limit("mm_bf16", t)
        if mm32 or mm16:
            parts.append(f"torch::mm 2048² at {t} thread{'s' if t > 1 else ''}: float32 "
                         f"{mm32 / 1e9 if mm32 else float('nan'):.0f}, bfloat16 "
                         f"{mm16 / 1e9 if mm16 else float('nan'):.0f} GFLOP/s")
    parts = [p for p in parts if p]
    if parts:
        lines.append("Limits (one core's peaks; at N threads the fractions are of N times them): "
                     + "; ".join(parts) + ".")
        lines.append("")
    lines.append("| threads | shape | pass | ours bf16 | SDPA bf16 | ours / SDPA | ours fp32 | "
                 "bf16 rate / fp32 rate | ours bf16 GFLOP/s | of FMA peak | of VDPBF16PS peak | "
                 "SDPA bf16 GFLOP/s |")
    lines.append("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for t in threads:
        for shape in shapes:
            for pass_ in ("fwd", "fwdbwd"):
                key = lambda case: (f"{case}_{pass_}", shape, t)
                ours, sdpa, fp32 = (medians.get(key(c)) for c in BF16_CASES)
                if ours is None:
                    continue
                flop = flops.get(key(BF16_CASES[0]))
                cells = [str(t), shape, pass_, fmt_time(ours),
                         fmt_time(sdpa) if sdpa else "—",
                         f"{ours / sdpa:.2f}×" if sdpa else "—",
                         fmt_time(fp32) if fp32 else "—",
                         f"{fp32 / ours:.2f}×" if fp32 else "—",
                         fmt_rate(flop, ours),
                         fmt_fraction(flop, ours, fma * t if fma else None),
                         fmt_fraction(flop, ours, dp * t if dp else None),
                         fmt_rate(flop, sdpa)]
                lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def fp32_table(medians, flops, threads, shapes):
    """The float32 flash rows' useful rates and their fraction of the FMA peak (N times it at N
    threads), beside SDPA's rate; empty without the `limits` shape."""
    fma = limit_rate(medians, flops, "fma_peak", 1)
    if not fma:
        return ""
    lines = [f"float32 against the FMA peak ({fma / 1e9:.0f} GFLOP/s a core):", "",
             "| threads | shape | pass | flash | flash GFLOP/s | of FMA peak | SDPA GFLOP/s |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for t in threads:
        for shape in shapes:
            for pass_ in ("fwd", "fwdbwd"):
                ours = medians.get((f"dot_fused_noweights_{pass_}", shape, t))
                sdpa = medians.get((f"sdpa_{pass_}", shape, t))
                flop = flops.get((f"dot_fused_noweights_{pass_}", shape, t))
                if ours is None or not flop:
                    continue
                cells = [str(t), shape, pass_, fmt_time(ours), fmt_rate(flop, ours),
                         fmt_fraction(flop, ours, fma * t), fmt_rate(flop, sdpa)]
                lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


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


def main(args):
    time = "cpu_time" if "--cpu-time" in args else "real_time"
    paths = [a for a in args if a != "--cpu-time"]
    flops = {}
    medians, peaks, kind = read(paths, flops, time)
    ctx = context(paths)
    host = cpu_model()
    if host or ctx:
        print(f"Host: {host or ctx.get('host_name', '?')}, {ctx.get('num_cpus', '?')} CPUs; "
              f"LibTorch {ctx.get('torch_version', '?')}; d2l kernels "
              f"{ctx.get('d2l_cpu_isa', '?')}; measured {ctx.get('date', '?')}, load average "
              f"at the start {ctx.get('load_average', '?')}; times are "
              f"{'CPU' if time == 'cpu_time' else 'real'} time.")
        print()
    shapes = sorted({k[1] for k in medians if k[1] != "limits"}, key=shape_order)
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
    peak_rows = fp32_table(medians, flops, threads, shapes)
    if peak_rows:
        print()
        print(peak_rows, end="")
    if any(k[0].startswith(BF16_CASES[0] + "_") for k in medians):
        print()
        print(bf16_table(medians, flops, threads, shapes), end="")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
