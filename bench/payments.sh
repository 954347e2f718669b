#!/usr/bin/env bash
# Benchmark (not a test) of issue 17: what one payment costs the gateway.
#
# Starts a release `sluice demo` (sandbox PSP in process, no PSP latency) on one
# backend, then wrk creates and confirms Stripe-format payments for
# BENCH_SECONDS at BENCH_CONNECTIONS; the sandbox answers each confirm with the
# charge and then sends its signed webhooks, which the gateway verifies, keeps
# and applies. Prints one RESULT line for `cargo xtask bench`:
#
#   confirm/s, p50/p99/p99.9 of create+confirm, settled/s (every payment of the
#   run reached SUCCEEDED, counted in the database, and every webhook the
#   sandbox sent about it was applied), RSS high-water mark, and on
#   PostgreSQL: commits and statements per payment (pg_stat_database and
#   pg_stat_statements of the run's own database) plus the statements that run
#   most often, and the same-run pgbench baseline (single-row INSERT, 8 clients).
#
# Knobs: BENCH_BACKEND (postgres | sqlite), BENCH_SECONDS (15), BENCH_WEBHOOK_SENDERS (8),
# BENCH_CONNECTIONS (16), BENCH_INGEST_CONNECTIONS (32), BENCH_HALF_RATE (half of the run's), SLUICE_BIN, SLUICE_BENCH_ADAPTERS, SLUICE_BENCH_CONFIG,
# BENCH_PERF_INGEST (a file: perf profile of the gateway during webhook ingest),
# BENCH_PG (postgres://postgres@127.0.0.1:5432, trust auth).
# Statement counts need pg_stat_statements in shared_preload_libraries; without
# it they are reported as missing, not guessed.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT="$PWD"
TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
case "$TARGET_DIR" in /*) ;; *) TARGET_DIR="$ROOT/$TARGET_DIR" ;; esac
SLUICE="${SLUICE_BIN:-$TARGET_DIR/release/sluice}"
ADAPTERS="${SLUICE_BENCH_ADAPTERS:-$TARGET_DIR/adapters}"
BACKEND="${BENCH_BACKEND:-postgres}"
SECONDS_PER_RUN="${BENCH_SECONDS:-15}"
CONNECTIONS="${BENCH_CONNECTIONS:-16}"
# Webhook ingest is measured at its own concurrency: at 16 connections a
# webhook's 3 ms round trip (HTTP, the adapter, its share of a group commit)
# left a sixth of the 2 cores idle, so 16 senders measured their own latency,
# not what the gateway can keep (BENCHMARKS.md, issue 17, session 5).
INGEST_CONNECTIONS="${BENCH_INGEST_CONNECTIONS:-32}"
PG="${BENCH_PG:-postgres://postgres@127.0.0.1:5432}"

. "$ROOT/bench/lib.sh"
bench_require wrk curl python3
[ -x "$SLUICE" ] || { echo "error: no sluice binary at $SLUICE" >&2; exit 1; }
SLUICE="$(realpath "$SLUICE")"
ADAPTERS="$(realpath "$ADAPTERS")"
[ -f "$ADAPTERS/stripe.wasm" ] || { echo "error: no adapters in $ADAPTERS (cargo xtask build-adapters)" >&2; exit 1; }

WORK="$(mktemp -d)"
SERVER_PID=""
DB=""
cleanup() {
    bench_stop "$SERVER_PID"
    [ -n "$DB" ] && psql -q "$PG/postgres" -c "DROP DATABASE IF EXISTS $DB" >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

CONFIG_ARGS=()
[ -n "${SLUICE_BENCH_CONFIG:-}" ] && CONFIG_ARGS=(--config "$(realpath "$SLUICE_BENCH_CONFIG")")

sql() { psql -qAt "$PG/$DB" -c "$1"; }
case "$BACKEND" in
    postgres)
        bench_require psql pgbench
        DB="sluice_bench_$(python3 -c 'import secrets; print(secrets.token_hex(4))')"
        psql -q "$PG/postgres" -c "CREATE DATABASE $DB" >/dev/null
        DATABASE_URL="$PG/$DB"
        ;;
    sqlite) DATABASE_URL="sqlite://$WORK/data/sluice.db" ;;
    *) echo "error: BENCH_BACKEND is postgres or sqlite, not $BACKEND" >&2; exit 1 ;;
esac

# How many payments of this run are not yet SUCCEEDED / are SUCCEEDED.
count_sql() { # $1: a SELECT COUNT(*) on either backend
    if [ "$BACKEND" = postgres ]; then
        sql "$1"
    else
        python3 -c 'import sqlite3, sys; print(sqlite3.connect(sys.argv[1]).execute(sys.argv[2]).fetchone()[0])' \
            "$WORK/data/sluice.db" "$1"
    fi
}
count_orders() { # $1: SQL condition on state
    count_sql "SELECT COUNT(*) FROM payment_orders WHERE merchant_order_no LIKE 'bench-run-%' AND $1"
}
# Work the gateway still has queued: webhooks to apply, events to publish or deliver.
backlog() {
    count_sql "SELECT (SELECT COUNT(*) FROM webhook_inbox WHERE status IN ('pending', 'processing', 'failed')) \
        + (SELECT COUNT(*) FROM outbox WHERE status = 'pending') \
        + (SELECT COUNT(*) FROM event_deliveries WHERE status = 'pending')"
}
# Waits (bounded) until a phase's payments are settled: each one SUCCEEDED
# (the PSP's synchronous answer usually does that), the sandbox PSP has
# delivered every webhook about them (its own queue, which the database cannot
# see) and the gateway has applied each one and handed over every event.
# Prints whether the sandbox went idle.
settle_phase() {
    for _ in $(seq 1 300); do
        [ "$(count_orders "state NOT IN ('SUCCEEDED', 'FAILED', 'CANCELED', 'EXPIRED')")" = 0 ] && break
        sleep 0.1
    done
    local idle
    idle="$(curl -sf -X POST "$SANDBOX/_sandbox/wait_idle?timeout_ms=60000" | python3 -c 'import json, sys; print(str(json.load(sys.stdin)["idle"]).lower())' || echo false)"
    for _ in $(seq 1 600); do
        [ "$(backlog)" = 0 ] && break
        sleep 0.1
    done
    echo "$idle"
}

if [ "$BACKEND" = postgres ]; then
    # The baseline first, on the same server, in the run's own database.
    sql "CREATE TABLE bench_insert (id BIGSERIAL PRIMARY KEY, v TEXT NOT NULL)"
    echo "INSERT INTO bench_insert (v) VALUES ('payment');" >"$WORK/insert.sql"
    pgbench -n -c 8 -j 2 -T 10 -f "$WORK/insert.sql" "$PG/$DB" >"$WORK/pgbench.txt" 2>&1
    PGBENCH_TPS="$(sed -n 's/^tps = \([0-9.]*\).*/\1/p' "$WORK/pgbench.txt" | head -1)"
    echo "== pgbench single-row INSERT, 8 clients, 10 s: $PGBENCH_TPS tps"
    sql "DROP TABLE bench_insert"
    # The baseline's pages are written back now, not by the kernel half a
    # minute later in the middle of the gateway's run (bench_phase_sync).
    bench_phase_sync
