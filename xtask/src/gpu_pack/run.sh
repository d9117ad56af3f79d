#!/usr/bin/env bash
# kiln GPU run, written by `cargo xtask gpu-pack` (source: xtask/src/gpu_pack/run.sh).
#
# Runs on a GPU machine that has a driver but no Rust toolchain:
#   1. finds libcuda, libnvrtc and libcublas and exports LD_LIBRARY_PATH (plus the folder holding
#      cuda_fp16.h for NVRTC, as KILN_CUDA_INCLUDE and CUDA_HOME when a toolkit is found);
#   2. sets KILN_REQUIRE_CUDA=1, so every GPU test FAILS instead of skipping when no device is
#      usable: a silent skip can never pass for a GPU run;
#   3. unpacks bin.tar.xz (the test binaries with GPU tests, and xtask) into a temporary folder
#      and runs each test binary (KILN_ONLY=A,B: those whose names contain A or B), logging to
#      $OUT/logs/test-<name>.log; KILN_SANITIZE=TOOL runs them under compute-sanitizer;
#   4. runs `xtask bench --gpu-only --vs-torch` (when this build has a bench command): the CUDA
#      cases of every group (matmul vs cuBLAS, bandwidth, ResNet18 step and where its time
#      goes, allocator hit vs cuMemAlloc, fused clip and optimizer steps vs copy bandwidth)
#      and, where python3 has torch, the same matmul, step, convolution, AdamW and clip cases in
#      PyTorch on the same GPU; none of the CPU cases; the report is copied to
#      $OUT/gpu-bench.json and gpu-bench.md (also when a case failed), the step's breakdown
#      lines to summary.txt;
#   5. runs `xtask bench $KILN_CPU_BENCH --vs-torch` on the machine's CPU (default `threads`:
#      the CPU training step at 1, 2, 4, ... threads up to the cores, next to PyTorch at the
#      same count; KILN_CPU_BENCH= skips it), report in $OUT/cpu-bench.json and cpu-bench.md;
#   6. where `perf` exists, profiles that CPU step on every core (logs/cpu-perf.txt, its top
#      symbols in summary.txt); then times the step's two small-plane weight gradients
#      (KILN_CONV_WEIGHT_GRAD=chunks / taps) on every core, alternating, into summary.txt.
# Output goes to $OUT (default ./gpu-out): env.txt, summary.txt, gpu-bench.{json,md} and
# logs.tar.gz (every log), few files, so a runner that returns a handful of files gets them all.
# Planned to finish in under 8 minutes: each test binary gets KILN_TEST_TIMEOUT_S (120 s), the
# benchmarks get what is left of KILN_RUN_BUDGET_S (450 s), at least 60 s.
# Exit status: 0 when every test binary and the benchmarks passed, 1 otherwise.
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
START=$(date +%s)
: > "$OUT/summary.txt"
log() { echo "[+$(($(date +%s) - START))s] $*" | tee -a "$OUT/summary.txt"; }

# The binaries travel as one xz archive (bin.tar.xz: tests/ and xtask); unpack it once.
BIN="$HERE"
if [ -f "$HERE/bin.tar.xz" ]; then
    BIN="$(mktemp -d "${TMPDIR:-/tmp}/kiln-gpu-bin.XXXXXX")"
    trap 'rm -rf "$BIN"' EXIT
    if ! tar -xJf "$HERE/bin.tar.xz" -C "$BIN"; then
        log "FAIL  cannot unpack $HERE/bin.tar.xz (needs tar with xz)"
        exit 1
    fi
fi

