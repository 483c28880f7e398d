#!/usr/bin/env bash
# The release suite on Debian 13 ("trixie", the current Debian stable) and its
# own LibTorch (libtorch-dev 2.6), as a user of that Debian gets it, then the
# Debian packages of that build (make package).
#
#   tests/debian13.sh [ROOT]            (make test-debian13)
#   tests/debian13.sh ROOT --remove     (make clean-debian13)
#
# Builds a minimal Debian 13 root with debootstrap from Debian's archive into
# ROOT (default .debian13/ in the checkout, about 2 GB; kept for the next run),
# bind-mounts the checkout at /src inside it, and runs `make test` there: the
# Makefile installs the project's Debian packages inside the root, as it does
# on a fresh machine, and builds into build-debian13/; `make package` then
# writes build-debian13/packages/*.deb, which tests/debian_package.sh installs
# into the same root. Needs root (chroot, mount).
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
root=$(realpath -m "${1:-${DEBIAN13_ROOT:-$here/.debian13}}")
jobs=${JOBS:-$(nproc)}
# shellcheck source=tests/debian_root.sh
. "$here/tests/debian_root.sh"

if [ "${2:-}" = "--remove" ]; then
  debian_root_remove "$root"
  exit 0
fi

t0=$(date +%s)
# make (to run the project's Makefile), git (the subproject tests clone the
# checkout) and the certificates apt uses; the Makefile installs the rest.
debian_root_ensure trixie "$root" make,ca-certificates,git
t1=$(date +%s)
debian_root_mount "$root" "$here"

# The suite without the example programs: no test runs them, and the other
# legs of make check build them (three minutes of CI's time saved).
# It runs as on an AVX2-only CPU (AMD Zen 3, most laptops), whatever CPU CI
# has: our kernels capped at avx2, ATen's at AVX2, OpenBLAS's Haswell
# kernels, MKL's AVX2 ones where a LibTorch has MKL (this one has not);
# Platform.PinnedInstructionSetsTakeEffect fails where a pin did not take
# (D2L_EXPECT_AVX2_PINNING). AVX2_PINNING=0 runs it on the CPU's own levels.
pins=()
if [ "${AVX2_PINNING:-1}" = 1 ]; then
  pins=(D2L_CPU_ISA=avx2 ATEN_CPU_CAPABILITY=avx2 OPENBLAS_CORETYPE=Haswell
        MKL_ENABLE_INSTRUCTIONS=AVX2 D2L_EXPECT_AVX2_PINNING=1)
fi
debian_say "make test and make package in the Debian 13 root (JOBS=$jobs, no examples; ${pins[*]:-no pins})"
rc=0
debian_root_run "$root" "${pins[@]}" make -C /src test package TORCH=debian BUILD_DIR=build-debian13 CONSUMER_TESTS=1 \
  JOBS="$jobs" CMAKE_ARGS=-DD2L_BUILD_EXAMPLES=OFF || rc=$?
t2=$(date +%s)
debian_say "root $((t1 - t0)) s, make test and package $((t2 - t1)) s, exit $rc"
exit $rc