fi

bench_start_demo
DIRTY_BACKGROUND="$(bench_dirty_background)"
echo "== host: background writeback starts at $DIRTY_BACKGROUND dirty (vm.dirty_background_bytes / _ratio)"
bench_write_pay_lua
# Warm-up: the adapters' first calls, the pools, the database caches.
BENCH_PHASE=warm wrk -t1 -c1 -d2s -s "$WORK/pay.lua" "$BASE" >/dev/null

STATEMENTS="missing"
if [ "$BACKEND" = postgres ]; then
    sleep 2 # let the warm-up's statistics reach the shared counters
    if sql "CREATE EXTENSION IF NOT EXISTS pg_stat_statements; SELECT pg_stat_statements_reset()" >/dev/null 2>&1; then
        STATEMENTS="yes"
    fi
    COMMITS_BEFORE="$(sql "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")"
    # WAL flushes are the server's, not the database's: nothing else should run meanwhile.
    FLUSHES_BEFORE="$(sql "SELECT wal_sync FROM pg_stat_wal")"
    WAL_BEFORE="$(sql "SELECT wal_bytes || ' ' || wal_fpi FROM pg_stat_wal")"
fi

# Decisions the door took again after a lost compare-and-set (each a try's
# write that failed, which pg_stat_statements does not count, and a backoff).
# awk reads to the end: quitting at the match would close the pipe under curl,
# whose write error (23) then fails the pipeline and, under `set -e`, the bench.
cas_total() { curl -sf "$BASE/metrics" | awk '/^sluice_cas_conflicts_total/ && !seen { print $2; seen = 1 }'; }
CAS_BEFORE="$(cas_total)"
echo "== $BACKEND: create+confirm, $CONNECTIONS connections, ${SECONDS_PER_RUN}s ($(cut -d' ' -f1-3 /proc/loadavg) load, $(nproc) cores)"
START_MS="$(date +%s%3N)"
BENCH_PHASE=run wrk -t2 -c"$CONNECTIONS" -d"${SECONDS_PER_RUN}s" --latency -s "$WORK/pay.lua" "$BASE" >"$WORK/run.txt"
read -r RPS P50 P99 ERR TIMEOUTS P999 <<<"$(bench_wrk_summary "$WORK/run.txt")"