# Candidate library folders, most specific first.
python_nvidia_dirs() {
    local py
    for py in python3 python; do
        command -v "$py" >/dev/null 2>&1 || continue
        "$py" - <<'PY' 2>/dev/null && return 0
import os
try:
    import nvidia
except ImportError:
    raise SystemExit(0)
for root in nvidia.__path__:
    for sub in sorted(os.listdir(root)):
        for leaf in ("lib", "lib64"):
            d = os.path.join(root, sub, leaf)
            if os.path.isdir(d):
                print(d)
PY
    done
}
ldconfig_dirs() { # folders ldconfig knows that hold $1*
    { ldconfig -p 2>/dev/null || /sbin/ldconfig -p 2>/dev/null; } |
        awk -v n="$1" '$1 ~ "^"n { print $NF }' | xargs -r -n1 dirname | awk '!seen[$0]++'
}
toolkit_dirs() {
    local d
    for d in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda /usr/local/cuda-13*; do
        [ -n "$d" ] || continue
        echo "$d/lib64"
        echo "$d/lib"
        echo "$d/targets/x86_64-linux/lib"
        echo "$d/targets/sbsa-linux/lib"
    done
}
# find_lib_dir NAME PREFERRED_SUFFIX DIR... : first folder holding NAME.PREFERRED_SUFFIX, else NAME*.
find_lib_dir() {
    local name=$1 preferred=$2 d
    shift 2
    for d in "$@"; do
        [ -d "$d" ] && [ -e "$d/$name$preferred" ] && { echo "$d"; return 0; }
    done
    for d in "$@"; do
        [ -d "$d" ] && compgen -G "$d/$name*" >/dev/null && { echo "$d"; return 0; }
    done
    return 1
}

mapfile -t PY_DIRS < <(python_nvidia_dirs)
mapfile -t TK_DIRS < <(toolkit_dirs)
mapfile -t LDC_CUDA < <(ldconfig_dirs libcuda.so)
mapfile -t LDC_NVRTC < <(ldconfig_dirs libnvrtc.so)
mapfile -t LDC_CUBLAS < <(ldconfig_dirs libcublas.so)
DRIVER_DIRS=(/usr/lib/x86_64-linux-gnu /usr/lib64 /usr/local/nvidia/lib64 /usr/lib/wsl/lib)

LIB_DIRS=()
missing=()
add_dir() { local d; for d in "${LIB_DIRS[@]}"; do [ "$d" = "$1" ] && return; done; LIB_DIRS+=("$1"); }
# NVRTC/cuBLAS 13 from a toolkit or wheel first: cudarc dlopens the unversioned `libnvrtc.so`
# before `libnvrtc.so.13`, so a distribution's CUDA 12 `libnvrtc.so` in the driver's folder
# (/usr/lib/x86_64-linux-gnu) must not come earlier on the path. Then the driver's own libcuda
# (never a toolkit stub: those sit in stubs/ folders, which are not searched).
if d=$(find_lib_dir libnvrtc.so .13 "${TK_DIRS[@]}" "${PY_DIRS[@]}" "${LDC_NVRTC[@]}"); then add_dir "$d"; else missing+=(libnvrtc.so); fi
if d=$(find_lib_dir libcublas.so .13 "${TK_DIRS[@]}" "${PY_DIRS[@]}" "${LDC_CUBLAS[@]}"); then add_dir "$d"; else missing+=(libcublas.so); fi
if d=$(find_lib_dir libcuda.so .1 "${LDC_CUDA[@]}" "${DRIVER_DIRS[@]}"); then add_dir "$d"; else missing+=(libcuda.so); fi
LD_LIBRARY_PATH="$(IFS=:; echo "${LIB_DIRS[*]}")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export LD_LIBRARY_PATH

# NVRTC 13.0 has no built-in cuda_fp16.h / cuda_bf16.h: tell kiln where the headers are
# (kiln-device reads KILN_CUDA_INCLUDE first); a value set by the caller wins.
for d in "${KILN_CUDA_INCLUDE:-/nonexistent}" "${CUDA_HOME:-/nonexistent}/include" /usr/local/cuda/include /usr/local/cuda-13*/include \
    $(printf '%s\n' "${PY_DIRS[@]}" | sed -e 's#/lib64$#/include#' -e 's#/lib$#/include#'); do
    if [ -f "$d/cuda_fp16.h" ] && [ -f "$d/cuda_bf16.h" ]; then
        export KILN_CUDA_INCLUDE="$d"
        [ -z "${CUDA_HOME:-}" ] && [ -d "$d/../bin" ] && export CUDA_HOME="$(cd "$d/.." && pwd)"
        break
    fi
done
export KILN_REQUIRE_CUDA=1
export RUST_BACKTRACE=1
# NVRTC's PTX kept across the test processes (kiln-device's kernel_cache): each .cu file is
# compiled once per run instead of once per test binary.
export KILN_KERNEL_CACHE="${KILN_KERNEL_CACHE:-${TMPDIR:-/tmp}/kiln-kernel-cache}"

