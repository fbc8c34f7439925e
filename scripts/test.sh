#!/usr/bin/env bash
# Sets up everything and runs every test, each once in an optimized build, in three
# compiles of src/:
#   1. the release preset (gcc, Release, test hooks): the programs of the crash label
#      (process kills on SQLite, verify's schedules, the serve and relay processes), the
#      benchmarks, and the tests labelled release_only (the console in a real browser,
#      the installed package built out of tree); then what a user gets (`cmake
#      -DCMAKE_BUILD_TYPE=Release`, no test hooks, warning-clean; check-user-build.sh),
#      which finds every object but the crash-point hook's in ccache and so costs links.
#      The preset's other test programs run under ASan and are compiled by clang there
#      (with -Werror), not by gcc too: `--quick` builds every target with gcc;
#   2. the asan preset (clang; src/ at -O0, as in 3: at -O1 its compile took 2.3 times as
#      long, most of this script's CPU; ASan+UBSan, -Wthread-safety
#      as errors): the unit, integration and postgres labels (the PostgreSQL kill suites
#      and the C++ saga's among them), and each libFuzzer target for a bounded time
#      (beside the sanitizer tests);
#   3. the tsan preset (clang; src/ at -O0: its tests wait on threads, sockets and
#      the database, and took no longer than at -O1, whose build cost twice): the tests labelled
#      concurrency (tests/CMakeLists.txt: ws_test's CONCURRENCY filter names them beside
#      their test program).
# Both sanitizer builds compile in the background while the release tests run, and their
# tests then run in one ctest, four at a time.
# Test code is -O0 in every build; src/ keeps the build's optimisation.
# The crash label runs in the release build alone: under a sanitizer it would take most
# of CI's time to test the same recovery paths again. It holds the crash programs and the
# cases a program's CRASH filter names (tests/CMakeLists.txt: the PostgreSQL chaos run,
# the C++ saga's and the sql step's kills at every boundary on SQLite; their PostgreSQL
# kills run under ASan). verify's own threads are then
# checked by no sanitizer; its target, HttpFront, is covered under TSan by HttpFront*Test.
# Which test runs where, and the seconds of each stage: docs/performance.md#ci.
#
#   scripts/test.sh            everything (what .ci/run runs)
#   scripts/test.sh --quick    a developer's loop: the release preset's whole build, then the
#                              labels unit and integration (no user build, no sanitizers)
# WAYSTONE_SANITIZERS=0 skips builds 2 and 3 (and with them -Wthread-safety) and runs
# every label in the release build instead;
# WAYSTONE_FUZZ_SECONDS (default 30) sets the time per fuzz target, 0 skips them (a
# regression check of the seed corpus and a short search; scripts/fuzz.sh 900 is the
# soak). With the sanitizers they run beside the sanitizer tests at idle priority, on
# what those leave unused.
# Each stage prints the seconds since the start, and the end prints a table of every
# stage's seconds, so a slow machine shows where it went.
set -euo pipefail
cd "$(dirname "$0")/.."

quick=0
case "${1:-}" in
  --quick) quick=1 ;;
  "") ;;
  *) echo "usage: scripts/test.sh [--quick]" >&2; exit 2 ;;
esac

# The stage table: each stage's name and start; the previous stage ends where the next
# begins. Printed at the end (and on failure, up to the stage that failed).
stage_names=()
stage_starts=()
stage_cpu=()  # "TOTAL IDLE" clock ticks of every core (/proc/stat) at each stage's start
cpu_ticks() {
  local _ user nice system idle iowait irq softirq steal rest
  read -r _ user nice system idle iowait irq softirq steal rest </proc/stat
  echo "$((user + nice + system + idle + iowait + irq + softirq + steal)) $((idle + iowait))"
}
stage() {
  stage_names+=("$*")
  stage_starts+=("$SECONDS")
  stage_cpu+=("$(cpu_ticks)")
  printf '== [%4ds] %s\n' "$SECONDS" "$*"
}
# Each stage's seconds and the share of the machine's CPU time that went unused in it
# (idle or waiting for the disk): near 0, the stage is bound by the CPU and only less
# work makes it shorter; high, it waits (on timers, sockets, processes) and work beside
# it would be free.
stage_table() {
  local status="$1" end="$SECONDS" i next total idle end_cpu t0 i0 share
  end_cpu="$(cpu_ticks)"
  echo
  echo "== stages (seconds, unused CPU)"
  for i in "${!stage_names[@]}"; do
    next="${stage_starts[$((i + 1))]:-$end}"
    read -r total idle <<<"${stage_cpu[$((i + 1))]:-$end_cpu}"
    read -r t0 i0 <<<"${stage_cpu[$i]}"
    share=0
    ((total > t0)) && share=$(((idle - i0) * 100 / (total - t0)))
    printf '   %5d  %3d%%  %s\n' "$((next - stage_starts[i]))" "$share" "${stage_names[$i]}"
  done
  printf '   %5d        total (%s)\n' "$end" "$status"
  if ((end > 2700)); then
    echo "warning: the test command took ${end}s, more than 2700s: CI's limit is 5400s, and a" \
         "cold machine is slower than a warm one (docs/performance.md#ci)" >&2
  fi
}

