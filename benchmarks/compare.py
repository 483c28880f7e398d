#!/usr/bin/env python3
"""Put the library's Google Benchmark results beside the book's Python timings, as markdown.

    python3 benchmarks/compare.py --cpp build/bench-cpp.json --book build/bench-book-threads1.json
    python3 benchmarks/compare.py --cpp a.json --cpp b.json --book t1.json --book t2.json --out report.md

Standard library only, so it runs with any python3. Inputs:
- `--cpp`: a Google Benchmark JSON file (`--benchmark_format=json` or `--benchmark_out=FILE`). Names are
  `<case>/<shape>/threads:<N>` for the library's fast path, `composite:<case>/<shape>/threads:<N>` for its
  book-port path, plus `dot_parts_fwd/...` (bmm + softmax + bmm) and `tanh_floor/...` (tanh over B*n*m*h
  floats) as floors. With repetitions the `median` aggregate row is used; otherwise the median of the
  iteration rows. Peak memory comes from the `peak_heap_delta_bytes` user counter (the heap's exact
  high-water mark over one call, benchmarks/heap_peak.cpp) where present, else `peak_rss_delta_bytes`
  (the resident set's, which reads 0 wherever the allocator reuses pages freed by the warm-up call).
  The book's side is always its resident set (book_reference.py): against it the library's exact heap
  peak is the stricter comparison.
- `--book`: the JSON of benchmarks/book_reference.py, one file per thread count.
One table per thread count; a value that is missing prints as an em dash.
"""

import argparse
import functools
import json
import math
import statistics
from collections import defaultdict, namedtuple

from report_io import write_report

CASES = ["masked_softmax_fwd", "masked_softmax_fwdbwd", "softmax_fwd", "softmax_fwdbwd",
         "dot_fwd", "dot_fwdbwd", "additive_fwd", "additive_fwdbwd"]
SHAPES = ["toy", "d2l", "mid", "big"]
TIME_UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}
MISSING = "—"
COMPOSITE_PREFIX = "composite:"

Measurement = namedtuple("Measurement", "seconds peak_bytes")


# ----------------------------------------------------------------------------------------------------------
# Reading.

def parse_name(name):
    """Split `[composite:]<case>/<shape>[/key:value...]` into (implementation, case, shape, threads).

    Google Benchmark may append its own segments (`real_time`, `repeats:5`, `min_time:...`); they are
    ignored. Returns None for names that do not follow the convention.
    """
    segments = name.split("/")
    if len(segments) < 2 or not segments[0] or not segments[1]:
        return None
    head, implementation = segments[0], "library"
    if head.startswith(COMPOSITE_PREFIX):
        head, implementation = head[len(COMPOSITE_PREFIX):], "composite"
    threads = None
    for segment in segments[2:]:
        key, _, value = segment.partition(":")
        if key == "threads" and value.isdigit():
            threads = int(value)
    return implementation, head, segments[1], threads


def row_seconds(row):
    """A Google Benchmark row's real time in seconds."""
    return row["real_time"] * TIME_UNITS[row.get("time_unit", "ns")]


def summarize(rows):
    """One Measurement from the rows of one benchmark: its median aggregate, else the iterations' median."""
    medians = [r for r in rows if r.get("run_type") == "aggregate" and r.get("aggregate_name") == "median"]
    chosen = medians[:1] or [r for r in rows if r.get("run_type", "iteration") == "iteration"]
    if not chosen:
        return None
    field = "peak_heap_delta_bytes" if any("peak_heap_delta_bytes" in r for r in chosen) \
        else "peak_rss_delta_bytes"
    peaks = [r[field] for r in chosen if field in r]
    return Measurement(statistics.median(row_seconds(r) for r in chosen),
                       statistics.median(peaks) if peaks else None)


