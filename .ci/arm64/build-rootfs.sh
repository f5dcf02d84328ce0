#!/usr/bin/env bash
# Build the emulated 64-bit Raspberry Pi OS base that `make test-arm64` runs in:
# Debian bookworm arm64 (minbase + python3), with numpy and LiteRT in the venv
# /opt/edge. Nothing in it runs under emulation but the last check: debootstrap's
# first stage downloads and unpacks the packages here, every other downloaded
# package is unpacked with dpkg-deb, and the host's pip installs the aarch64
# wheels into the venv (made by hand: pyvenv.cfg and a link to python3.11).
# The packages are unpacked, not configured: no maintainer script runs, which
# the device app does not need (it needs python3's files and the wheels'). The
# second stage under emulation took 6-11 minutes of one core; this, under one.
# Writes a zstd tar archive (ARCHIVE.tmp, then renamed). Needs root, qemu-user-
# static with binfmt (the check), debootstrap, dpkg-deb, zstd.
# The cache key is this file's sha256 (.ci/arm64/test.sh): the pins below are
# part of it. Why each step is there: docs/field_notes.md (64-bit ARM).
#
# usage: build-rootfs.sh ARCHIVE   (HOST_PYTHON: a python with pip, for the wheels)
set -euo pipefail

archive=${1:?usage: build-rootfs.sh ARCHIVE}
host_python=${HOST_PYTHON:-python3}
# The same versions as .venv-edge (edge_demo/requirements.txt resolved on x86-64):
# ai-edge-litert 2.3.0 requires numpy, ml_dtypes, flatbuffers, protobuf, tqdm,
# typing-extensions and backports.strenum. tokenizers (embedding bundles'
# WordPiece) declares huggingface-hub, which it imports only to download
# tokenizers: the device never does, so it is left out.
wheels=(numpy==2.4.6 ai-edge-litert==2.3.0 ml_dtypes==0.6.0 flatbuffers==25.12.19
    protobuf==7.36.2 tqdm==4.70.1 typing_extensions==4.16.0 backports.strenum==1.2.8
    tokenizers==0.23.3)
packages=python3

# The Debian mirror apt uses here (deb822 "URIs:" or a one-line "deb URI ...").
mirror=${ARM64_MIRROR:-$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list \
    /etc/apt/sources.list.d/*.sources 2>/dev/null |
    awk '/^URIs:/ && !/security/ {print $2; exit} /^deb / && !/security/ {print $2; exit}' || true)}
[ -n "$mirror" ] || { echo "build-rootfs: no Debian mirror found in /etc/apt/sources.list*; set ARM64_MIRROR" >&2; exit 2; }

work=$(mktemp -d /var/tmp/keras-mha-rootfs.XXXXXX)
root=$work/root
cleanup() {
    for m in dev proc; do
        if mountpoint -q "$root/$m" 2>/dev/null; then umount -l "$root/$m" || true; fi
    done
    # Never delete through a bind mount of the host's /dev.
    if grep -q " $work" /proc/mounts; then
        echo "build-rootfs: mounts remain under $work; not deleting it" >&2
    else
        rm -rf "$work"
    fi
    rm -f "$archive.tmp"
}
trap cleanup EXIT

echo "build-rootfs: debootstrap bookworm arm64 from $mirror into $root (first stage: download, unpack)"
debootstrap --arch=arm64 --foreign --variant=minbase --include="$packages" bookworm "$root" "$mirror"
# The first stage unpacked the required packages; the rest (python3 and what it
# depends on) wait in apt's archive for a second stage. Unpacking all is enough.
for deb in "$root"/var/cache/apt/archives/*.deb; do
    dpkg-deb -x "$deb" "$root"
done
version=$(basename "$root"/var/cache/apt/archives/python3.11-minimal_*_arm64.deb | cut -d_ -f2)
version=${version%%-*}  # 3.11.2-6+deb12u6 -> 3.11.2
[[ $version == 3.11.* ]] || { echo "build-rootfs: no python3.11-minimal among the packages" >&2; exit 1; }
rm -rf "$root/debootstrap" "$root/var/cache/apt/archives/"*.deb "$root/var/lib/apt/lists/"*

echo "build-rootfs: the venv /opt/edge (Python $version) and its aarch64 wheels, installed from here"
site=$root/opt/edge/lib/python3.11/site-packages
mkdir -p "$site" "$root/opt/edge/bin"
ln -s /usr/bin/python3.11 "$root/opt/edge/bin/python"
ln -s python "$root/opt/edge/bin/python3"
printf 'home = /usr/bin\ninclude-system-site-packages = false\nversion = %s\n' "$version" \
    >"$root/opt/edge/pyvenv.cfg"
# pip does not widen an explicit --platform to older glibc tags: tokenizers
# ships manylinux_2_17 (and abi3) wheels only. --no-deps: every package is
# listed above (tokenizers' huggingface-hub left out on purpose).
"$host_python" -m pip install -q --no-deps --only-binary=:all: --no-compile \
    --platform manylinux_2_27_aarch64 --platform manylinux_2_17_aarch64 --python-version 3.11 \
    --implementation cp --abi cp311 --abi abi3 --target "$site" "${wheels[@]}"
rm -rf "$site/bin"  # console scripts, written for the host's python
cp /usr/bin/qemu-aarch64-static "$root/usr/bin/"
# The one emulated step: the venv's python imports what the device app needs.
mount -t proc proc "$root/proc"
QEMU_CPU=cortex-a72 chroot "$root" /opt/edge/bin/python -c "import numpy, ai_edge_litert.interpreter, tokenizers; print('build-rootfs: numpy', numpy.__version__, 'tokenizers', tokenizers.__version__)"
umount "$root/proc"

mkdir -p "$(dirname "$archive")"
tar --zstd -C "$root" -cf "$archive.tmp" .
mv "$archive.tmp" "$archive"
echo "build-rootfs: wrote $archive ($(du -h "$archive" | cut -f1))"
