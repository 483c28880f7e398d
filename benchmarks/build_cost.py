#!/usr/bin/env python3
"""What a build target costs to compile, file by file and in unity batches.

    python3 benchmarks/build_cost.py [--target attention_scoring] [--jobs N]
                                     [--write docs/building.md]

Configures this checkout twice into fresh trees under a temporary folder
(`cmake --preset release`, Debian's LibTorch or whatever CMAKE_PREFIX_PATH
names), with -DD2L_UNITY_BUILD=OFF (every file its own translation unit) and
=ON (the default: unity batches, one translation unit per kernel instruction
set), builds the target in each, one after the other, and sums the compile
times ninja records in .ninja_log by part: the precompiled header, the
library's files, the CPU kernel copies, d2l::train, d2l::viz, the program.
Those are each job's wall time: on an idle machine with at most one job per
core, its CPU time. Prints a markdown block with the machine and the date;
with --write replaces the block between this script's markers in the named
page. Run it on an idle machine. Standard library only.
"""
import argparse
import datetime
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from front_door import machine  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
BEGIN = "<!-- build-cost: written by benchmarks/build_cost.py -->"
END = "<!-- /build-cost -->"
PARTS = ["precompiled header", "library", "kernels", "d2l::train", "d2l::viz", "program", "links"]
ISAS = ["DEFAULT", "AVX2", "AVX512", "AVX512_BF16", "AMX_BF16"]


def isa_of(output):
    """The instruction set of a kernel object, or None."""
    match = re.search(r"_(DEFAULT|AVX2|AVX512_BF16|AVX512|AMX_BF16)\.cpp\.o$", output)
    return match.group(1) if match else None


def part_of(output):
    """The part of the build that made `output` (a path in .ninja_log)."""
    if "d2l_pch" in output:
        return "precompiled header"
    if not output.endswith(".o"):
        return "links"
    if "/d2l_train.dir/" in output:
        return "d2l::train"
    if "/d2l_viz.dir/" in output:
        return "d2l::viz"
    if "/d2l_attention.dir/" in output:
        return "kernels" if "/cpu/" in output and "kernel" in output else "library"
    return "program"


def ninja_log(tree):
    """{output: seconds} of the newest build of each output in tree/.ninja_log."""
    jobs = {}
    for line in (tree / ".ninja_log").read_text().splitlines():
        if line.startswith("#"):
            continue
        start, end, _, output, _ = line.split("\t")
        jobs[output] = (int(end) - int(start)) / 1000
    return jobs


def build(tree, target, jobs, unity):
    subprocess.check_call(["cmake", "--preset", "release", "-S", str(ROOT), "-B", str(tree),
                           f"-DD2L_UNITY_BUILD={'ON' if unity else 'OFF'}",
                           "-DD2L_BUILD_TESTS=OFF"], stdout=subprocess.DEVNULL)
    t0 = time.monotonic()
    subprocess.check_call(["cmake", "--build", str(tree), "-j", str(jobs), "--target", target],
                          stdout=subprocess.DEVNULL)
    wall = time.monotonic() - t0
    sums, counts = {p: 0.0 for p in PARTS}, {p: 0 for p in PARTS}
    isas = {i: 0.0 for i in ISAS}
    for output, seconds in ninja_log(tree).items():
        part = part_of(output)
        sums[part] += seconds
        counts[part] += 1
        if part == "kernels" and isa_of(output):
            isas[isa_of(output)] += seconds
    return sums, counts, wall, isas


def block(target, jobs, results, when):
    off, on = results
    lines = [BEGIN, "",
             f"`{target}` built in a fresh tree with `-j {jobs}`, compile seconds summed from "
             f"`.ninja_log` (each job's time; on an idle machine, its CPU time), on {machine()}, "
             f"nothing else running; {when}, by `python3 "
             f"benchmarks/build_cost.py --target {target}`:", "",
             "| part | file by file (`D2L_UNITY_BUILD=OFF`) | unity batches (default) | ratio |",
             "| --- | --- | --- | --- |"]
    for part in PARTS:
        if off[0][part] == 0 and on[0][part] == 0:
            continue
        ratio = on[0][part] / off[0][part] if off[0][part] else 0
        lines.append(f"| {part} | {off[0][part]:.0f} s ({off[1][part]} jobs) | "
                     f"{on[0][part]:.0f} s ({on[1][part]} jobs) | {ratio:.2f} |")
        if part == "kernels":
            for isa in ISAS:
                if off[3][isa] or on[3][isa]:
                    lines.append(f"| &nbsp; of which {isa.lower()} | {off[3][isa]:.0f} s | "
                                 f"{on[3][isa]:.0f} s | "
                                 f"{on[3][isa] / off[3][isa] if off[3][isa] else 0:.2f} |")
    total_off, total_on = sum(off[0].values()), sum(on[0].values())
    lines.append(f"| **all** | **{total_off:.0f} s** | **{total_on:.0f} s** | "
                 f"**{total_on / total_off:.2f}** |")
    lines.append(f"| wall time of the build | {off[2]:.0f} s | {on[2]:.0f} s | "
                 f"{on[2] / off[2]:.2f} |")
    lines += ["", END]
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", default="attention_scoring")
    parser.add_argument("--jobs", type=int, default=os.cpu_count())
    parser.add_argument("--write", metavar="PAGE", help="replace the block in this page")
    parser.add_argument("--keep", action="store_true", help="keep the build trees")
    args = parser.parse_args()
    work = pathlib.Path(tempfile.mkdtemp(prefix="d2l-build-cost-"))
    results = []
    for unity in (False, True):
        tree = work / ("unity" if unity else "files")
        results.append(build(tree, args.target, args.jobs, unity))
        print(f"D2L_UNITY_BUILD={'ON' if unity else 'OFF'}: {sum(results[-1][0].values()):.0f} "
              f"compile seconds, {results[-1][2]:.0f} s wall", flush=True)
        if not args.keep:
            shutil.rmtree(tree, ignore_errors=True)
    text = block(args.target, args.jobs, results, datetime.date.today().isoformat())
    print(text)
    if args.write:
        page = ROOT / args.write
        body = page.read_text()
        pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
        if not pattern.search(body):
            sys.exit(f"{args.write} has no build-cost markers")
        page.write_text(pattern.sub(lambda _: text, body))
    return 0


if __name__ == "__main__":
    sys.exit(main())
