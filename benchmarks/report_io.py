"""Where the benchmark scripts write their reports, and how they read Google Benchmark's JSON."""

import json
import re
import statistics
import sys
from collections import defaultdict

UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}


def benchmark_rows(paths, time="real_time"):
    """Yields (name parts split on '/', row, time in seconds) for every row of the Google
    Benchmark JSON files `paths`: real time, or with time="cpu_time" the process's CPU time."""
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        for row in data.get("benchmarks", []):
            parts = row.get("run_name", row["name"]).split("/")
            yield parts, row, row[time] * UNITS[row.get("time_unit", "ns")]


def medians(keyed_rows):
    """{key: median seconds} from (key, row, seconds) triples: the median aggregate where the run
    wrote one, else the median of the iteration rows."""
    rows, result = defaultdict(list), {}
    for key, row, seconds in keyed_rows:
        if row.get("aggregate_name") == "median":
            result[key] = seconds
        elif row.get("run_type", "iteration") == "iteration":
            rows[key].append(seconds)
    for key, values in rows.items():
        result.setdefault(key, statistics.median(values))
    return result


def impl_medians(paths):
    """The medians and useful-flop counters of the Python-SDPA benchmarks (bench_sdpa_gqa,
    bench_sdpa_bands: names `<ours|torch>_<f32|bf16>_<fwd|fwdbwd>/<case>/threads:<N>`), each
    keyed (impl, dtype, pass, case, threads): ({key: median seconds}, {key: useful flop})."""
    keyed, flops = [], {}
    for parts, row, seconds in benchmark_rows(paths):
        m = re.fullmatch(r"(ours|torch)_(f32|bf16)_(fwd|fwdbwd)", parts[0])
        if not m or len(parts) < 3:
            continue
        key = (m[1], m[2], m[3], parts[1], int(parts[2].split(":")[1]))
        keyed.append((key, row, seconds))
        if "useful_flop" in row:
            flops[key] = max(flops.get(key, 0), row["useful_flop"])
    return medians(keyed), flops


def write_report(text, out):
    """Writes `text` to the file `out`, or to stdout when `out` is empty."""
    if out:
        with open(out, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
