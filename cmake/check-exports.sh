#!/bin/sh
# check-exports.sh LIB HEADER GCC - passes when the shared library LIB
# exports exactly the functions HEADER declares: nothing private leaks
# (callers cannot come to depend on it) and nothing public is missing. The
# header's list comes from gcc (-aux-info), independently of the version
# script that cmake/FerryExports.cmake generates. Exits 77 (skipped) when
# GCC is empty: no gcc was found.
set -eu
lib=$1 header=$2 gcc=${3:-}
if [ -z "$gcc" ]; then
  echo "check-exports: SKIPPED: needs gcc for -aux-info" >&2
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$gcc" -fsyntax-only -aux-info "$tmp/aux" -x c "$header"
# Lines look like: /* /path/ferry.h:52:NC */ extern const char *ferry_strerror (ferry_status);
grep -F "$header:" "$tmp/aux" |
  sed -E 's|^/\*[^*]*\*/ *||; s/^([^(]*[^A-Za-z0-9_])?([A-Za-z_][A-Za-z0-9_]*) \(.*/\2/' |
  sort -u >"$tmp/declared"
nm -D --defined-only "$lib" | awk '$2 ~ /^[TWDBRVi]$/ {print $3}' | sed 's/@.*//' |
  sort -u >"$tmp/exported"

if [ ! -s "$tmp/declared" ]; then
  echo "check-exports: no function found in $header" >&2
  exit 1
fi
comm -13 "$tmp/declared" "$tmp/exported" >"$tmp/extra"
comm -23 "$tmp/declared" "$tmp/exported" >"$tmp/missing"
if [ -s "$tmp/extra" ] || [ -s "$tmp/missing" ]; then
  [ -s "$tmp/extra" ] && { echo "exported by $lib but not declared in $header:"; cat "$tmp/extra"; }
  [ -s "$tmp/missing" ] && { echo "declared in $header but not exported by $lib:"; cat "$tmp/missing"; }
  exit 1
fi
echo "check-exports: $(wc -l <"$tmp/exported") functions, exactly those of $header"
