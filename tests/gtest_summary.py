#!/usr/bin/env python3
"""Adds up GoogleTest's XML reports of one or more build trees, case by case.

ctest counts one test per suite (cmake/D2LGTestSuites.cmake); this counts the
cases inside them, and names the reasons cases were skipped, so that coverage
which drops out (no GPU, an instruction set this CPU lacks, an older LibTorch)
is said, not silent. Standard library only.

    tests/gtest_summary.py build/gtest-reports [build-torch2/gtest-reports ...]
"""
import collections
import pathlib
import sys
import xml.etree.ElementTree as ET


def summarize(report_dir):
    passed = failed = 0
    skipped = collections.Counter()
    for path in sorted(pathlib.Path(report_dir).rglob("*.xml")):
        for case in ET.parse(path).getroot().iter("testcase"):
            skip = case.find("skipped")
            if case.find("failure") is not None or case.find("error") is not None:
                failed += 1
            elif skip is not None or case.get("result") == "skipped":
                # The message is "file:line\nreason" (GoogleTest 1.15, Debian
                # 13's, ends it with a newline); the reason groups them.
                message = (skip.get("message", "") if skip is not None else "").strip()
                reason = message.split("\n")[-1].strip() if "\n" in message else ""
                skipped[reason or "no reason given"] += 1
            else:
                passed += 1
    return passed, failed, skipped


def main(argv):
    if len(argv) < 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    totals = [0, 0, 0]
    for report_dir in argv[1:]:
        if not pathlib.Path(report_dir).is_dir():
            print(f"{report_dir}: no reports (did ctest run?)")
            continue
        passed, failed, skipped = summarize(report_dir)
        count = sum(skipped.values())
        print(f"{report_dir}: {passed + failed + count} GoogleTest cases, {passed} passed, "
              f"{failed} failed, {count} skipped")
        for reason, n in skipped.most_common():
            print(f"  skipped {n}: {reason}")
        totals = [totals[0] + passed, totals[1] + failed, totals[2] + count]
    if len(argv) > 2:
        print(f"all: {totals[0]} passed, {totals[1]} failed, {totals[2]} skipped")
    return 1 if totals[1] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
