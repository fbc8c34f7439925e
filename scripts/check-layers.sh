#!/usr/bin/env bash
# Checks the layering of src/ (docs/architecture.md): every #include "x/..." in
# src/<layer>/ names its own layer or one that ws_<layer> links, directly or
# through another layer (the target_link_libraries in src/<layer>/CMakeLists.txt
# are the truth); and no layer links one at its own rank or above:
#   base < model < http, definition, store, connectors, rules < sim, engine < messaging, server, verify < cli, api
# rules/ (the pure rules of recovery and approval) thereby includes and links only
# base/ and model/: no store, no HTTP client, none of the engine's I/O.
# Every include directory is src/, so the compiler cannot refuse an upward include;
# this does. Exits 1 and names each offending line. Run by scripts/test.sh and ctest.
set -euo pipefail
cd "$(dirname "$0")/.."

declare -A rank=([base]=0 [model]=1 [http]=2 [sim]=3 [definition]=2 [store]=2 [connectors]=2 [rules]=2
                 [engine]=3 [messaging]=4 [server]=4 [verify]=4 [cli]=5 [api]=5)
failed=0
fail() {
  echo "check-layers: $*" >&2
  failed=1
}

layers=()
for dir in src/*/; do
  layer="$(basename "$dir")"
  [[ -f "$dir/CMakeLists.txt" ]] || continue
  layers+=("$layer")
  [[ -n "${rank[$layer]+x}" ]] || fail "src/$layer/ is a layer this script does not rank (add it)"
done
is_layer() {
  local l
  for l in "${layers[@]}"; do [[ "$l" == "$1" ]] && return 0; done
  return 1
}

# The layers ws_<layer> links itself (any ws_<layer> in a target_link_libraries).
declare -A direct
for layer in "${layers[@]}"; do
  deps=""
  while read -r dep; do
    [[ "$dep" == "$layer" ]] && continue
    is_layer "$dep" || continue
    deps+=" $dep"
  done < <(tr '\n' ' ' < "src/$layer/CMakeLists.txt" | grep -oE 'target_link_libraries\([^)]*\)' |
           grep -oE '\bws_[a-z_]+' | sed 's/^ws_//' | sort -u)
  direct[$layer]="$deps"
done

# What each layer may include: itself and everything it links, transitively.
declare -A allowed
for layer in "${layers[@]}"; do
  reach=" $layer "
  todo="${direct[$layer]}"
  while [[ -n "${todo// /}" ]]; do
    next=""
    for dep in $todo; do
      [[ "$reach" == *" $dep "* ]] && continue
      reach+="$dep "
      next+=" ${direct[$dep]:-}"
    done
    todo="$next"
  done
  allowed[$layer]="$reach"
  for dep in ${direct[$layer]}; do
    if [[ -n "${rank[$layer]+x}" && -n "${rank[$dep]+x}" && ${rank[$dep]} -ge ${rank[$layer]} ]]; then
      fail "src/$layer/CMakeLists.txt: ws_$layer links ws_$dep, a layer not below it"
    fi
  done
done

for layer in "${layers[@]}"; do
  while IFS=: read -r file line text; do
    # Bash's own regex: a sed per line took 20 CPU-seconds (a fork per include).
    [[ "$text" =~ ^[[:space:]]*#[[:space:]]*include[[:space:]]*\"([a-z_]+)/ ]] || continue
    target="${BASH_REMATCH[1]}"
    is_layer "$target" || continue
    if [[ "${allowed[$layer]}" != *" $target "* ]]; then
      fail "$file:$line: $layer includes $target/ (ws_$layer does not link ws_$target): $text"
    fi
  done < <(grep -rnE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"[a-z_]+/' "src/$layer" \
             --include='*.h' --include='*.cc' || true)
done

if [[ "$failed" != 0 ]]; then
  echo "check-layers: FAILED (see docs/architecture.md for the layers)" >&2
  exit 1
fi
echo "check-layers: ${#layers[@]} layers, every include points down"
