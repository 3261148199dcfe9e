#!/usr/bin/env bash
# Orders persisted per second, sync and async modes, against the yardstick.
#
# Per round, in a rotating order:
#   (c) yardstick: loadtest/persist/yardstick, a bare Go loop writing one
#       order per transaction (guarded UPDATE + INSERT) on 64 connections;
#   (a) the server in SECKILL_MODE=sync, driven by loadtest/persist/drive;
#   (b) the server in SECKILL_MODE=async, same driver;
# each writing N orders of one voucher with stock N, bought by N distinct
# users. Prints each figure, a/c and b/c per round, and the medians; for
# round 1 also the MySQL statements and Redis commands per order.
#
# Before each measurement it waits (up to QUIET_WAIT seconds) until no
# other load test, Go build or test binary runs and the CPU is idle; a
# round during which one started is run again (up to RETRIES times).
#
# Loopback only: MySQL root@127.0.0.1 (database seckill_persist, dropped and
# created fresh), Redis 127.0.0.1:6379 DB 6 (only DB 6 is flushed), the
# server on 127.0.0.1:$PORT. Every process started here is stopped on exit.
#
#   loadtest/persist.sh                      # 3 rounds of 20,000 orders
#   ROUNDS=5 N=30000 CONC=256 loadtest/persist.sh
#   PERF=1 loadtest/persist.sh               # also perf record -a -g each server run
#                                            # ($WORK/logs/perf-MODE-ROUND.data)
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-3}
N=${N:-20000}                    # orders per measurement (users, stock)
CONC=${CONC:-128}                # the driver's concurrent requests
YARD_CONNS=${YARD_CONNS:-64}     # the yardstick's connections
MYSQL_CONNS=${MYSQL_CONNS:-64}   # the server's MYSQL_MAX_OPEN_CONNS
PORT=${PORT:-18095}
REDIS_DB=6
DB=seckill_persist
DSN="root:@tcp(127.0.0.1:3306)/$DB"
YARD_DSN=${YARD_DSN:-$DSN}       # e.g. "$DSN?interpolateParams=true" for the variant
WORK=${WORK:-/tmp/seckill-persist}
MAX_SECONDS=${MAX_SECONDS:-1500} # the whole run
QUIET_WAIT=${QUIET_WAIT:-300}    # longest wait for other load tests to end
RETRIES=${RETRIES:-2}            # a round disturbed by another load test is run again
BASE="http://127.0.0.1:$PORT"
JWT_SECRET=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')

