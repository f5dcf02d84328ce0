#!/usr/bin/env bash
# make test-arm64: the edge demo on emulated 64-bit Raspberry Pi CPUs.
#
# Restores (or first builds: rootfs.sh) a Debian bookworm arm64 root file system
# with numpy + LiteRT, copies the device app (edge_demo.DEVICE_PACKAGES) and the bundles in, and runs
# `python3 -m edge_demo BUNDLE --json REPORT` as each CPU in ARM64_CPUS
# (QEMU_CPU). Passes when every run exits 0 (every mode meets the manifest's
# thresholds) and nothing says LiteRT ran without a usable CPU description.
# Its --raw outputs (the same invocations) go beside; make test-arm64 then gates them against
# x86-64's with summary.py (RAW_BOUNDS), which also writes summary.json.
# Pitfalls handled here, each measured: docs/field_notes.md (64-bit ARM).
#
# usage: test.sh OUT_DIR DIGITS_BUNDLE TEXT_BUNDLE ENCODER_BUNDLE RERANKER_BUNDLE "TEXT" "QUERY"
# env:   ARM64_CPUS (default "cortex-a72 cortex-a76"), ARM64_CACHE
#        (default /var/cache/keras-mha), HOST_PYTHON (pip download, first build)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
out=${1:?usage: test.sh OUT_DIR DIGITS_BUNDLE TEXT_BUNDLE ENCODER_BUNDLE RERANKER_BUNDLE TEXT QUERY}
digits=${2:?digits bundle}
text_bundle=${3:?text bundle}
encoder_bundle=${4:?encoder bundle}
reranker_bundle=${5:?reranker bundle}
sentence=${6:?a sentence for --text}
query=${7:?"a query for the encoder's --text and the reranker's --pair"}
cpus=${ARM64_CPUS-cortex-a72 cortex-a76}
host_python=${HOST_PYTHON:-python3}  # numpy, for summary.py --modes-for
chroot=$(command -v chroot || echo /usr/sbin/chroot)
device_packages=$(cd "$repo" && "$host_python" -c 'import edge_demo; print(*edge_demo.DEVICE_PACKAGES)') ||
    { echo "test.sh: cannot read edge_demo.DEVICE_PACKAGES with $host_python" >&2; exit 2; }

fail() { echo "test-arm64: FAIL: $*" >&2; exit 1; }

[ -n "${cpus// /}" ] || fail "ARM64_CPUS is empty: name CPU models, e.g. cortex-a72 cortex-a76"
for cpu in $cpus; do
    # qemu's default "max" advertises SME/SVE2, on which XNNPACK's int8 kernels compute garbage.
    case $cpu in max | host) fail "QEMU_CPU=$cpu: use a real core (cortex-a72, cortex-a76)" ;; esac
    "$here/cpuinfo.sh" "$cpu" >/dev/null || fail "no /proc/cpuinfo for QEMU_CPU=$cpu in cpuinfo.sh"
done
for path in "$digits" "$text_bundle" "$encoder_bundle" "$reranker_bundle"; do
    [ -f "$path/manifest.json" ] || { echo "test-arm64: $path is not a bundle (no manifest.json)" >&2; exit 2; }
done
[ "$(id -u)" = 0 ] || { echo "test-arm64: needs root (chroot, mount); make test does not" >&2; exit 2; }

# --- host tools and the root file system (cached by its build script's sha256) ----
archive=$("$here/rootfs.sh") || fail "no root file system (.ci/arm64/rootfs.sh)"

# Each CPU in a root file system of its own (its own /proc/cpuinfo), all of them
# at once: an emulated core is one host thread, and CI has two host cores.
roots=()
cleanup() {
    local status=$? root m
    for root in "${roots[@]}"; do
        for m in proc/cpuinfo dev sys proc; do
            if mountpoint -q "$root/$m" 2>/dev/null; then
                umount "$root/$m" 2>/dev/null || umount -l "$root/$m" || true
            fi
        done
        # Never delete through a bind mount of the host's /dev.
        if grep -q " $root" /proc/mounts; then
            echo "test-arm64: mounts remain under $root; not deleting it" >&2
            status=1
        else
            rm -rf "$root"
        fi
    done
    exit $status
}
trap cleanup EXIT
trap 'exit 130' INT TERM
mkdir -p "$out"

