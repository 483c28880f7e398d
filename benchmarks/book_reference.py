#!/usr/bin/python3
"""Time the book's own PyTorch attention code: the Python baseline of `make bench`.

Run with Debian's interpreter, which has torch 1.13.1 on OpenBLAS (the `python3` on PATH may have no torch):

    /usr/bin/python3 benchmarks/book_reference.py --threads 1 --out build/book-threads1.json
    /usr/bin/python3 benchmarks/book_reference.py --shapes toy,d2l --min-time 0.05 --repetitions 2 --no-memory

The attention code (tests/reference/d2l_book.py) is the book's "Attention Scoring Functions" code
(the `#@tab pytorch` blocks) and d2l's `sequence_mask`, with no `d2l` import, so that the numbers are
those of the code a reader runs.

Conventions shared with the C++ benchmarks (benchmarks/compare.py joins the two on them):
- case names: masked_softmax_{fwd,fwdbwd}, softmax_{fwd,fwdbwd}, dot_{fwd,fwdbwd}, additive_{fwd,fwdbwd};
- shape names: toy, d2l, mid, big (see SHAPES); inputs are float32 from a fixed seed, valid lengths are
  1-D, shape (B,), drawn uniformly from 1..m;
- `*_fwd` runs under torch.no_grad() (inference); `*_fwdbwd` runs the forward with inputs (and module
  parameters) requiring grad, then `out.backward(G)` with a fixed G;
- time is per iteration, the median over repetitions; peak memory is the growth of the peak resident set
  size (VmHWM) over one iteration in a fresh process.
"""

import argparse
import datetime
import gc
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections import namedtuple

import torch
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "tests",
                                "reference"))
from d2l_book import AdditiveAttention, DotProductAttention, masked_softmax  # noqa: E402

from report_io import write_report  # noqa: E402


# ----------------------------------------------------------------------------------------------------------
# Benchmark cases.

Shape = namedtuple("Shape", "B n m d h")
SHAPES = {
    "toy": Shape(B=2, n=1, m=10, d=2, h=8),
    "d2l": Shape(B=64, n=10, m=10, d=32, h=32),
    "mid": Shape(B=32, n=128, m=128, d=64, h=64),
    "big": Shape(B=8, n=512, m=512, d=64, h=128),
}
CASES = ["masked_softmax_fwd", "masked_softmax_fwdbwd", "softmax_fwd", "softmax_fwdbwd",
         "dot_fwd", "dot_fwdbwd", "additive_fwd", "additive_fwdbwd"]
SEED = 0


def make_inputs(shape):
    """Float32 queries, keys, values, scores and valid lengths from a fixed seed, the same in every process."""
    g = torch.Generator().manual_seed(SEED)
    B, n, m, d = shape.B, shape.n, shape.m, shape.d
    return {
        "queries": torch.randn(B, n, d, generator=g),
        "keys": torch.randn(B, m, d, generator=g),
        "values": torch.randn(B, m, d, generator=g),
        "scores": torch.randn(B, n, m, generator=g),
        "valid_lens": torch.randint(1, m + 1, (B,), generator=g),
        "grad_out": torch.randn(B, n, d, generator=g),
        "grad_scores": torch.randn(B, n, m, generator=g),
    }


def make_module(kind, shape):
    """The book's module in eval mode with dropout 0; parameters from a fixed seed."""
    torch.manual_seed(SEED)
    if kind == "dot":
        return DotProductAttention(dropout=0).eval()
    return AdditiveAttention(key_size=shape.d, query_size=shape.d, num_hiddens=shape.h, dropout=0).eval()


def softmax_step(masked, backward, x):
    """One call of masked_softmax(X, valid_lens) or of plain softmax on the same (B, n, m) scores.

    The book's sequence_mask writes into its argument, which autograd forbids on a view of a leaf that
    requires grad; the backward case therefore masks a clone, as the book's modules mask fresh scores.
    """
    X, lens = x["scores"], x["valid_lens"]
    if not backward:
        if masked:
            return lambda: masked_softmax(X, lens)
        return lambda: nn.functional.softmax(X, dim=-1)
    X.requires_grad_(True)
    G = x["grad_scores"]

    def step():
        X.grad = None
        Y = masked_softmax(X.clone(), lens) if masked else nn.functional.softmax(X, dim=-1)
        Y.backward(G)
    return step


