#!/usr/bin/env bash
# reject.sh measures the server's reject path against the yardstick
# (loadtest/yardstick: gin + one EVALSHA, no checks at all).
#
# Two reject paths, each measured separately:
#   sold_out         a voucher created with stock 0;
#   already_ordered  a voucher with stock left, every user already bought it.
#
# For each path it alternates wrk runs, yardstick then server, PAIRS times,
# and prints each pair's ratio server/yardstick and their median. The
# target is a median >= 1.0.
#
# It runs against the real MariaDB/MySQL and Redis of this machine, on
# loopback only: database seckill_bench (dropped and created afresh) and
# Redis logical database 5 (flushed; no other database is touched). Every
# step is bounded in time and the processes it starts are stopped on exit.
#
#   loadtest/reject.sh                      # 7 pairs of 5s runs per path
#   PAIRS=5 DURATION=5s CONNS=64 loadtest/reject.sh
#   PROFILE=1 loadtest/reject.sh            # also perf-profile both programs
#   YARD=constant PATHS=sold_out loadtest/reject.sh  # against gin answering
#                                           # a constant 409, no Redis
#   SERVER_REV=HEAD loadtest/reject.sh      # the server as committed
#   K6=k6 loadtest/reject.sh                # then the k6 scenarios too
#                                           # (go install go.k6.io/k6@latest)
#
# Needs go, wrk (apt-get installed if missing), mysql, redis-cli, curl, jq
# and python3; perf for PROFILE=1.
#
# Generated files (binaries, tokens, logs, profiles) go to $WORK, /tmp by
# default, never into the repository.
set -euo pipefail

cd "$(dirname "$0")/.."

PAIRS=${PAIRS:-7}
DURATION=${DURATION:-5s}
THREADS=${THREADS:-2}
CONNS=${CONNS:-64}
USERS=${USERS:-40000} # distinct users: more than the per-user token bucket lets through at this rate
PROFILE=${PROFILE:-0}
PATHS=${PATHS:-sold_out already_ordered} # which reject paths to measure
# YARD=constant: the yardstick answers a constant 409 without Redis (gin
# alone), the measure of the sold-out path with its admission checks
# (issue 13's target: >= 0.9); default: one EVALSHA per request.
YARD=${YARD:-evalsha}
K6=${K6:-} # a k6 binary to also run loadtest/seckill.js with; empty: skip
WORK=${WORK:-/tmp/seckill-reject}
SERVER_ADDR=127.0.0.1:18080
YARD_ADDR=127.0.0.1:18081
REDIS_ADDR=${REDIS_ADDR:-127.0.0.1:6379}
REDIS_DB=5
DB=seckill_bench
MYSQL_DSN="root:@tcp(127.0.0.1:3306)/$DB"
# A benchmark-only key; the server refuses to start without one.
JWT_SECRET=reject-bench-only-secret-not-for-production

# shellcheck source=loadtest/lib.sh
. loadtest/lib.sh

# --- prerequisites --------------------------------------------------------
need wrk mysql redis-cli curl jq python3 go

# --- build ----------------------------------------------------------------
# SERVER_REV=<commit> builds the server from that commit (git archive into
# $WORK/src), so that edits in progress in the tree do not leak into the
# figures; empty builds the working tree as it is.
log "building server, yardstick, tokens into $WORK"
build_server
build_tools

# --- fresh stores ---------------------------------------------------------
fresh_stores

# --- start both -----------------------------------------------------------
# The login code limits are off: every user logs in from this one address,
# and the admin more than once (k6's setup logs it in again).
HTTP_ADDR=$SERVER_ADDR MYSQL_DSN=$MYSQL_DSN REDIS_ADDR=$REDIS_ADDR REDIS_DB=$REDIS_DB \
	JWT_SECRET=$JWT_SECRET PAYMENT_WEBHOOK_SECRET=$JWT_SECRET ADMIN_PHONES=13800000000 AUTH_DEV_CODES=true \
	AUTH_CODE_INTERVAL=0 AUTH_CODES_PER_DAY=0 AUTH_CODES_PER_ADDR_PER_MIN=0 \
	"$WORK/server" >"$WORK/server.log" 2>&1 &