# A restored root file system for one CPU, with the app, the bundles and that CPU's
# /proc/cpuinfo (qemu-user passes the host's x86 one through: LiteRT then segfaults).
prepare_root() {
    local cpu=$1 root=$2 start=$SECONDS
    tar --zstd -C "$root" -xf "$archive"
    # LiteRT's cpuinfo reads /proc and /sys (without them it silently skips XNNPACK).
    mount -t proc proc "$root/proc"
    mount -t sysfs sysfs "$root/sys"
    mount --bind /dev "$root/dev"
    "$here/cpuinfo.sh" "$cpu" >"$root/tmp/cpuinfo-$cpu"
    mount --bind "$root/tmp/cpuinfo-$cpu" "$root/proc/cpuinfo"
    local app=$root/opt/app
    mkdir -p "$app/bundles" "$app/out"
    # What a device copies (edge_demo.DEVICE_PACKAGES), nothing else of the repository.
    for package in $device_packages; do
        cp -r "$repo/$package" "$app/$package"
        find "$app/$package" -name __pycache__ -type d -prune -exec rm -rf {} +
    done
    cp -r "$digits" "$app/bundles/digits"
    cp -r "$text_bundle" "$app/bundles/text"
    cp -r "$encoder_bundle" "$app/bundles/encoder"
    cp -r "$reranker_bundle" "$app/bundles/reranker"
    echo "test-arm64: $cpu: restored $archive in $((SECONDS - start)) s"
}

# Runs in $root's chroot as QEMU_CPU=$1 with a clean environment; stderr kept in $2 (and shown).
in_arm() {
    local cpu=$1 log=$2 status=0
    shift 2
    env -i PATH=/opt/edge/bin:/usr/bin:/bin HOME=/root LANG=C.UTF-8 QEMU_CPU="$cpu" \
        PYTHONDONTWRITEBYTECODE=1 "$chroot" "$root" /bin/sh -c 'cd /opt/app && exec "$@"' sh "$@" \
        2>"$log" || status=$?
    cat "$log" >&2
    return $status
}
# A cpuinfo complaint means LiteRT ran without knowing the CPU: results are not the device's.
check_stderr() {
    if grep -Eiq 'cpuinfo|Segmentation fault' "$1"; then
        fail "$(grep -Ei -m1 'cpuinfo|Segmentation fault' "$1") (in $1)"
    fi
}

# extra_cpu K: the CPU of ARM64_CPUS that runs the app's K-th other command.
extra_cpu() {
    local list=($cpus)
    echo "${list[$(($1 % ${#list[@]}))]}"
}

