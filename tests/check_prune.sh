#!/usr/bin/env bash
# tests/check_prune.sh PATH...: deletes what a leg of `make check` left once
# the leg has passed (make check CHECK_PRUNE=1, the default under CI), so that
# the whole matrix needs the disk of its largest leg, not of all of them:
#   a build tree (CMakeCache.txt)    all but ctest.log and gtest-reports/,
#                                    which make check's summary reads, and
#                                    packages/, which the package legs install
#   a Debian root (.d2l-root-ready)  all of it, never while anything is
#                                    mounted under it (tests/debian_root.sh)
#   a Python environment (pyvenv.cfg) all of it
# A PATH that does not exist is skipped; anything else is refused.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=tests/debian_root.sh
. "$here/tests/debian_root.sh"

for path in "$@"; do
  if [ ! -e "$path" ] || [ -e "$path/.d2l-pruned" ]; then
    continue
  elif [ -f "$path/CMakeCache.txt" ]; then
    find "$path" -mindepth 1 -maxdepth 1 ! -name ctest.log ! -name gtest-reports ! -name packages \
      -exec rm -rf {} +
    touch "$path/.d2l-pruned"
  elif [ -e "$path/.d2l-root-ready" ]; then
    debian_root_remove "$path"
  elif [ -f "$path/pyvenv.cfg" ]; then
    rm -rf "$path"
  else
    echo "check_prune.sh: $path is not a build tree, a Debian root or a Python environment; not deleting it" >&2
    exit 1
  fi
  echo "check_prune.sh: pruned $path ($(df -Pk . | awk 'NR == 2 { printf "%.1f", $4 / 1048576 }') GiB free)"
done
