#!/usr/bin/env bash
# Installs the Debian packages that `make package` wrote into a Debian root,
# uses them as a user would, removes them and checks that nothing is left.
#
#   tests/debian_package.sh SUITE ROOT DEB_DIR
#     SUITE    bookworm (Debian 12) or trixie (Debian 13): the root's release
#     ROOT     the root (built by debootstrap if missing, then kept)
#     DEB_DIR  the folder holding libd2l-attention*.deb (in the checkout)
#
# In the root: `apt-get install ./<file>.deb` (which brings libtorch-dev and
# the rest from Debian's archive); the CMake consumer (tests/package, through
# find_package only, with COMPONENTS) built by g++ and by clang++ and run; a component
# this build lacks refused with one line; the pkg-config consumer
# (tests/package/pkgconfig_consumer.cpp) built with nothing but pkg-config's
# flags and run; then `apt-get purge`, and no file of the packages, nor any
# d2l file under /usr, is left. Needs root (chroot, mount).
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
suite=${1:?SUITE (bookworm or trixie)}
root=$(realpath -m "${2:?ROOT}")
debs=$(realpath -m "${3:?DEB_DIR}")
# shellcheck source=tests/debian_root.sh
. "$here/tests/debian_root.sh"

shopt -s nullglob
files=("$debs"/libd2l-attention*.deb)
if [ ${#files[@]} = 0 ]; then
  debian_say "no libd2l-attention*.deb in $debs: run make package first" >&2
  exit 1
fi
case "$debs/" in
  "$here"/*) ;;
  *) debian_say "$debs is outside the checkout ($here), which is all the root sees" >&2; exit 1 ;;
esac
inside=/src/${debs#"$here"/}
names=()
for f in "${files[@]}"; do names+=("$(dpkg-deb -f "$f" Package)"); done

t0=$(date +%s)
debian_root_ensure "$suite" "$root" ca-certificates
debian_root_mount "$root" "$here"
# A root of this machine's own release shares its package cache: what this
# machine downloaded (libtorch-dev and the rest) is not downloaded again.
if [ "$suite" = "$(. /etc/os-release && echo "${VERSION_CODENAME:-}")" ]; then
  debian_bind "$root" /var/cache/apt/archives /var/cache/apt/archives
fi
run() { debian_root_run "$root" "$@"; }
t1=$(date +%s)

debian_say "installing ${names[*]} into the Debian $suite root $root"
run apt-get update -q
run apt-get install -y -q --no-install-recommends "${files[@]/#$debs/$inside}" cmake make g++ clang pkg-config
run dpkg-query -W "${names[@]}"
# What the packages installed, to check after the purge.
installed=$(run dpkg -L "${names[@]}" | sort -u)
t2=$(date +%s)

work=/tmp/d2l-package-test
run rm -rf "$work"
debian_say "the CMake consumer, through find_package and the installed files only"
run cmake -S /src/tests/package -B "$work/cmake" -DCMAKE_BUILD_TYPE=Release \
  -DD2L_CONSUMER_COMPONENTS="train;viz;distributed;vector_kernels"
run cmake --build "$work/cmake" -j "${JOBS:-$(nproc)}"
run "$work/cmake/consumer"
run "$work/cmake/train_only" /src/tests/data/fra-eng-sample
# clang, with the same installed files (Debian's LibTorch gets no -lstdc++
# from us: the link line is LibTorch's own).
debian_say "the CMake consumer built by clang++"
run cmake -S /src/tests/package -B "$work/clang" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=clang++
run cmake --build "$work/clang" -j "${JOBS:-$(nproc)}" --target consumer
run "$work/clang/consumer"
# A component this build lacks (no CUDA LibTorch here: nccl) is one line.
if out=$(run cmake -S /src/tests/package -B "$work/missing" -DD2L_CONSUMER_COMPONENTS=nccl 2>&1 |
         tr -s ' \n' ' '; exit "${PIPESTATUS[0]}"); then
  debian_say "find_package(d2l_attention COMPONENTS nccl) succeeded on a package without NCCL" >&2
  exit 1
fi
grep -q "component 'nccl' was not built; rebuild d2l_attention with -DD2L_WITH_NCCL=ON" <<< "$out" || {
  echo "$out" >&2; debian_say "the missing component's message is not the expected one" >&2; exit 1; }
debian_say "a missing component is refused: $(grep -o "d2l_attention 0[^;]*;[^)]*)" <<< "$out")"

debian_say "the pkg-config consumer: g++ \$(pkg-config --cflags --libs d2l_attention)"
run sh -c "g++ -std=c++17 -O1 -o $work/pkgconfig_consumer /src/tests/package/pkgconfig_consumer.cpp \
  \$(pkg-config --cflags --libs d2l_attention)"
run "$work/pkgconfig_consumer"
run rm -rf "$work"
t3=$(date +%s)

debian_say "removing ${names[*]}"
run apt-get purge -y -q "${names[@]}"
left=$(run dpkg-query -W -f='${db:Status-Abbrev} ${Package}\n' "${names[@]}" 2>/dev/null | grep -v '^un ' || true)
[ -z "$left" ] || { debian_say "still known to dpkg after the purge: $left" >&2; exit 1; }
stale=""
while IFS= read -r path; do
  # Directories shared with other packages (/usr, /usr/lib/...) stay.
  if [ -e "$root$path" ] && [ ! -d "$root$path" ]; then stale+="$path "; fi
done <<< "$installed"
stale+=$(cd "$root" && find usr -path '*d2l*' -print 2>/dev/null | tr '\n' ' ')
[ -z "$stale" ] || { debian_say "left after the purge: $stale" >&2; exit 1; }
t4=$(date +%s)
debian_say "Debian $suite: root $((t1 - t0)) s, install $((t2 - t1)) s, consumers $((t3 - t2)) s, purge $((t4 - t3)) s; nothing left"
