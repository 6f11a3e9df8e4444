#!/bin/bash
# tests/gpu/run-on-device.sh - every GPU test and the GPU bench rows in one
# prepared run (issue 30), for a GPU machine that gets a copy of the tree
# and build-gpu/ (made here by tests/gpu/pack.sh; the `run` tool's carry),
# has no network and none of ferry's Debian libraries. Within 8 minutes it
#   1. says what machine it is on: the GPU, the driver, and its glibc
#      against the newest one the packed programs need: at or above it
#      they run as they are (LD_LIBRARY_PATH=build-gpu/lib), below it
#      through the packed glibc's own loader (build-gpu/glibc);
#   2. finds the Python binding: the packed one (CPython 3.12), else
#      `setup.py build_ext --inplace` with that Python against the packed
#      headers and libraries, each failure logged with its cause;
#   3. runs tests/gpu/gpu_transfer (over tcp, then over fabric's tcp
#      provider with FERRY_GPU_TEST_FABRIC), tests/gpu/test_gpu_torch.py and
#      `gpu_transfer --bench` (staged device<->device against host<->host,
#      1 and 64 MiB, one run), then gpu_transfer and its bench over shm
#      (FERRY_GPU_TEST_TRANSPORT=shm: CUDA IPC), each under a timeout;
# and writes $OUT/summary.txt (every PASS/FAIL/BENCH line, each step's
# verdict) and one log per step. Without a pack it builds from source when
# the machine has cmake and ferry's libraries (a GPU machine will not).
# Without a CUDA device every step reads "SKIPPED (no CUDA device ...)" and
# the script exits 0: that is how it is tested on a CPU machine. Exit 1
# when a step failed or timed out.
#
# Usage: tests/gpu/run-on-device.sh   (OUT: where results go, default
# build-gpu-out; PACK default build-gpu; PYTHON default the torch venv's,
# else python3.12, else python3; FERRY_GPU_FORCE_LOADER=1 takes the older-
# glibc path anyway, to try it)
set -u
cd "$(dirname "$0")/../.." || exit 1
ROOT=$PWD
PACK=${PACK:-$ROOT/build-gpu}
OUT=${OUT:-$ROOT/build-gpu-out}
PYTHON=${PYTHON:-/opt/torch/.venv/bin/python3}
DEADLINE=$(($(date +%s) + 470)) # 8 minutes, less the summary's own time
mkdir -p "$OUT"
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
FAILED=0

say() { echo "$*" | tee -a "$SUMMARY"; }
# a.b >= c.d
version_ge() { [ "$(printf '%s\n%s\n' "$2" "$1" | sort -t. -k1,1n -k2,2n | head -1)" = "$2" ]; }
left() { echo $((DEADLINE - $(date +%s))); }

# step NAME SECONDS COMMAND...: runs it into $OUT/NAME.log, bounded by
# SECONDS and by what is left of the 8 minutes; one verdict line.
step() {
  local name=$1 limit=$2 rc why t0
  shift 2
  [ "$(left)" -lt "$limit" ] && limit=$(left)
  if [ "$limit" -le 5 ]; then
    say "$name: NOT RUN (the 8 minutes are used up)"
    FAILED=1
    return
  fi
  t0=$(date +%s)
  timeout -k 10 "$limit" "$@" >"$OUT/$name.log" 2>&1
  rc=$?
  grep -E '^(PASS|FAIL|BENCH) ' "$OUT/$name.log" | sed 's/^/    /' >>"$SUMMARY"
  case $rc in
  0) say "$name: PASSED ($(($(date +%s) - t0)) s)" ;;
  77)
    why=$(grep -m1 '^SKIP: ' "$OUT/$name.log" | sed 's/^SKIP: //')
    say "$name: SKIPPED (${why:-no reason printed})"
    ;;
  124 | 137)
    say "$name: TIMED OUT after $limit s (log: $name.log)"
    FAILED=1
    ;;
  *)
    say "$name: FAILED, exit $rc (log: $name.log; its last lines:)"
    tail -5 "$OUT/$name.log" | sed 's/^/    | /' | tee -a "$SUMMARY"
    FAILED=1
    ;;
  esac
}

# ---- 1. the machine ---------------------------------------------------------
say "ferry GPU run $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n), kernel $(uname -r), $(nproc) CPUs"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1
  say "GPU: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 |
    head -4 | paste -sd';')"
else
  say "GPU: no nvidia-smi here"
