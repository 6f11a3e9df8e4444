#!/usr/bin/env bash
# fuzz/run.sh - builds the libFuzzer targets with clang (ASan + UBSan) into
# build-fuzz and runs each one for SECONDS (default 10), starting from its
# seed corpus in fuzz/corpus/<target>, then prints the executions per target.
# New interesting inputs go to a scratch folder, not into the repository.
#
# Usage: fuzz/run.sh [SECONDS] [TARGET...]      (default: every fuzz_* target)
#        fuzz/run.sh --seeds                    (rewrite the seeds from make_seeds.c, keeping reproducers)
# Env:   FERRY_FUZZ_BUILD (build dir, default build-fuzz), FERRY_FUZZ_KEEP=1
#        (keep the scratch corpora and logs), FERRY_FUZZ_JOBS (parallel targets,
#        default 1).
# Exit status: nonzero if any target crashed, leaked or hung; its reproducer
# is saved as build-fuzz/artifacts/<target>-crash-* (replay: build-fuzz/fuzz/<target> FILE).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
build=${FERRY_FUZZ_BUILD:-build-fuzz}

generator=()
if command -v ninja >/dev/null; then generator=(-G Ninja); fi
if [ ! -f "$build/CMakeCache.txt" ]; then
  CC=clang cmake -S . -B "$build" "${generator[@]}" -DFERRY_FUZZ=ON -DFERRY_SANITIZE=address \
    -DCMAKE_C_FLAGS="-fsanitize=fuzzer-no-link" >/dev/null
fi
cmake --build "$build" --target fuzz_all >/dev/null

# Seeds are rewritten in place; kept reproducers (files make_seeds does not
# write) stay.
if [ "${1:-}" = "--seeds" ]; then
  seeds=$(mktemp -d)
  "$build/fuzz/fuzz_make_seeds" "$seeds"
  cp -r "$seeds"/. fuzz/corpus/
  rm -rf "$seeds"
  find fuzz/corpus -type f | sort
  exit 0
fi

seconds=${1:-10}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for src in fuzz/fuzz_*.c; do targets+=("$(basename "$src" .c)"); done
fi

scratch=$(mktemp -d)
artifacts="$root/$build/artifacts"
mkdir -p "$artifacts"
cleanup() { if [ -z "${FERRY_FUZZ_KEEP:-}" ]; then rm -rf "$scratch"; else echo "kept $scratch"; fi; }
trap cleanup EXIT

export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export FERRY_LOG=off

run_one() {
  local t=$1 log="$scratch/$1.log"
  mkdir -p "$scratch/$t"
  local rc=0
  "$build/fuzz/$t" -max_total_time="$seconds" -print_final_stats=1 -timeout=20 \
    -rss_limit_mb=4096 -max_len=65536 -artifact_prefix="$artifacts/$t-" \
    "$scratch/$t" "fuzz/corpus/$t" >"$log" 2>&1 || rc=$?
  local execs
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  local corpus
  corpus=$(find "$scratch/$t" "fuzz/corpus/$t" -type f 2>/dev/null | wc -l)
  if [ "$rc" -eq 0 ]; then
    printf '%-20s %12s executions  %4s corpus inputs  ok\n' "$t" "${execs:-?}" "$corpus"
  else
    printf '%-20s %12s executions  FAILED (exit %s); log tail:\n' "$t" "${execs:-?}" "$rc"
    tail -40 "$log" | sed 's/^/    /'
    ls "$artifacts/$t-"* 2>/dev/null | sed 's/^/    reproducer: /' || true
    return 1
  fi
}

failed=0
jobs=${FERRY_FUZZ_JOBS:-1}
if [ "$jobs" -le 1 ]; then
  for t in "${targets[@]}"; do run_one "$t" || failed=1; done
else
  pids=()
  for t in "${targets[@]}"; do
    run_one "$t" >"$scratch/$t.summary" 2>&1 &
    pids+=($!)
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do sleep 0.2; done
  done
  for p in "${pids[@]}"; do wait "$p" || failed=1; done
  for t in "${targets[@]}"; do cat "$scratch/$t.summary"; done
fi
exit $failed
