#!/usr/bin/env bash
# room.sh measures the waiting room (issue 30) on one server, one Redis and
# MariaDB of this machine:
#
#  1. joins a second against sold-out answers a second, paired: wrk runs
#     alternate, POST /seckill/{id} on a voucher with no stock, then
#     POST /vouchers/{id}/room on a fresh room voucher, PAIRS times, and
#     print each pair's ratio joins/sold-out (the goal: a join costs no
#     more than a sold-out answer, a ratio >= 1.0). JOINS=drawn joins before
#     begin_time (into the draw), JOINS=late after it (numbered in order);
#     both by default. Every join of a run is a different user.
#  2. loadtest/roomload: the admission rate held under a 10x spike of
#     joins, what a thousand waiters on the events stream cost the server
#     and Redis a second, and the error of the wait estimate.
#
# Database seckill_bench (dropped and created afresh) and a Redis of its
# own (redis-server on port 16390, no persistence), so that Redis' figures
# (INFO: commands, CPU) count this server's calls alone; REDIS_ADDR=host:port
# uses that Redis instead, its logical database 8 (flushed; no other
# database is touched). Loopback only; every step is bounded in time and
# the processes it starts are stopped on exit.
#
#   loadtest/room.sh                        # 5 pairs of 4s runs, then roomload
#   PAIRS=3 JOINS=late STEPS=pairs loadtest/room.sh
#   STEPS=load loadtest/room.sh              # roomload alone
#   SERVER_REV=HEAD loadtest/room.sh         # the server as committed
#
# Needs go, wrk (apt-get installed if missing), mysql, redis-cli, curl, jq
# and python3. Generated files go to $WORK, /tmp by default.
set -euo pipefail

cd "$(dirname "$0")/.."

PAIRS=${PAIRS:-5}
DURATION=${DURATION:-4s}
THREADS=${THREADS:-2}
CONNS=${CONNS:-64}
USERS=${USERS:-60000} # distinct users: a run of joins never sends one twice
JOINS=${JOINS:-drawn late}
STEPS=${STEPS:-pairs load}
ROOMLOAD=${ROOMLOAD:-} # more flags for loadtest/roomload, e.g. "-steps spike -rate 500"
PROFILE=${PROFILE:-0} # 1: a CPU profile of the server during one more run of joins
WORK=${WORK:-/tmp/seckill-room}
SERVER_ADDR=127.0.0.1:18090
METRICS_ADDR=127.0.0.1:18091
REDIS_ADDR=${REDIS_ADDR:-}
REDIS_DB=8
DB=seckill_bench
MYSQL_DSN="root:@tcp(127.0.0.1:3306)/$DB"
JWT_SECRET=room-bench-only-secret-not-for-production

# shellcheck source=loadtest/lib.sh
. loadtest/lib.sh

need wrk mysql redis-cli curl jq python3 go redis-server

[[ -z $REDIS_ADDR ]] && redis_up 16390

log "building server, tokens and roomload into $WORK"
build_server
build_tools
[[ " $STEPS " == *" load "* ]] && timeout 600 go build -o "$WORK/roomload" ./loadtest/roomload
fresh_stores

# The per-user rate limit of POST /seckill would answer 429 to a user sent
# twice a second; every user here is sent once a run (sold-out answers
# cycle through the file, more slowly than the limit refills).
# MAX_CONNS_PER_ADDR=0: every connection (2,000 event streams among them)
# comes from this one address.
HTTP_ADDR=$SERVER_ADDR MYSQL_DSN=$MYSQL_DSN REDIS_ADDR=$REDIS_ADDR REDIS_DB=$REDIS_DB \
	JWT_SECRET=$JWT_SECRET PAYMENT_WEBHOOK_SECRET=$JWT_SECRET ADMIN_PHONES=13800000000 AUTH_DEV_CODES=true \
	METRICS_ADDR=$METRICS_ADDR PPROF=true MAX_CONNS_PER_ADDR=0 AUTH_CODE_INTERVAL=0 AUTH_CODES_PER_DAY=0 AUTH_CODES_PER_ADDR_PER_MIN=0 \
	"$WORK/server" >"$WORK/server.log" 2>&1 &
server_pid=$!
pids+=("$server_pid")
for _ in $(seq 300); do
	curl -fsS -o /dev/null --max-time 1 "http://$SERVER_ADDR/readyz" 2>/dev/null && break
	sleep 0.1
done
curl -fsS -o /dev/null --max-time 1 "http://$SERVER_ADDR/readyz"

log "admin and $USERS users log in"
timeout 60 "$WORK/tokens" -base "http://$SERVER_ADDR" -first 13800000000 -n 1 -out "$WORK/admin.txt" 2>/dev/null
admin=$(head -1 "$WORK/admin.txt")
timeout 600 "$WORK/tokens" -base "http://$SERVER_ADDR" -first 13900000000 -n "$USERS" -c 32 \
	-timeout 10m -out "$WORK/tokens.txt"