def load_cpp(doc, into):
    """Add a Google Benchmark document's results to `into[threads][implementation][(case, shape)]`."""
    groups = defaultdict(list)
    for row in doc.get("benchmarks", []):
        if row.get("error_occurred") or "real_time" not in row:
            continue
        parsed = parse_name(row.get("run_name") or row["name"])
        if parsed:
            groups[parsed].append(row)
    for (implementation, case, shape, threads), rows in groups.items():
        measurement = summarize(rows)
        if measurement:
            into[threads][implementation][(case, shape)] = measurement


def load_book(doc, into):
    """Add a book_reference.py document's results to `into[threads]["book"][(case, shape)]`."""
    table = into[doc.get("threads")]["book"]
    for row in doc.get("results", []):
        table[(row["case"], row["shape"])] = Measurement(row["median_s"], row.get("peak_rss_delta_bytes"))


def new_store():
    """threads -> implementation ("library", "composite", "book") -> (case, shape) -> Measurement."""
    return defaultdict(lambda: defaultdict(dict))


# ----------------------------------------------------------------------------------------------------------
# Formatting.

def three_digits(x):
    """x with three significant digits and no exponent: 372, 37.2, 1.20, 0.0350."""
    if x == 0 or not math.isfinite(x):
        return "{:g}".format(x)
    decimals = max(0, 2 - math.floor(math.log10(abs(x))))
    return "{:.{}f}".format(x, decimals)


def fmt_time(seconds):
    if seconds is None:
        return MISSING
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if seconds >= scale:
            return "{} {}".format(three_digits(seconds / scale), unit)
    return "{} ns".format(three_digits(seconds / 1e-9))


def fmt_bytes(count):
    if count is None:
        return MISSING
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(count) >= scale:
            return "{} {}".format(three_digits(count / scale), unit)
    return "{} B".format(int(count))


def ratio(numerator, denominator):
    """numerator / denominator, or None when either is unknown or the denominator is not positive."""
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return numerator / denominator


def fmt_ratio(value):
    return MISSING if value is None else three_digits(value) + "×"


# ----------------------------------------------------------------------------------------------------------
# Report.

def lookup(results, implementation, case, shape, field="seconds"):
    """One field of one measurement, or None when that benchmark did not run."""
    measurement = results[implementation].get((case, shape))
    return getattr(measurement, field) if measurement else None


def ordered_shapes(results):
    """The standard shapes in size order, then any others in name order."""
    seen = {shape for table in results.values() for (_, shape) in table}
    return [s for s in SHAPES if s in seen] + sorted(seen - set(SHAPES))


def table_rows(results):
    """Cells of one thread count's table: a row per case and shape that any implementation measured."""
    rows = []
    for case in CASES:
        for shape in ordered_shapes(results):
            if not any((case, shape) in results[impl] for impl in ("library", "composite", "book")):
                continue
            lib, comp, book = (lookup(results, impl, case, shape) for impl in ("library", "composite", "book"))
            lib_mem, book_mem = (lookup(results, impl, case, shape, "peak_bytes")
                                 for impl in ("library", "book"))
            rows.append([case, shape, fmt_time(lib), fmt_time(comp), fmt_time(book),
                         fmt_ratio(ratio(book, lib)), fmt_bytes(lib_mem), fmt_bytes(book_mem),
                         fmt_ratio(ratio(book_mem, lib_mem))])
    return rows


TABLE_HEADER = ["case", "shape", "library", "C++ composite", "book Python", "speed-up book/library",
                "peak Δ library", "peak Δ book", "memory book/library"]


def markdown_table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def time_ratio_line(label, numerator, denominator):
    """`label: n / d = r` with both operands, so a surprising ratio can be traced to its inputs."""
    return "- {}: {} / {} = {}".format(label, fmt_time(numerator), fmt_time(denominator),
                                       fmt_ratio(ratio(numerator, denominator)))


