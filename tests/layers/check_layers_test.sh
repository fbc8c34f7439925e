#!/usr/bin/env bash
# scripts/check-layers.sh can fail: on a copy of src/ it passes as checked in, and fails,
# naming the file and line, on each kind of include it exists to refuse (ctest
# CheckLayersRefuses).
set -euo pipefail
source_dir="$(cd "$(dirname "$0")/../.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

fresh_copy() {
  rm -rf "$work/tree" && mkdir -p "$work/tree/scripts"
  cp "$source_dir/scripts/check-layers.sh" "$work/tree/scripts/"
  cp -r "$source_dir/src" "$work/tree/src"
}
failures=0
expect() {  # expect pass|fail DESCRIPTION [TEXT THE REFUSAL MUST NAME]
  local want="$1" what="$2" named="${3:-}" out rc=0
  out="$(bash "$work/tree/scripts/check-layers.sh" 2>&1)" || rc=$?
  if [[ "$want" == pass && "$rc" != 0 ]]; then
    echo "FAIL: $what: refused an unchanged tree (exit $rc): $out"
    failures=$((failures + 1))
  elif [[ "$want" == fail && "$rc" == 0 ]]; then
    echo "FAIL: $what: passed: $out"
    failures=$((failures + 1))
  elif [[ "$want" == fail && "$out" != *"$named"* ]]; then
    echo "FAIL: $what: refused without naming '$named': $out"
    failures=$((failures + 1))
  else
    echo "ok: $what"
  fi
}
# Appends a line after the first #include of FILE (relative to src/), so the refusal
# must name the line it is on.
inject() {
  local file="$work/tree/src/$1" text="$2"
  awk -v t="$text" '{print} !done && /^#include/ {print t; done=1}' "$file" >"$file.new"
  mv "$file.new" "$file"
}

fresh_copy
expect pass "the tree as checked in"

fresh_copy
inject rules/transitions.cc '#include "engine/context.h"'
line="$(grep -n 'engine/context.h' "$work/tree/src/rules/transitions.cc" | cut -d: -f1)"
expect fail "a pure rule including the engine's I/O" "src/rules/transitions.cc:$line: rules includes engine/"

fresh_copy
inject rules/approvals.cc '#include "store/sqlite/sqlite_store.h"'
line="$(grep -n 'store/sqlite' "$work/tree/src/rules/approvals.cc" | cut -d: -f1)"
expect fail "a pure rule including a store implementation" "src/rules/approvals.cc:$line: rules includes store/"

fresh_copy
inject rules/state_machine.h '#include "connectors/http/http_client.h"'
line="$(grep -n 'connectors/http' "$work/tree/src/rules/state_machine.h" | cut -d: -f1)"
expect fail "a pure rule including the HTTP client" "src/rules/state_machine.h:$line: rules includes connectors/"

fresh_copy
sed -i 's/PUBLIC ws_model/PUBLIC ws_model ws_store/' "$work/tree/src/rules/CMakeLists.txt"
expect fail "the rules linking the store" "ws_rules links ws_store, a layer not below it"

fresh_copy
inject store/store.h '#include "engine/engine.h"'
line="$(grep -n 'engine/engine.h' "$work/tree/src/store/store.h" | cut -d: -f1)"
expect fail "a lower layer including a higher one" "src/store/store.h:$line: store includes engine/"

fresh_copy
printf '\ntarget_link_libraries(ws_model PUBLIC ws_engine)\n' >>"$work/tree/src/model/CMakeLists.txt"
expect fail "a layer linking one above it" "ws_model links ws_engine, a layer not below it"

fresh_copy
mkdir -p "$work/tree/src/widgets" && echo 'add_library(ws_widgets)' >"$work/tree/src/widgets/CMakeLists.txt"
expect fail "a layer the script does not rank" "src/widgets/ is a layer this script does not rank"

((failures == 0)) || { echo "check_layers_test: $failures case(s) failed"; exit 1; }
echo "check_layers_test: every case held"
