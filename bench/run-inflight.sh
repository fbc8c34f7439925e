#!/usr/bin/env bash
# Runs bench/inflight_bench against tests/targets/slow_target.py, a loopback endpoint
# (Python asyncio, shares no code with Waystone) that answers every request after
# --delay seconds, one benchmark process per instance count. Other flags go to the benchmark.
#   bench/run-inflight.sh [--delay 2] [--instances 1000,10000] [--workers 4]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${WAYSTONE_BUILD:-$root/build}"
delay=2
counts=1000,10000
args=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --delay) delay="$2"; shift 2 ;;
    --instances) counts="$2"; shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
work="$(mktemp -d)"
trap 'kill "$target" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT
ulimit -n "$(ulimit -Hn)"
python3 "$root/tests/targets/slow_target.py" --delay "$delay" > "$work/port" 2> "$work/target.err" &
target=$!
for _ in $(seq 100); do grep -q '^PORT ' "$work/port" && break; sleep 0.1; done
port="$(sed -n 's/^PORT //p' "$work/port")"
[[ -n "$port" ]] || { cat "$work/target.err"; exit 1; }
# One process per count: memory a run freed stays with the process and would hide the next
# run's growth.
IFS=, read -ra each <<< "$counts"
for n in "${each[@]}"; do
  "$build/bench/inflight_bench" --target "http://127.0.0.1:$port" --delay "$delay" --dir "$work" \
    --instances "$n" "${args[@]}"
done