def goal_lines(results):
    """The numbers the library's goals are stated in, each with the two measurements it divides."""
    lib = functools.partial(lookup, results, "library")
    book = functools.partial(lookup, results, "book")
    lines = []
    for mode in ("fwd", "fwdbwd"):
        for shape in ("mid", "big"):
            lines.append(time_ratio_line(
                "masked_softmax_{0} / softmax_{0} (library), {1}".format(mode, shape),
                lib("masked_softmax_" + mode, shape), lib("softmax_" + mode, shape)))
    lines.append(time_ratio_line("additive_fwdbwd speed-up book / library, mid",
                                 book("additive_fwdbwd", "mid"), lib("additive_fwdbwd", "mid")))
    lib_mem = lookup(results, "library", "additive_fwdbwd", "big", "peak_bytes")
    book_mem = lookup(results, "book", "additive_fwdbwd", "big", "peak_bytes")
    lines.append("- additive_fwdbwd peak memory library / book, big: {} / {} = {}".format(
        fmt_bytes(lib_mem), fmt_bytes(book_mem), fmt_ratio(ratio(lib_mem, book_mem))))
    for shape in SHAPES:
        lines.append(time_ratio_line("dot_fwd library / dot_parts_fwd (bmm+softmax+bmm), " + shape,
                                     lib("dot_fwd", shape), lib("dot_parts_fwd", shape)))
    for case in ("dot_fwd", "additive_fwd"):
        lines.append(time_ratio_line(case + " library / book, toy", lib(case, "toy"), book(case, "toy")))
    for shape in ordered_shapes(results):
        if lib("tanh_floor", shape) is not None:
            lines.append(time_ratio_line("additive_fwd library / tanh_floor, " + shape,
                                         lib("additive_fwd", shape), lib("tanh_floor", shape)))
    return lines


FUSED_CASES = ["masked_softmax_fwd", "masked_softmax_fwdbwd", "dot_fwd", "dot_fwdbwd", "additive_fwd",
               "additive_fwdbwd"]
# What the machine allows, at the same thread counts: ATen's copy of the scores (one read and one
# write of (B, n, m)), and an empty parallel region (starting and joining the threads).
SCALING_FLOORS = ["copy_floor", "parallel_floor"]
SCALING_HEADER = ["case", "shape", "1 thread", "2 threads", "speed-up"]


def scaling_rows(store, few=1, many=2):
    """The library's fused ops and the floors at `few` and `many` threads: a row per case and shape
    measured at both, with time(few) / time(many)."""
    if few not in store or many not in store:
        return []
    rows = []
    for case in FUSED_CASES + SCALING_FLOORS:
        for shape in ordered_shapes(store[few]):
            t1 = lookup(store[few], "library", case, shape)
            t2 = lookup(store[many], "library", case, shape)
            if t1 is None or t2 is None:
                continue
            rows.append([case, shape, fmt_time(t1), fmt_time(t2), fmt_ratio(ratio(t1, t2))])
    return rows


def render(store):
    """The whole markdown report: per thread count, the table and then the goal lines; then the
    speed-up from 1 to 2 threads where both ran."""
    sections = []
    for threads in sorted(store, key=lambda t: (t is None, t or 0)):
        results = store[threads]
        title = "threads: {}".format(threads if threads is not None else "not stated")
        sections.append("## {}\n\n{}\n\nGoals:\n{}".format(
            title, markdown_table(TABLE_HEADER, table_rows(results)), "\n".join(goal_lines(results))))
    scaling = scaling_rows(store)
    if scaling:
        sections.append("## 1 -> 2 threads (library)\n\n" + markdown_table(SCALING_HEADER, scaling))
    return "\n\n".join(sections) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cpp", action="append", default=[], help="Google Benchmark JSON (repeatable)")
    p.add_argument("--book", action="append", default=[], help="book_reference.py JSON (repeatable)")
    p.add_argument("--out", help="write the markdown here instead of stdout")
    args = p.parse_args(argv)
    if not args.cpp and not args.book:
        p.error("give at least one --cpp or --book file")
    store = new_store()
    for path in args.cpp:
        with open(path) as f:
            load_cpp(json.load(f), store)
    for path in args.book:
        with open(path) as f:
            load_book(json.load(f), store)
    text = render(store)
    write_report(text, args.out)


if __name__ == "__main__":
    main()
