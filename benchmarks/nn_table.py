#!/usr/bin/env python3
"""The drop-ins of <d2l/nn.h> beside torch::nn's modules, as a markdown table.

    python3 benchmarks/nn_table.py build-torch2/bench-nn.json [more.json ...] [--out report.md]

Reads Google Benchmark JSON from benchmarks/bench_nn (names
`nn/<case>/<call>/<impl>/fwd_bwd/threads:1`, impl `d2l` or `torch_nn`), takes the median of
the repetitions of each (real time, and CPU time, which another process on the machine does
not inflate) and prints one row per case and file: both medians, ours / LibTorch's, and the
goal. The machine, date and command head the report. Standard library only.
"""

import argparse
import datetime
import json
import platform
import statistics
import sys

UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}
CASES = [
    ("mha_small", "default", "MultiheadAttention, L 10, N 64, E 32, 4 heads, default call", 0.6),
    ("mha_small", "causal", "MultiheadAttention, L 10, N 64, E 32, 4 heads, causal, no weights",
     0.6),
    ("mha_large", "default", "MultiheadAttention, L 128, N 32, E 512, 8 heads, default call",
     0.8),
    ("mha_large", "causal",
     "MultiheadAttention, L 128, N 32, E 512, 8 heads, causal, no weights", 0.8),
    ("encoder6", "default", "6 TransformerEncoderLayers, d_model 512, nhead 8, FFN 2048, "
     "L 128, N 8, training", 1.0),
]


def read(path):
    with open(path) as f:
        data = json.load(f)
    times = {}
    for row in data.get("benchmarks", []):
        if row.get("run_type", "iteration") != "iteration":
            continue
        parts = row.get("run_name", row["name"]).split("/")
        if len(parts) < 4 or parts[0] != "nn":
            continue
        unit = UNITS[row.get("time_unit", "ns")]
        real, cpu = times.setdefault((parts[1], parts[2], parts[3]), ([], []))
        real.append(row["real_time"] * unit)
        cpu.append(row["cpu_time"] * unit)
    med = {k: (statistics.median(r), statistics.median(c)) for k, (r, c) in times.items()}
    return med, data.get("context", {})


def ms(s):
    return f"{s * 1e3:.3g} ms"


def table(path):
    med, context = read(path)
    if not med:
        sys.exit(f"nn_table.py: no nn/ rows in {path}")
    version = context.get("torch_version", "?")
    out = [f"\nLibTorch {version} (ISA {context.get('d2l_cpu_isa', '?')}), 1 thread, forward + "
           "backward, medians (real time / CPU time):\n",
           "| case | d2l::nn | torch::nn | d2l / torch (real) | d2l / torch (CPU) | goal |",
           "| --- | --- | --- | --- | --- | --- |"]
    for case, call, what, goal in CASES:
        ours, theirs = med.get((case, call, "d2l")), med.get((case, call, "torch_nn"))
        if ours is None or theirs is None:
            continue
        ratio_real, ratio_cpu = ours[0] / theirs[0], ours[1] / theirs[1]
        met = "met" if ratio_cpu <= goal else "missed"
        out.append(f"| {what} | {ms(ours[0])} / {ms(ours[1])} | {ms(theirs[0])} / "
                   f"{ms(theirs[1])} | {ratio_real:.2f} | {ratio_cpu:.2f} | "
                   f"<= {goal} ({met}) |")
    floor = med.get(("mha_large", "floor", "projections"))
    large = med.get(("mha_large", "default", "torch_nn"))
    if floor and large:
        out.append(f"\nThe four projections alone at L 128, N 32, E 512 (GEMMs both run): "
                   f"{ms(floor[0])} / {ms(floor[1])}, {floor[1] / large[1]:.2f} of torch::nn's "
                   "default call (CPU).")
    return "\n".join(out) + "\n", context


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", nargs="+")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    body, context = "", {}
    for path in args.json:
        text, context = table(path)
        body += text
    head = (f"Machine: {platform.node()}, {context.get('num_cpus', '?')} CPUs at "
            f"{context.get('mhz_per_cpu', '?')} MHz; {datetime.date.today().isoformat()}; "
            f"`make bench-nn`.\n")
    text = head + body
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    sys.stdout.write(text)


if __name__ == "__main__":
    main()