mkdir -p "$WORK/bin" "$WORK/logs"
SERVER_PID=
PERF_PID=
cleanup() {
  [[ -z ${WATCH_PID:-} ]] || kill "$WATCH_PID" 2>/dev/null || true
  [[ -z $PERF_PID ]] || kill -INT "$PERF_PID" 2>/dev/null || true
  if [[ -n $SERVER_PID ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -TERM "$SERVER_PID" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.2; done
    kill -KILL "$SERVER_PID" 2>/dev/null || true
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

left() { echo $((MAX_SECONDS - SECONDS)); }
bounded() { # bounded SECONDS cmd...: a step, never past the run's deadline
  local t=$1; shift
  (( $(left) > 5 )) || { echo "persist.sh: out of time (MAX_SECONDS=$MAX_SECONDS)" >&2; exit 1; }
  (( t < $(left) )) || t=$(left)
  timeout "$t" "$@"
}

echo "== build"
bounded 300 go build -o "$WORK/bin/server" ./cmd/server
bounded 300 go build -o "$WORK/bin/tokens" ./loadtest/tokens
bounded 300 go build -o "$WORK/bin/yardstick" ./loadtest/persist/yardstick
bounded 300 go build -o "$WORK/bin/drive" ./loadtest/persist/drive

mysql -uroot -e "DROP DATABASE IF EXISTS $DB; CREATE DATABASE $DB"
redis-cli -n $REDIS_DB FLUSHDB >/dev/null

# Another load test, build or test suite on this 2-core machine would skew
# the figures: wait for it (wrk, k6, anything run from loadtest/ other than
# this script, Go compiles and test binaries), and for the CPU to be idle.
others() {
  { pgrep -ax 'wrk|k6|compile|link'; pgrep -af '[.]test( |$)';
    pgrep -af loadtest | grep -v -e "loadtest/persist" -e "^[0-9]* pgrep "; } 2>/dev/null | sort -u || true
}
cpu_busy() { # percent of the CPU busy over one second, all processes
  local a b
  a=($(head -1 /proc/stat)); sleep 1; b=($(head -1 /proc/stat))
  local idle=$(( b[4] + b[5] - a[4] - a[5] )) total=0 i
  for i in 1 2 3 4 5 6 7 8; do total=$(( total + b[i] - a[i] )); done
  echo $(( 100 - 100 * idle / (total > 0 ? total : 1) ))
}
wait_quiet() {
  local waited=0 busy
  while busy=$(others; b=$(cpu_busy); ((b < 25)) || echo "CPU ${b}% busy") && [[ -n $busy ]]; do
    if (( waited == 0 )); then echo "   waiting for other load tests to end:"; sed 's/^/     /' <<<"$busy"; fi >&2
    if (( waited >= QUIET_WAIT )); then echo "   still busy after ${QUIET_WAIT}s: measuring anyway (NOISY)" >&2; return; fi
    sleep 5; waited=$((waited + 5))
  done
}

# The login code limits are off: every user logs in from this one address.
start_server() { # start_server MODE TAG
  SECKILL_MODE=$1 HTTP_ADDR=127.0.0.1:$PORT MYSQL_DSN="$DSN" \
    REDIS_ADDR=127.0.0.1:6379 REDIS_DB=$REDIS_DB JWT_SECRET=$JWT_SECRET PAYMENT_WEBHOOK_SECRET=$JWT_SECRET \
    ADMIN_PHONES=13800000000 AUTH_DEV_CODES=true MYSQL_MAX_OPEN_CONNS=$MYSQL_CONNS \
    AUTH_CODE_INTERVAL=0 AUTH_CODES_PER_DAY=0 AUTH_CODES_PER_ADDR_PER_MIN=0 \
    "$WORK/bin/server" >"$WORK/logs/server-$2.log" 2>&1 &
  SERVER_PID=$!
  for _ in $(seq 150); do
    curl -fsS "$BASE/readyz" >/dev/null 2>&1 && return 0
    kill -0 "$SERVER_PID" 2>/dev/null || break
    sleep 0.2
  done
  echo "persist.sh: the server did not come up; see $WORK/logs/server-$2.log" >&2
  tail -5 "$WORK/logs/server-$2.log" >&2
  exit 1
}
stop_server() {
  kill -TERM "$SERVER_PID"
  for _ in $(seq 150); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.2; done
  kill -KILL "$SERVER_PID" 2>/dev/null || true
  wait "$SERVER_PID" 2>/dev/null || true
  SERVER_PID=
}

# A clean slate before each measurement: no orders in the table, nothing in
# Redis DB 6. Users and earlier vouchers stay.
reset() {
  mysql -uroot -e "TRUNCATE TABLE $DB.voucher_orders"
  redis-cli -n $REDIS_DB FLUSHDB >/dev/null
}

echo "== log in $N users (server in sync mode)"
start_server sync login
bounded 300 "$WORK/bin/tokens" -base "$BASE" -n "$N" -c 64 -first 13900000000 -out "$WORK/tokens.txt"
stop_server

field() { tr ' ' '\n' <<<"$1" | awk -F= -v k="$2" '$1 == k { print $2 }'; }

# watch_start/watch_stop: note whether another load test ran at any moment
# of a measurement (it would skew it, and the round is run again).
WATCH_PID=
watch_start() {
  rm -f "$WORK/noisy"
  ( while :; do [[ -n $(others) ]] && touch "$WORK/noisy"; sleep 0.5; done ) &
  WATCH_PID=$!
}
watch_stop() {
  kill "$WATCH_PID" 2>/dev/null; wait "$WATCH_PID" 2>/dev/null || true
  WATCH_PID=
  [[ ! -e $WORK/noisy ]]
}

measure() { # measure c|a|b ROUND: prints one RESULT line
  local what=$1 r=$2
  wait_quiet
  reset
  case $what in
  c) bounded 300 "$WORK/bin/yardstick" -dsn "$YARD_DSN" -n "$N" -c "$YARD_CONNS" ;;
  a | b)
    local mode=sync; [[ $what == b ]] && mode=async
    start_server $mode "$mode-$r"
    if [[ ${PERF:-0} == 1 ]]; then # the whole machine, while the driver runs
      perf record -q -a -g -F 499 -o "$WORK/logs/perf-$mode-$r.data" >/dev/null 2>&1 &
      PERF_PID=$!
    fi
    bounded 300 "$WORK/bin/drive" -base "$BASE" -tokens "$WORK/tokens.txt" -n "$N" -c "$CONC" -dsn "$DSN" -label $mode
    if [[ -n $PERF_PID ]]; then kill -INT "$PERF_PID"; wait "$PERF_PID" || true; PERF_PID=; fi
    stop_server ;;
  esac
}

declare -a C A B BA BL RA RB
order=(c a b)
printf '\n== %d rounds of %d orders; driver concurrency %d; yardstick conns %d; server MYSQL_MAX_OPEN_CONNS %d\n' \
  "$ROUNDS" "$N" "$CONC" "$YARD_CONNS" "$MYSQL_CONNS"
for r in $(seq "$ROUNDS"); do
  declare -A got=()
  for attempt in $(seq $((1 + RETRIES))); do
    echo "-- round $r, attempt $attempt ($(cut -d' ' -f1-3 /proc/loadavg) load before)"
    clean=1
    for i in 0 1 2; do
      w=${order[$(( (i + r - 1) % 3 ))]}
      watch_start
      measure "$w" "$r" >"$WORK/logs/$w-$r.out"
      note=
      watch_stop || { clean=0; note='   [another load test ran meanwhile]'; }
      line=$(grep '^RESULT' "$WORK/logs/$w-$r.out")
      echo "   ($w) ${line#RESULT }$note"
      if ((r == 1)) && per=$(grep '^PER_ORDER' "$WORK/logs/$w-$r.out"); then
        echo "       per order: ${per#PER_ORDER kind=* }"
      fi
      got[$w]=$line
    done
    ((clean)) && break
    ((attempt <= RETRIES)) && echo "   round $r was disturbed: running it again"
  done
  ((clean)) || echo "   round $r: NOISY (another load test ran during it in every attempt)"
  c=$(field "${got[c]}" orders_per_s)
  a=$(field "${got[a]}" persisted_per_s)
  ba=$(field "${got[b]}" accepted_per_s)
  b=$(field "${got[b]}" persisted_per_s)
  bl=$(field "${got[b]}" lag_ms)
  ra=$(awk -v x="$a" -v y="$c" 'BEGIN { printf "%.2f", x / y }')
  rb=$(awk -v x="$b" -v y="$c" 'BEGIN { printf "%.2f", x / y }')
  C+=("$c"); A+=("$a"); B+=("$b"); BA+=("$ba"); BL+=("$bl"); RA+=("$ra"); RB+=("$rb")
  printf '   round %d: c=%s/s  a(sync)=%s/s  b(async persisted)=%s/s (accepted %s/s, lag %s ms)  a/c=%s  b/c=%s\n' \
    "$r" "$c" "$a" "$b" "$ba" "$bl" "$ra" "$rb"
  unset got
done

median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
echo
echo "== medians of $ROUNDS rounds"
echo "   (c) yardstick          $(median "${C[@]}") orders/s"
echo "   (a) sync persisted     $(median "${A[@]}") orders/s"
echo "   (b) async accepted     $(median "${BA[@]}") orders/s"
echo "   (b) async persisted    $(median "${B[@]}") orders/s"
echo "   (b) async lag          $(median "${BL[@]}") ms after the last 200"
echo "   a/c                    $(median "${RA[@]}")   (target >= 0.9)"
echo "   b/c                    $(median "${RB[@]}")   (target >= 4)"
