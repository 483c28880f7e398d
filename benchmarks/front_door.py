#!/usr/bin/env python3
"""Times the front door from a fresh clone and writes the figures down.

    python3 benchmarks/front_door.py [--check] [--write]

Times each command in its own fresh clone of this checkout's HEAD, one after
the other: `make demo`, `make test` and, with --check, `make check` (what CI
runs). The Debian packages they install stay installed, so the figures are
for a machine that has them (the first run on a new machine also downloads
them). Prints a markdown block with the machine, the date and the
commands; with --write puts it into README.md between the front-door
markers. Run it on an idle machine: nothing else should be building beside
it. Standard library only.
"""
import argparse
import datetime
import os
import pathlib
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
BEGIN = "<!-- front-door: written by benchmarks/front_door.py -->"
END = "<!-- /front-door -->"


def machine():
    """'<CPU model>, <n> vCPUs, <memory> GiB', from /proc."""
    model = platform.processor() or "unknown CPU"
    family = number = None
    try:
        for line in open("/proc/cpuinfo"):
            key, _, value = line.partition(":")
            key, value = key.strip(), value.strip()
            if key == "model name":
                model = value
            elif key == "cpu family" and family is None:
                family = value
            elif key == "model" and number is None:
                number = value
            elif not key and family is not None:
                break
    except OSError:
        pass
    if family is not None and number is not None:
        model += f" (family {family}, model {number})"
    gib = 0
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal"):
                gib = round(int(line.split()[1]) / 2**20)
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} vCPUs, {gib} GiB"


def minutes(seconds):
    return f"{int(seconds) // 60} min {int(seconds) % 60:02d} s"


def timed(cmd, cwd, log):
    """Runs cmd in cwd, its output to log; returns (seconds, exit code)."""
    t0 = time.monotonic()
    with open(log, "w") as out:
        rc = subprocess.call(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, shell=True)
    return time.monotonic() - t0, rc


def block(rows, when):
    lines = [BEGIN, "",
             f"Each command in a fresh clone (`git clone`, then the command), with the Debian "
             f"packages already installed, on {machine()}, nothing else running; {when}, by "
             f"`python3 benchmarks/front_door.py"
             f"{' --check' if len(rows) > 2 else ''} --write`:", "",
             "| command | wall time | exit |", "| --- | --- | --- |"]
    for cmd, seconds, rc in rows:
        lines.append(f"| `{cmd}` | {minutes(seconds)} | {rc} |")
    lines += ["", END]
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="time make check as well")
    parser.add_argument("--write", action="store_true", help="update README.md")
    parser.add_argument("--keep", action="store_true", help="keep the clones (the logs always stay)")
    args = parser.parse_args()

    when = datetime.date.today().isoformat()
    work = pathlib.Path(tempfile.mkdtemp(prefix="d2l-front-door-"))
    rows = []
    commands = ["make demo", "make test"] + (["make check"] if args.check else [])
    for cmd in commands:
        clone = work / cmd.replace(" ", "-")
        subprocess.check_call(["git", "clone", "-q", str(ROOT), str(clone)])
        log = work / (cmd.replace(" ", "-") + ".log")
        seconds, rc = timed(cmd, clone, log)
        print(f"{cmd}: {minutes(seconds)}, exit {rc} (log: {log})", flush=True)
        rows.append((cmd, seconds, rc))
        if rc != 0:
            break
    text = block(rows, when)
    print(text)
    if args.write:
        readme = ROOT / "README.md"
        body = readme.read_text()
        pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
        if not pattern.search(body):
            sys.exit("README.md has no front-door markers")
        readme.write_text(pattern.sub(lambda _: text, body))
    # The clones go (several GiB each), the logs stay. Never delete a folder
    # with a Debian root still mounted in it (its /dev is the machine's).
    ok = all(rc == 0 for _, _, rc in rows)
    for cmd, _, _ in rows:
        clone = work / cmd.replace(" ", "-")
        mounted = any(line.split()[1].startswith(str(clone) + "/") for line in open("/proc/mounts"))
        if not args.keep and not mounted and ok:
            shutil.rmtree(clone, ignore_errors=True)
    print(f"logs: {work}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
