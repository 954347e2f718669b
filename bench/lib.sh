# Shared by the benchmark scripts in bench/ (sourced, not run): start a release
# `sluice demo` on a loopback port, read the demo merchant from its banner, and
# summarise wrk's output. Needs wrk, curl and python3.
#
# The sourcing script sets: SLUICE (binary), ADAPTERS (dir), WORK (temp dir),
# and optionally DATABASE_URL (default: SQLite in $WORK) and CONFIG_ARGS (array).

bench_require() {
    for tool in "$@"; do
        command -v "$tool" >/dev/null || { echo "error: $tool is missing (apt-get install -y $tool)" >&2; exit 1; }
    done
}

bench_free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Stops a process: TERM, up to 10 s, then KILL.
bench_stop() {
    local pid="$1"
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
        kill -KILL "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    fi
}

# Starts the demo; sets PORT, BASE, ADMIN_TOKEN, SERVER_PID, API_KEY, STRIPE_ACCOUNT,
# SANDBOX (the in-process sandbox PSP's URL). The sandbox sends up to
# BENCH_WEBHOOK_SENDERS (8) webhooks at once: one after another, it kept pace
# with about 650 a second, and a payment's webhooks would still be arriving
# long after the run that made them (BENCHMARKS.md, session 18).
bench_start_demo() {
    PORT="$(bench_free_port)"
    BASE="http://127.0.0.1:$PORT"
    ADMIN_TOKEN="bench_admin_$(python3 -c 'import secrets; print(secrets.token_hex(16))')"
    mkdir -p "$WORK/data"
    (
        cd "$WORK"
        exec env -u SLUICE_NATS_URL \
            SLUICE_LISTEN="127.0.0.1:$PORT" \
            SLUICE_DATA_DIR="$WORK/data" \
            SLUICE_DATABASE_URL="${DATABASE_URL:-sqlite://$WORK/data/sluice.db}" \
            SLUICE_ADMIN_TOKEN="$ADMIN_TOKEN" \
            SLUICE_LOG="${BENCH_LOG:-error}" \
            "$SLUICE" "${CONFIG_ARGS[@]}" demo --adapters-dir "$ADAPTERS" \
            --webhook-senders "${BENCH_WEBHOOK_SENDERS:-8}"
    ) >"$WORK/demo.log" 2>&1 &
    SERVER_PID=$!
    for _ in $(seq 1 600); do
        kill -0 "$SERVER_PID" 2>/dev/null || {
            echo "error: sluice demo exited early" >&2
            grep -v -i -E 'key|token|secret' "$WORK/demo.log" | tail -20 >&2
            exit 1
        }
        [ -n "$(bench_banner_value 'connector account stripe-b')" ] && break
        sleep 0.2
    done
    API_KEY="$(bench_banner_value 'API key')"
    STRIPE_ACCOUNT="$(bench_banner_value 'connector account stripe')"
    SANDBOX="$(bench_banner_value 'sandbox PSP')"
    [ -n "$API_KEY" ] && [ -n "$STRIPE_ACCOUNT" ] || { echo "error: no demo merchant in the banner" >&2; exit 1; }
}

# How much dirty page cache the kernel lets build up before it starts writing
# back in the background, e.g. "8MiB" or "10%" (of reclaimable memory). Above a
# few tens of MB, its bursts make PostgreSQL's WAL flushes wait (BENCHMARKS.md,
# session 8).
bench_dirty_background() {
    local bytes
    bytes="$(cat /proc/sys/vm/dirty_background_bytes)"
    if [ "$bytes" != 0 ]; then
        echo "$((bytes / 1048576))MiB"
    else
        echo "$(cat /proc/sys/vm/dirty_background_ratio)%"
    fi
}

# Writes back every dirty page before the next phase starts. The kernel writes
# back a page about 30 s after it was dirtied (vm.dirty_expire_centisecs), in
# bursts that make PostgreSQL's WAL flushes wait: without this, the bursts of
# one phase's writes (pgbench's baseline, the full-rate run) land in the next
# phase and its tail measures them (BENCHMARKS.md, sessions 8 and 18). What a
# phase itself dirties is still written back during it, as in steady state.
bench_phase_sync() {
    local start
    start="$(date +%s%3N)"
    sync
    echo "== dirty pages of the earlier phase written back in $(( $(date +%s%3N) - start )) ms"
}

bench_banner_value() { sed -n "s/^  $1: //p" "$WORK/demo.log" | head -1; }

