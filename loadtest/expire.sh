#!/usr/bin/env bash
# expire.sh measures the deadline (docs/order-lifecycle.md): ORDERS
# unpaid orders that all expire in the same second, on INSTANCES servers
# (each runs an expirer), while buyers keep buying another voucher.
#
# It prints:
#   cancelled   seconds from their pay_by until the last one is cancelled
#               in MySQL (its unit back in MySQL's stock);
#   on sale     until the last unit is back on sale in Redis too (GET
#               /vouchers/{id} shows the whole stock again);
#   buying      the other voucher's orders/s (wrk, DURATION windows, one
#               after the other) before the deadline and while the expiry
#               runs, and their ratio: the expiry's cost to the sale;
#   or, SALE=0  no sale: the CPU the expiry itself costs the servers,
#               Redis and MariaDB, from the deadline until the last unit is
#               on sale, in all, an order, and as a share of the machine's
#               cores over the 10 s the expiry may take: what a sale
#               running beside it, if CPU-bound on the same cores, must
#               give up.
#
# The orders are written straight into MySQL (INSERT ... SELECT from
# MariaDB's sequence engine, seq_1_to_N: a MySQL server would need a
# recursive CTE instead), for a voucher of ORDERS units with its stock at
# 0, and its Redis keys dropped, so that the first request reloads them
# from MySQL (stock 0, ORDERS buyers).
#
# Loopback only: database seckill_expire (dropped and created afresh),
# Redis logical database 3 (flushed; no other database is touched).
#
#   loadtest/expire.sh
#   ORDERS=100000 INSTANCES=3 loadtest/expire.sh
#   SERVER_REV=HEAD~1 loadtest/expire.sh
#   SALE=0 ORDERS=100000 INSTANCES=3 loadtest/expire.sh  # the expiry's own CPU
#
# Needs go, wrk, mysql (MariaDB), redis-cli, curl, jq, python3.
set -euo pipefail

cd "$(dirname "$0")/.."

ORDERS=${ORDERS:-100000}
INSTANCES=${INSTANCES:-1}
DURATION=${DURATION:-4s}
THREADS=${THREADS:-2}
CONNS=${CONNS:-64}
USERS=${USERS:-60000} # buyers of the other voucher: more than the windows sell
LEAD=${LEAD:-25}      # seconds from writing the orders to their pay_by
SALE=${SALE:-1}       # 0: no buying beside the expiry; measure its CPU instead
WORK=${WORK:-/tmp/seckill-expire}
REDIS_ADDR=${REDIS_ADDR:-127.0.0.1:6379}
REDIS_DB=3
DB=seckill_expire
MYSQL_DSN="root:@tcp(127.0.0.1:3306)/$DB"
JWT_SECRET=expire-bench-only-secret-not-for-production
BASE_PORT=18100

# shellcheck source=loadtest/lib.sh
. loadtest/lib.sh

need wrk mysql redis-cli curl jq python3 go
log "building server, tokens into $WORK"
build_server
build_tools
fresh_stores
sql() { timeout 120 mysql -uroot -N -B "$DB" -e "$1"; }

addr() { echo "127.0.0.1:$((BASE_PORT + $1))"; }
server_pids=()
for i in $(seq 0 $((INSTANCES - 1))); do
	HTTP_ADDR=$(addr "$i") MYSQL_DSN=$MYSQL_DSN REDIS_ADDR=$REDIS_ADDR REDIS_DB=$REDIS_DB \
		JWT_SECRET=$JWT_SECRET PAYMENT_WEBHOOK_SECRET=$JWT_SECRET ADMIN_PHONES=13800000000 AUTH_DEV_CODES=true \
		AUTH_CODE_INTERVAL=0 AUTH_CODES_PER_DAY=0 AUTH_CODES_PER_ADDR_PER_MIN=0 CONSUMER_NAME="expire-$i" \
		"$WORK/server" >"$WORK/server-$i.log" 2>&1 &
	pids+=("$!")
	server_pids+=("$!")
done
for i in $(seq 0 $((INSTANCES - 1))); do
	for _ in $(seq 300); do
		curl -fsS -o /dev/null --max-time 1 "http://$(addr "$i")/readyz" 2>/dev/null && break
		sleep 0.1
	done
done
base="http://$(addr 0)"

