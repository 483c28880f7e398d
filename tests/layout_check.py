#!/usr/bin/env python3
"""Checks docs/contributing.md's "Layout" section against the tree.

Every file the section names (brace lists such as `svg.{h,cpp}` and globs such
as `heatmap*.cpp` expanded) must exist, and every source file of the library,
the examples, the benchmarks, the cmake modules and the Debian scripts must be
named there: a moved, added or deleted file fails this test (ctest
`docs.layout`) until the page says where it is.

Usage: layout_check.py [REPO_ROOT]
"""

import fnmatch
import itertools
import os
import pathlib
import re
import sys

EXTENSIONS = ("cpp", "h", "py", "sh", "cmake", "cu", "in")
# Files a reader of the layout does not look for there.
COVERED_ELSEWHERE = ("tests/", "fuzz/", "docs/", ".ci/")
MUST_BE_NAMED = ("src/**/*.cpp", "src/**/*.h", "include/d2l/**/*.h", "examples/*.cpp",
                 "examples/*.h", "examples/*.py", "benchmarks/*.cpp", "benchmarks/*.h",
                 "benchmarks/*.py", "benchmarks/*.sh", "cmake/*.cmake", "cmake/*.in",
                 "tests/*.sh", "tests/*.py")


def layout_section(text):
    start = text.index("## Layout")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else len(text)]


def expand_braces(token):
    parts = re.split(r"\{([^{}]*)\}", token)
    fixed, choices = parts[0::2], [p.split(",") for p in parts[1::2]]
    for combo in itertools.product(*choices):
        yield "".join(f + c for f, c in itertools.zip_longest(fixed, combo, fillvalue=""))


def named_patterns(section):
    ext = "|".join(EXTENSIONS)
    token = re.compile(r"(?<![>\w./*{},+-])[A-Za-z0-9_./*{},+-]*\.(?:\{[a-z,]+\}|(?:%s)\b)" % ext)
    for match in token.finditer(section):
        word = match.group(0).strip(".,")
        if word:
            yield from expand_braces(word)


def tracked_files(root):
    """The tree's files, without the build trees, environments and outputs that make adds."""
    top_level = (".git", ".venv", ".venv-cpu", ".debian12", ".debian13", "dist", "data")
    for folder, subfolders, names in os.walk(root):
        at_top = os.path.samefile(folder, root)
        subfolders[:] = [d for d in subfolders if d != "__pycache__" and not (
            at_top and (d in top_level or d.startswith("build") or d.endswith("_out")))]
        for name in names:
            yield os.path.relpath(os.path.join(folder, name), root)


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
    section = layout_section((root / "docs" / "contributing.md").read_text())
    patterns = sorted(set(named_patterns(section)))
    files = sorted(tracked_files(root))

    def matches(pattern, path):
        name = pathlib.PurePath(path).name
        return fnmatch.fnmatch(path, pattern) or fnmatch.fnmatch(path, "*/" + pattern) or \
            fnmatch.fnmatch(name, pattern)

    problems = []
    for pattern in patterns:
        if not any(matches(pattern, f) for f in files):
            problems.append(f"docs/contributing.md names {pattern}, which is not in the tree")
    for glob in MUST_BE_NAMED:
        for path in sorted(root.glob(glob)):
            rel = str(path.relative_to(root))
            if rel.startswith(COVERED_ELSEWHERE) and not glob.startswith("tests/"):
                continue
            if not any(matches(pattern, rel) for pattern in patterns):
                problems.append(f"{rel} is not named in docs/contributing.md's Layout section")
    for problem in problems:
        print(problem)
    print(f"layout_check: {len(patterns)} names, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