fi
GLIBC_HERE=$(ldd --version 2>&1 | head -1 | grep -oE '[0-9]+\.[0-9]+$')
say "glibc here: ${GLIBC_HERE:-unknown} ($(ldd --version 2>&1 | head -1))"
CUDA_LIB=$(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 /{print $NF; exit}')
say "libcuda.so.1: ${CUDA_LIB:-not in the ld.so cache}"

BIN=""
RUN=()
if [ -f "$PACK/MANIFEST" ]; then
  cp "$PACK/MANIFEST" "$OUT/MANIFEST"
  NEED=$(awk '/^glibc_needed /{print $2}' "$PACK/MANIFEST")
  say "pack: $(head -1 "$PACK/MANIFEST"); its programs need glibc >= $NEED"
  BIN=$PACK/bin
  if [ -n "$GLIBC_HERE" ] && version_ge "$GLIBC_HERE" "$NEED" && [ -z "${FERRY_GPU_FORCE_LOADER:-}" ]; then
    say "glibc: $GLIBC_HERE >= $NEED, the packed programs run as they are"
    RUN=(env LD_LIBRARY_PATH="$PACK/lib")
  else
    LOADER=$PACK/glibc/ld-linux-x86-64.so.2
    LIBS=$PACK/glibc:$PACK/lib${CUDA_LIB:+:$(dirname "$CUDA_LIB")}
    say "glibc: ${GLIBC_HERE:-unknown} is older than $NEED${FERRY_GPU_FORCE_LOADER:+ (or FERRY_GPU_FORCE_LOADER is set)}: the C programs run through the packed"
    say "  glibc's loader ($LOADER); the Python binding needs $NEED and will not load"
    RUN=(env FERRY_GPU_LOADER="$LOADER" FERRY_GPU_LIBRARY_PATH="$LIBS" "$LOADER" --library-path
      "$LIBS")
  fi
else
  say "pack: none at $PACK (run tests/gpu/pack.sh on the build machine and carry build-gpu)"
  missing=$(for m in libcrypto libcurl jansson hiredis libfabric libmicrohttpd; do
    pkg-config --exists "$m" 2>/dev/null || echo -n "$m "
  done)
  if command -v cmake >/dev/null && [ -z "$missing" ]; then
    step build_from_source 300 bash -c "cmake -S . -B build-device -DFERRY_BUILD_TESTS=OFF &&
      cmake --build build-device -j$(nproc) --target ferry_tool gpu_transfer"
    BIN=$ROOT/build-device
    RUN=(env)
  else
    say "build from source: not possible here (cmake: $(command -v cmake || echo none);" \
      "missing: ${missing:-nothing})"
    FAILED=1
  fi
fi

# ---- 2. the Python binding ----------------------------------------------------
PYPATH=
if ! "$PYTHON" -c '' 2>/dev/null; then
  for p in python3.12 python3; do # a pyenv shim may exist and not run
    "$p" -c '' 2>/dev/null && break
  done
  say "python: $PYTHON does not run here; using $p"
  PYTHON=$p
fi
say "python: $PYTHON ($("$PYTHON" --version 2>&1))"
if [ -d "$PACK/python" ] &&
  PYTHONPATH=$PACK/python "$PYTHON" -c 'import ferry, mooncake.engine' >"$OUT/py_import.log" 2>&1; then
  PYPATH=$PACK/python
  say "python binding: the packed one ($(cd "$PACK/python/ferry" && echo _ferry*.so))"
else
  [ -d "$PACK/python" ] && say "python binding: the packed one does not import:" \
    "$(tail -1 "$OUT/py_import.log")"
  if "$PYTHON" -c 'import setuptools' >/dev/null 2>&1; then
    step setup_build_ext 180 env CFLAGS="-I$PACK/include" \
      LDFLAGS="-L$PACK/lib -Wl,--disable-new-dtags,-rpath,$PACK/lib" \
      "$PYTHON" setup.py build_ext --inplace
    PYTHONPATH=$ROOT/python "$PYTHON" -c 'import ferry' >>"$OUT/py_import.log" 2>&1 &&
      PYPATH=$ROOT/python
  else
    say "python binding: $PYTHON has no setuptools, so setup.py build_ext cannot run"
  fi
fi

# ---- 3. the tests and the bench rows ------------------------------------------
if [ -n "$BIN" ]; then
  step gpu_transfer 240 "${RUN[@]}" "$BIN/gpu_transfer"
  # fabric's tcp provider (the packed libfabric): device memory staged, or
  # registered where the provider has FI_HMEM; 64 MiB largest.
  step gpu_transfer_fabric 90 env FERRY_GPU_TEST_FABRIC='tcp;ofi_rxm' \
    FERRY_GPU_TEST_MAX_BYTES=67108864 "${RUN[@]}" "$BIN/gpu_transfer"
else
  say "gpu_transfer: NOT RUN (nothing built)"
fi
if [ -n "$PYPATH" ]; then
  step test_gpu_torch 150 env PYTHONPATH="$PYPATH" "$PYTHON" tests/gpu/test_gpu_torch.py
else
  say "test_gpu_torch: NOT RUN (no Python binding that imports; see py_import.log)"
  FAILED=1
fi
if [ -n "$BIN" ]; then
  step gpu_bench 150 "${RUN[@]}" "$BIN/gpu_transfer" --bench
  # The same over shm (CUDA IPC between the two processes), sizes to 64 MiB.
  step gpu_transfer_shm 90 env FERRY_GPU_TEST_TRANSPORT=shm FERRY_GPU_TEST_MAX_BYTES=67108864 \
    "${RUN[@]}" "$BIN/gpu_transfer"
  step gpu_bench_shm 75 env FERRY_GPU_TEST_TRANSPORT=shm "${RUN[@]}" "$BIN/gpu_transfer" --bench
fi

say "done in $((470 - $(left))) s; $([ $FAILED = 0 ] && echo 'no step failed' || echo 'a step FAILED')"
exit $FAILED
