#!/usr/bin/env bash
# Sets up everything and runs every test, in four builds:
#   1. what a user gets (Release, no test hooks, warning-clean; scripts/check-user-build.sh);
#   2. the release preset (Release, test hooks): the whole suite, unit to crash;
#   3. the asan preset (clang, ASan+UBSan, -Wthread-safety as errors): the unit,
#      integration and postgres labels, then each libFuzzer target for a bounded time;
#   4. the tsan preset (clang): the concurrency tests.
# The suites labelled crash (process kills on SQLite, verify's schedules) run once, in the
# release build: under a sanitizer they would take most of CI's time to test the same
# recovery paths again. The kill suites labelled postgres (and the C++ saga's) still run
# under ASan. verify's own threads are then checked by no sanitizer; its target, HttpFront,
# is covered under TSan by HttpFront*Test.
# WAYSTONE_SANITIZERS=0 skips builds 3 and 4 (and with them -Wthread-safety);
# WAYSTONE_FUZZ_SECONDS (default 20) sets the time per fuzz target, 0 skips them.
# Each stage prints the seconds since the start, so a slow machine shows where it went.
set -euo pipefail
cd "$(dirname "$0")/.."

stage() { printf '== [%4ds] %s\n' "$SECONDS" "$*"; }

stage "setup"
bash scripts/setup.sh
jobs="$(nproc)"
# Paths in the cache key relative to the checkout: the user build and the release
# preset compile src/ with the same flags, so the second finds the first's objects.
export CCACHE_BASEDIR="$PWD"

# One private PostgreSQL cluster for every test process (tests that restart the
# server start their own). Stopped however this script ends.
pg_dir="$(mktemp -d)"
trap 'bash scripts/pg-test-cluster.sh stop "$pg_dir"' EXIT
WAYSTONE_TEST_PG="$(bash scripts/pg-test-cluster.sh start "$pg_dir")"
export WAYSTONE_TEST_PG
stage "PostgreSQL test cluster at $WAYSTONE_TEST_PG"

stage "layers: every #include in src/ points down (scripts/check-layers.sh)"
bash scripts/check-layers.sh

stage "a user's build (Release, no test hooks, warning-clean)"
bash scripts/check-user-build.sh

stage "release build"
cmake --preset release >/dev/null
cmake --build build -j "$jobs"
stage "release tests: every label"
ctest --test-dir build --output-on-failure -j "$jobs"

if [[ "${WAYSTONE_SANITIZERS:-1}" != "0" ]]; then
  stage "ASan + UBSan build (clang -Wthread-safety: the locking of base/mutex.h checked as errors)"
  cmake --preset asan >/dev/null
  cmake --build build-asan -j "$jobs" --target tests_unit tests_integration tests_postgres waystone
  stage "ASan + UBSan tests: labels unit, integration, postgres"
  # The browser drives the same server the release run drove; OutOfTreeExample is not
  # defined in sanitizer builds.
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    ctest --test-dir build-asan --output-on-failure --no-tests=error -j "$jobs" -L 'unit|integration|postgres' \
      -E '^ConsoleBrowserTest$'

  fuzz_seconds="${WAYSTONE_FUZZ_SECONDS:-20}"
  if [[ "$fuzz_seconds" != "0" ]]; then
    stage "libFuzzer targets (asan build), ${fuzz_seconds}s each"
    bash scripts/fuzz.sh "$fuzz_seconds"
  fi

  stage "TSan build (concurrency tests)"
  cmake --preset tsan >/dev/null
  cmake --build build-tsan -j "$jobs" --target engine_test engine_parts_test \
    store_conformance_test api_write_test http_front_test independent_target_test \
    embedded_api_test code_saga_test code_targets_test
  stage "TSan tests"
  TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tests/tsan.supp" \
    ctest --test-dir build-tsan --output-on-failure --no-tests=error -j "$jobs" \
      -R 'EngineTest\.|EngineFakeHttpTest\.|Simulator(Shape)?Test\.|CommitQueueTest\.|LeaseKeeperTest\.|StoreConformanceTest\.|ApiWriteTest\.|HttpFront(Connection)?Test\.|WaitingCallsTest\.|LostResponseTest\..*_pool|OAuthTargetTest\.|TargetProtectionTest\.|ParallelCallsTest\.|ParallelTargetTest\.|ApprovalClockTest\.|EmbeddedApiTest\.|CodeSagaTest\.|CodeTargetsTest\.'
elif [[ "${WAYSTONE_FUZZ_SECONDS:-20}" != "0" ]]; then
  stage "libFuzzer targets, ${WAYSTONE_FUZZ_SECONDS:-20}s each"
  bash scripts/fuzz.sh "${WAYSTONE_FUZZ_SECONDS:-20}"
fi
stage "all tests passed"
