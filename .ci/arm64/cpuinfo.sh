#!/usr/bin/env bash
# An arm64 /proc/cpuinfo for QEMU_CPU=$1, as a Raspberry Pi's kernel writes it:
# qemu-user shows the guest the host's x86 one, and LiteRT's cpuinfo library
# crashes parsing it (docs/field_notes.md, 64-bit ARM). Four cores, like the Pis.
set -euo pipefail
case ${1:?usage: cpuinfo.sh cortex-a72|cortex-a76} in
cortex-a72) # Raspberry Pi 4 (BCM2711)
    features="fp asimd evtstrm crc32 cpuid"
    variant=0x0 part=0xd08 revision=3 model="Raspberry Pi 4 Model B Rev 1.4" ;;
cortex-a76) # Raspberry Pi 5 (BCM2712)
    features="fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp"
    variant=0x4 part=0xd0b revision=1 model="Raspberry Pi 5 Model B Rev 1.0" ;;
*) echo "cpuinfo.sh: no cpuinfo for CPU $1 (cortex-a72, cortex-a76)" >&2; exit 2 ;;
esac
for cpu in 0 1 2 3; do
    printf 'processor\t: %d\nBogoMIPS\t: 108.00\nFeatures\t: %s\nCPU implementer\t: 0x41\n' "$cpu" "$features"
    printf 'CPU architecture: 8\nCPU variant\t: %s\nCPU part\t: %s\nCPU revision\t: %d\n\n' "$variant" "$part" "$revision"
done
printf 'Revision\t: 0000\nSerial\t\t: 0000000000000000\nModel\t\t: %s\n' "$model"
