#!/usr/bin/env bash
# demo.sh - the `make demo` run: starts `ferry serve` on loopback, benchmarks
# WRITE and READ against it with every byte verified, then stops the server.
# Usage: scripts/demo.sh [path/to/ferry]   (default build/ferry)
# Exits non-zero if anything fails; the server never outlives the script.
set -euo pipefail

FERRY=${1:-build/ferry}
READY_TIMEOUT_S=10
# Info lines from both engines would bury the results; FERRY_LOG still wins.
export FERRY_LOG=${FERRY_LOG:-warn}

if [ ! -x "$FERRY" ]; then
  echo "demo: $FERRY is not an executable; build first (cmake --build build)" >&2
  exit 1
fi

workdir=$(mktemp -d)
server_pid=""

cleanup() {
  # Runs on every exit: a failed step must not leave the server running.
  if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
    kill -TERM "$server_pid" 2>/dev/null || true
    sleep 0.5
    kill -KILL "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  rm -rf "$workdir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Waits for the server's single "ready ..." line and prints its target=.
wait_ready() {
  local deadline=$((SECONDS + READY_TIMEOUT_S)) line
  while [ "$SECONDS" -lt "$deadline" ]; do
    line=$(grep -m1 '^ready ' "$workdir/serve.out" || true)
    if [ -n "$line" ]; then
      sed -n 's/.* target=\([^ ]*\).*/\1/p' <<<"$line"
      return 0
    fi
    if ! kill -0 "$server_pid" 2>/dev/null; then
      echo "demo: ferry serve exited before it was ready:" >&2
      cat "$workdir/serve.err" >&2
      return 1
    fi
    sleep 0.1
  done
  echo "demo: ferry serve did not print its ready line within ${READY_TIMEOUT_S} s" >&2
  return 1
}

"$FERRY" serve --host 127.0.0.1 --port 0 --size 256M >"$workdir/serve.out" 2>"$workdir/serve.err" &
server_pid=$!
target=$(wait_ready)
echo "demo: ferry serve ready at $target with 256 MiB registered"
echo "demo: 1 MiB WRITEs and READs for 3 s each, over tcp (what crosses hosts) and shm (same host):"

# TCP over loopback first (what crosses machines), then the same-host shm
# transport ferry picks by itself when both engines share a kernel.
for protocol in tcp shm; do
  for op in write read; do
    "$FERRY" bench --target "$target" --protocol "$protocol" --op "$op" --block 1M --duration 3 \
      --verify | sed 's/^/  /'
  done
done

echo "demo: every transfer verified (reads byte for byte, writes by reading the target back)"

kill -TERM "$server_pid"
status=0
wait "$server_pid" || status=$?
server_pid=""
if [ "$status" -ne 0 ]; then
  echo "demo: ferry serve exited with status $status after SIGTERM" >&2
  cat "$workdir/serve.err" >&2
  exit 1
fi
