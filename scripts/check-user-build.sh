#!/usr/bin/env bash
# What a user or packager gets from `cmake -DCMAKE_BUILD_TYPE=Release`: it must build
# warning-clean (checked here with WAYSTONE_WERROR=ON, which a user's build leaves off)
# and carry no test hooks: WAYSTONE_CRASH_AT must not be able to kill it.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build-user -G Ninja -DCMAKE_BUILD_TYPE=Release -DWAYSTONE_WERROR=ON >/dev/null
cmake --build build-user -j "$(nproc)" --target waystone waystone_api

work="$(mktemp -d)"
trap 'kill "$sim_pid" 2>/dev/null || true; rm -rf "$work"' EXIT
build-user/apps/waystone sim --port 0 >"$work/sim.out" 2>&1 &
sim_pid=$!
for _ in $(seq 100); do grep -q "listening on" "$work/sim.out" 2>/dev/null && break; sleep 0.05; done
url="$(grep -o 'http://[0-9.:]*' "$work/sim.out")"
if ! CRM_URL="$url" ERP_URL="$url" LINE_URL="$url" EMAIL_URL="$url" \
     WAYSTONE_SECRET_ERP_TOKEN=t WAYSTONE_SECRET_LINE_TOKEN=t WAYSTONE_DB="$work/w.db" \
     WAYSTONE_CRASH_AT=after-call:create-order \
     build-user/apps/waystone run examples/order-to-erp.yaml \
       --input '{"source":"crm","order_id":"1","customer_id":"C-1","amount":1}' >"$work/run.out" 2>&1; then
  cat "$work/run.out"
  echo "user build: the release binary did not complete with WAYSTONE_CRASH_AT set" >&2
  exit 1
fi
echo "user build: warning-clean, and WAYSTONE_CRASH_AT has no effect on it"
