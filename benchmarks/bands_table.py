#!/usr/bin/env python3
"""Sliding windows and packed sequences (bench_sdpa_bands) as a markdown table.

    python3 benchmarks/bands_table.py [--peak GFLOPS] build-torch2/bench-bands.json [more.json ...]

Reads bench_sdpa_bands' Google Benchmark JSON (names `<ours|torch>_<f32|bf16>_<fwd|fwdbwd>/<case>/
threads:<N>`), takes the median of each case's rows and prints, per thread count, dtype and pass:
the window of 512 over 8192 keys against 16 blocks of 512 (as many pairs: the issue's goal is at
most 1.2), packed sequences against the same ones each in a call of its own (the same tokens, no
padding: goal at most 1.05) and padded to the longest with lengths, and
each of ours beside LibTorch's SDPA given the same attention as a boolean mask; with --peak (one
core's float32 FMA peak in GFLOP/s, benchmarks/compute_peak.c), the float32 rows' fraction of the
peak times the thread count, from the `useful_flop` counter (pairs that take part). Standard
library only.
"""

import sys

from report_io import impl_medians
from sdpa_table import context, cpu_model


def fmt_time(s):
    return "—" if s is None else (f"{s * 1e3:.1f} ms" if s < 10 else f"{s:.1f} s")


def ratio(a, b):
    return "—" if a is None or b is None else f"{a / b:.2f}"


def main(args):
    peak = None
    if "--peak" in args:
        i = args.index("--peak")
        peak = float(args[i + 1]) * 1e9 if args[i + 1] else None
        args = args[:i] + args[i + 2:]
    times, flops = impl_medians(args)
    ctx = context(args)
    print(f"Host: {cpu_model() or ctx.get('host_name', '?')}, {ctx.get('num_cpus', '?')} CPUs; "
          f"LibTorch {ctx.get('torch_version', '?')}; d2l kernels {ctx.get('d2l_cpu_isa', '?')}; "
          f"measured {ctx.get('date', '?')}; real time, medians; H 8, E 128."
          + (f" FMA peak {peak / 1e9:.0f} GFLOP/s a core." if peak else ""))
    print()
    print("| threads | dtype | pass | window 512 / 8192 | 16 blocks of 512 | window / blocks "
          "| packed | one call each | packed / one each | padded | packed / padded "
          "| window: SDPA, mask | padded: SDPA, mask "
          "| packed GFLOP/s |" + (" of the peak |" if peak else ""))
    print("|" + " --- |" * (14 + (1 if peak else 0)))
    for threads in sorted({k[4] for k in times}):
        for dtype in ("f32", "bf16"):
            for pas in ("fwd", "fwdbwd"):
                t = {c: times.get(("ours", dtype, pas, c, threads))
                     for c in ("window512_n8192", "blocks16_n512", "packed16", "separate16",
                               "padded16")}
                s = {c: times.get(("torch", dtype, pas, c, threads))
                     for c in ("window512_n8192", "padded16")}
                if all(v is None for v in t.values()):
                    continue
                flop = flops.get(("ours", dtype, pas, "packed16", threads))
                rate = flop / t["packed16"] if flop and t["packed16"] else None
                rate_s = f"{rate / 1e9:.0f}" if rate else "—"
                row = (f"| {threads} | {dtype} | {pas} | {fmt_time(t['window512_n8192'])} | "
                       f"{fmt_time(t['blocks16_n512'])} | "
                       f"{ratio(t['window512_n8192'], t['blocks16_n512'])} | "
                       f"{fmt_time(t['packed16'])} | {fmt_time(t['separate16'])} | "
                       f"{ratio(t['packed16'], t['separate16'])} | {fmt_time(t['padded16'])} | "
                       f"{ratio(t['packed16'], t['padded16'])} | "
                       f"{fmt_time(s['window512_n8192'])} | {fmt_time(s['padded16'])} | "
                       f"{rate_s} |")
                if peak:
                    row += (f" {rate / (peak * threads):.2f} |" if rate and dtype == "f32"
                            else " — |")
                print(row)


if __name__ == "__main__":
    main(sys.argv[1:])