# One private PostgreSQL cluster for every test process (tests that restart the
# server start their own), and a build in the background (below): both stopped however
# this script ends.
pg_dir=""
bg_pid=""
fuzz_group=""  # the sanitizer builds' session, where the fuzzers go on after them
finish() {  # finish EXIT_CODE
  local rc="$1"
  if [[ -n "$bg_pid" ]]; then kill -- "-$bg_pid" 2>/dev/null || true; fi
  if [[ -n "$fuzz_group" ]]; then kill -- "-$fuzz_group" 2>/dev/null || true; fi
  if [[ -n "$pg_dir" ]]; then
    stage "stop the PostgreSQL test cluster"
    bash scripts/pg-test-cluster.sh stop "$pg_dir"
  fi
  if ((rc == 0)); then stage_table "passed"; else stage_table "FAILED, exit $rc"; fi
}
trap 'finish $?' EXIT

stage "setup"
bash scripts/setup.sh
jobs="$(nproc)"
# Paths in the cache key relative to the checkout: the user build and the release
# preset compile src/ with the same flags, so the second finds the first's objects.
# Depend mode: a miss hashes the compiler's own dependency list instead of running the
# preprocessor once more, which cost a tenth of every cold compile.
# No working folder in the key either (the sanitizer builds carry line tables, and ccache
# would otherwise hash the folder for them): with the unity files' relative #include
# paths (cmake/relocatable_unity.cmake), a clone in another folder finds every object.
export CCACHE_BASEDIR="$PWD" CCACHE_DEPEND=1 CCACHE_NOHASHDIR=1

pg_dir="$(mktemp -d)"
WAYSTONE_TEST_PG="$(bash scripts/pg-test-cluster.sh start "$pg_dir")"
export WAYSTONE_TEST_PG
stage "PostgreSQL test cluster at $WAYSTONE_TEST_PG"

sanitizers=1
[[ "${WAYSTONE_SANITIZERS:-1}" == "0" ]] && sanitizers=0

if ((quick)); then
  stage "release build (every target)"
  cmake --preset release >/dev/null
  cmake --build build -j "$jobs"
  stage "release tests: labels unit, integration"
  ctest --test-dir build --output-on-failure --no-tests=error -j "$jobs" -L 'unit|integration'
  echo "== quick tests passed"
  exit 0
fi

# A build runs beside the test stage before it, at the lowest CPU and I/O priority: the
# tests wait on processes, sockets and timers for half their time, and the compiler gets
# only what they leave idle, so their timing is what it is alone. Its output goes to
# build-*.log, shown if it fails; the stage that waits for it says so.
bg_log=""
background_build() {  # background_build LOG COMMAND...: runs COMMAND in a session of its own
  bg_log="$1"
  shift
  setsid nice -n 19 ionice -c 3 "$@" >"$bg_log" 2>&1 &
  bg_pid=$!
}
wait_background_build() {
  local rc=0
  wait "$bg_pid" || rc=$?
  bg_pid=""
  if ((rc != 0)); then
    tail -100 "$bg_log"
    echo "test.sh: the build in the background failed (exit $rc); its whole output: $bg_log" >&2
    exit "$rc"
  fi
}

fuzz_seconds="${WAYSTONE_FUZZ_SECONDS:-30}"
fuzz_targets=()
if [[ "$fuzz_seconds" != "0" ]]; then
  fuzz_targets=(definition_fuzz template_fuzz cloudevents_fuzz api_body_fuzz http_front_fuzz)