# Everything one CPU runs, in its own root (a subshell: `fail` ends only this CPU).
run_cpu() {
    trap - EXIT INT TERM  # the parent unmounts and deletes every root
    local cpu=$1 start=$SECONDS
    root=$2
    local app=$root/opt/app
    echo "=== test-arm64: QEMU_CPU=$cpu"
    machine=$(in_arm "$cpu" "$out/$cpu-machine.err" python3 -c \
        'import platform; print(platform.machine(), "Python", platform.python_version())') ||
        fail "python3 does not start as $cpu"
    echo "test-arm64: $machine"
    [[ $machine == aarch64* ]] || fail "the chroot's python3 says machine $machine, not aarch64"
    for name in digits text encoder reranker; do
        # Its integer modes and its share of the float modes (summary.py's float_cpu).
        # shellcheck disable=SC2086
        modes=$("$host_python" "$here/summary.py" --modes-for "$cpu" "$app/bundles/$name" $cpus) ||
            fail "summary.py --modes-for $cpu $name exited $?"
        echo "test-arm64: $cpu runs $name in $modes"
        # One pass: the parity report and, from the same invocations, the raw outputs.
        in_arm "$cpu" "$out/$cpu-$name.err" python3 -m edge_demo "bundles/$name" --quant "$modes" \
            --json "out/$cpu-$name.json" --raw "out/$cpu-$name-raw.npz" ||
            fail "edge demo on $name as $cpu exited $?"
        check_stderr "$out/$cpu-$name.err"
        # the report's runtime.delegates: what LiteRT said it created when a model loaded
        "$host_python" -c 'import json, sys; sys.exit("XNNPACK" not in json.load(open(sys.argv[1]))["runtime"]["delegates"])' \
            "$app/out/$cpu-$name.json" ||
            fail "LiteRT did not create its XNNPACK delegate as $cpu (runtime.delegates in $cpu-$name.json)"
    done
    # The app's other commands, each on one of the CPUs in turn (extra_cpu): they
    # run the kernels the parity runs above ran on both; what they add is the
    # app's own code on aarch64 Python, the same on every core.
    printf '%s\n' "$query" "$sentence" >"$app/sentences.txt"
    if [ "$(extra_cpu 0)" = "$cpu" ]; then
        in_arm "$cpu" "$out/$cpu-text-sentence.err" python3 -m edge_demo bundles/text --text "$sentence" |
            tee "$out/$cpu-text-sentence.txt" || fail "--text as $cpu exited $?"
        check_stderr "$out/$cpu-text-sentence.err"
    fi
    if [ "$(extra_cpu 1)" = "$cpu" ]; then
        in_arm "$cpu" "$out/$cpu-encoder-query.err" python3 -m edge_demo bundles/encoder --text "$query" |
            tee "$out/$cpu-encoder-query.txt" || fail "encoder --text as $cpu exited $?"
        check_stderr "$out/$cpu-encoder-query.err"
    fi
    if [ "$(extra_cpu 2)" = "$cpu" ]; then
        in_arm "$cpu" "$out/$cpu-encoder-embed.err" python3 -m edge_demo bundles/encoder \
            --embed sentences.txt --out "out/$cpu-encoder-embed.npy" || fail "encoder --embed as $cpu exited $?"
        check_stderr "$out/$cpu-encoder-embed.err"
        [ -s "$app/out/$cpu-encoder-embed.npy" ] || fail "encoder --embed as $cpu wrote no vectors"
    fi
    if [ "$(extra_cpu 3)" = "$cpu" ]; then
        in_arm "$cpu" "$out/$cpu-reranker-pair.err" python3 -m edge_demo bundles/reranker \
            --pair "$query" "$sentence" | tee "$out/$cpu-reranker-pair.txt" ||
            fail "reranker --pair as $cpu exited $?"
        check_stderr "$out/$cpu-reranker-pair.err"
    fi
    if [ "$(extra_cpu 4)" = "$cpu" ]; then
        in_arm "$cpu" "$out/$cpu-reranker-rerank.err" python3 -m edge_demo bundles/reranker \
            --rerank "$query" sentences.txt | tee "$out/$cpu-reranker-rerank.txt" ||
            fail "reranker --rerank as $cpu exited $?"
        check_stderr "$out/$cpu-reranker-rerank.err"
    fi
    cp "$app/out/"* "$out/"
    echo "test-arm64: $cpu: done in $((SECONDS - start)) s"
}

declare -A pids=()
for cpu in $cpus; do
    root=$(mktemp -d /var/tmp/keras-mha-arm64.XXXXXX)
    roots+=("$root")
    prepare_root "$cpu" "$root"
    (run_cpu "$cpu" "$root") >"$out/$cpu.log" 2>&1 &
    pids[$cpu]=$!
done
failed=()
for cpu in $cpus; do
    wait "${pids[$cpu]}" || failed+=("$cpu")
    cat "$out/$cpu.log"
done
[ ${#failed[@]} -eq 0 ] || fail "the run as ${failed[*]} failed (its log above: $out/<cpu>.log)"
echo "test-arm64: PASS: edge demo exit 0 on digits, text, encoder and reranker as ${cpus// /, }"
