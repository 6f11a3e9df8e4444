#!/usr/bin/env bash
# run.sh BUILD_DIR - keeps the install path honest: installs BUILD_DIR into
# a temporary DESTDIR, builds every example against the *installed* library
# (pkg-config, shared and --static; and CMake's find_package(ferry)), and
# runs them, with the installed `ferry metadata-server` for the metadata
# example and the installed `ferry serve` for serve_client (also built with
# the README's link lines, as written). Prints one line per step; a
# failure prints its cause and exits 1. (No `grep -q` after a pipe: with
# pipefail, the writer's SIGPIPE would fail the step.)
set -euo pipefail
build=$(cd "$1" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
md_pid="" serve_pid=""
cleanup() {
  [ -n "$md_pid" ] && kill "$md_pid" 2>/dev/null && wait "$md_pid" 2>/dev/null
  [ -n "$serve_pid" ] && kill "$serve_pid" 2>/dev/null && wait "$serve_pid" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
root=$tmp/root prefix=/usr/local
cc=${CC:-cc}

DESTDIR=$root cmake --install "$build" --prefix "$prefix" >/dev/null
export PKG_CONFIG_PATH
PKG_CONFIG_PATH=$(dirname "$(find "$root" -name ferry.pc)")
libdir=$(pkg-config --variable=libdir ferry)
for f in "$libdir/libferry.so.0" "$libdir/libferry.a" "$root$prefix/include/ferry.h" \
  "$root$prefix/bin/ferry"; do
  [ -e "$f" ] || { echo "examples: $f was not installed" >&2; exit 1; }
done
echo "examples: installed into DESTDIR, pkg-config: $(pkg-config --modversion ferry)"

# --static must list what libferry.a needs. The static example links
# libferry.a (named directly so the shared library cannot win) with those
# modules' shared libraries: a static libcrypto is not what users link.
static_libs=$(pkg-config --static --libs ferry)
for dep in -lcrypto -ljansson; do
  case " $static_libs " in *" $dep "*) ;; *)
    echo "examples: pkg-config --static --libs ferry lacks $dep: $static_libs" >&2; exit 1 ;;
  esac
done
# shellcheck disable=SC2046
static_libs="$(pkg-config --libs $(pkg-config --print-requires-private ferry)) -pthread"
flags=(-std=c11 -Wall -Wextra -Werror)
for src in "$here"/*.c; do
  name=$(basename "$src" .c)
  # shellcheck disable=SC2046
  "$cc" "${flags[@]}" $(pkg-config --cflags ferry) "$src" -o "$tmp/$name" $(pkg-config --libs ferry)
done
# shellcheck disable=SC2046,SC2086
"$cc" "${flags[@]}" $(pkg-config --cflags ferry) "$here/write_read.c" -o "$tmp/write_read_static" \
  "$libdir/libferry.a" $static_libs

# The README's link lines, as written (app.c is serve_client.c): each must
# build, and is run against `ferry serve` below.
readme_lines() {
  awk '/^## Install and link/{on=1; next} /^## /{on=0} on' "$here/../README.md" |
    sed -e ':a' -e '/\\$/{N; s/\\\n *//; ba' -e '}' | grep '^cc app\.c ' | sed 's/ *#.*$//'
}
readme_builds=()
while IFS= read -r line; do
  out="$tmp/readme_${#readme_builds[@]}"
  eval "${line//app.c/\"\$here/serve_client.c\"} -o \"\$out\"" ||
    { echo "examples: the README's line does not link: $line" >&2; exit 1; }
  readme_builds+=("$out")
done < <(readme_lines)
[ ${#readme_builds[@]} -eq 3 ] ||
  { echo "examples: expected the README's 3 link lines, found ${#readme_builds[@]}" >&2; exit 1; }
readelf -d "${readme_builds[2]}" | grep "NEEDED.*libferry" >/dev/null &&
  { echo "examples: the README's static line linked libferry.so" >&2; exit 1; }
echo "examples: built serve_client.c with the README's 3 link lines (shared, rpath, static)"

cmake -S "$here" -B "$tmp/cmake" -DCMAKE_PREFIX_PATH="$root$prefix" >/dev/null
cmake --build "$tmp/cmake" >/dev/null
echo "examples: built with pkg-config (shared, static) and find_package(ferry)"

export LD_LIBRARY_PATH=$libdir
# The installed metadata service, on a port it picks.
exec 3< <(exec "$root$prefix/bin/ferry" metadata-server --host 127.0.0.1 --port 0 2>"$tmp/md.log")
md_pid=$!
read -r -t 10 ready <&3 || {
  echo "examples: metadata-server did not start: $(cat "$tmp/md.log")" >&2
  exit 1
}
url=${ready#*url=}

ldd "$tmp/write_read" | grep "libferry.so.0 => $libdir/" >/dev/null ||
  { echo "examples: write_read does not use the installed libferry.so.0" >&2; exit 1; }
# The installed `ferry serve`, and the README's builds of its client: the
# rpath and static ones without LD_LIBRARY_PATH.
exec 4< <(exec "$root$prefix/bin/ferry" serve --host 127.0.0.1 --port 0 --size 2M 2>"$tmp/serve.log")
serve_pid=$!
read -r -t 10 ready <&4 || {
  echo "examples: ferry serve did not start: $(cat "$tmp/serve.log")" >&2
  exit 1
}
target=${ready#*target=} target=${target%% *}
out=$("${readme_builds[0]}" "$target")
echo "examples: [README shared] $out"
for i in 1 2; do
  out=$(env -u LD_LIBRARY_PATH "${readme_builds[$i]}" "$target")
  echo "examples: [README $([ $i = 1 ] && echo rpath || echo static), no LD_LIBRARY_PATH] $out"
done

for build in pkg-config:"$tmp" find_package:"$tmp/cmake"; do
  dir=${build#*:}
  for run in write_read write_read_static async_batch "metadata_segment $url" \
    "serve_client $target"; do
    # shellcheck disable=SC2086
    out=$("$dir"/$run) # a failing example stops the script here (set -e)
    link=shared
    [ "$run" = write_read_static ] && link=static
    echo "examples: [${build%%:*}, $link] $out"
  done
done
