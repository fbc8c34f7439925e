#!/usr/bin/env bash
# Runs bench/inflight_bench against tests/targets/slow_target.py, a loopback endpoint
# (Python asyncio, shares no code with Waystone) that answers every request after
# --delay seconds. Flags other than --delay go to the benchmark.
#   bench/run-inflight.sh [--delay 2] [--instances 1000,10000] [--workers 4]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${WAYSTONE_BUILD:-$root/build}"
delay=2
args=()
while [[ $# -gt 0 ]]; do
  if [[ "$1" == "--delay" ]]; then delay="$2"; shift 2; else args+=("$1"); shift; fi
done
work="$(mktemp -d)"
trap 'kill "$target" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT
ulimit -n "$(ulimit -Hn)"
python3 "$root/tests/targets/slow_target.py" --delay "$delay" > "$work/port" 2> "$work/target.err" &
target=$!
for _ in $(seq 100); do grep -q '^PORT ' "$work/port" && break; sleep 0.1; done
port="$(sed -n 's/^PORT //p' "$work/port")"
[[ -n "$port" ]] || { cat "$work/target.err"; exit 1; }
"$build/bench/inflight_bench" --target "http://127.0.0.1:$port" --delay "$delay" --dir "$work" "${args[@]}"
