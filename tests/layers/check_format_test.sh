#!/usr/bin/env bash
# scripts/check-format.sh can fail: a copy of a formatted source passes, and the same
# copy with one badly formatted line is refused, naming its file and that line
# (ctest CheckFormatRefuses).
set -euo pipefail
source_dir="$(cd "$(dirname "$0")/../.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
check="$source_dir/scripts/check-format.sh"
failures=0

cp "$source_dir/src/base/clock.h" "$work/clock.h"
if out="$(bash "$check" "$work/clock.h" 2>&1)"; then
  echo "ok: a formatted file passes"
else
  echo "FAIL: a formatted file was refused: $out"
  failures=$((failures + 1))
fi

# Line 3 of the copy becomes a declaration clang-format would rewrite.
awk 'NR == 3 {print "int   badly =1 ;"} {print}' "$source_dir/src/base/clock.h" >"$work/clock.h"
if out="$(bash "$check" "$work/clock.h" 2>&1)"; then
  echo "FAIL: a badly formatted line passed: $out"
  failures=$((failures + 1))
elif [[ "$out" != *"$work/clock.h:3:"* ]]; then
  echo "FAIL: refused without naming $work/clock.h:3: $out"
  failures=$((failures + 1))
else
  echo "ok: refused, naming the line: $out"
fi

# --fix rewrites it, after which the check passes.
bash "$check" --fix "$work/clock.h"
if out="$(bash "$check" "$work/clock.h" 2>&1)" && grep -q '^int badly = 1;$' "$work/clock.h"; then
  echo "ok: --fix rewrote the line and the check passes"
else
  echo "FAIL: after --fix: $out"
  failures=$((failures + 1))
fi
exit $((failures > 0))
