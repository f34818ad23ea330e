#!/usr/bin/env bash
# Installs the Debian packages powercut needs, only those that are missing.
# Called by the Makefile; safe to run repeatedly.
set -euo pipefail

# package:command-or-file that proves it is installed
needs=(
  "e2fsprogs:/usr/sbin/mkfs.ext4"
  "xfsprogs:/usr/sbin/mkfs.xfs"
  "btrfs-progs:/usr/bin/btrfs"
  "f2fs-tools:/usr/sbin/mkfs.f2fs"
  "fuse3:/usr/bin/fusermount3"
  "libfuse3-dev:/usr/include/fuse3/fuse.h"
  "pkg-config:/usr/bin/pkg-config"
  "build-essential:/usr/bin/make"
  "gcc:/usr/bin/gcc"
  "util-linux:/usr/sbin/losetup"
  "coreutils:/usr/bin/sync"
  "procps:/usr/bin/pkill"
  "redis-server:/usr/bin/redis-server"
  "iproute2:/usr/sbin/ip"
)
extra="${POWERCUT_EXTRA_PKGS:-}"   # e.g. "afl++ qemu-system-x86" for optional engines

missing=()
for n in "${needs[@]}"; do
  pkg=${n%%:*}; path=${n#*:}
  [ -e "$path" ] || missing+=("$pkg")
done
# Debian's python3 needs python3-venv for `python3 -m venv`.
if ! python3 -c 'import ensurepip, venv' 2>/dev/null; then missing+=(python3-venv); fi
for p in $extra; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then exit 0; fi
if [ "$(id -u)" != 0 ]; then
  echo "powercut: missing packages (${missing[*]}) and not root: run as root or install them" >&2
  exit 2
fi
echo "powercut: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