def module_step(kind, backward, shape, x):
    """One forward (or forward and backward) call of the book's DotProductAttention or AdditiveAttention."""
    module = make_module(kind, shape)
    Q, K, V, lens = x["queries"], x["keys"], x["values"], x["valid_lens"]
    if not backward:
        return lambda: module(Q, K, V, lens)
    leaves = [Q, K, V] + list(module.parameters())
    for t in (Q, K, V):
        t.requires_grad_(True)
    G = x["grad_out"]

    def step():
        for t in leaves:
            t.grad = None
        module(Q, K, V, lens).backward(G)
    return step


def make_step(case, shape_name):
    """Build inputs (and module) for `case` at `shape_name`; return a no-argument callable doing one iteration."""
    shape = SHAPES[shape_name]
    x = make_inputs(shape)
    kind, _, mode = case.rpartition("_")
    backward = mode == "fwdbwd"
    if kind in ("masked_softmax", "softmax"):
        step = softmax_step(kind == "masked_softmax", backward, x)
    else:
        step = module_step(kind, backward, shape, x)
    if backward:
        return step

    def no_grad_step():
        with torch.no_grad():
            step()
    return no_grad_step


# ----------------------------------------------------------------------------------------------------------
# Timing.

def warm_up(step, seconds):
    """Run `step` once, then for about `seconds` more; return the first call's time and a per-call estimate.

    The first call pays one-time costs (allocations, thread start-up), so the estimate excludes it.
    """
    start = time.perf_counter()
    step()
    first = time.perf_counter() - start
    if first >= seconds:
        return first, first
    calls = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        step()
        calls += 1
    return first, (time.perf_counter() - start) / calls


def time_step(step, min_time, repetitions, slow_seconds, slow_repetitions):
    """Median per-iteration time over repetitions of as many iterations as fill `min_time`.

    A case whose first call already takes `slow_seconds` (big additive attention: seconds and gigabytes
    per call) runs `slow_repetitions` repetitions of one iteration, so the suite ends in minutes.
    """
    first, per_call = warm_up(step, min(min_time, 0.25))
    if first >= slow_seconds:
        repetitions, iterations = min(repetitions, slow_repetitions), 1
    else:
        iterations = max(1, math.ceil(min_time / per_call))
    times = []
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(repetitions):
            start = time.perf_counter()
            for _ in range(iterations):
                step()
            times.append((time.perf_counter() - start) / iterations)
    finally:
        if gc_was_enabled:
            gc.enable()
    return {"median_s": statistics.median(times), "repetitions_s": times, "iterations": iterations}


# ----------------------------------------------------------------------------------------------------------
# Peak memory.

def rss_bytes():
    """This process's current (VmRSS) and peak (VmHWM) resident set size in bytes, from /proc/self/status.

    Not getrusage's ru_maxrss: Linux carries the parent's high-water mark into a child across fork and
    exec, so a child started by a suite that has already run a big case would report the suite's peak.
    VmHWM belongs to the process's own address space, which exec makes afresh.
    """
    sizes = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                sizes[key] = int(rest.split()[0]) * 1024
    return sizes["VmRSS"], sizes["VmHWM"]


def reset_peak_rss():
    """Restart VmHWM from the current RSS (Linux 4.0+), so the peak that follows is the op's alone.

    Without it the baseline is the high-water mark left by importing torch and building inputs, which can
    hide an op that needs less than that transient did.
    """
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def peak_one(case, shape_name):
    """Peak memory of one iteration, measured inside this (fresh) process.

    One toy-shape call comes first so that one-time library initialisation (BLAS buffers, autograd
    threads) lands in the baseline, not in the delta of the measured shape.
    """
    make_step(case, "toy")()
    step = make_step(case, shape_name)
    gc.collect()
    reset_peak_rss()
    baseline = rss_bytes()[1]
    step()
    peak = rss_bytes()[1]
    return {"peak_rss_delta_bytes": peak - baseline, "peak_rss_bytes": peak, "baseline_rss_bytes": baseline}


def measure_peak(case, shape_name, threads):
    """Run `peak_one` in a fresh interpreter, so that no earlier case's freed-but-kept memory is counted."""
    command = [sys.executable, os.path.abspath(__file__), "--threads", str(threads),
               "--peak-one", case, shape_name]
    done = subprocess.run(command, check=True, stdout=subprocess.PIPE, text=True)
    return json.loads(done.stdout)


# ----------------------------------------------------------------------------------------------------------
# Report.

