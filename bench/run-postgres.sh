#!/usr/bin/env bash
# Runs a benchmark on a private PostgreSQL cluster (fsync on) beside the cluster's
# raw commit rate: engine_bench (1, 2 and 4 worker processes) by default, or the one
# named by WAYSTONE_BENCH (e.g. WAYSTONE_BENCH=closed_loop_bench).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake --preset release >/dev/null
bench="${WAYSTONE_BENCH:-engine_bench}"
cmake --build build --target "$bench"
dir="$(mktemp -d)"
trap 'bash scripts/pg-test-cluster.sh stop "$dir"' EXIT
# pg_stat_statements counts the statements per workflow closed_loop_bench reports.
server="$(WAYSTONE_PG_SERVER_OPTIONS="-c shared_preload_libraries=pg_stat_statements" \
  bash scripts/pg-test-cluster.sh start "$dir")"
"build/bench/$bench" --postgres "$server" "$@"
