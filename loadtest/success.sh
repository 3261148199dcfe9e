#!/usr/bin/env bash
# success.sh measures the path that sells, against the yardstick
# (loadtest/yardstick: gin + one EVALSHA that takes a unit, nothing else).
#
# Every request comes from a user who has not bought yet, and the stock
# never runs out (a fresh voucher of 10,000,000 units per run), so every
# request the server answers in time is an order. Per mode (sync, async) it
# alternates wrk runs, yardstick then server, PAIRS times, and prints per
# pair:
#   yardstick   its req/s (each one a unit taken in Redis);
#   orders/s    sync: rows committed for the run's voucher (every 200 is a
#               committed row); async: orders accepted (units gone from the
#               voucher's stock in Redis), all of which must reach MySQL;
#   ratio       orders/s over the yardstick's req/s; a pair whose run
#               sent as many requests as there are USERS is marked CAPPED:
#               it may have sold to them all, and its rate may be theirs
#               over the run, a lower bound of the server's (raise USERS);
#   lag         async: from the end of the load to the last accepted order
#               in MySQL (polled every 10 ms);
#   cpu         CPU µs per order of each program: the yardstick or the
#               server, redis-server, mariadbd, wrk (user + system from
#               /proc/<pid>/stat and wrk's rusage, from before the load to
#               after the last row is in MySQL), written to $WORK/<mode>.cpu
#               and summed up as medians. Redis and MariaDB are shared: a
#               test suite running beside the benchmark shows up in them.
# and the medians. Targets (issue 13): async >= 0.75 and lag <= 250 ms,
# sync >= 0.35.
#
# Loopback only: database seckill_success (dropped and created afresh),
# Redis logical database 2 (flushed; no other database is touched). Every
# process started here is stopped on exit.
#
#   loadtest/success.sh                      # 5 pairs of 4 s runs per mode
#   PAIRS=7 MODES=async loadtest/success.sh
#   SERVER_REV=HEAD~3 loadtest/success.sh    # the server as of that commit
#   REUSE_TOKENS=1 loadtest/success.sh       # the last hour's tokens, no logins
#   PROFILE=1 loadtest/success.sh            # also perf-profile the server
#                                            # and the yardstick, split by
#                                            # stage (loadtest/stages.py)
#
# Needs go, wrk (apt-get installed if missing), mysql, redis-cli, curl, jq,
# python3; perf for PROFILE=1. Generated files go to $WORK.
set -euo pipefail

cd "$(dirname "$0")/.."

PAIRS=${PAIRS:-5}
DURATION=${DURATION:-4s}
THREADS=${THREADS:-2}
CONNS=${CONNS:-64}
USERS=${USERS:-300000} # more than a run can sell, so that no user buys twice
MODES=${MODES:-sync async}
PROFILE=${PROFILE:-0}
REUSE_TOKENS=${REUSE_TOKENS:-0} # 1: skip the logins if $WORK holds tokens of the last hour
WORK=${WORK:-/tmp/seckill-success}
SERVER_ADDR=127.0.0.1:18090
YARD_ADDR=127.0.0.1:18091
REDIS_ADDR=${REDIS_ADDR:-127.0.0.1:6379}
REDIS_DB=2
DB=seckill_success
MYSQL_DSN="root:@tcp(127.0.0.1:3306)/$DB"
JWT_SECRET=success-bench-only-secret-not-for-production
STOCK=10000000

# shellcheck source=loadtest/lib.sh
. loadtest/lib.sh

need wrk mysql redis-cli curl jq python3 go
log "building server, yardstick, tokens into $WORK"
build_server
build_tools
fresh_stores
sql() { timeout 30 mysql -uroot -N -B "$DB" -e "$1"; }