log "admin and $USERS buyers log in"
timeout 60 "$WORK/tokens" -base "$base" -first 13800000000 -n 1 -out "$WORK/admin.txt" 2>/dev/null
admin=$(head -1 "$WORK/admin.txt")
timeout 600 "$WORK/tokens" -base "$base" -first 13900000000 -n "$USERS" -c 32 -out "$WORK/tokens.txt"
begin=$(date -u -d '-1 min' +%Y-%m-%dT%H:%M:%SZ)
end=$(date -u -d '+6 hour' +%Y-%m-%dT%H:%M:%SZ)
new_voucher() { # stock
	curl -fsS --max-time 10 -X POST "$base/vouchers" -H "Authorization: Bearer $admin" -H 'Content-Type: application/json' \
		-d "{\"title\":\"expire bench\",\"stock\":$1,\"price\":100,\"pay_within\":86400,\"begin_time\":\"$begin\",\"end_time\":\"$end\"}" | jq -r .id
}
left() { curl -fsS --max-time 10 "$base/vouchers/$1" | jq -r .stock; }

expiring=$(new_voucher "$ORDERS")
log "$ORDERS unpaid orders of voucher $expiring, due in ${LEAD}s"
sql "INSERT INTO voucher_orders (id, user_id, voucher_id, status, created_at, amount, pay_by, bucket)
     SELECT seq, seq, $expiring, 'unpaid', NOW(3), 100, NOW(3) + INTERVAL $LEAD SECOND, 0 FROM seq_1_to_$ORDERS;
     UPDATE vouchers SET stock = 0 WHERE id = $expiring;"
due=$(sql "SELECT UNIX_TIMESTAMP(MIN(pay_by)) FROM voucher_orders WHERE voucher_id = $expiring")
# Redis forgets the voucher: the next request reloads it from MySQL.
rcli --scan --pattern "*:v$expiring:*" | xargs -r redis-cli -h "${REDIS_ADDR%:*}" -p "${REDIS_ADDR#*:}" -n "$REDIS_DB" DEL >/dev/null
curl -sS -o /dev/null --max-time 30 -X POST -H "Authorization: Bearer $admin" "$base/seckill/$expiring"
[[ $(left "$expiring") == 0 ]] || { echo "expire.sh: voucher $expiring did not reload at 0" >&2; exit 1; }

# The clock: when the last order is cancelled, when the last unit is on
# sale again. Polled every 50 ms in the background.
(
	cancelled=
	while :; do
		now=$(date +%s.%N)
		# EXISTS stops at the first unpaid order it finds: a COUNT(*)
		# would read up to ORDERS index entries 20 times a second, CPU
		# that MariaDB would take from the sale being measured.
		if [[ -z $cancelled ]] && [[ $(sql "SELECT EXISTS (SELECT 1 FROM voucher_orders WHERE voucher_id = $expiring AND status = 'unpaid')") == 0 ]]; then
			cancelled=$now
			echo "cancelled $cancelled"
		fi
		if [[ -n $cancelled ]] && [[ $(left "$expiring") == "$ORDERS" ]]; then
			echo "onsale $(date +%s.%N)"
			break
		fi
		sleep 0.05
	done
) >"$WORK/clock.txt" &
clock_pid=$!
pids+=("$clock_pid")

# SALE=0: the CPU of every process the expiry uses (the servers, Redis,
# MariaDB), read at the deadline and when the last unit is on sale.
expiry_cpu() { # prints ticks: servers redis mariadb
	local servers=0 pid
	for pid in "${server_pids[@]}"; do servers=$((servers + $(ticks "$pid"))); done
	echo "$servers $(ticks "$redis_pid") $(ticks "$mysql_pid")"
}
# What the same processes use while idle (consumers, sweepers, MariaDB's
# background work, the clock's own polling) is read over 2 s before the
# deadline and taken off.
sleep_until() { sleep "$(python3 -c 'import sys, time; print(max(0, float(sys.argv[1]) - time.time()))' "$1")"; }
if ((!SALE)); then
	store_pids
	sleep_until "$(python3 -c 'import sys; print(float(sys.argv[1]) - 2.25)' "$due")"
	cpu_idle="$(date +%s.%N) $(expiry_cpu)"
	sleep_until "$(python3 -c 'import sys; print(float(sys.argv[1]) - 0.25)' "$due")"
	cpu_due="$(date +%s.%N) $(expiry_cpu)"
	while kill -0 "$clock_pid" 2>/dev/null; do
		if (($(date +%s) > ${due%.*} + 120)); then
			echo "expire.sh: the expiry did not end within 120 s of the deadline" >&2
			exit 1
		fi
		sleep 0.05
	done
	cpu_end="$(date +%s.%N) $(expiry_cpu)"
