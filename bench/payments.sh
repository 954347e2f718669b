#!/usr/bin/env bash
# Benchmark (not a test) of issue 17: what one payment costs the gateway.
#
# Starts a release `sluice demo` (sandbox PSP in process, no PSP latency) on one
# backend, then wrk creates and confirms Stripe-format payments for
# BENCH_SECONDS at BENCH_CONNECTIONS; each one settles by the sandbox's signed
# webhooks. Prints one RESULT line for `cargo xtask bench`:
#
#   confirm/s, p50/p99/p99.9 of create+confirm, settled/s (every payment of the
#   run reached SUCCEEDED, counted in the database), RSS high-water mark, and on
#   PostgreSQL: commits and statements per payment (pg_stat_database and
#   pg_stat_statements of the run's own database) plus the statements that run
#   most often, and the same-run pgbench baseline (single-row INSERT, 8 clients).
#
# Knobs: BENCH_BACKEND (postgres | sqlite), BENCH_SECONDS (15),
# BENCH_CONNECTIONS (16), SLUICE_BIN, SLUICE_BENCH_ADAPTERS, SLUICE_BENCH_CONFIG,
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
count_orders() { # $1: SQL condition on state
    local q="SELECT COUNT(*) FROM payment_orders WHERE merchant_order_no LIKE 'bench-run-%' AND $1"
    if [ "$BACKEND" = postgres ]; then
        sql "$q"
    else
        python3 -c 'import sqlite3, sys; print(sqlite3.connect(sys.argv[1]).execute(sys.argv[2]).fetchone()[0])' \
            "$WORK/data/sluice.db" "$q"
    fi
}

if [ "$BACKEND" = postgres ]; then
    # The baseline first, on the same server, in the run's own database.
    sql "CREATE TABLE bench_insert (id BIGSERIAL PRIMARY KEY, v TEXT NOT NULL)"
    echo "INSERT INTO bench_insert (v) VALUES ('payment');" >"$WORK/insert.sql"
    pgbench -n -c 8 -j 2 -T 10 -f "$WORK/insert.sql" "$PG/$DB" >"$WORK/pgbench.txt" 2>&1
    PGBENCH_TPS="$(sed -n 's/^tps = \([0-9.]*\).*/\1/p' "$WORK/pgbench.txt" | head -1)"
    echo "== pgbench single-row INSERT, 8 clients, 10 s: $PGBENCH_TPS tps"
    sql "DROP TABLE bench_insert"
fi

bench_start_demo
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
fi

echo "== $BACKEND: create+confirm, $CONNECTIONS connections, ${SECONDS_PER_RUN}s ($(cut -d' ' -f1-3 /proc/loadavg) load, $(nproc) cores)"
START_MS="$(date +%s%3N)"
BENCH_PHASE=run wrk -t2 -c"$CONNECTIONS" -d"${SECONDS_PER_RUN}s" --latency -s "$WORK/pay.lua" "$BASE" >"$WORK/run.txt"
read -r RPS P50 P99 ERR TIMEOUTS P999 <<<"$(bench_wrk_summary "$WORK/run.txt")"

# Settled: every payment of the run has reached SUCCEEDED by webhook (bounded wait).
for _ in $(seq 1 300); do
    [ "$(count_orders "state NOT IN ('SUCCEEDED', 'FAILED', 'CANCELED', 'EXPIRED')")" = 0 ] && break
    sleep 0.1
done
END_MS="$(date +%s%3N)"
SUCCEEDED="$(count_orders "state = 'SUCCEEDED'")"
OPEN="$(count_orders "state NOT IN ('SUCCEEDED', 'FAILED', 'CANCELED', 'EXPIRED')")"
SETTLED_PER_S="$(python3 -c "print(f'{$SUCCEEDED * 1000 / ($END_MS - $START_MS):.1f}')")"
RSS_MB="$(awk '/VmHWM/ { printf "%.0f", $2 / 1024 }' "/proc/$SERVER_PID/status")"
echo "   create+confirm $RPS/s  p50 $P50 ms  p99 $P99 ms  p99.9 $P999 ms  non-2xx $ERR  timeouts $TIMEOUTS"
echo "   settled $SUCCEEDED payments ($OPEN still open) in $(( (END_MS - START_MS) / 1000 )) s: $SETTLED_PER_S/s; RSS high-water $RSS_MB MB"

COMMITS_PER="-"
STATEMENTS_PER="-"
if [ "$BACKEND" = postgres ]; then
    sleep 2
    COMMITS="$(( $(sql "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()") - COMMITS_BEFORE ))"
    COMMITS_PER="$(python3 -c "print(f'{$COMMITS / max($SUCCEEDED, 1):.1f}')")"
    if [ "$STATEMENTS" = yes ]; then
        STATEMENTS_PER="$(sql "SELECT round(sum(calls)::numeric / GREATEST($SUCCEEDED, 1), 1) FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())")"
        echo "   per payment: $COMMITS_PER commits, $STATEMENTS_PER statements; the most frequent:"
        sql "SELECT round(calls::numeric / GREATEST($SUCCEEDED, 1), 2) || ' x ' || round(mean_exec_time::numeric, 3) || ' ms  ' || left(regexp_replace(query, '\s+', ' ', 'g'), 110) FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) ORDER BY calls DESC LIMIT 25" | sed 's/^/     /'
    else
        echo "   per payment: $COMMITS_PER commits (statement counts need pg_stat_statements in shared_preload_libraries)"
    fi
fi

echo "RESULT backend=$BACKEND confirm_per_s=$RPS p50_ms=$P50 p99_ms=$P99 p999_ms=$P999 non2xx=$ERR timeouts=$TIMEOUTS settled=$SUCCEEDED open=$OPEN settled_per_s=$SETTLED_PER_S rss_mb=$RSS_MB commits_per_payment=$COMMITS_PER statements_per_payment=$STATEMENTS_PER pgbench_tps=${PGBENCH_TPS:--}"
