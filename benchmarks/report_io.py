"""Where the benchmark scripts write their reports, and how they read Google Benchmark's JSON."""

import json
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


def write_report(text, out):
    """Writes `text` to the file `out`, or to stdout when `out` is empty."""
    if out:
        with open(out, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
