#!/usr/bin/env bash
# The emulated 64-bit ARM root file system that make test-arm64 runs in: installs
# the host tools (Debian's qemu-user-static, debootstrap, binfmt-support, zstd),
# enables binfmt_misc's qemu-aarch64 entry, and builds the archive if the cache
# has none (build-rootfs.sh, about a minute from nothing: nothing in it runs
# under emulation but a last import check). Prints the archive's path on stdout,
# everything else on stderr.
# Needs root. .ci/run starts it early (make arm64-prepare) so that the build
# overlaps the main test run; test.sh calls it again and finds the archive.
#
# usage: rootfs.sh   (env: ARM64_CACHE, default /var/cache/keras-mha; HOST_PYTHON)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cache=${ARM64_CACHE:-/var/cache/keras-mha}
fail() { echo "rootfs: FAIL: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "rootfs: needs root (apt-get, binfmt_misc, chroot)" >&2; exit 2; }

if ! command -v qemu-aarch64-static >/dev/null || ! command -v debootstrap >/dev/null ||
    ! command -v update-binfmts >/dev/null || ! command -v zstd >/dev/null; then
    echo "rootfs: installing qemu-user-static debootstrap binfmt-support zstd" >&2
    apt-get update -q >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q qemu-user-static debootstrap binfmt-support zstd >&2
fi
if [ ! -e /proc/sys/fs/binfmt_misc/register ]; then
    mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
fi
if ! grep -qx enabled /proc/sys/fs/binfmt_misc/qemu-aarch64 2>/dev/null; then
    update-binfmts --enable qemu-aarch64 >&2
fi
grep -qx enabled /proc/sys/fs/binfmt_misc/qemu-aarch64 || fail "binfmt_misc has no enabled qemu-aarch64 entry"

key=$(sha256sum "$here/build-rootfs.sh" | cut -d' ' -f1)
archive=$cache/arm64-rootfs-$key.tar.zst
mkdir -p "$cache"
# One builder at a time: a second caller (test.sh while .ci/run's early build runs)
# waits for the first and then finds its archive.
exec 9>"$cache/.rootfs.lock"
flock 9
if [ ! -f "$archive" ]; then
    echo "rootfs: no cached root file system ($archive): building it (about a minute)" >&2
    start=$(date +%s)
    nice -n 15 "$here/build-rootfs.sh" "$archive" >&2
    echo "rootfs: built in $(($(date +%s) - start)) s" >&2
fi
echo "$archive"
