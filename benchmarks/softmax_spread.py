#!/usr/bin/env python3
"""How much the masked-softmax backward moves from run to run (issue 12, item 4).

Starts `bench_attention` RUNS times per thread count, each a fresh process,
and in each process times d2l::masked_softmax forward+backward (1-D valid
lengths) and ATen's softmax forward+backward on the same (32, 128, 128)
scores (the `mid` shape), interleaved, medians of REPS repetitions. Prints the
distribution over processes of each time and of their ratio: minimum,
quartiles, median, maximum. A ratio that moves with the softmax's own time is
the machine, not the op.

    softmax_spread.py BENCH_ATTENTION [--runs 20] [--threads 1,2] [--out FILE]

Only the standard library: runs with any python3.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

from report_io import write_report

CASES = ("masked_softmax_fwdbwd", "softmax_fwdbwd")


def one_run(bench, threads, reps, min_time):
    """Medians (µs) of the two cases in one fresh process."""
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(threads))
    cmd = [
        bench, "--threads", str(threads), "--shapes", "mid", "--no-memory",
        "--benchmark_filter=^(%s)/" % "|".join(CASES),
        "--benchmark_repetitions=%d" % reps,
        "--benchmark_report_aggregates_only=true",
        "--benchmark_enable_random_interleaving=true",
        "--benchmark_min_time=%s" % min_time,
        "--benchmark_format=json",
    ]
    out = subprocess.run(cmd, env=env, check=True, stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True).stdout
    medians = {}
    for b in json.loads(out)["benchmarks"]:
        if b.get("aggregate_name") != "median":
            continue
        name = b["run_name"].split("/")[0]
        scale = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}[b["time_unit"]]
        medians[name] = b["real_time"] * scale
    missing = [c for c in CASES if c not in medians]
    if missing:
        sys.exit("softmax_spread.py: %s printed no median for %s" % (bench, ", ".join(missing)))
    return medians


def quantiles(xs):
    """Minimum, first quartile, median, third quartile, maximum."""
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return [min(xs), q[0], statistics.median(xs), q[2], max(xs)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("bench", help="path of bench_attention")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--min-time", default="0.2")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    if args.runs < 2:
        sys.exit("softmax_spread.py: --runs must be at least 2, got %d" % args.runs)

    thread_counts = [int(t) for t in args.threads.split(",")]
    runs = {t: [] for t in thread_counts}
    for i in range(args.runs):  # thread counts alternate, run after run
        for t in thread_counts:
            runs[t].append(one_run(args.bench, t, args.reps, args.min_time))
            print("run %d/%d, %d thread(s): masked %.0f µs, softmax %.0f µs" % (
                i + 1, args.runs, t, runs[t][-1][CASES[0]], runs[t][-1][CASES[1]]),
                file=sys.stderr)

    lines = [
        "(32, 128, 128) float32 scores, 1-D valid lengths; forward+backward; "
        "%d processes per thread count, each the median of %d repetitions "
        "(µs; ratio = masked_softmax / softmax, per process)" % (args.runs, args.reps),
        "",
        "| threads | quantity | min | 25% | median | 75% | max |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for t in thread_counts:
        masked = [r[CASES[0]] for r in runs[t]]
        plain = [r[CASES[1]] for r in runs[t]]
        ratio = [m / p for m, p in zip(masked, plain)]
        for label, xs, fmt in (("d2l::masked_softmax", masked, "%.0f"),
                               ("torch::softmax", plain, "%.0f"),
                               ("ratio", ratio, "%.2f×")):
            lines.append("| %d | %s | %s |" % (t, label, " | ".join(fmt % x for x in quantiles(xs))))
    lines.append("")
    for t in thread_counts:
        ratio = [r[CASES[0]] / r[CASES[1]] for r in runs[t]]
        lines.append("Ratio per process in run order, %d thread(s): %s" % (
            t, ", ".join("%.2f" % x for x in ratio)))
    write_report("\n".join(lines) + "\n", args.out)


if __name__ == "__main__":
    main()