# Settled: every payment of the run has reached SUCCEEDED and every webhook
# about it was delivered and applied (bounded waits).
WEBHOOKS_IDLE="$(settle_phase)"
END_MS="$(date +%s%3N)"
SUCCEEDED="$(count_orders "state = 'SUCCEEDED'")"
OPEN="$(count_orders "state NOT IN ('SUCCEEDED', 'FAILED', 'CANCELED', 'EXPIRED')")"
SETTLED_PER_S="$(python3 -c "print(f'{$SUCCEEDED * 1000 / ($END_MS - $START_MS):.1f}')")"
RSS_MB="$(awk '/VmHWM/ { printf "%.0f", $2 / 1024 }' "/proc/$SERVER_PID/status")"
echo "   create+confirm $RPS/s  p50 $P50 ms  p99 $P99 ms  p99.9 $P999 ms  non-2xx $ERR  timeouts $TIMEOUTS"
WEBHOOKS_PER="$(python3 -c "print(f'{$(count_sql "SELECT COUNT(*) FROM webhook_inbox") / max($SUCCEEDED, 1):.2f}')")"
echo "   settled $SUCCEEDED payments ($OPEN still open) in $(( (END_MS - START_MS) / 1000 )) s: $SETTLED_PER_S/s; RSS high-water $RSS_MB MB"
echo "   the sandbox's webhooks all delivered: $WEBHOOKS_IDLE; $WEBHOOKS_PER webhook events kept a payment; gateway backlog left: $(backlog)"
CAS_AFTER="$(cas_total)"
CAS_PER="$(python3 -c "print(f'{(${CAS_AFTER:-0} - ${CAS_BEFORE:-0}) / max($SUCCEEDED, 1):.3f}')")"
echo "   decisions taken again after a lost compare-and-set: $CAS_PER a payment"

COMMITS_PER="-"
STATEMENTS_PER="-"
FLUSHES_PER="-"
if [ "$BACKEND" = postgres ]; then
    sleep 2
    COMMITS="$(( $(sql "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()") - COMMITS_BEFORE ))"
    COMMITS_PER="$(python3 -c "print(f'{$COMMITS / max($SUCCEEDED, 1):.1f}')")"
    FLUSHES="$(( $(sql "SELECT wal_sync FROM pg_stat_wal") - FLUSHES_BEFORE ))"
    FLUSHES_PER="$(python3 -c "print(f'{$FLUSHES / max($SUCCEEDED, 1):.2f}')")"
    echo "   per payment: $FLUSHES_PER WAL flushes (one flush serves every commit waiting for it)"
    read -r WAL_BYTES_BEFORE WAL_FPI_BEFORE <<<"$WAL_BEFORE"
    read -r WAL_BYTES_AFTER WAL_FPI_AFTER <<<"$(sql "SELECT wal_bytes || ' ' || wal_fpi FROM pg_stat_wal")"
    WAL_KB_PER="$(python3 -c "print(f'{($WAL_BYTES_AFTER - $WAL_BYTES_BEFORE) / 1024 / max($SUCCEEDED, 1):.1f}')")"
    FPI_PER="$(python3 -c "print(f'{($WAL_FPI_AFTER - $WAL_FPI_BEFORE) / max($SUCCEEDED, 1):.2f}')")"
    echo "   per payment: $WAL_KB_PER KiB of WAL, $FPI_PER full-page images"
    if [ "$STATEMENTS" = yes ]; then
        STATEMENTS_PER="$(sql "SELECT round(sum(calls)::numeric / GREATEST($SUCCEEDED, 1), 1) FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())")"
        echo "   per payment: $COMMITS_PER commits, $STATEMENTS_PER statements; the most frequent:"
        sql "SELECT round(calls::numeric / GREATEST($SUCCEEDED, 1), 2) || ' x ' || round(mean_exec_time::numeric, 3) || ' ms  ' || left(regexp_replace(query, '\s+', ' ', 'g'), 110) FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) ORDER BY calls DESC LIMIT 25" | sed 's/^/     /'
        echo "   WAL a payment by statement (bytes, full-page images):"
        sql "SELECT round(wal_bytes::numeric / GREATEST($SUCCEEDED, 1)) || ' B, ' || round(wal_fpi::numeric / GREATEST($SUCCEEDED, 1), 2) || ' fpi  ' || left(regexp_replace(query, '\s+', ' ', 'g'), 100) FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) ORDER BY wal_bytes DESC LIMIT 8" | sed 's/^/     /'
    else
        echo "   per payment: $COMMITS_PER commits (statement counts need pg_stat_statements in shared_preload_libraries)"
    fi
