#!/bin/bash
# tests/gpu/pack.sh - run HERE (the Debian build machine), before a GPU run:
# builds what tests/gpu/run-on-device.sh needs and puts it, with every
# shared library it needs beyond glibc, into one folder the GPU machine gets
# next to the tree (the `run` tool's carry: build-gpu is git-ignored). The
# GPU machine has none of ferry's Debian libraries and no network.
#
#   build-gpu/bin      ferry, gpu_transfer (libferry linked in)
#   build-gpu/lib      their libraries and the extension's (libcurl and what
#                      it pulls in, libfabric, jansson, hiredis, ...), plus the
#                      unversioned .so links setup.py's link step asks for
#   build-gpu/glibc    this machine's glibc and its loader: on a GPU machine
#                      with an older glibc the programs run through it
#   build-gpu/include  the dependencies' headers, for setup.py build_ext there
#   build-gpu/python   the ferry and mooncake packages, with ferry._ferry built
#                      for CPython 3.12 (the GPU machine's torch Python)
#   build-gpu/MANIFEST what was packed, from which commit, and the newest
#                      GLIBC_x.y symbol version the programs need
#
# Usage: tests/gpu/pack.sh [OUT]   (OUT default build-gpu; BUILD default
# build, made with `make build`; PY312: a CPython 3.12 with its headers)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-build-gpu}
BUILD=${BUILD:-build}
LIMIT_MIB=60
die() { echo "pack.sh: $*" >&2; exit 1; }

find_py312() {
  local p
  for p in "${PY312:-}" python3.12 /root/.pyenv/versions/3.12*/bin/python3.12; do
    [ -n "$p" ] && command -v "$p" >/dev/null 2>&1 || continue
    if "$p" 2>/dev/null -c 'import sys, sysconfig, os; sys.exit(not (sys.version_info[:2] == (3, 12) and
os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h"))))'; then
      command -v "$p"
      return 0
    fi
  done
  return 1
}

[ -f "$BUILD/CMakeCache.txt" ] || die "$BUILD is not configured: run make build first"
cmake --build "$BUILD" --target ferry_static ferry_tool gpu_transfer -j"${JOBS:-2}" >/dev/null
rm -rf "$OUT"
mkdir -p "$OUT"/{bin,lib,glibc,include,python}
cp "$BUILD/ferry" "$BUILD/gpu_transfer" "$OUT/bin/"

# The extension for CPython 3.12, compiled as setup.py compiles it, but
# against the libferry.a just built (its objects are position independent).
PY=$(find_py312) || die "no CPython 3.12 with headers found (set PY312)"
PYINC=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
SUFFIX=$("$PY" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
cp -r python/ferry python/mooncake "$OUT/python/"
find "$OUT/python" \( -name '*.c' -o -name '*.h' -o -name '*.so' -o -name __pycache__ \
  -o -name ferry-tool \) -prune -exec rm -rf {} +
gcc -shared -fPIC -O2 -g -std=gnu11 -D_GNU_SOURCE -Wall -Wextra -Wno-unused-parameter \
  -Iinclude -Isrc -I"$PYINC" python/ferry/*.c "$BUILD/libferry.a" \
  -lcrypto -ljansson -lpthread -ldl -o "$OUT/python/ferry/_ferry$SUFFIX" \
  -Wl,--disable-new-dtags,-rpath,'$ORIGIN/../../lib' # DT_RPATH: also for libcurl's own libraries
cp "$BUILD/ferry" "$OUT/python/ferry/ferry-tool"

ELVES=("$OUT/bin/ferry" "$OUT/bin/gpu_transfer" "$OUT/python/ferry/_ferry$SUFFIX")
# What libferry loads when a feature is first used (src/base/library.h): no
# NEEDED entry names them, so their own libraries are listed from them.
FEATURE_LIBS=(libcurl.so.4 libhiredis.so.0.14 libfabric.so.1)
for name in "${FEATURE_LIBS[@]}"; do ELVES+=("/usr/lib/x86_64-linux-gnu/$name"); done
mkdir -p "$OUT/lib"
for name in "${FEATURE_LIBS[@]}"; do cp -L "/usr/lib/x86_64-linux-gnu/$name" "$OUT/lib/$name"; done
GLIBC_RE='^(ld-linux-x86-64\.so\.2|libc\.so\.6|libm\.so\.6|libpthread\.so\.0|libdl\.so\.2|librt\.so\.1|libresolv\.so\.2|libutil\.so\.1|libanl\.so\.1|libmvec\.so\.1)$'
# Every library the programs load, glibc's apart.
ldd "${ELVES[@]}" | awk '/=> \//{print $1, $3} /^\t\/.*ld-linux/{print "ld-linux-x86-64.so.2", $1}' |
  sort -u | while read -r name path; do
  if [[ $name =~ $GLIBC_RE ]]; then
    cp -L "$path" "$OUT/glibc/$name"
  else
    cp -L "$path" "$OUT/lib/$name"
  fi
done
for name in ld-linux-x86-64.so.2 libc.so.6 libm.so.6 libpthread.so.0 libdl.so.2 librt.so.1 \
  libresolv.so.2; do # what libcuda itself may ask of the carried glibc
  [ -e "$OUT/glibc/$name" ] || cp -L "/lib/x86_64-linux-gnu/$name" "$OUT/glibc/$name"
done
# libfoo.so -> libfoo.so.N, for -lfoo in a build there.
for lib in crypto curl jansson hiredis fabric microhttpd; do
  real=$(cd "$OUT/lib" && ls lib$lib.so.* 2>/dev/null | head -1) || true
  [ -n "$real" ] || real=$(basename "$(readlink -f "/usr/lib/x86_64-linux-gnu/lib$lib.so")")
  [ -e "$OUT/lib/$real" ] || cp -L "/usr/lib/x86_64-linux-gnu/lib$lib.so" "$OUT/lib/$real"
  ln -sf "$real" "$OUT/lib/lib$lib.so"
done
strip --strip-debug "$OUT"/lib/*.so.* "$OUT"/glibc/* 2>/dev/null || true

# Headers from /usr/include and its multiarch folder, merged.
for dir in openssl curl hiredis rdma; do
  for base in /usr/include /usr/include/x86_64-linux-gnu; do
    [ -d "$base/$dir" ] && mkdir -p "$OUT/include/$dir" && cp -r "$base/$dir/." "$OUT/include/$dir/"
  done
done
cp /usr/include/jansson*.h /usr/include/microhttpd.h "$OUT/include/"

# The newest glibc symbol version any packed program or library needs.
need=$(objdump -T "${ELVES[@]}" "$OUT"/lib/*.so.* 2>/dev/null | grep -o 'GLIBC_[0-9.]*' |
  sed 's/GLIBC_//' | sort -t. -k1,1n -k2,2n -u | tail -1)
{
  echo "commit $(git rev-parse HEAD)$(git diff --quiet HEAD || echo ' (with uncommitted changes)')"
  echo "packed $(date -u +%Y-%m-%dT%H:%MZ) on $(. /etc/os-release && echo "$PRETTY_NAME")"
  echo "glibc_here $(ldd --version | head -1 | grep -o '[0-9.]*$')"
  echo "glibc_needed $need"
  echo "python_ext $(basename "$OUT"/python/ferry/_ferry*.so) built with $PY"
} >"$OUT/MANIFEST"
size=$(du -sm "$OUT" | cut -f1)
echo "size_mib $size" >>"$OUT/MANIFEST"
cat "$OUT/MANIFEST"
[ "$size" -le $LIMIT_MIB ] || die "$OUT is $size MiB, over the $LIMIT_MIB MiB a carry may take"