iso() { date -u -d "$1" +%Y-%m-%dT%H:%M:%S.%3NZ; }
create() { # title stock begin [room-json]
	local room=""
	[[ -n ${4:-} ]] && room=",\"room\":$4"
	curl -sS --max-time 10 -X POST "http://$SERVER_ADDR/vouchers" \
		-H "Authorization: Bearer $admin" -H 'Content-Type: application/json' \
		-d "{\"title\":\"$1\",\"stock\":$2,\"begin_time\":\"$3\",\"end_time\":\"$(iso '+6 hour')\"$room}" |
		jq -r '.id // error("creating a voucher: \(.)")'
}

cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
# rps runs wrk once: "req/s server-cpu-µs-per-request".
rps() { # path-format voucher-id
	local out t0 t1 n
	t0=$(cpu_ticks "$server_pid")
	out=$(timeout 60 wrk -t"$THREADS" -c"$CONNS" -d"$DURATION" -s loadtest/reject.lua \
		"http://$SERVER_ADDR" -- "$WORK/tokens.txt" "$2" "$THREADS" "$1")
	t1=$(cpu_ticks "$server_pid")
	grep -q 'Non-2xx' <<<"$out" && [[ $1 == *room ]] && log "joins answered other than 200: $(grep Non-2xx <<<"$out")"
	n=$(awk '/requests in/ { print $1 }' <<<"$out")
	# reject.lua goes round the token file: past it, a join is a user's
	# second, the cheaper "in line already".
	[[ $1 == *room ]] && ((n > USERS)) && log "$n joins sent, more than USERS=$USERS: some users joined twice (raise USERS)"
	awk -v n="$n" -v ticks=$((t1 - t0)) -v hz="$(getconf CLK_TCK)" \
		'/^Requests\/sec:/ { printf "%s %.1f\n", $2, ticks / hz * 1e6 / n }' <<<"$out"
}

echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(go version | cut -d' ' -f3), $(redis-server --version | cut -d' ' -f3)"
echo "server: $server_desc"

if [[ " $STEPS " == *" pairs "* ]]; then
	sold_out_id=$(create "room bench: sold out" 0 "$(iso '-1 min')")
	echo "pairs: wrk -t$THREADS -c$CONNS -d$DURATION, $PAIRS pairs, a fresh room voucher (stock 10,000,000, admit_per_second 1) a run"
	for kind in $JOINS; do
		: >"$WORK/$kind.pairs"
		for i in $(seq 0 "$PAIRS"); do # pair 0 warms up
			case $kind in
			drawn) begin=$(iso '+1 hour') ;;
			late) begin=$(iso '-1 min') ;;
			*) echo "room.sh: JOINS takes drawn and late" >&2; exit 1 ;;
			esac
			# opens_at: a minute ago, or (its default) begin_time when that
			# is earlier than the voucher's creation.
			opens="\"opens_at\":\"$(iso '-1 min')\","
			[[ $kind == late ]] && opens=""
			room_id=$(create "room bench: $kind joins" 10000000 "$begin" \
				"{$opens\"admit_per_second\":1,\"hold_for\":60}")
			# Which runs first alternates, so that neither gains from going
			# first (a warmer machine, or a cooler one).
			if ((i % 2 == 0)); then
				s=$(rps "/seckill/%d" "$sold_out_id")
				j=$(rps "/vouchers/%d/room" "$room_id")
			else
				j=$(rps "/vouchers/%d/room" "$room_id")
				s=$(rps "/seckill/%d" "$sold_out_id")
			fi
			[[ $i == 0 ]] && continue
			echo "$i $s $j" >>"$WORK/$kind.pairs"
			pair_line "$kind" "$i" "sold out" "$s" join "$j"
		done
		pairs_summary "$kind" "$WORK/$kind.pairs" sold_out join
		if [[ $PROFILE == 1 ]]; then
			room_id=$(create "room bench: profile" 10000000 "$begin" \
				"{$opens\"admit_per_second\":1,\"hold_for\":60}")
			curl -fsS --max-time 30 -o "$WORK/$kind.join.pprof" "http://$METRICS_ADDR/debug/pprof/profile?seconds=3" &
			rps "/vouchers/%d/room" "$room_id" >/dev/null
			wait $!
			log "$kind: the server's CPU profile of joins: $WORK/$kind.join.pprof"
			go tool pprof -top -nodecount=35 "$WORK/server" "$WORK/$kind.join.pprof" 2>/dev/null | head -45
		fi
	done
fi

if [[ " $STEPS " == *" load "* ]]; then
	timeout 900 "$WORK/roomload" -base "http://$SERVER_ADDR" -admin "$admin" -tokens "$WORK/tokens.txt" \
		-pid "$server_pid" -redis "$REDIS_ADDR" -db "$REDIS_DB" $ROOMLOAD
fi

if [[ " $STEPS " == *" hold "* ]]; then # keep the server up, for a look by hand
	log "server on http://$SERVER_ADDR (admin token in $WORK/admin.txt, users' in $WORK/tokens.txt) for 10 minutes"
	sleep 600
fi