server_pid=$!
pids+=("$server_pid")
yard_flags=()
[[ $YARD == constant ]] && yard_flags=(-constant)
"$WORK/yardstick" -addr "$YARD_ADDR" -redis "$REDIS_ADDR" -db "$REDIS_DB" "${yard_flags[@]}" >"$WORK/yardstick.log" 2>&1 &
yard_pid=$!
pids+=("$yard_pid")

wait_ready() { # url
	for _ in $(seq 300); do
		curl -fsS -o /dev/null --max-time 1 "$1" 2>/dev/null && return 0
		sleep 0.1
	done
	echo "reject.sh: $1 did not come up in 30s; see $WORK/*.log" >&2
	exit 1
}
wait_ready "http://$SERVER_ADDR/readyz"
# The yardstick has one route; any HTTP answer means it listens.
for _ in $(seq 300); do
	curl -sS -o /dev/null --max-time 1 "http://$YARD_ADDR/" 2>/dev/null && break
	sleep 0.1
done

# --- vouchers and users ---------------------------------------------------
log "admin login, two vouchers, $USERS users who each buy the second one"
timeout 60 "$WORK/tokens" -base "http://$SERVER_ADDR" -first 13800000000 -n 1 -out "$WORK/admin.txt" 2>/dev/null
admin=$(head -1 "$WORK/admin.txt")
begin=$(date -u -d '-1 min' +%Y-%m-%dT%H:%M:%SZ)
end=$(date -u -d '+6 hour' +%Y-%m-%dT%H:%M:%SZ)
create() { # title stock
	curl -fsS --max-time 10 -X POST "http://$SERVER_ADDR/vouchers" \
		-H "Authorization: Bearer $admin" -H 'Content-Type: application/json' \
		-d "{\"title\":\"$1\",\"stock\":$2,\"begin_time\":\"$begin\",\"end_time\":\"$end\"}" | jq -r .id
}
sold_out_id=$(create "reject bench: sold out" 0)
ordered_id=$(create "reject bench: already ordered" $((USERS + 1000)))
# Every token's user buys ordered_id once, so that later requests for it
# are already_ordered while stock is still left.
timeout 300 "$WORK/tokens" -base "http://$SERVER_ADDR" -first 13900000000 -n "$USERS" \
	-buy "$ordered_id" -out "$WORK/tokens.txt"
# The yardstick's own stock keys: 0, so that it rejects too.
rcli SET "yardstick:{v$sold_out_id}:stock" 0 >/dev/null
rcli SET "yardstick:{v$ordered_id}:stock" 0 >/dev/null

# --- check the answers before timing them -----------------------------------
tok=$(head -1 "$WORK/tokens.txt")
expect() { # url code
	local body
	body=$(curl -sS --max-time 5 -X POST -H "Authorization: Bearer $tok" "$1")
	[[ $(jq -r .error.code <<<"$body") == "$2" ]] || { echo "reject.sh: $1 answered $body, want $2" >&2; exit 1; }
}
expect "http://$SERVER_ADDR/seckill/$sold_out_id" sold_out
expect "http://$SERVER_ADDR/seckill/$ordered_id" already_ordered
expect "http://$YARD_ADDR/seckill/$sold_out_id" sold_out
for target in "$SERVER_ADDR/seckill/$sold_out_id" "$SERVER_ADDR/seckill/$ordered_id" "$YARD_ADDR/seckill/$ordered_id"; do
	# A short run counting statuses: every answer must be a 409.
	out=$(WRK_COUNT=1 timeout 30 wrk -t"$THREADS" -c"$CONNS" -d1s -s loadtest/reject.lua \
		"http://${target%%/*}" -- "$WORK/tokens.txt" "${target##*/}")
	statuses=$(grep '^status ' <<<"$out" | sort | tr '\n' ' ' || true)
	log "check $target: $statuses"
	[[ $statuses =~ ^"status 409: "[0-9]+" "$ ]] || { echo "reject.sh: not all 409" >&2; exit 1; }
done

# --- measure ----------------------------------------------------------------
cpu_ticks() { # pid -> user+system CPU time in clock ticks
	awk '{ print $14 + $15 }' "/proc/$1/stat"
}

