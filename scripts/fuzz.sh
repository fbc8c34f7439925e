#!/usr/bin/env bash
# Builds the libFuzzer targets in the asan preset's build (clang, ASan+UBSan, build-asan/)
# and runs each for SECONDS (default 20) from a copy of its checked-in seed corpus
# (tests/fuzz/corpus/<target>). A crash, leak, hang (-timeout=10) or sanitizer report
# fails the run; the input that caused it is left in build-asan/findings/. Prints each
# target's final figures. Targets run side by side, one per core.
#   scripts/fuzz.sh [--built] [SECONDS]   e.g. scripts/fuzz.sh 900 for the documented soak
# --built: the caller has built them (scripts/test.sh, whose tests read build-asan's
# test list while this runs: no configure then).
set -euo pipefail
cd "$(dirname "$0")/.."
built=0
if [[ "${1:-}" == "--built" ]]; then
  built=1
  shift
fi
seconds="${1:-20}"
targets=(definition template cloudevents api_body http_front)

if ((!built)); then
  cmake --preset asan >/dev/null
  cmake --build build-asan -j "$(nproc)" --target "${targets[@]/%/_fuzz}"
fi

mkdir -p build-asan/findings
# Each target is one process on one core: as many run side by side as there are cores.
run_target() {
  local t="$1" work="build-asan/corpus/$1" log="build-asan/findings/$1.log"
  rm -rf "$work" && mkdir -p "$work" && cp tests/fuzz/corpus/"$t"/* "$work"/
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    "build-asan/tests/fuzz/${t}_fuzz" -max_total_time="$seconds" -timeout=10 -max_len=16384 \
    -print_final_stats=1 -artifact_prefix="build-asan/findings/$t-" "$work" >"$log" 2>&1
}
report() {
  local t="$1" log="build-asan/findings/$1.log"
  echo "== fuzz $t for ${seconds}s"
  # The last status line (executions, coverage, features) and the final stats.
  grep -E '^#[0-9]+.*(DONE|pulse|NEW|REDUCE)' "$log" | tail -1 || true
  grep -E 'stat::number_of_executed_units|stat::peak_rss_mb' "$log" || true
}
parallel="$(nproc)"
failed=()
for ((i = 0; i < ${#targets[@]}; i += parallel)); do
  batch=("${targets[@]:i:parallel}")
  pids=()
  for t in "${batch[@]}"; do
    run_target "$t" &
    pids+=($!)
  done
  for j in "${!batch[@]}"; do
    if wait "${pids[$j]}"; then
      report "${batch[$j]}"
    else
      failed+=("${batch[$j]}")
    fi
  done
done
for t in "${failed[@]}"; do
  tail -60 "build-asan/findings/$t.log"
  echo "fuzz: $t failed; the input is in build-asan/findings/" >&2
done
((${#failed[@]} == 0)) || exit 1
echo "fuzz targets ran ${seconds}s each without a finding"
