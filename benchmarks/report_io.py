"""Where the benchmark scripts write their reports."""

import sys


def write_report(text, out):
    """Writes `text` to the file `out`, or to stdout when `out` is empty."""
    if out:
        with open(out, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