# rps runs wrk once and prints "req/s cpu-µs-per-request": the second
# figure is the target process's own CPU time (user + system, from
# /proc/<pid>/stat) over the requests answered. It is much less sensitive
# than req/s to other load on the machine, so it is printed alongside.
rps() { # base-url voucher-id pid
	local out t0 t1 n
	t0=$(cpu_ticks "$3")
	out=$(timeout 60 wrk -t"$THREADS" -c"$CONNS" -d"$DURATION" -s loadtest/reject.lua \
		"$1" -- "$WORK/tokens.txt" "$2")
	t1=$(cpu_ticks "$3")
	if grep -q 'Socket errors' <<<"$out"; then
		log "$(grep 'Socket errors' <<<"$out") ($1)"
	fi
	n=$(awk '/requests in/ { print $1 }' <<<"$out")
	awk -v n="$n" -v ticks=$((t1 - t0)) -v hz="$(getconf CLK_TCK)" \
		'/^Requests\/sec:/ { printf "%s %.1f\n", $2, ticks / hz * 1e6 / n }' <<<"$out"
}

measure() { # path-name voucher-id
	local name=$1 id=$2 y s
	log "$name: warm-up"
	rps "http://$YARD_ADDR" "$id" "$yard_pid" >/dev/null
	rps "http://$SERVER_ADDR" "$id" "$server_pid" >/dev/null
	: >"$WORK/$name.pairs"
	for i in $(seq "$PAIRS"); do
		y=$(rps "http://$YARD_ADDR" "$id" "$yard_pid")
		s=$(rps "http://$SERVER_ADDR" "$id" "$server_pid")
		echo "$i $y $s" >>"$WORK/$name.pairs"
		pair_line "$name" "$i" yardstick "$y" server "$s"
	done
	pairs_summary "$name" "$WORK/$name.pairs" yardstick server
}

profile() { # path-name voucher-id who pid base-url
	local name=$1 id=$2 who=$3 pid=$4 url=$5 data
	command -v perf >/dev/null || { log "perf missing: no profile"; return; }
	data="$WORK/$name.$who.perf.data"
	log "$name: perf record of the $who during one ${DURATION} run"
	timeout 120 perf record -F 999 -g -p "$pid" -o "$data" -- sleep "${DURATION%s}" >/dev/null 2>&1 &
	local perf_pid=$!
	sleep 0.2
	rps "$url" "$id" "$pid" >/dev/null
	wait "$perf_pid" || true
	perf report -i "$data" --no-children --percent-limit 1 --stdio -g none 2>/dev/null |
		grep -E '^ +[0-9]' | head -25 >"$data.self.txt" || true
	perf report -i "$data" --children --percent-limit 0.8 --stdio -g none 2>/dev/null |
		grep -E '^ +[0-9]' | grep -v 'kernel.kallsyms' | head -60 >"$data.children.txt" || true
	log "$name/$who: top functions by self time ($data.self.txt)"
	cat "$data.self.txt"
	log "$name/$who: Go functions including callees ($data.children.txt)"
	cat "$data.children.txt"
}

echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(go version | cut -d' ' -f3), $(wrk -v 2>&1 | head -1 | cut -d' ' -f1-2)"
echo "server: $server_desc"
echo "runs: wrk -t$THREADS -c$CONNS -d$DURATION, $PAIRS pairs per path, $USERS users"
voucher_of() { # path-name -> voucher ID
	case $1 in
	sold_out) echo "$sold_out_id" ;;
	already_ordered) echo "$ordered_id" ;;
	*) echo "reject.sh: unknown path $1 in PATHS" >&2; exit 1 ;;
	esac
}
for path in $PATHS; do
	measure "$path" "$(voucher_of "$path")"
done
if [[ $PROFILE == 1 ]]; then
	for path in $PATHS; do
		profile "$path" "$(voucher_of "$path")" server "$server_pid" "http://$SERVER_ADDR"
		profile "$path" "$(voucher_of "$path")" yardstick "$yard_pid" "http://$YARD_ADDR"
	done
fi
if [[ -n $K6 ]]; then
	if command -v "$K6" >/dev/null; then
		log "k6: loadtest/seckill.js (sale and reject scenarios)"
		timeout 300 "$K6" run --quiet -e BASE="http://$SERVER_ADDR" -e TOKENS="$WORK/tokens.txt" loadtest/seckill.js ||
			log "k6 failed or a threshold was crossed (exit $?)"
	else
		log "k6 ($K6) not found: k6 scenarios skipped"
	fi
fi