{
    echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
    echo "host: $(uname -a)"
    echo "cpu: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
    echo "pack: $(cat "$HERE/MANIFEST.txt" 2>/dev/null | head -n 3 | tr '\n' ' ')"
    echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
    echo "KILN_CUDA_INCLUDE=${KILN_CUDA_INCLUDE:-<none found>}"
    echo "CUDA_HOME=${CUDA_HOME:-<unset>}"
    echo "KILN_KERNEL_CACHE=$KILN_KERNEL_CACHE"
    echo "missing: ${missing[*]:-none}"
    for d in "${LIB_DIRS[@]}"; do ls -l "$d"/libcuda.so* "$d"/libnvrtc.so* "$d"/libcublas.so* 2>/dev/null; done
    if command -v nvidia-smi >/dev/null 2>&1; then
        nvidia-smi --query-gpu=index,name,driver_version,memory.total,compute_cap --format=csv 2>&1
        nvidia-smi 2>&1
    else
        echo "nvidia-smi: not found"
    fi
} > "$OUT/env.txt"
log "kiln GPU run; libraries: ${LIB_DIRS[*]:-none}"
if command -v nvidia-smi >/dev/null 2>&1; then
    log "GPU: $(nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader 2>&1 | head -n 1)"
else
    log "GPU: nvidia-smi not found"
fi

FAILS=0
# A GPU run without the CUDA libraries proves nothing: count each missing one as a failure.
for lib in "${missing[@]}"; do
    log "FAIL  $lib not found (searched ldconfig, CUDA_HOME, /usr/local/cuda*, the nvidia Python packages)"
    FAILS=$((FAILS + 1))
done
TEST_TIMEOUT="${KILN_TEST_TIMEOUT_S:-120}"
# KILN_SANITIZE=TOOL runs each test binary under `compute-sanitizer --tool TOOL` (memcheck,
# racecheck, synccheck, initcheck) and skips the benchmarks; KILN_ONLY=A,B keeps the binaries
# whose names contain A or B (the benchmarks then run only when a part names them, as in
# KILN_ONLY=xtask-bench, which runs the benchmarks alone);
# KILN_SANITIZE_PRINT_LIMIT (20) caps the findings printed per binary.
SANITIZE="${KILN_SANITIZE:-}"
SANITIZER=()
if [ -n "$SANITIZE" ]; then
    cs="$(command -v compute-sanitizer || ls "${CUDA_HOME:-/usr/local/cuda}"/bin/compute-sanitizer 2>/dev/null | head -n 1)"
    if [ -z "$cs" ]; then
        log "FAIL  KILN_SANITIZE=$SANITIZE but compute-sanitizer was not found"
        FAILS=$((FAILS + 1))
    else
        # API errors are not reported: kiln's tests provoke some on purpose (the OOM report's
        # test fails cuMemAlloc and cuMemCreate) and check kiln's handling of them themselves.
        SANITIZER=("$cs" --tool "$SANITIZE" --error-exitcode 99 --print-limit "${KILN_SANITIZE_PRINT_LIMIT:-20}" --report-api-errors no)
        log "under compute-sanitizer --tool $SANITIZE: $("$cs" --version 2>&1 | tail -n 1)"
    fi
