#!/usr/bin/env bash
# Benchmark (not a test) of issue 13's noisy-neighbour goal: one merchant's
# Stripe-format payments while another merchant's adapter burns its CPU deadline
# on every webhook.
#
# It starts a release `sluice demo` on 127.0.0.1 with a SQLite data dir in a temp
# directory (as .ci/schemathesis does), reads the demo merchant from its banner,
# creates a second merchant whose connector account uses `test-infinite-loop`
# (every export spins until the CPU deadline), then measures with wrk:
#
#   1. baseline: the demo merchant creating+confirming payments alone
#      (POST /v1/payments with "confirm": true; payments/s, p50, p99);
#   2. flood: the same while 32 connections send webhooks to the looping
#      merchant's route (/webhooks/test-infinite-loop/<account>).
#
# Goal (issue 13): in (2) the demo merchant keeps >= 70 % of its baseline
# payments/s and its p99 stays <= 2x the baseline p99.
#
# Knobs: SLUICE_BIN (default <target>/release/sluice), SLUICE_BENCH_CONFIG (a
# sluice.toml passed with --config, e.g. a [bulkhead] section), BENCH_SECONDS (20),
# BENCH_CONNECTIONS (8, the well-behaved merchant), FLOOD_CONNECTIONS (32).
# Needs: wrk, curl, python3. Build first:
#   cargo build --release -p sluice-server --bin sluice && cargo xtask build-adapters
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT="$PWD"
TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
case "$TARGET_DIR" in /*) ;; *) TARGET_DIR="$ROOT/$TARGET_DIR" ;; esac
SLUICE="${SLUICE_BIN:-$TARGET_DIR/release/sluice}"
ADAPTERS="${SLUICE_BENCH_ADAPTERS:-$TARGET_DIR/adapters}"
SECONDS_PER_RUN="${BENCH_SECONDS:-20}"
CONNECTIONS="${BENCH_CONNECTIONS:-8}"
FLOOD="${FLOOD_CONNECTIONS:-32}"

. "$ROOT/bench/lib.sh"
bench_require wrk curl python3
[ -x "$SLUICE" ] || { echo "error: no sluice binary at $SLUICE" >&2; exit 1; }
SLUICE="$(realpath "$SLUICE")"
ADAPTERS="$(realpath "$ADAPTERS")"
[ -f "$ADAPTERS/test-infinite-loop.wasm" ] || { echo "error: no adapters in $ADAPTERS (cargo xtask build-adapters)" >&2; exit 1; }

WORK="$(mktemp -d)"
SERVER_PID=""
FLOOD_PID=""
cleanup() {
    bench_stop "$FLOOD_PID"
    bench_stop "$SERVER_PID"
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

CONFIG_ARGS=()
[ -n "${SLUICE_BENCH_CONFIG:-}" ] && CONFIG_ARGS=(--config "$(realpath "$SLUICE_BENCH_CONFIG")")
bench_start_demo

admin() { curl -sf -H "Authorization: Bearer $ADMIN_TOKEN" -H 'Content-Type: application/json' "$@"; }
json_id() { python3 -c 'import json, sys; print(json.load(sys.stdin)["id"])'; }
HOSTILE_MERCHANT="$(admin -X POST "$BASE/admin/merchants" -d '{"name": "hostile"}' | json_id)"
HOSTILE_ACCOUNT="$(admin -X POST "$BASE/admin/merchants/$HOSTILE_MERCHANT/connector_accounts" \
    -d '{"adapter": "test-infinite-loop", "label": "burner", "config": {"base_url": "http://127.0.0.1:9"}, "secrets": {"webhook_secret": "whsec_burner"}}' | json_id)"

bench_write_pay_lua
cat >"$WORK/flood.lua" <<'LUA'
wrk.method = "POST"
wrk.body = '{"id": "evt_flood", "type": "payment.succeeded"}'
wrk.headers["Content-Type"] = "application/json"
LUA

# One payment first: the adapters' first calls and the database warm up.
BENCH_PHASE=warm wrk -t1 -c1 -d3s -s "$WORK/pay.lua" "$BASE" >/dev/null

echo "== load before: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores"
echo "== baseline: demo merchant alone, $CONNECTIONS connections, ${SECONDS_PER_RUN}s"
BENCH_PHASE=base wrk -t2 -c"$CONNECTIONS" -d"${SECONDS_PER_RUN}s" --latency -s "$WORK/pay.lua" "$BASE" >"$WORK/base.txt"
read -r B_RPS B_P50 B_P99 B_ERR B_TO _ <<<"$(bench_wrk_summary "$WORK/base.txt")"
echo "   payments/s $B_RPS  p50 ${B_P50} ms  p99 ${B_P99} ms  non-2xx $B_ERR  timeouts $B_TO"

echo "== flood: $FLOOD connections of webhooks to the looping merchant's route"
wrk -t2 -c"$FLOOD" -d"$((SECONDS_PER_RUN + 6))s" --latency -s "$WORK/flood.lua" \
    "$BASE/webhooks/test-infinite-loop/$HOSTILE_ACCOUNT" >"$WORK/flood.txt" 2>&1 &
FLOOD_PID=$!
sleep 3
BENCH_PHASE=flood wrk -t2 -c"$CONNECTIONS" -d"${SECONDS_PER_RUN}s" --latency -s "$WORK/pay.lua" "$BASE" >"$WORK/under.txt"
LOAD_DURING="$(cut -d' ' -f1-3 /proc/loadavg)"
wait "$FLOOD_PID" || true
FLOOD_PID=""
read -r U_RPS U_P50 U_P99 U_ERR U_TO _ <<<"$(bench_wrk_summary "$WORK/under.txt")"
echo "   payments/s $U_RPS  p50 ${U_P50} ms  p99 ${U_P99} ms  non-2xx $U_ERR  timeouts $U_TO  (load $LOAD_DURING)"
FLOOD_RPS="$(sed -n 's/^Requests\/sec:\s*//p' "$WORK/flood.txt")"
echo "   flood: $FLOOD_RPS webhooks/s answered; statuses seen by the flood:"
grep -E "Non-2xx|Socket errors" "$WORK/flood.txt" | sed 's/^/     /' || true
curl -sf "$BASE/metrics" | grep -E '^sluice_(adapter_calls_shed_total|adapter_slot_waits_total|webhooks_total)' | sed 's/^/     /' || true

python3 - "$B_RPS" "$B_P99" "$U_RPS" "$U_P99" <<'PY'
import sys
b_rps, b_p99, u_rps, u_p99 = map(float, sys.argv[1:])
kept = 100 * u_rps / b_rps if b_rps else 0
ratio = u_p99 / b_p99 if b_p99 else float("inf")
ok = kept >= 70 and ratio <= 2
print(f"== result: kept {kept:.0f}% of baseline payments/s (goal >= 70%), p99 {ratio:.2f}x baseline (goal <= 2x): {'GOAL MET' if ok else 'GOAL NOT MET'}")
PY
