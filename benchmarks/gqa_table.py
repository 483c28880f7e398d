#!/usr/bin/env python3
"""Grouped-query attention: d2l::nn::functional::scaled_dot_product_attention against LibTorch's
own SDPA (enable_gqa), as a markdown table.

    python3 benchmarks/gqa_table.py [--peak GFLOPS] build-torch2/bench-gqa.json [more.json ...]

Reads bench_sdpa_gqa's Google Benchmark JSON (names `<ours|torch>_<f32|bf16>_<fwd|fwdbwd>/<shape>/
threads:<N>`), takes the median of each case's rows and prints, per shape, thread count, dtype and
pass, both medians, ours / torch (the issue's goal: at most 0.5), and our useful rate (the
`useful_flop` counter: Q Kᵀ and P V over the pairs that take part, 3.5 times that forward and
backward) with, given --peak (one core's float32 FMA peak in GFLOP/s, from
benchmarks/compute_peak.c), the float32 rows' fraction of the peak times the thread count. A header line says
the host, the date, the load and the LibTorch. Standard library only.
"""

import re
import sys

from report_io import impl_medians
from sdpa_table import context, cpu_model


def shape_order(name):
    m = re.fullmatch(r"gqa(\d+)_b(\d+)_n(\d+)(_causal)?", name)
    return (int(m[1]), int(m[3]), int(m[2]), bool(m[4])) if m else (0, 0, 0, name)


def fmt_time(s):
    return f"{s * 1e3:.1f} ms" if s < 10 else f"{s:.1f} s"


def main(args):
    peak = None
    if "--peak" in args:
        i = args.index("--peak")
        peak = float(args[i + 1]) * 1e9 if args[i + 1] else None  # "": no AVX-512 peak
        args = args[:i] + args[i + 2:]
    times, flops = impl_medians(args)
    ctx = context(args)
    print(f"Host: {cpu_model() or ctx.get('host_name', '?')}, {ctx.get('num_cpus', '?')} CPUs; "
          f"LibTorch {ctx.get('torch_version', '?')}; d2l kernels {ctx.get('d2l_cpu_isa', '?')}; "
          f"measured {ctx.get('date', '?')}, load average at the start "
          f"{ctx.get('load_average', '?')}; real time, medians."
          + (f" FMA peak {peak / 1e9:.0f} GFLOP/s a core." if peak else ""))
    print()
    print("| shape | threads | dtype | pass | ours | LibTorch SDPA | ours / SDPA | ours GFLOP/s |"
          + (" of the peak |" if peak else ""))
    print("| --- | --- | --- | --- | --- | --- | --- | --- |" + (" --- |" if peak else ""))
    shapes = sorted({k[3] for k in times}, key=shape_order)
    worst = {}
    for shape in shapes:
        for threads in sorted({k[4] for k in times}):
            for dtype in ("f32", "bf16"):
                for pas in ("fwd", "fwdbwd"):
                    ours, theirs = (times.get((who, dtype, pas, shape, threads))
                                    for who in ("ours", "torch"))
                    if ours is None or theirs is None:
                        continue
                    flop = flops.get(("ours", dtype, pas, shape, threads))
                    rate = flop / ours if flop else None
                    ratio = ours / theirs
                    worst[(dtype, pas)] = max(worst.get((dtype, pas), 0), ratio)
                    rate_s = f"{rate / 1e9:.0f}" if rate else "—"
                    row = (f"| {shape} | {threads} | {dtype} | {pas} | {fmt_time(ours)} | "
                           f"{fmt_time(theirs)} | {ratio:.2f} | {rate_s} |")
                    if peak:
                        # float32 only: bfloat16 may run on a matrix engine, which no
                        # register peak bounds.
                        row += (f" {rate / (peak * threads):.2f} |" if rate and dtype == "f32"
                                else " — |")
                    print(row)
    print()
    print("Largest ours / SDPA: " + ", ".join(
        f"{d} {p} {r:.2f}" for (d, p), r in sorted(worst.items())))


if __name__ == "__main__":
    main(sys.argv[1:])