fi

# Latency at half the maximum rate (goal 2): the same requests on a fixed
# schedule at half of the run's create+confirm rate, 16 connections so that one
# is always free. Goal 2 is the gateway's share: each answer's latency as wrk
# saw it minus the time the gateway waited for the sandbox PSP in that request
# (its Server-Timing header), paired by order number (pay.lua, BENCH_SHARE).
# BENCH_HALF_RATE fixes it instead, to compare two builds at one load.
HALF_RATE="${BENCH_HALF_RATE:-$(python3 -c "print(max(1, int(float('$RPS') / 2)))")}"
HALF_SECONDS=10
# The full-rate run is settled above, its webhooks delivered and applied: the
# latency at half the rate is not measured while the gateway (or the sandbox)
# is still catching up with twice that rate, nor while the kernel writes back
# what that run left dirty (bench_phase_sync).
bench_phase_sync
echo "== $BACKEND: create+confirm at half that rate, $HALF_RATE/s for ${HALF_SECONDS}s"
BENCH_PHASE=half BENCH_SHARE=1 BENCH_RATE="$HALF_RATE" wrk -t2 -c16 -d"${HALF_SECONDS}s" --latency -s "$WORK/pay.lua" "$BASE" >"$WORK/half.txt"
read -r H_RPS H_P50 H_P99 H_ERR H_TO H_P999 <<<"$(bench_wrk_summary "$WORK/half.txt")"
echo "   $H_RPS/s achieved, p50 $H_P50 ms  p99 $H_P99 ms  p99.9 $H_P999 ms  non-2xx $H_ERR  timeouts $H_TO"
read -r S_P50 S_P99 S_P999 S_N S_UNPAIRED PSP_P50 PSP_P99 <<<"$(python3 - "$WORK/half.txt" <<'PY'
import re, sys
m = re.search(r"SHARE_US p50=(\d+) p99=(\d+) p999=(\d+) n=(\d+) unpaired=(\d+) psp_p50=(\d+) psp_p99=(\d+)", open(sys.argv[1]).read())
v = [int(x) for x in m.groups()] if m else [0] * 7
print(" ".join([f"{x / 1000:.1f}" for x in v[:3]] + [str(v[3]), str(v[4])] + [f"{x / 1000:.2f}" for x in v[5:]]))
PY
)"
echo "   the gateway's share (each answer's latency minus its PSP time): p50 $S_P50 ms  p99 $S_P99 ms  p99.9 $S_P999 ms over $S_N answers ($S_UNPAIRED unpaired); the PSP's time p50 $PSP_P50 ms  p99 $PSP_P99 ms"
read -r I_P50 I_P99 I_P999 <<<"$(python3 - "$WORK/half.txt" <<'PY'
import re, sys
m = re.search(r"INSIDE_US p50=(\d+) p99=(\d+) p999=(\d+)", open(sys.argv[1]).read())
print(" ".join(f"{int(x) / 1000:.1f}" for x in m.groups()) if m else "- - -")
PY
)"
echo "   of it inside the gateway's /v1 routes (Server-Timing app minus psp): p50 $I_P50 ms  p99 $I_P99 ms  p99.9 $I_P999 ms"
HALF_WEBHOOKS_IDLE="$(settle_phase)"