def cpu_model():
    """The CPU's marketing name from /proc/cpuinfo (platform.processor() is often empty on Linux)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_info():
    """What decides these numbers: the CPU, core count, and which BLAS libblas.so.3 resolves to."""
    blas = "/usr/lib/{}-linux-gnu/libblas.so.3".format(platform.machine())
    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_model": cpu_model(),
        "logical_cpus": os.cpu_count(),
        "python": platform.python_version(),
        "blas": os.path.realpath(blas) if os.path.exists(blas) else None,
        "omp_num_threads_env": os.environ.get("OMP_NUM_THREADS"),
    }


def run_suite(args):
    """Time every requested case at every requested shape and, unless --no-memory, measure its peak memory."""
    pairs = [(case, shape) for shape in args.shapes for case in args.cases]
    results = []
    for index, (case, shape) in enumerate(pairs, 1):
        row = {"case": case, "shape": shape}
        row.update(time_step(make_step(case, shape), args.min_time, args.repetitions,
                             args.slow_seconds, args.slow_repetitions))
        if args.memory:
            row.update(measure_peak(case, shape, args.threads))
        results.append(row)
        log_progress(index, len(pairs), row)
    return results


def log_progress(index, total, row):
    """One line per case on stderr, so that a run of several minutes shows where it is."""
    memory = ""
    if "peak_rss_delta_bytes" in row:
        memory = ", peak +{:.1f} MiB".format(row["peak_rss_delta_bytes"] / 2**20)
    print("[{}/{}] {} {}: median {:.4g} ms ({} reps x {} it){}".format(
        index, total, row["case"], row["shape"], row["median_s"] * 1e3,
        len(row["repetitions_s"]), row["iterations"], memory), file=sys.stderr, flush=True)


def report(args, results):
    """The JSON document that benchmarks/compare.py reads."""
    return {
        "implementation": "book-python",
        "torch_version": torch.__version__,
        "threads": torch.get_num_threads(),
        "machine": machine_info(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "config": {"min_time_s": args.min_time, "repetitions": args.repetitions,
                   "slow_seconds": args.slow_seconds, "slow_repetitions": args.slow_repetitions,
                   "forward_mode": "torch.no_grad", "seed": SEED, "dtype": "float32",
                   "peak_memory": "one iteration in a fresh process: VmHWM after it minus VmHWM reset "
                                  "(clear_refs 5) after a toy warm-up and building the inputs",
                   "shapes": {name: SHAPES[name]._asdict() for name in args.shapes}},
        "results": results,
    }


def name_list(choices):
    """argparse type for a comma-separated subset of `choices`, kept in the order given."""
    def parse(text):
        names = [name for name in text.split(",") if name]
        unknown = [name for name in names if name not in choices]
        if unknown or not names:
            raise argparse.ArgumentTypeError("expected a comma-separated subset of {}, got {!r}".format(
                ",".join(choices), text))
        return names
    return parse


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    p.add_argument("--shapes", type=name_list(list(SHAPES)), default=list(SHAPES),
                   help="comma-separated, from " + ",".join(SHAPES))
    p.add_argument("--cases", type=name_list(CASES), default=list(CASES),
                   help="comma-separated, from " + ",".join(CASES))
    p.add_argument("--min-time", type=float, default=0.5, help="seconds per repetition (default 0.5)")
    p.add_argument("--repetitions", type=int, default=5, help="repetitions per case (default 5)")
    p.add_argument("--slow-seconds", type=float, default=2.0,
                   help="a case whose first call takes this long runs --slow-repetitions of 1 iteration")
    p.add_argument("--slow-repetitions", type=int, default=3)
    p.add_argument("--no-memory", dest="memory", action="store_false", help="skip peak-memory measurement")
    p.add_argument("--out", help="write the JSON here instead of stdout")
    p.add_argument("--peak-one", nargs=2, metavar=("CASE", "SHAPE"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.threads < 1 or args.repetitions < 1 or args.slow_repetitions < 1 or args.min_time <= 0:
        p.error("--threads, --repetitions and --slow-repetitions must be positive, --min-time above 0")
    return args


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.peak_one:
        case, shape = args.peak_one
        print(json.dumps(peak_one(case, shape)))
        return
    print("book_reference: torch {} with {} thread(s)".format(torch.__version__, torch.get_num_threads()),
          file=sys.stderr)
    text = json.dumps(report(args, run_suite(args)), indent=2) + "\n"
    write_report(text, args.out)


if __name__ == "__main__":
    main()
