"""The per-epoch table of a `vit_fashion_mnist` run (docs/vit.md, "The full run") from its log.

    python3 benchmarks/vit_log_table.py build/vit/train.log

The log may hold several runs appended to each other (`make vit-fashion-mnist` appends, and a
run resumed from its checkpoint goes on where the last one stopped): an epoch that comes again
starts the table over from there, so the table is that of the last run's epochs. Standard library
only.
"""

import argparse
import re
import sys

EPOCH = re.compile(r"^epoch (\d+)/(\d+): train_loss ([0-9.]+), val_loss ([0-9.]+), "
                   r"val_acc ([0-9.]+), ([0-9.]+) s", re.M)
FINAL = re.compile(r"^final val_acc ([0-9.]+)", re.M)


def epochs(text):
    """[(epoch, of, train_loss, val_loss, val_acc, seconds)] of the last run in the log."""
    rows = []
    for m in EPOCH.finditer(text):
        row = (int(m[1]), int(m[2]), m[3], m[4], m[5], float(m[6]))
        rows = [r for r in rows if r[0] < row[0]]
        rows.append(row)
    return rows


def table(text):
    rows = epochs(text)
    if not rows:
        raise ValueError("no epoch line in the log")
    expected = list(range(1, rows[-1][0] + 1))
    if [r[0] for r in rows] != expected:
        raise ValueError(f"epochs {[r[0] for r in rows]} in the log, not {expected}")
    lines = ["| epoch | train_loss | val_loss | val_acc | seconds |",
             "| --- | --- | --- | --- | --- |"]
    lines += [f"| {e} | {tl} | {vl} | {va} | {s:.0f} |" for e, _, tl, vl, va, s in rows]
    final = FINAL.findall(text)
    done = rows[-1][0] == rows[-1][1] and final
    lines.append("")
    lines.append(f"final val_acc {final[-1]} after {rows[-1][0]} epochs" if done
                 else f"unfinished: {rows[-1][0]} of {rows[-1][1]} epochs")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log")
    args = parser.parse_args()
    with open(args.log) as f:
        sys.stdout.write(table(f.read()))


if __name__ == "__main__":
    main()