# Webhook ingest: correctly signed, distinct Stripe-format webhooks to one
# account whose own limit is raised out of the way (config keys webhook_burst,
# webhook_per_second); counted as rows in the inbox, i.e. verified and durable.
admin() { curl -sf -H "Authorization: Bearer $ADMIN_TOKEN" -H 'Content-Type: application/json' "$@"; }
json_id() { python3 -c 'import json, sys; print(json.load(sys.stdin)["id"])'; }
INGEST_SECRET="whsec_bench_$(python3 -c 'import secrets; print(secrets.token_hex(12))')"
INGEST_MERCHANT="$(admin -X POST "$BASE/admin/merchants" -d '{"name": "ingest"}' | json_id)"
INGEST_ACCOUNT="$(admin -X POST "$BASE/admin/merchants/$INGEST_MERCHANT/connector_accounts" \
    -d "{\"adapter\": \"stripe\", \"label\": \"ingest\", \"config\": {\"base_url\": \"http://127.0.0.1:9/\", \"webhook_burst\": \"1000000\", \"webhook_per_second\": \"1000000\"}, \"secrets\": {\"api_key\": \"sk_test_bench\", \"webhook_secret\": \"$INGEST_SECRET\"}}" | json_id)"
python3 - "$ROOT/adapters/stripe/tests/fixtures/webhooks/payment_intent.succeeded.json" "$INGEST_SECRET" "$WORK/webhooks.txt" <<'PY'
import hashlib, hmac, json, sys, time
template = json.load(open(sys.argv[1]))
secret, out = sys.argv[2].encode(), open(sys.argv[3], "w")
now = int(time.time())
# More distinct events than the phase can keep: a sender that ran out would
# repeat earlier ones, which the inbox rightly counts once (60,000 capped the
# count at 6,000/s).
for n in range(150000):
    template["id"] = f"evt_bench_{n}"
    template["data"]["object"]["id"] = f"pi_bench_{n}"
    body = json.dumps(template, separators=(",", ":"))
    sig = hmac.new(secret, f"{now}.{body}".encode(), hashlib.sha256).hexdigest()
    out.write(f"t={now},v1={sig}\t{body}\n")