fi

cmake --preset release >/dev/null
if ((sanitizers)); then
  stage "release build: the crash label's programs, the benchmarks, the release_only tests' programs"
  cmake --build build -j "$jobs" --target waystone waystone_api tests_crash benches
else
  stage "release build (every target)"
  cmake --build build -j "$jobs"
fi

if ((sanitizers)); then
  # The ASan build, then the fuzzers beside the TSan build and whatever runs then: in the
  # background, at idle priority, so they take only what the tests leave unused while
  # they wait on processes, sockets and timers. Each fuzz target runs ${fuzz_seconds}s;
  # the last stage waits for them (build-asan/fuzz.status holds fuzz.sh's exit code).
  cmake --preset asan >/dev/null
  cmake --preset tsan >/dev/null
  rm -f build-asan/fuzz.status
  background_build "$PWD/build-sanitizers.log" bash -c '
    jobs="$1" seconds="$2"
    shift 2
    cmake --build build-asan -j "$jobs" --target tests_unit tests_integration tests_postgres \
      waystone "$@" || exit
    if [[ "$seconds" != 0 ]]; then
      (bash scripts/fuzz.sh --built "$seconds" >build-asan/fuzz.log 2>&1
       echo "$?" >build-asan/fuzz.status) &
    fi
    cmake --build build-tsan -j "$jobs" --target tests_concurrency' \
    sanitizer-builds "$jobs" "$fuzz_seconds" "${fuzz_targets[@]}"
  fuzz_group="$bg_pid"
fi

stage "a user's build (Release, no test hooks, warning-clean)"
bash scripts/check-user-build.sh

if ((sanitizers)); then
  # Three at a time: two left a quarter of the machine unused (they wait on the processes
  # they kill and restart).
  stage "release tests: labels crash, release_only (the sanitizer builds beside them)"
  ctest --test-dir build --output-on-failure --no-tests=error -j "$((jobs + 1))" \
    -L 'crash|release_only'
else
  stage "release tests: every label"
  ctest --test-dir build --output-on-failure --no-tests=error -j "$jobs"
fi

if ((sanitizers)); then
  stage "ASan + UBSan and TSan builds, the rest (clang -O0, -Wthread-safety: base/mutex.h's locking as errors)"
  wait_background_build
  # Both sanitizer builds' tests in one ctest (build-sanitizers/CTestTestfile.cmake
  # names the two builds; the TSan build registers only the concurrency label, its tests
  # named tsan/...), four at a time on two cores. Run one build after the other, each
  # run's last tests left the machine a fifth idle while they finished; in one pool the
  # long programs of both builds start first together (their COST). At three at a time
  # the pool was bound by the tests' waits on processes, sockets and timers.
  mkdir -p build-sanitizers
  printf '# Generated by scripts/test.sh: the tests of both sanitizer builds in one ctest.\n%s\n%s\n' \
    "subdirs(\"$PWD/build-asan\")" "subdirs(\"$PWD/build-tsan\")" >build-sanitizers/CTestTestfile.cmake
  stage "ASan + UBSan tests (labels unit, integration, postgres) and TSan tests (label concurrency)"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tests/tsan.supp" \
    ctest --test-dir build-sanitizers --output-on-failure --no-tests=error -j "$((jobs * 2))" \
      -L 'unit|integration|postgres|concurrency' -LE release_only
  if [[ "$fuzz_seconds" != "0" ]]; then
    stage "libFuzzer targets (asan build, beside the builds and tests): what they found"
    while [[ ! -e build-asan/fuzz.status ]] && kill -0 -- "-$fuzz_group" 2>/dev/null; do
      sleep 1
    done
    fuzz_group=""
    cat build-asan/fuzz.log
    fuzz_status="$(cat build-asan/fuzz.status 2>/dev/null || echo "none (fuzz.sh did not finish)")"
    if [[ "$fuzz_status" != "0" ]]; then
      echo "test.sh: the fuzzers failed, exit $fuzz_status (build-asan/findings/)" >&2
      exit 1
    fi
  fi
elif [[ "$fuzz_seconds" != "0" ]]; then
  stage "libFuzzer targets, ${fuzz_seconds}s each"
  bash scripts/fuzz.sh "$fuzz_seconds"
fi
echo "== all tests passed"
