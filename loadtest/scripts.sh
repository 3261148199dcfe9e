#!/usr/bin/env bash
# scripts.sh measures what one Redis core runs of the stock scripts: sync
# mode's take.lua and async mode's accept.lua, each call a new buyer of a
# voucher whose stock never runs out, against a plain INCR as the
# yardstick, on a redis-server of its own (a free port, nothing kept on
# disk). It prints, per round, the calls a second redis-benchmark got
# through (50 connections, 16 commands in flight on each) and the server's
# own time per call (INFO commandstats, usec_per_call): the figure of
# docs/scaling.md, since it is what a master's one core spends, whoever
# shares the machine.
#
#   loadtest/scripts.sh              # 3 rounds of 400,000 calls each
#   ROUNDS=5 CALLS=1000000 loadtest/scripts.sh
#
# Needs redis-server and redis-benchmark (Debian's redis-tools).
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-3}
CALLS=${CALLS:-400000}
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
WORK=$(mktemp -d)
trap 'redis-cli -p "$PORT" shutdown nosave >/dev/null 2>&1 || true; rm -rf "$WORK"' EXIT

redis-server --port "$PORT" --bind 127.0.0.1 --save "" --appendonly no --daemonize yes --logfile "$WORK/redis.log" --dir "$WORK"
for _ in $(seq 1 50); do redis-cli -p "$PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done

r() { redis-cli -p "$PORT" "$@"; }
take=$(r SCRIPT LOAD "$(cat internal/stock/take.lua)")
accept=$(r SCRIPT LOAD "$(cat internal/order/queue/accept.lua)")
v='seckill:{s1}:v1'
r SET "$v:stock" 2000000000 >/dev/null

# one NAME ARGS...: a run of redis-benchmark, then its rate and the
# server's time per call of the command it sent.
one() {
  local name=$1 cmd=$2
  shift
  r CONFIG RESETSTAT >/dev/null
  redis-benchmark -p "$PORT" -q -n "$CALLS" -c 50 -P 16 -r 1000000000 "$@" 2>&1 | tr '\r' '\n' >"$WORK/out"
  local rps usec
  rps=$(grep 'requests per second' "$WORK/out" | tail -1 | sed 's/.*: \([0-9.]*\) requests.*/\1/')
  usec=$(r INFO commandstats | tr -d '\r' | grep "^cmdstat_$(echo "$cmd" | tr 'A-Z' 'a-z'):" | sed 's/.*usec_per_call=\([0-9.]*\).*/\1/')
  printf '%-8s %10.0f calls/s   %6s us of the server a call\n' "$name" "$rps" "$usec"
}

echo "machine: $(nproc) CPUs, $(redis-server --version | cut -d' ' -f3), commit $(git rev-parse --short HEAD), load $(cut -d' ' -f1-3 /proc/loadavg)"
for round in $(seq 1 "$ROUNDS"); do
  echo "-- round $round"
  one incr INCR yard
  one take EVALSHA "$take" 5 "$v:stock" "$v:buyers" "$v:holds" "$v:claims" "$v:room:admitted" __rand_int__ 15000 0
  one accept EVALSHA "$accept" 9 "$v:stock" "$v:buyers" 'seckill:{s1}:orders' 'seckill:{s1}:orders:pending' \
    "$v:accepted" "$v:queued" "$v:void:x" "$v:claims" "$v:room:admitted" __rand_int__ 1 1700000000000 __rand_int__ '' 1 0 '' ''
  # The stream grows by CALLS each round: empty it, as the consumers would.
  r DEL 'seckill:{s1}:orders' 'seckill:{s1}:orders:pending' "$v:accepted" "$v:buyers" "$v:holds" >/dev/null
done