PY
cat >"$WORK/ingest.lua" <<'LUA'
local lines, nthreads, threads = {}, 2, {}
function setup(thread)
    thread:set("tid", #threads)
    table.insert(threads, thread)
end
function init(args)
    for line in io.lines(os.getenv("BENCH_WEBHOOKS")) do lines[#lines + 1] = line end
    idx = tid
end
request = function()
    -- Each thread its own lines: every request is a distinct event.
    idx = idx + nthreads
    local line = lines[(idx % #lines) + 1]
    local tab = line:find("\t", 1, true)
    return wrk.format("POST", nil, {
        ["Content-Type"] = "application/json",
        ["Stripe-Signature"] = line:sub(1, tab - 1),
    }, line:sub(tab + 1))
end
response = function(status, headers, body)
    statuses = statuses or {}
    statuses[status] = (statuses[status] or 0) + 1
    if status >= 300 and not shown then
        shown = true
        io.write("FIRST REFUSAL " .. status .. " " .. body:sub(1, 300) .. "\n")
    end
end
function done(summary, latency, requests)
    local total = {}
    for _, thread in ipairs(threads) do
        for status, n in pairs(thread:get("statuses") or {}) do total[status] = (total[status] or 0) + n end
    end
    local seen = {}
    for status, n in pairs(total) do seen[#seen + 1] = status .. ": " .. n end
    table.sort(seen)
    io.write("STATUSES " .. table.concat(seen, ", ") .. "\n")
end
LUA
INGEST_SECONDS=10
if [ "$BACKEND" = postgres ]; then
    [ "$STATEMENTS" = yes ] && sql "SELECT pg_stat_statements_reset()" >/dev/null
    INGEST_COMMITS_BEFORE="$(sql "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")"
fi
echo "== $BACKEND: webhook ingest, $INGEST_CONNECTIONS connections, ${INGEST_SECONDS}s"
# BENCH_PERF_INGEST=FILE: a perf profile of the gateway during the phase.
PERF_PID=""
if [ -n "${BENCH_PERF_INGEST:-}" ]; then
    perf record -F 999 -g -p "$SERVER_PID" -o "$BENCH_PERF_INGEST" -- sleep $((INGEST_SECONDS - 2)) >/dev/null 2>&1 &
    PERF_PID=$!
fi
BENCH_WEBHOOKS="$WORK/webhooks.txt" wrk -t2 -c"$INGEST_CONNECTIONS" -d"${INGEST_SECONDS}s" --latency -s "$WORK/ingest.lua" \
    "$BASE/webhooks/stripe/$INGEST_ACCOUNT" >"$WORK/ingest.txt"
[ -n "$PERF_PID" ] && wait "$PERF_PID"
read -r W_RPS W_P50 W_P99 W_ERR W_TO _ <<<"$(bench_wrk_summary "$WORK/ingest.txt")"
INBOX_Q="SELECT COUNT(*) FROM webhook_inbox WHERE connector_account_id = '$INGEST_ACCOUNT'"
if [ "$BACKEND" = postgres ]; then
    INBOX="$(sql "$INBOX_Q")"
else
    INBOX="$(python3 -c 'import sqlite3, sys; print(sqlite3.connect(sys.argv[1]).execute(sys.argv[2]).fetchone()[0])' "$WORK/data/sluice.db" "$INBOX_Q")"
fi
INGEST_PER_S="$(python3 -c "print(f'{$INBOX / $INGEST_SECONDS:.1f}')")"
echo "   $W_RPS answers/s, p50 $W_P50 ms, p99 $W_P99 ms; $(sed -n 's/^STATUSES //p' "$WORK/ingest.txt"); $INBOX events in the inbox: $INGEST_PER_S/s"
# Commits and statements per webhook kept (they include the inbox processor's
# work on the same events meanwhile, and the other workers' polling).
INGEST_COMMITS_PER="-"
INGEST_STATEMENTS_PER="-"
if [ "$BACKEND" = postgres ]; then
    sleep 2 # let the phase's statistics reach the shared counters
    INGEST_COMMITS="$(( $(sql "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()") - INGEST_COMMITS_BEFORE ))"
    INGEST_COMMITS_PER="$(python3 -c "print(f'{$INGEST_COMMITS / max($INBOX, 1):.2f}')")"
    if [ "$STATEMENTS" = yes ]; then
        INGEST_STATEMENTS_PER="$(sql "SELECT round(sum(calls)::numeric / GREATEST($INBOX, 1), 2) FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())")"
        KEPT_BY="$(sql "SELECT round(sum(calls)::numeric / GREATEST($INBOX, 1), 3) FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) AND query LIKE 'WITH input%'")"
        echo "   per webhook: $INGEST_COMMITS_PER commits, $INGEST_STATEMENTS_PER statements, of them $KEPT_BY keeping webhooks"
    else
        echo "   per webhook: $INGEST_COMMITS_PER commits"
    fi
fi
grep "^FIRST REFUSAL" "$WORK/ingest.txt" | sed "s/^/     /" | head -2 || true
curl -sf "$BASE/metrics" | grep -E '^sluice_adapter_calls_shed_total' | sed 's/^/     /' || true

# The database's own floor of a payment (PostgreSQL): bench/payment_floor.sql
# writes, by pgbench alone, the rows one settled payment of this run wrote (14
# inserted, 10 updated), copied from such a payment, into the same tables with
# their indexes, checks and triggers. A gateway writing these rows settles
# payments about as fast as its database takes them, and folding the floor's
# commits into one gains little (BENCHMARKS.md, session 12), so floor ÷ INSERT
# tps is near the most goal 1's ratio can be. The floor writes each payment's
# rows alone, in 11 commits; the gateway shares the inbox's, the claims' and the
# publisher's statements between payments (6.6 commits a payment). Until the
# settled figure waited for every webhook (session 18), the gateway seemed to
# settle faster than its floor: most of its webhooks came after the run.
# The template is looked up among the demo account's webhooks only (the
# inbox's unique index leads with adapter and account): the ingest phase left
# tens of thousands of rows of another account that a LIKE would otherwise read.
FLOOR_TPS="-"
if [ "$BACKEND" = postgres ]; then
    read -r T_PAY T_MERCHANT T_KEY T_INBOX T_BODY <<<"$(psql -qAt -F' ' "$PG/$DB" -c "SELECT o.id, o.merchant_id, o.merchant_order_no, i.id, i.raw_body_id \
        FROM payment_orders o JOIN webhook_inbox i ON i.adapter = 'stripe' AND i.connector_account_id = '$STRIPE_ACCOUNT' \
          AND i.event_json LIKE '%' || o.id || '%' \
        WHERE o.merchant_order_no LIKE 'bench-run-%' AND o.state = 'SUCCEEDED' AND i.status = 'processed' \
          AND (SELECT COUNT(*) FROM state_history h WHERE h.payment_id = o.id) = 7 \
          AND (SELECT COUNT(*) FROM webhook_inbox j WHERE j.adapter = 'stripe' AND j.connector_account_id = '$STRIPE_ACCOUNT' \
                 AND j.event_json LIKE '%' || o.id || '%') = 1 \
          AND (SELECT COUNT(*) FROM outbox e WHERE e.partition_key = o.id) = 1 \
        LIMIT 1")"
    if [ -n "$T_BODY" ]; then
        sql "CREATE SEQUENCE floor_seq"
        pgbench -n -M prepared -c 8 -j 2 -T 10 -f "$ROOT/bench/payment_floor.sql" \
            -D tpl_payment="$T_PAY" -D tpl_merchant="$T_MERCHANT" -D tpl_key="$T_KEY" \
            -D tpl_inbox="$T_INBOX" -D tpl_body="$T_BODY" "$PG/$DB" >"$WORK/floor.txt" 2>&1 || true
        FLOOR_TPS="$(sed -n 's/^tps = \([0-9.]*\).*/\1/p' "$WORK/floor.txt" | head -1)"
        FLOOR_TPS="${FLOOR_TPS:--}"
        FLOOR_DONE="$(sql "SELECT COUNT(*) FROM payment_orders WHERE id LIKE 'pay_floor_%' AND state = 'SUCCEEDED'")"
        echo "== postgres: a payment's rows without the gateway (pgbench, bench/payment_floor.sql, 8 clients, 10 s): $FLOOR_TPS payments/s ($FLOOR_DONE settled; $(grep -c 'error' "$WORK/floor.txt" || true) error lines)"
    else
        echo "== postgres: no settled payment of the run to copy for the floor"
    fi
fi

echo "RESULT ingest_per_s=$INGEST_PER_S ingest_connections=$INGEST_CONNECTIONS ingest_commits_per_webhook=$INGEST_COMMITS_PER ingest_statements_per_webhook=$INGEST_STATEMENTS_PER backend=$BACKEND confirm_per_s=$RPS p50_ms=$P50 p99_ms=$P99 p999_ms=$P999 non2xx=$ERR timeouts=$TIMEOUTS settled=$SUCCEEDED open=$OPEN settled_per_s=$SETTLED_PER_S rss_mb=$RSS_MB webhooks_idle=$WEBHOOKS_IDLE half_webhooks_idle=$HALF_WEBHOOKS_IDLE webhooks_per_payment=$WEBHOOKS_PER commits_per_payment=$COMMITS_PER wal_flushes_per_payment=$FLUSHES_PER statements_per_payment=$STATEMENTS_PER cas_retries_per_payment=$CAS_PER pgbench_tps=${PGBENCH_TPS:--} floor_tps=$FLOOR_TPS dirty_background=$DIRTY_BACKGROUND half_rate=$HALF_RATE half_rps=$H_RPS half_p50_ms=$H_P50 half_p99_ms=$H_P99 half_p999_ms=$H_P999 half_non2xx=$H_ERR half_share_p50_ms=$S_P50 half_share_p99_ms=$S_P99 half_share_p999_ms=$S_P999 half_share_n=$S_N half_share_unpaired=$S_UNPAIRED half_psp_p50_ms=$PSP_P50 half_psp_p99_ms=$PSP_P99 half_inside_p50_ms=$I_P50 half_inside_p99_ms=$I_P99 half_inside_p999_ms=$I_P999"
