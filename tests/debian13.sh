#!/usr/bin/env bash
# The release suite on Debian 13 ("trixie", the current Debian stable) and its
# own LibTorch (libtorch-dev 2.6), as a user of that Debian gets it.
#
#   tests/debian13.sh [ROOT]            (make test-debian13)
#   tests/debian13.sh ROOT --remove     (make clean-debian13)
#
# Builds a minimal Debian 13 root with debootstrap from Debian's archive into
# ROOT (default .debian13/ in the checkout, about 2 GB; kept for the next run),
# bind-mounts the checkout at /src inside it, and runs `make test` there: the
# Makefile installs the project's Debian packages inside the root, as it does
# on a fresh machine, and builds into build-debian13/. Needs root (chroot,
# mount) and debootstrap (installed when missing).
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
root=$(realpath -m "${1:-${DEBIAN13_ROOT:-$here/.debian13}}")
mirror=${DEBIAN13_MIRROR:-http://deb.debian.org/debian}
jobs=${JOBS:-$(nproc)}
sudo=$([ "$(id -u)" = 0 ] || echo sudo)

say() { echo "tests/debian13.sh: $*"; }

if ! command -v debootstrap > /dev/null; then
  command -v apt-get > /dev/null ||
    { say "needs debootstrap (Debian's package), and this is not Debian" >&2; exit 1; }
  $sudo apt-get update -q && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q debootstrap
fi

# Never delete a root with anything still mounted in it: /src is this
# checkout.
mounted_in_root() { awk -v r="$root/" 'index($2 "/", r) == 1 { found = 1 } END { exit !found }' /proc/mounts; }
if [ "${2:-}" = "--remove" ]; then
  if mounted_in_root; then say "something is still mounted under $root; not removing it" >&2; exit 1; fi
  $sudo rm -rf "$root"
  exit 0
fi

t0=$(date +%s)
if [ ! -e "$root/.d2l-root-ready" ]; then
  say "building a Debian 13 root in $root from $mirror"
  if mounted_in_root; then say "something is still mounted under $root; not replacing it" >&2; exit 1; fi
  $sudo rm -rf "$root"
  # make (to run the project's Makefile), git (the subproject tests clone the
  # checkout) and the certificates apt uses; the
  # Makefile installs everything else.
  $sudo debootstrap --variant=minbase --include=make,ca-certificates,git trixie "$root" "$mirror"
  $sudo touch "$root/.d2l-root-ready"
fi
t1=$(date +%s)

mounts=()
cleanup() {
  local i
  for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do $sudo umount -l "${mounts[i]}" || true; done
}
trap cleanup EXIT
bind() {  # bind SOURCE TARGET-inside-root
  $sudo mkdir -p "$root$2"
  $sudo mount --bind "$1" "$root$2"
  mounts+=("$root$2")
}
$sudo mount -t proc proc "$root/proc" && mounts+=("$root/proc")
bind /dev /dev
bind /dev/pts /dev/pts
bind /dev/shm /dev/shm
bind /sys /sys
bind "$here" /src
$sudo cp -L /etc/resolv.conf "$root/etc/resolv.conf"

# The suite without the example programs: no test runs them, and the other
# legs of make check build them (three minutes of CI's time saved).
say "make test in the Debian 13 root (JOBS=$jobs, no examples)"
rc=0
$sudo chroot "$root" /usr/bin/env -i HOME=/root PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 \
  make -C /src test TORCH=debian BUILD_DIR=build-debian13 JOBS="$jobs" \
  CMAKE_ARGS=-DD2L_BUILD_EXAMPLES=OFF || rc=$?
t2=$(date +%s)
say "root $((t1 - t0)) s, make test $((t2 - t1)) s, exit $rc"
exit $rc
