# Sourced by tests/debian13.sh and tests/debian_package.sh: a minimal Debian
# root built by debootstrap from Debian's archive, and the mounts to use it.
#
#   debian_root_ensure SUITE ROOT [PACKAGES]   build ROOT once (kept; marked
#                                              ready), with PACKAGES included
#   debian_root_mount ROOT CHECKOUT            proc, dev, sys and CHECKOUT at
#                                              /src; unmounted on exit
#   debian_root_run ROOT CMD...                run CMD in ROOT, clean env
#   debian_root_remove ROOT                    delete ROOT (never with mounts)
# Needs root (chroot, mount) and debootstrap (installed when missing).

debian_mirror=${DEBIAN_MIRROR:-${DEBIAN13_MIRROR:-http://deb.debian.org/debian}}
debian_sudo=$([ "$(id -u)" = 0 ] || echo sudo)
debian_mounts=()

debian_say() { echo "${0##*/}: $*"; }

debian_mounted_in() {  # debian_mounted_in ROOT: anything mounted under it?
  awk -v r="$1/" 'index($2 "/", r) == 1 { found = 1 } END { exit !found }' /proc/mounts
}

debian_root_remove() {
  if debian_mounted_in "$1"; then debian_say "something is still mounted under $1; not removing it" >&2; return 1; fi
  $debian_sudo rm -rf "$1"
}

debian_root_ensure() {  # SUITE ROOT [PACKAGES]
  local suite=$1 root=$2 include=${3:-ca-certificates}
  [ -e "$root/.d2l-root-ready" ] && return 0
  if ! command -v debootstrap > /dev/null; then
    command -v apt-get > /dev/null ||
      { debian_say "needs debootstrap (Debian's package), and this is not Debian" >&2; return 1; }
    $debian_sudo apt-get update -q && DEBIAN_FRONTEND=noninteractive $debian_sudo apt-get install -y -q debootstrap
  fi
  debian_say "building a Debian $suite root in $root from $debian_mirror"
  if debian_mounted_in "$root"; then debian_say "something is still mounted under $root; not replacing it" >&2; return 1; fi
  $debian_sudo rm -rf "$root"
  $debian_sudo debootstrap --variant=minbase --include="$include" "$suite" "$root" "$debian_mirror"
  # debootstrap leaves the packages it fetched in the root's apt cache.
  $debian_sudo chroot "$root" apt-get clean
  $debian_sudo touch "$root/.d2l-root-ready"
}

debian_root_unmount() {
  local i
  for ((i = ${#debian_mounts[@]} - 1; i >= 0; i--)); do $debian_sudo umount -l "${debian_mounts[i]}" || true; done
  debian_mounts=()
}

debian_bind() {  # ROOT SOURCE TARGET-inside-root
  $debian_sudo mkdir -p "$1$3"
  $debian_sudo mount --bind "$2" "$1$3"
  debian_mounts+=("$1$3")
}

debian_root_mount() {  # ROOT CHECKOUT
  local root=$1
  trap debian_root_unmount EXIT
  $debian_sudo mount -t proc proc "$root/proc" && debian_mounts+=("$root/proc")
  debian_bind "$root" /dev /dev
  debian_bind "$root" /dev/pts /dev/pts
  debian_bind "$root" /dev/shm /dev/shm
  debian_bind "$root" /sys /sys
  debian_bind "$root" "$2" /src
  $debian_sudo cp -L /etc/resolv.conf "$root/etc/resolv.conf"
}

debian_root_run() {  # ROOT CMD...
  local root=$1
  shift
  $debian_sudo chroot "$root" /usr/bin/env -i HOME=/root PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 \
    DEBIAN_FRONTEND=noninteractive "$@"
}
