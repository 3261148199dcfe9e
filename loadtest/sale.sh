#!/usr/bin/env bash
# sale.sh is the k6 scenario's sale (loadtest/seckill.js), small, driven by
# wrk: CI runs it on every change. k6 itself is not used here: the
# machines this project's CI runs on forbid AGPL tools, and wrk (Apache 2.0)
# sends the same requests. For each mode (sync, then async) it starts the
# real server binary, makes a voucher of STOCK units and USERS users, lets
# wrk press the buy button with their tokens for DURATION (every user
# several times: the first press may buy, the rest are already_ordered or
# sold_out), and fails on:
#   - any 5xx, or any answer but 200, 409 and 429;
#   - oversell: more 200s than units, a negative stock, or
#     vouchers.stock + orders != initial once the queue is written;
#   - a user with two orders;
#   - fewer orders than 200s (a 200 without its row).
#
#   loadtest/sale.sh                          # what CI runs
#   STOCK=500 USERS=5000 DURATION=10s loadtest/sale.sh
#
# It uses database seckill_ci_load (dropped and made afresh) and Redis
# database 7 (flushed) on this machine's MariaDB and Redis, loopback only.
set -euo pipefail

cd "$(dirname "$0")/.."

STOCK=${STOCK:-100}
USERS=${USERS:-1000}
DURATION=${DURATION:-3s}
MODES=${MODES:-sync async}
WORK=${WORK:-/tmp/seckill-sale}
SERVER_ADDR=127.0.0.1:18090
REDIS_ADDR=${REDIS_ADDR:-127.0.0.1:6379}
REDIS_DB=7
DB=seckill_ci_load
MYSQL_DSN="root:@tcp(127.0.0.1:3306)/$DB"
JWT_SECRET=sale-check-only-secret-not-for-production

# shellcheck source=loadtest/lib.sh
. loadtest/lib.sh

need wrk mysql redis-cli curl jq go
log "building server and tokens into $WORK"
build_server
build_tools

sql() { timeout 30 mysql -uroot -N -B "$DB" -e "$1"; }

for mode in $MODES; do
	fresh_stores
	HTTP_ADDR=$SERVER_ADDR MYSQL_DSN=$MYSQL_DSN REDIS_ADDR=$REDIS_ADDR REDIS_DB=$REDIS_DB \
		JWT_SECRET=$JWT_SECRET PAYMENT_WEBHOOK_SECRET=$JWT_SECRET ADMIN_PHONES=13800000000 AUTH_DEV_CODES=true SECKILL_MODE=$mode \
		AUTH_CODE_INTERVAL=0 AUTH_CODES_PER_DAY=0 AUTH_CODES_PER_ADDR_PER_MIN=0 \
		"$WORK/server" >"$WORK/server-$mode.log" 2>&1 &
	server_pid=$!
	pids+=("$server_pid")
	for _ in $(seq 300); do
		curl -fsS -o /dev/null --max-time 1 "http://$SERVER_ADDR/readyz" 2>/dev/null && break
		sleep 0.1
	done
	curl -fsS -o /dev/null --max-time 2 "http://$SERVER_ADDR/readyz" ||
		{ echo "sale.sh: the server did not come up; see $WORK/server-$mode.log" >&2; exit 1; }

	timeout 60 "$WORK/tokens" -base "http://$SERVER_ADDR" -first 13800000000 -n 1 -out "$WORK/admin.txt" 2>/dev/null
	admin=$(head -1 "$WORK/admin.txt")
	begin=$(date -u -d '-1 min' +%Y-%m-%dT%H:%M:%SZ)
	end=$(date -u -d '+1 hour' +%Y-%m-%dT%H:%M:%SZ)
	voucher=$(curl -fsS --max-time 10 -X POST "http://$SERVER_ADDR/vouchers" \
		-H "Authorization: Bearer $admin" -H 'Content-Type: application/json' \
		-d "{\"title\":\"sale check\",\"stock\":$STOCK,\"begin_time\":\"$begin\",\"end_time\":\"$end\"}" | jq -r .id)
	timeout 300 "$WORK/tokens" -base "http://$SERVER_ADDR" -first 13900000000 -n "$USERS" -out "$WORK/tokens.txt"

	log "$mode: $USERS users, $STOCK units, wrk for $DURATION"
	out=$(WRK_COUNT=1 timeout 60 wrk -t2 -c32 -d"$DURATION" -s loadtest/reject.lua \
		"http://$SERVER_ADDR" -- "$WORK/tokens.txt" "$voucher")
	statuses=$(grep '^status ' <<<"$out" | sort | tr '\n' ' ' || true)
	log "$mode: answers: $statuses"
	ok=$(awk '/^status 200:/ { print $3 }' <<<"$out")
	ok=${ok:-0}
	bad=$(awk '/^status / && $2 != "200:" && $2 != "409:" && $2 != "429:" { n += $3 } END { print n + 0 }' <<<"$out")
	[[ $bad -eq 0 ]] || { echo "sale.sh: $mode: $bad answers other than 200, 409 and 429 ($statuses)" >&2; exit 1; }
	[[ $ok -le $STOCK ]] || { echo "sale.sh: $mode: oversold: $ok answers of 200 for $STOCK units" >&2; exit 1; }
	[[ $ok -gt 0 ]] || { echo "sale.sh: $mode: nobody bought" >&2; exit 1; }

	# Async: wait until every accepted order is a row.
	for _ in $(seq 100); do
		orders=$(sql "SELECT COUNT(*) FROM voucher_orders WHERE voucher_id = $voucher")
		[[ $orders -ge $ok ]] && break
		sleep 0.1
	done
	read -r left initial orders users <<<"$(sql "SELECT v.stock, v.initial_stock, COUNT(o.id), COUNT(DISTINCT o.user_id)
		FROM vouchers v LEFT JOIN voucher_orders o ON o.voucher_id = v.id WHERE v.id = $voucher GROUP BY v.id")"
	log "$mode: MySQL: stock $left + orders $orders (of $users users) = initial $initial; $ok answers of 200"
	[[ $left -ge 0 && $((left + orders)) -eq $initial ]] || { echo "sale.sh: $mode: stock + orders != initial" >&2; exit 1; }
	[[ $orders -eq $users ]] || { echo "sale.sh: $mode: a user holds two orders" >&2; exit 1; }
	[[ $orders -ge $ok ]] || { echo "sale.sh: $mode: $ok answers of 200 but $orders rows" >&2; exit 1; }

	kill -TERM "$server_pid"
	wait "$server_pid" || { echo "sale.sh: $mode: the server did not stop cleanly; see $WORK/server-$mode.log" >&2; exit 1; }
done
timeout 30 mysql -uroot -e "DROP DATABASE IF EXISTS $DB"
log "sale.sh: passed"
