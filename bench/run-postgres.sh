#!/usr/bin/env bash
# Runs the engine benchmark on a private PostgreSQL cluster (fsync on) with 1, 2
# and 4 worker processes, beside the cluster's raw commit rate.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake --preset release >/dev/null
cmake --build build --target engine_bench
dir="$(mktemp -d)"
trap 'bash scripts/pg-test-cluster.sh stop "$dir"' EXIT
server="$(bash scripts/pg-test-cluster.sh start "$dir")"
build/bench/engine_bench --postgres "$server" "$@"