server_pid=
PROFILE_RUN=0
start_server() { # mode
	HTTP_ADDR=$SERVER_ADDR MYSQL_DSN=$MYSQL_DSN REDIS_ADDR=$REDIS_ADDR REDIS_DB=$REDIS_DB \
		JWT_SECRET=$JWT_SECRET PAYMENT_WEBHOOK_SECRET=$JWT_SECRET ADMIN_PHONES=13800000000 AUTH_DEV_CODES=true SECKILL_MODE=$1 \
		AUTH_CODE_INTERVAL=0 AUTH_CODES_PER_DAY=0 AUTH_CODES_PER_ADDR_PER_MIN=0 \
		"$WORK/server" >"$WORK/server-$1.log" 2>&1 &
	server_pid=$!
	pids+=("$server_pid")
	for _ in $(seq 300); do
		curl -fsS -o /dev/null --max-time 1 "http://$SERVER_ADDR/readyz" 2>/dev/null && return 0
		sleep 0.1
	done
	echo "success.sh: the server did not come up in 30s; see $WORK/server-$1.log" >&2
	exit 1
}
stop_server() {
	kill -TERM "$server_pid"
	for _ in $(seq 300); do kill -0 "$server_pid" 2>/dev/null || break; sleep 0.1; done
	kill -KILL "$server_pid" 2>/dev/null || true
	wait "$server_pid" 2>/dev/null || true
}

"$WORK/yardstick" -addr "$YARD_ADDR" -redis "$REDIS_ADDR" -db "$REDIS_DB" >"$WORK/yardstick.log" 2>&1 &
yard_pid=$!
pids+=("$yard_pid")
for _ in $(seq 300); do
	curl -sS -o /dev/null --max-time 1 "http://$YARD_ADDR/" 2>/dev/null && break
	sleep 0.1
done

start_server sync
# The admin logs in each time: an admin's rights are read from the database.
log "admin logs in"
timeout 60 "$WORK/tokens" -base "http://$SERVER_ADDR" -first 13800000000 -n 1 -out "$WORK/admin.txt" 2>/dev/null
if [[ $REUSE_TOKENS == 1 && -f $WORK/tokens.txt && $(wc -l <"$WORK/tokens.txt") -ge $USERS &&
	-n $(find "$WORK/tokens.txt" -mmin -60 2>/dev/null) ]]; then
	# A buyer's token is self-contained (signed claims, JWT_SECRET is
	# fixed): those of a run less than an hour old still hold, though the
	# database of their users was made afresh (orders refer to users by
	# ID only).
	log "reusing the $USERS users' tokens of $WORK/tokens.txt"
else
	log "$USERS users log in"
	timeout 600 "$WORK/tokens" -base "http://$SERVER_ADDR" -first 13900000000 -n "$USERS" -c 32 -out "$WORK/tokens.txt"
fi
# Exactly USERS of them: a file kept from a run with more users would
# give wrk more, and the runs' figures (users, CAPPED) would be wrong.
head -n "$USERS" "$WORK/tokens.txt" >"$WORK/users.txt"
admin=$(head -1 "$WORK/admin.txt")
begin=$(date -u -d '-1 min' +%Y-%m-%dT%H:%M:%SZ)
end=$(date -u -d '+6 hour' +%Y-%m-%dT%H:%M:%SZ)
new_voucher() {
	curl -fsS --max-time 10 -X POST "http://$SERVER_ADDR/vouchers" \
		-H "Authorization: Bearer $admin" -H 'Content-Type: application/json' \
		-d "{\"title\":\"success bench\",\"stock\":$STOCK,\"begin_time\":\"$begin\",\"end_time\":\"$end\"}" | jq -r .id
}
# Units left, as Redis counts them (GET /vouchers/{id}).
left() { curl -fsS --max-time 10 "http://$SERVER_ADDR/vouchers/$1" | jq -r .stock; }

# CPU accounting: clock ticks (user + system) of a process, and of the
# stores the runs share. wrk's own comes from its rusage (/usr/bin/time).
hz=$(getconf CLK_TCK)
store_pids
# cpu_now pid: "program redis mariadb" ticks now.
cpu_now() { echo "$(ticks "$1") $(ticks "$redis_pid") $(ticks "$mysql_pid")"; }
# cpu_line mode who orders "before" "after": one line of $WORK/<mode>.cpu,
# "who orders program redis mariadb wrk", the last four in µs per order.
cpu_line() {
	# shellcheck disable=SC2086 # the tick lists are words on purpose
	python3 -c 'import sys; who, n, hz, *t = sys.argv[1:]; n, hz = float(n), float(hz); t = list(map(float, t)); b, a, w = t[0:3], t[3:6], t[6]; print(who, int(n), *(f"{(y - x) / hz * 1e6 / max(n, 1):.1f}" for x, y in zip(b, a)), f"{w * 1e6 / max(n, 1):.1f}")' \
		"$2" "$3" "$hz" $4 $5 "$(awk '{ print $1 + $2 }' "$WORK/wrk.time")" >>"$WORK/$1.cpu"
}