fi

# Buying windows, one after the other, until the expiry is over: each
# sells a fresh voucher of its own, so that every request is an order.
: >"$WORK/windows.txt"
windows=0
while ((SALE)) && { kill -0 "$clock_pid" 2>/dev/null || ((windows < 2)); }; do
	selling=$(new_voucher 10000000)
	curl -sS -o /dev/null --max-time 5 -X POST -H "Authorization: Bearer $admin" "$base/seckill/$selling"
	start=$(date +%s.%N)
	out=$(timeout 60 wrk -t"$THREADS" -c"$CONNS" -d"$DURATION" -s loadtest/reject.lua "$base" -- "$WORK/tokens.txt" "$selling" "$THREADS")
	rps=$(awk '/^Requests\/sec:/ { print $2 }' <<<"$out")
	echo "$start $rps" >>"$WORK/windows.txt"
	windows=$((windows + 1))
	if (($(date +%s) > ${due%.*} + 120)); then
		echo "expire.sh: the expiry did not end within 120 s of the deadline" >&2
		exit 1
	fi
done
wait "$clock_pid" || true

echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(go version | cut -d' ' -f3)"
echo "server: $server_desc, $INSTANCES instance(s), SWEEP_EVERY default (5s)"
python3 - "$due" "$WORK/clock.txt" "$WORK/windows.txt" "${DURATION%s}" "$ORDERS" "${cpu_idle:-}" "${cpu_due:-}" "${cpu_end:-}" "$(getconf CLK_TCK)" "$(nproc)" <<-'EOF'
	import statistics, sys
	due, clock, windows, dur, orders = float(sys.argv[1]), sys.argv[2], sys.argv[3], float(sys.argv[4]), int(sys.argv[5])
	cpu_idle, cpu_due, cpu_end, hz, cores = sys.argv[6], sys.argv[7], sys.argv[8], int(sys.argv[9]), int(sys.argv[10])
	t = dict(l.split() for l in open(clock) if l.strip())
	cancelled, onsale = float(t["cancelled"]) - due, float(t["onsale"]) - due
	print(f"{orders} orders due at once: last cancelled {cancelled:.2f} s after their pay_by, last unit on sale in Redis {onsale:.2f} s after")
	before, during = [], []
	for l in open(windows):
	    start, rps = map(float, l.split())
	    if start + dur <= due:
	        before.append(rps)
	    elif start < due + onsale:
	        during.append(rps)
	if cpu_due and cpu_end:
	    # Each reading: the time, then ticks of the servers, Redis, MariaDB.
	    idle, start, end = ([float(x) for x in r.split()] for r in (cpu_idle, cpu_due, cpu_end))
	    names = ("servers", "redis", "mariadb")
	    span = end[0] - start[0]
	    idle_rate = [(b - a) / hz / (start[0] - idle[0]) for a, b in zip(idle[1:], start[1:])]
	    secs = [(b - a) / hz - r * span for a, b, r in zip(start[1:], end[1:], idle_rate)]
	    total = sum(secs)
	    parts = ", ".join(f"{n} {s:.2f}" for n, s in zip(names, secs))
	    per = ", ".join(f"{n} {s / orders * 1e6:.1f}" for n, s in zip(names, secs))
	    print(f"the expiry's CPU, no sale beside it, idle use taken off ({sum(idle_rate):.2f} CPU-s a second): "
	          f"{total:.2f} s ({parts}); µs an order: {total / orders * 1e6:.1f} ({per})")
	    print(f"of {cores} cores: {total / (10 * cores):.1%} over the 10 s the expiry may take, "
	          f"{total / (span * cores):.1%} over the {span:.1f} s it took: what a CPU-bound sale beside it gives up")
	if before and during:
	    b, d = statistics.median(before), statistics.median(during)
	    print(f"buying another voucher: {b:.0f} req/s before the deadline ({len(before)} windows), {d:.0f} while the expiry ran ({len(during)}): ratio {d / b:.3f}")
EOF
