#!/usr/bin/env bash
# Build the emulated 64-bit Raspberry Pi OS base that `make test-arm64` runs in:
# Debian bookworm arm64 (minbase + python3), with numpy and LiteRT installed
# offline into the venv /opt/edge. Writes a zstd tar archive (ARCHIVE.tmp, then
# renamed). Needs root, qemu-user-static with binfmt, debootstrap, zstd.
# The cache key is this file's sha256 (.ci/arm64/test.sh): the pins below are
# part of it. Why each step is there: docs/field_notes.md (64-bit ARM).
#
# usage: build-rootfs.sh ARCHIVE   (HOST_PYTHON: a python with pip, for pip download)
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
packages=python3,python3-venv,ca-certificates

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

echo "build-rootfs: debootstrap bookworm arm64 from $mirror into $root"
debootstrap --arch=arm64 --foreign --variant=minbase --include="$packages" bookworm "$root" "$mirror"
cp /usr/bin/qemu-aarch64-static "$root/usr/bin/"
# A CPU model without SME/SVE2 (qemu's default "max" breaks XNNPACK's int8 paths).
export QEMU_CPU=cortex-a72
chroot "$root" /debootstrap/debootstrap --second-stage

echo "build-rootfs: wheels for aarch64 (downloaded here: pip has no CA bundle in the chroot)"
mkdir -p "$root/tmp/wheels"
# pip does not widen an explicit --platform to older glibc tags: tokenizers
# ships manylinux_2_17 (and abi3) wheels only.
"$host_python" -m pip download -q --no-deps --only-binary=:all: --platform manylinux_2_27_aarch64 \
    --platform manylinux_2_17_aarch64 --python-version 3.11 --implementation cp --abi cp311 \
    --abi abi3 -d "$root/tmp/wheels" "${wheels[@]}"
mount -t proc proc "$root/proc"
mount --bind /dev "$root/dev"
chroot "$root" /usr/bin/python3 -m venv /opt/edge
# --no-deps: every package is listed above (tokenizers' huggingface-hub left out on purpose).
chroot "$root" /opt/edge/bin/python -m pip install -q --no-deps --no-index --find-links /tmp/wheels "${wheels[@]}"
chroot "$root" /opt/edge/bin/python -c "import numpy, ai_edge_litert.interpreter, tokenizers; print('build-rootfs: numpy', numpy.__version__, 'tokenizers', tokenizers.__version__)"
umount "$root/dev" "$root/proc"
rm -rf "$root/tmp/wheels" "$root/var/cache/apt/archives/"*.deb "$root/var/lib/apt/lists/"* "$root/root/.cache"

mkdir -p "$(dirname "$archive")"
tar --zstd -C "$root" -cf "$archive.tmp" .
mv "$archive.tmp" "$archive"
echo "build-rootfs: wrote $archive ($(du -h "$archive" | cut -f1))"