fi
wanted() { # wanted NAME: KILN_ONLY unset, or NAME contains one of its comma-separated parts
    local part
    [ -z "${KILN_ONLY:-}" ] && return 0
    IFS=, read -ra parts <<<"$KILN_ONLY"
    for part in "${parts[@]}"; do [[ -n "$part" && "$1" == *"$part"* ]] && return 0; done
    return 1
}
budget_spare() { # seconds left of KILN_RUN_BUDGET_S (450) since the start (may be negative)
    echo $(( ${KILN_RUN_BUDGET_S:-450} - ($(date +%s) - START) ))
}
budget_left() { # budget_spare, at least 60: what a required step still gets
    local left
    left=$(budget_spare)
    [ $left -lt 60 ] && left=60
    echo $left
}
# Logs go to $OUT/logs, packed into $OUT/logs.tar.gz at the end: $OUT keeps a handful of files.
LOGS="$OUT/logs"
mkdir -p "$LOGS"
for t in "$BIN"/tests/*; do
    [ -x "$t" ] || continue
    name="$(basename "$t")"
    wanted "$name" || continue
    t0=$(date +%s)
    # Under a sanitizer the tests of a binary run one at a time (racecheck lost track of kernel
    # launches made from several test threads at once).
    args=()
    [ -n "$SANITIZE" ] && args=(--test-threads=1)
    (cd "$OUT" && timeout "$TEST_TIMEOUT" "${SANITIZER[@]}" "$t" "${args[@]}") >"$LOGS/test-$name.log" 2>&1
    rc=$?
    secs=$(($(date +%s) - t0))
    result="$(grep -E '^test result:' "$LOGS/test-$name.log" | tail -n 1)"
    # A test that cannot run here says why on a line starting `skipping` (e.g. the two-rank
    # NCCL tests on a one-GPU machine); it passes, so the summary counts and shows those lines.
    skips="$(grep -cE '^skipping[ :]' "$LOGS/test-$name.log")"
    [ "$skips" -gt 0 ] && result="$result; $skips skip line(s)"
    if [ $rc -eq 0 ]; then
        log "PASS  $name  (${secs}s)  $result"
    else
        [ $rc -eq 124 ] && result="timed out after ${TEST_TIMEOUT}s"
        [ $rc -eq 99 ] && result="compute-sanitizer ($SANITIZE) reported errors; $result"
        log "FAIL  $name  (rc $rc, ${secs}s)  $result  -> logs/test-$name.log"
        FAILS=$((FAILS + 1))
    fi
    # Why tests failed (the line after each panic, a sanitizer's findings), and any skips.
    {
        grep -A1 'panicked at' "$LOGS/test-$name.log" | grep -vE 'panicked at|^--$' | head -n 5
        grep -E '^========= (Invalid|Race|Barrier|Uninitialized|Program hit|ERROR SUMMARY: [1-9])' "$LOGS/test-$name.log" | sort | uniq -c | head -n 8
        grep -E '^skipping[ :]' "$LOGS/test-$name.log" | sort | uniq -c | head -n 5
    } | sed 's/^/      /' | tee -a "$OUT/summary.txt"
done

if [ -x "$BIN/xtask" ] && [ -z "$SANITIZE" ] && wanted xtask-bench; then
    left=$(budget_left)
    mkdir -p "$LOGS/bench"
    t0=$(date +%s)
    # --vs-torch: PyTorch's side of the matmul, ResNet18-step, AdamW and clip cases on the same
    # GPU ($KILN_TORCH_PYTHON, else python3); without torch those rows say why and pass.
    (cd "$LOGS/bench" && KILN_BENCH_OUT="$LOGS/bench" timeout "$left" "$BIN/xtask" bench --gpu-only --vs-torch) \
        >"$LOGS/bench.log" 2>&1
    rc=$?
    secs=$(($(date +%s) - t0))
    report="$(find "$LOGS/bench" -name report.json 2>/dev/null | head -n 1)"
    # A bench with a failed case still writes its report (the failed rows say why, the others
    # keep their figures): copy it either way.
    if [ -n "$report" ]; then
        cp "$report" "$OUT/gpu-bench.json"
        find "$LOGS/bench" -name report.md -exec cp {} "$OUT/gpu-bench.md" \;
    fi
    if grep -q 'unknown command `bench`' "$LOGS/bench.log"; then
        log "SKIP  bench: this build's xtask has no bench command yet"
    elif [ $rc -ne 0 ]; then
        [ $rc -eq 124 ] && log "      bench timed out after ${left}s"
        log "FAIL  xtask bench --gpu-only --vs-torch  (rc $rc, ${secs}s)  -> logs/bench.log"
        FAILS=$((FAILS + 1))
    elif [ -z "$report" ]; then
        log "FAIL  xtask bench --gpu-only wrote no report.json  -> logs/bench.log"
        FAILS=$((FAILS + 1))
    else
        log "PASS  xtask bench --gpu-only --vs-torch  (${secs}s)  -> gpu-bench.json, gpu-bench.md"
    fi
    # Where the ResNet step's time goes (forward by op, backward by node, the convolutions'
    # passes alone), for a first look.
    grep -E '^bench ops: gpu .*(by op|by node|passes alone)' "$LOGS/bench.log" | sed 's/^/      /' \
        | tee -a "$OUT/summary.txt"
fi

# The CPU side: a GPU machine usually has more cores than the development machine, and how
# kiln's CPU step scales with them is measured nowhere else.
CPU_BENCH="${KILN_CPU_BENCH-threads}"
if [ -x "$BIN/xtask" ] && [ -z "$SANITIZE" ] && [ -n "$CPU_BENCH" ] && wanted cpu-bench; then
    left=$(budget_left)
    mkdir -p "$LOGS/cpu-bench"
    t0=$(date +%s)
    # shellcheck disable=SC2086  # a list of group names
    (cd "$LOGS/cpu-bench" && KILN_BENCH_OUT="$LOGS/cpu-bench" timeout "$left" "$BIN/xtask" bench ${CPU_BENCH//,/ } --vs-torch) \
        >"$LOGS/cpu-bench.log" 2>&1
    rc=$?
    secs=$(($(date +%s) - t0))
    if [ $rc -ne 0 ] || [ ! -f "$LOGS/cpu-bench/report.json" ]; then
        [ $rc -eq 124 ] && log "      CPU bench timed out after ${left}s"
        log "FAIL  xtask bench $CPU_BENCH --vs-torch (CPU)  (rc $rc, ${secs}s)  -> logs/cpu-bench.log"
        FAILS=$((FAILS + 1))
    else
        cp "$LOGS/cpu-bench/report.json" "$OUT/cpu-bench.json"
        cp "$LOGS/cpu-bench/report.md" "$OUT/cpu-bench.md"
        log "PASS  xtask bench $CPU_BENCH --vs-torch (CPU)  (${secs}s)  -> cpu-bench.json, cpu-bench.md"
    fi
fi

# Where the CPU step's time goes at the machine's core count, when `perf` is there: a profile of
# the `threads` group's child (a warm-up and 10 steps of batch 32, so that the steady steps
# dominate the model's set-up), flat by symbol over all threads (release builds keep no frame
# pointers). Optional: without perf, or where the VM refuses it, a SKIP line, never a failure.
if [ -x "$BIN/xtask" ] && [ -z "$SANITIZE" ] && [ -n "$CPU_BENCH" ] && wanted cpu-perf; then
    cores=$(nproc)
    if ! command -v perf >/dev/null 2>&1; then
        log "SKIP  perf profile of the CPU step: no perf on this machine"
    elif [ "$(budget_spare)" -lt 60 ]; then
        log "SKIP  perf profile of the CPU step: under 60 s of KILN_RUN_BUDGET_S left"
    elif KILN_NUM_THREADS=$cores timeout 120 perf record -F 499 -o "$LOGS/perf.data" \
            "$BIN/xtask" bench-threads-child "$cores" 32 10 --no-passes \
            >"$LOGS/cpu-perf-child.log" 2>&1 \
        && timeout 120 perf report -i "$LOGS/perf.data" --sort dso,symbol --stdio \
            --percent-limit 0.2 >"$LOGS/cpu-perf.txt" 2>/dev/null; then
        log "PASS  perf profile of the CPU step on $cores threads  -> logs/cpu-perf.txt; top symbols:"
        grep -E '^ +[0-9.]+%' "$LOGS/cpu-perf.txt" | head -15 | tee -a "$OUT/summary.txt"
    else
        log "SKIP  perf profile of the CPU step: perf failed  -> logs/cpu-perf-child.log"
    fi
    rm -f "$LOGS/perf.data"
fi

# The two small-plane weight gradients (KILN_CONV_WEIGHT_GRAD: chunks, the default, and taps)
# side by side on every core, alternating, two rounds: which one scales is measured only here.
if [ -x "$BIN/xtask" ] && [ -z "$SANITIZE" ] && [ -n "$CPU_BENCH" ] && wanted cpu-ab; then
    cores=$(nproc)
    log "      small-plane weight gradient, chunks vs taps, $cores threads (batch 32, 5 steps):"
    for round in 1 2; do
        for path in chunks taps; do
            if [ "$(budget_spare)" -lt 30 ]; then
                log "SKIP  $path round $round: under 30 s of KILN_RUN_BUDGET_S left"
                continue
            fi
            KILN_CONV_WEIGHT_GRAD=$path KILN_NUM_THREADS=$cores timeout 60 \
                "$BIN/xtask" bench-threads-child "$cores" 32 5 >/dev/null 2>>"$LOGS/cpu-ab.log"
            grep "small-plane weight gradient: $path" "$LOGS/cpu-ab.log" | tail -1 \
                | tee -a "$OUT/summary.txt"
        done
    done
fi

log "done in $(($(date +%s) - START))s: $FAILS failure(s); logs in $OUT/logs.tar.gz"
tar -czf "$OUT/logs.tar.gz" -C "$OUT" logs && rm -rf "$LOGS"
[ $FAILS -eq 0 ]
