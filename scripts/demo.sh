#!/usr/bin/env bash
# The main job: run examples/order-to-erp.yaml for a batch of orders against the
# simulator with faults switched on, SIGKILL the worker in the middle, restart it,
# and print what happened. Fails if any order, message or email was duplicated.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build --target waystone

W="$PWD/build/apps/waystone"
work="$(mktemp -d)"
sim_pid="" worker_pid=""
cleanup() {
  [[ -n "$worker_pid" ]] && kill -9 "$worker_pid" 2>/dev/null || true
  [[ -n "$sim_pid" ]] && kill "$sim_pid" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# Faults: lost responses and timeouts after the ERP committed, 503/429 with
# Retry-After, and a cancel that always fails for one account.
faults='{
  "erp.create_order":    {"drop_response": 0.12, "delay": 0.05, "delay_ms": 2500, "unavailable": 0.08, "retry_after_s": 1},
  "erp.find_orders":     {"unavailable": 0.05, "retry_after_s": 0},
  "erp.create_shipment": {"drop_response": 0.08, "rate_limit": 0.05, "retry_after_s": 1},
  "line.push":           {"drop_response": 0.1, "rate_limit": 0.1, "retry_after_s": 1},
  "email.send":          {"delay": 0.05, "delay_ms": 2500, "unavailable": 0.08, "retry_after_s": 0},
  "crm.writeback":       {"error": 0.05}
}'
"$W" sim --port 0 --seed 7 --faults "$faults" >"$work/sim.out" 2>&1 &
sim_pid=$!
for _ in $(seq 100); do grep -q "listening on" "$work/sim.out" 2>/dev/null && break; sleep 0.05; done
sim_url="$(grep -o 'http://[0-9.:]*' "$work/sim.out")"
export CRM_URL="$sim_url" ERP_URL="$sim_url" LINE_URL="$sim_url" EMAIL_URL="$sim_url"
export WAYSTONE_SECRET_ERP_TOKEN=demo-erp-token WAYSTONE_SECRET_LINE_TOKEN=demo-line-token
export WAYSTONE_DB="$work/waystone.db"
echo "simulator on $sim_url, database $WAYSTONE_DB"

# 60 orders: most go through; blocked addresses are compensated; one account's
# cancel keeps failing, so that order waits for an operator.
for i in $(seq 1 60); do
  customer="C-$i"
  if (( i % 12 == 0 )); then customer="C-BLOCKED-$i"; fi
  if (( i == 60 )); then customer="C-BLOCKED-STUCK-$i"; fi
  printf '{"source":"crm","order_id":"%d","customer_id":"%s","amount":%d}\n' "$((10000 + i))" "$customer" "$((i * 10))"
done >"$work/orders.jsonl"
"$W" start examples/order-to-erp.yaml --inputs "$work/orders.jsonl" >/dev/null
echo "started 60 instances"

orders() { curl -s "$sim_url/_sim/stats" | grep -o '"orders":[0-9]*' | cut -d: -f2; }

"$W" worker --workers 8 2>"$work/worker1.err" &
worker_pid=$!
for _ in $(seq 600); do (( $(orders) >= 20 )) && break; sleep 0.05; done
kill -9 "$worker_pid"
wait "$worker_pid" 2>/dev/null || true
worker_pid=""
echo "SIGKILLed the worker after $(orders) ERP orders; restarting it"

"$W" worker --workers 8 --exit-when-idle 2>"$work/worker2.err"
echo
"$W" status --sim "$sim_url"

echo
echo "An instance that waits for an operator:"
"$W" list --state needs_attention
echo "(an operator acts on it through the API: waystone serve, then"
echo " waystone retry|confirm|compensate|skip|close KEY --reason ... [--dry-run]; see docs/operations.md)"

summary="$("$W" status --json --sim "$sim_url")"
dups="$(echo "$summary" | { grep -o '"duplicate_[a-z_]*": [0-9]*' || true; } | awk '{s += $2} END {print s + 0}')"
running="$(echo "$summary" | { grep -o '"running": [0-9]*' || true; } | awk '{s += $2} END {print s + 0}')"
if [[ "$dups" != "0" || "$running" != "0" ]]; then
  echo "demo FAILED: duplicates=$dups running=$running" >&2
  exit 1
fi
echo
echo "demo ok: no duplicate orders, shipments, LINE messages or emails"
