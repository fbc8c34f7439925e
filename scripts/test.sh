#!/usr/bin/env bash
# Sets up everything and runs every test: the release build's full suite (unit,
# integration, crash), then the suite under ASan+UBSan, then the concurrency
# tests under TSan, then each libFuzzer target for a bounded time. Before them, clang
# compiles the libraries with -Wthread-safety (every ABSL_GUARDED_BY checked).
# WAYSTONE_SANITIZERS=0 skips the sanitizer builds; WAYSTONE_FUZZ_SECONDS (default 20)
# sets the time per fuzz target, 0 skips them. First it checks the layering of src/
# (scripts/check-layers.sh), then builds what a user gets (scripts/check-user-build.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
jobs="$(nproc)"

# One private PostgreSQL cluster for every test process (tests that restart the
# server start their own). Stopped however this script ends.
pg_dir="$(mktemp -d)"
trap 'bash scripts/pg-test-cluster.sh stop "$pg_dir"' EXIT
WAYSTONE_TEST_PG="$(bash scripts/pg-test-cluster.sh start "$pg_dir")"
export WAYSTONE_TEST_PG
echo "== PostgreSQL test cluster at $WAYSTONE_TEST_PG"

echo "== layers: every #include in src/ points down (scripts/check-layers.sh)"
bash scripts/check-layers.sh

echo "== a user's build (Release, no test hooks, warning-clean)"
bash scripts/check-user-build.sh

echo "== clang -Wthread-safety: the libraries' locking, checked by the compiler (base/mutex.h)"
cmake --preset thread-safety >/dev/null
cmake --build build-tsa -j "$jobs" --target ws_base ws_model ws_http ws_definition ws_store ws_connectors \
  ws_engine ws_messaging ws_server ws_sim ws_cli waystone_api

echo "== release build"
cmake --preset release >/dev/null
cmake --build build -j "$jobs"
ctest --test-dir build --output-on-failure -j "$jobs"

if [[ "${WAYSTONE_SANITIZERS:-1}" != "0" ]]; then
  echo "== ASan + UBSan build"
  cmake --preset asan >/dev/null
  cmake --build build-asan -j "$jobs"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    ctest --test-dir build-asan --output-on-failure -j "$jobs"

  echo "== TSan build (concurrency tests)"
  cmake --preset tsan >/dev/null
  cmake --build build-tsan -j "$jobs" --target engine_test engine_parts_test \
    store_conformance_test api_write_test http_front_test independent_target_test verify_process_test \
    embedded_api_test code_saga_test
  TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tests/tsan.supp" \
    ctest --test-dir build-tsan --output-on-failure -j "$jobs" \
      -R 'EngineTest\.|EngineFakeHttpTest\.|Simulator(Shape)?Test\.|CommitQueueTest\.|LeaseKeeperTest\.|StoreConformanceTest\.|ApiWriteTest\.|HttpFront(Connection)?Test\.|WaitingCallsTest\.|LostResponseTest\..*_pool|OAuthTargetTest\.|TargetProtectionTest\.|ParallelCallsTest\.|ParallelTargetTest\.|ApprovalClockTest\.|VerifyProcessTest\.TheExampleSaga|EmbeddedApiTest\.|CodeSagaTest\.'
fi

fuzz_seconds="${WAYSTONE_FUZZ_SECONDS:-20}"
if [[ "$fuzz_seconds" != "0" ]]; then
  echo "== libFuzzer targets, ${fuzz_seconds}s each"
  bash scripts/fuzz.sh "$fuzz_seconds"
fi