# run_wrk base-url voucher: one timed run; prints "req/s seconds requests".
run_wrk() {
	local out
	out=$(/usr/bin/time -f '%U %S' -o "$WORK/wrk.time" timeout 60 wrk -t"$THREADS" -c"$CONNS" -d"$DURATION" -s loadtest/reject.lua "$1" -- "$WORK/users.txt" "$2" "$THREADS")
	grep -q 'Socket errors' <<<"$out" && log "$(grep 'Socket errors' <<<"$out") ($1)"
	awk '/requests in/ { n = $1; s = $4; sub(/s,?$/, "", s) } /^Requests\/sec:/ { r = $2 } END { print r, s, n }' <<<"$out"
}

# yard_run [mode]: the yardstick takes units of a key of its own, never
# empty; with a mode, its CPU per request goes to $WORK/<mode>.cpu.
yard_run() {
	local id=$((900000 + RANDOM)) before rps n
	rcli SET "yardstick:{v$id}:stock" "$STOCK" >/dev/null
	before=$(cpu_now "$yard_pid")
	read -r rps _ n < <(run_wrk "http://$YARD_ADDR" "$id")
	[[ -z ${1:-} ]] || cpu_line "$1" yardstick "$n" "$before" "$(cpu_now "$yard_pid")"
	echo "$rps"
}

# server_run mode: a fresh voucher, one timed run; prints "orders/s lag-ms requests".
server_run() {
	local mode=$1 vid rps secs n orders t0 lag accepted before
	vid=$(new_voucher)
	# Warm the voucher into the instance's cache and Redis: the first
	# request of a voucher reads MySQL.
	curl -sS -o /dev/null --max-time 5 -X POST -H "Authorization: Bearer $admin" "http://$SERVER_ADDR/seckill/$vid"
	before=$(cpu_now "$server_pid")
	read -r rps secs n < <(run_wrk "http://$SERVER_ADDR" "$vid")
	t0=$(date +%s%N)
	accepted=$((STOCK - $(left "$vid") - 1)) # the admin's warm-up order is not counted
	lag=0
	if [[ $mode == async ]]; then
		for _ in $(seq 3000); do
			orders=$(sql "SELECT COUNT(*) - 1 FROM voucher_orders WHERE voucher_id = $vid")
			((orders >= accepted)) && break
			sleep 0.01
		done
		lag=$((($(date +%s%N) - t0) / 1000000))
		((orders >= accepted)) || { echo "success.sh: after 30 s, $orders of $accepted accepted orders in MySQL" >&2; exit 1; }
	else
		orders=$(sql "SELECT COUNT(*) - 1 FROM voucher_orders WHERE voucher_id = $vid")
	fi
	[[ $PROFILE_RUN == 1 ]] || cpu_line "$mode" "$mode" "$orders" "$before" "$(cpu_now "$server_pid")"
	((n < USERS)) || log "warning: $n requests for $USERS users: some users asked twice (answered already_ordered)"
	python3 -c 'import sys; o, s = map(float, sys.argv[1:]); print(f"{o / s:.0f}")' "$orders" "$secs" | tr '\n' ' '
	echo "$lag $n"
}

echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(go version | cut -d' ' -f3), $(wrk -v 2>&1 | head -1 | cut -d' ' -f1-2)"
echo "server: $server_desc"
echo "runs: wrk -t$THREADS -c$CONNS -d$DURATION, $PAIRS pairs per mode, $USERS distinct users, stock $STOCK per run"
running=sync # the logins ran on a sync server
for mode in $MODES; do
	if [[ $mode != "$running" ]]; then
		stop_server
		start_server "$mode"
		running=$mode
	fi
	log "$mode: warm-up"
	yard_run >/dev/null
	server_run "$mode" >/dev/null
	: >"$WORK/$mode.pairs"
	: >"$WORK/$mode.cpu"
	for i in $(seq "$PAIRS"); do
		y=$(yard_run "$mode")
		s=$(server_run "$mode")
		echo "$i $y $s" >>"$WORK/$mode.pairs"
		# A run that sent as many requests as there are users may have
		# sold to all of them: its rate is then theirs over the run, not
		# the server's.
		python3 -c 'import sys; m, i, users, y, o, lag, n = sys.argv[1:]; y, o = float(y), float(o); print(f"{m:<6} pair {i}: yardstick {y:8.0f} req/s   {m} {o:8.0f} orders/s   ratio {o / y:.3f}" + (f"   lag {lag} ms" if m == "async" else "") + (f"   CAPPED: {n} requests for {users} users, a lower bound (raise USERS)" if int(n) >= int(users) else ""))' \
			"$mode" "$i" "$USERS" $y $s
	done
	python3 - "$mode" "$WORK/$mode.cpu" <<-'EOF'
		import statistics, sys
		mode, path = sys.argv[1], sys.argv[2]
		rows = {}
		for l in open(path):
		    f = l.split()
		    if f:
		        rows.setdefault(f[0], []).append(list(map(float, f[2:])))
		print(f"{mode:<6} CPU µs per order, medians of the runs:   program  redis  mariadb    wrk")
		for who in ("yardstick", mode):
		    r = rows.get(who, [])
		    if r:
		        print(f"{mode:<6}   {who:<40} " + " ".join(f"{statistics.median(x[i] for x in r):7.1f}" for i in range(4)))
	EOF
	if [[ $PROFILE == 1 ]] && command -v perf >/dev/null; then
		# One more run of each, under perf, apart from the figures above
		# (perf itself costs CPU). Each profile is split into stages by
		# loadtest/stages.py, scaled by the program's median µs per order.
		for who in yardstick "$mode"; do
			if [[ $who == yardstick ]]; then pid=$yard_pid; else pid=$server_pid; fi
			us=$(awk -v w="$who" '$1 == w { print $3 }' "$WORK/$mode.cpu" | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }')
			log "$mode: perf record of the $who during one run"
			timeout 120 perf record -F 999 -g -p "$pid" -o "$WORK/$mode.$who.perf.data" -- sleep "${DURATION%s}" >/dev/null 2>&1 &
			perf_pid=$!
			sleep 0.2
			PROFILE_RUN=1
			if [[ $who == yardstick ]]; then yard_run >/dev/null; else server_run "$mode" >/dev/null; fi
			PROFILE_RUN=0
			wait "$perf_pid" || true
			perf report -i "$WORK/$mode.$who.perf.data" --no-children --percent-limit 1 --stdio -g none 2>/dev/null |
				grep -E '^ +[0-9]' | head -30 >"$WORK/$mode.$who.perf.self.txt" || true
			perf script -i "$WORK/$mode.$who.perf.data" 2>/dev/null | python3 loadtest/stages.py "$us" >"$WORK/$mode.$who.stages.txt" || true
			log "$mode: the $who's CPU by stage, at $us µs an order ($WORK/$mode.$who.stages.txt; top functions in $WORK/$mode.$who.perf.self.txt)"
			cat "$WORK/$mode.$who.stages.txt"
		done
	fi
	python3 - "$mode" "$WORK/$mode.pairs" "$USERS" <<-'EOF'
		import statistics, sys
		mode, path, users = sys.argv[1], sys.argv[2], float(sys.argv[3])
		rows = [tuple(map(float, l.split()[1:4])) for l in open(path) if l.strip()]
		ratios = [o / y for y, o, _ in rows]
		med = statistics.median
		line = (f"{mode:<6} ratios: {' '.join(f'{r:.3f}' for r in ratios)}\n"
		        f"{mode:<6} median ratio orders/s over yardstick req/s: {med(ratios):.3f}"
		        f"  (median: yardstick {med(r[0] for r in rows):.0f} req/s, {mode} {med(r[1] for r in rows):.0f} orders/s")
		if mode == "async":
		    line += f"; lag to the last row {med(r[2] for r in rows):.0f} ms, worst {max(r[2] for r in rows):.0f} ms"
		print(line + ")")
		if capped := sum(1 for l in open(path) if l.split()[4:] and float(l.split()[4]) >= users):
		    print(f"{mode:<6} CAPPED: {capped} of {len(rows)} pairs sent a request for each of the {users:.0f} users or more: their ratios may be lower bounds (raise USERS)")
	EOF
done