# Writes $WORK/pay.lua: each request creates and confirms one Stripe-format
# payment of the demo merchant (its own order number and Idempotency-Key).
# With BENCH_RATE set (requests per second over all of wrk's threads; the
# script must then run with -t2), requests leave on a fixed schedule instead of
# back to back: each thread sends one every 2/BENCH_RATE s, on whichever of its
# connections is free (wrk's delay() before each request, against the
# monotonic clock through LuaJIT's FFI). A late answer does not push the
# schedule back, so with enough idle connections the rate is the one asked for
# and the latency is the system's, not the generator's; the run's achieved rate
# is printed by wrk and checked by the caller.
bench_write_pay_lua() {
    cat >"$WORK/pay.lua" <<LUA
local counter = 0
local thread_id = 0
local threads = {}
local interval_ms = nil
local next_at = nil
local ffi = require("ffi")
ffi.cdef[[
typedef struct { long tv_sec; long tv_nsec; } bench_timespec;
int clock_gettime(int clk_id, bench_timespec *tp);
]]
local timespec = ffi.new("bench_timespec")
local function now_ms()
    ffi.C.clock_gettime(1, timespec) -- CLOCK_MONOTONIC
    return tonumber(timespec.tv_sec) * 1000 + tonumber(timespec.tv_nsec) / 1e6
end
function setup(thread)
    thread:set("tid", #threads)
    table.insert(threads, thread)
end
function init(args)
    thread_id = tid
    local rate = tonumber(os.getenv("BENCH_RATE") or "")
    -- Defined only when paced: wrk looks for delay() after init, and an
    -- unpaced run keeps wrk's back-to-back path.
    if rate and rate > 0 then
        interval_ms = 2000 / rate
        delay = paced_delay
    end
end
function paced_delay()
    local now = now_ms()
    if not next_at then next_at = now + thread_id * interval_ms / 2 end
    local slot = next_at
    next_at = next_at + interval_ms
    return math.max(0, math.floor(slot - now))
end
-- BENCH_SHARE=1: each answer's own latency, paired with its request by the
-- order number the body echoes, minus the PSP's time from its Server-Timing
-- header (psp;dur=ms): the gateway's share of every payment (goal 2).
started = {}
shares = {}
psps = {}
-- The same share as the gateway's /v1 routes measured it (Server-Timing
-- app;dur minus psp;dur): what is left of a share beyond it was spent outside
-- them (sockets, the kernel's queues, this generator on the same cores).
insides = {}
unpaired = 0
if os.getenv("BENCH_SHARE") == "1" then
    function response(status, headers, body)
        local at = now_ms()
        local order = body and string.match(body, '"merchant_order_no":"([^"]+)"')
        local timing = headers["server-timing"] or headers["Server-Timing"] or ""
        local psp = tonumber(string.match(timing, "psp;dur=([%d.]+)"))
        local app = tonumber(string.match(timing, "app;dur=([%d.]+)"))
        local from = order and started[order]
        if from and psp then
            started[order] = nil
            table.insert(shares, at - from - psp)
            table.insert(psps, psp)
            if app then table.insert(insides, app - psp) end
        else
            unpaired = unpaired + 1
        end
    end
end
local function percentile(sorted, p)
    if #sorted == 0 then return 0 end
    local rank = math.max(1, math.ceil(#sorted * p / 100))
    return sorted[math.min(rank, #sorted)]
end
request = function()
    counter = counter + 1
    local order = string.format("bench-%s-%d-%d", os.getenv("BENCH_PHASE") or "x", thread_id, counter)
    if response then started[order] = now_ms() end
    local body = string.format('{"amount": 1999, "currency": "EUR", "merchant_order_no": "%s", "capture_mode": "automatic", "connector_account": "$STRIPE_ACCOUNT", "payment_method": "pm_card_visa", "confirm": true}', order)
    return wrk.format("POST", "/v1/payments", {
        ["Authorization"] = "Bearer $API_KEY",
        ["Content-Type"] = "application/json",
        ["Idempotency-Key"] = order,
    }, body)
end
function done(summary, latency, requests)
    io.write(string.format("LATENCY_US p50=%d p99=%d p999=%d\n",
        latency:percentile(50), latency:percentile(99), latency:percentile(99.9)))
    if os.getenv("BENCH_SHARE") ~= "1" then return end
    local all, all_psp, all_inside, missing = {}, {}, {}, 0
    for _, t in ipairs(threads) do
        for _, v in ipairs(t:get("shares") or {}) do table.insert(all, v) end
        for _, v in ipairs(t:get("psps") or {}) do table.insert(all_psp, v) end
        for _, v in ipairs(t:get("insides") or {}) do table.insert(all_inside, v) end
        missing = missing + (t:get("unpaired") or 0)
    end
    table.sort(all)
    table.sort(all_psp)
    table.sort(all_inside)
    io.write(string.format("INSIDE_US p50=%d p99=%d p999=%d n=%d\n",
        math.floor(percentile(all_inside, 50) * 1000), math.floor(percentile(all_inside, 99) * 1000),
        math.floor(percentile(all_inside, 99.9) * 1000), #all_inside))
    io.write(string.format("SHARE_US p50=%d p99=%d p999=%d n=%d unpaired=%d psp_p50=%d psp_p99=%d\n",
        math.floor(percentile(all, 50) * 1000), math.floor(percentile(all, 99) * 1000),
        math.floor(percentile(all, 99.9) * 1000), #all, missing,
        math.floor(percentile(all_psp, 50) * 1000), math.floor(percentile(all_psp, 99) * 1000)))
end
LUA
}

# wrk output -> "requests/s p50_ms p99_ms non2xx timeouts p999_ms": the
# percentiles from pay.lua's LATENCY_US line when present, else wrk's --latency.
bench_wrk_summary() {
    python3 - "$1" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
def dur(v):
    m = re.match(r"([\d.]+)(us|ms|s|m)", v)
    n, u = float(m.group(1)), m.group(2)
    return n * {"us": 0.001, "ms": 1, "s": 1000, "m": 60000}[u]
def pct(p):
    m = re.search(r"^\s+%s%%\s+(\S+)" % re.escape(p), text, re.M)
    return dur(m.group(1)) if m else float("nan")
exact = re.search(r"LATENCY_US p50=(\d+) p99=(\d+) p999=(\d+)", text)
if exact:
    p50, p99, p999 = (int(v) / 1000 for v in exact.groups())
else:
    p50, p99, p999 = pct("50"), pct("99"), float("nan")
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))
non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", text)
timeouts = re.search(r"timeout (\d+)", text)
print(f"{rps:.1f} {p50:.1f} {p99:.1f} {non2xx.group(1) if non2xx else 0} {timeouts.group(1) if timeouts else 0} {p999:.1f}")
PY
}
