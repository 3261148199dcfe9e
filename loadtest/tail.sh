#!/usr/bin/env bash
# tail.sh measures the tail latency of each path (issue 33): p50, p99 and
# p99.9 at half and at nine tenths of the path's own peak rate, each
# request timed from when it was due (wrk2's rule), not from when it was
# written, so that a stall counts for every buyer who arrived during it.
#
# For each path it finds the peak with wrk (a closed loop, -t$THREADS
# -c$CONNS, one run of PEAK_DURATION, as reject.sh and success.sh measure
# rates), then sends an open loop at each fraction of that peak with
# loadtest/openloop (WARMUP not counted, then DURATION), and prints a row a
# run: the peak, the rate asked and achieved, p50, p99, p99.9 and the
# maximum in ms, the send lag at p99 (from due to the write: the wait for a
# free connection and the generator's own lateness), how many requests
# found every connection busy when due (queued), and the statuses (with
# errors and unsent requests, if any). A lag-p99 near the p99 with few
# queued means the figure is the generator's or the machine's, not the
# server's.
# The goal on the 2-core machine: p99 <= 10 ms at half the peak.
#
# Two more readings explain a selling path's tail. Before the runs, the
# disk's latency of a durable write, as InnoDB's log makes one (line
# "disk"): a sync order waits for a COMMIT, so that tail is under its own.
# After them, for each async and sync run, the quantiles of the stages the
# server times (the stock script, the lock, the commit, the confirm), read
# off its /metrics histograms before and after the run: doubling buckets,
# so each quantile is interpolated inside one, and the warm-up is counted
# in them.
#
# The paths (PATHS, comma- or space-separated):
#   sold_out         POST /seckill/{id} of a voucher with no stock;
#   already_ordered  POST /seckill/{id} of a voucher with stock left that
#                    every user has bought (CYCLE_USERS users, in turn);
#   async, sync      POST /seckill/{id} that orders, on a server in that
#                    mode: a fresh voucher of 10,000,000 units a run, every
#                    request a user who has not bought it (openloop -unique);
#   join             POST /vouchers/{id}/room, joins after begin_time of a
#                    fresh room voucher a run, every request another user.
# sold_out and already_ordered cycle through CYCLE_USERS users (more than
# the per-user token bucket lets through at these rates); the others need
# a user a request, and users are logged in as the rates need them.
#
# Database seckill_tail (dropped and created afresh) and a Redis of its own
# (redis-server on port 16393, no persistence); REDIS_ADDR=host:port uses
# that Redis instead, its logical database 11 (flushed; no other database
# is touched). Loopback only; every step is bounded in time and the
# processes it starts are stopped on exit. The generator shares the machine
# with the server: run it on a quiet machine.
#
#   loadtest/tail.sh                          # every path, 10 s at 0.5 and 0.9
#   PATHS=sold_out,async loadtest/tail.sh
#   FRACTIONS="0.25 0.5 0.75 0.9" DURATION=30s loadtest/tail.sh
#   SERVER_REV=HEAD loadtest/tail.sh          # the server as committed
#   PEAK_DURATION=2s WARMUP=1s DURATION=3s CYCLE_USERS=5000 loadtest/tail.sh  # a smoke run
#
# WARMUP, DURATION and PEAK_DURATION are whole seconds (2s, 10s). Each
# run's full report is $WORK/<path>-<fraction>.json (openloop -json).
# Needs go, wrk (apt-get installed if missing), mysql, redis-cli,
# redis-server, curl, jq and python3. Generated files go to $WORK.
set -euo pipefail

cd "$(dirname "$0")/.."

PATHS=${PATHS:-sold_out,already_ordered,async,sync,join}
FRACTIONS=${FRACTIONS:-0.5 0.9}
PEAK_DURATION=${PEAK_DURATION:-5s}
WARMUP=${WARMUP:-2s}
DURATION=${DURATION:-10s}
THREADS=${THREADS:-2}
CONNS=${CONNS:-64}            # wrk's connections, for the peak
# openloop's connections: more than the server's MAX_IN_FLIGHT (256), so
# that requests wait in the server (or are refused 429 busy by it), not
# for a free connection in the generator.
OPEN_CONNS=${OPEN_CONNS:-512}
CYCLE_USERS=${CYCLE_USERS:-40000}
USERS=${USERS:-100000} # users logged in before the first path that needs a user a request
PAUSE=${PAUSE:-2}      # seconds between runs, for the server to settle
WORK=${WORK:-/tmp/seckill-tail}
SERVER_ADDR=127.0.0.1:18130
REDIS_ADDR=${REDIS_ADDR:-}
REDIS_DB=11
DB=seckill_tail
MYSQL_DSN="root:@tcp(127.0.0.1:3306)/$DB"
JWT_SECRET=tail-bench-only-secret-not-for-production
STOCK=10000000
FIRST_USER=13900000000

# shellcheck source=loadtest/lib.sh
. loadtest/lib.sh

need wrk mysql redis-cli curl jq python3 go redis-server

read -r -a paths <<<"${PATHS//,/ }"
for path in "${paths[@]}"; do
	case $path in
	sold_out | already_ordered | async | sync | join) ;;
	*) echo "tail.sh: unknown path $path in PATHS (sold_out, already_ordered, async, sync, join)" >&2; exit 1 ;;
	esac
done
mode_of() { [[ $1 == async ]] && echo async || echo sync; }

[[ -z $REDIS_ADDR ]] && redis_up 16393
log "building server, tokens and openloop into $WORK"
build_server
build_tools openloop
fresh_stores
sql() { timeout 30 mysql -uroot -N -B "$DB" -e "$1"; }

running=$(mode_of "${paths[0]}")
server_up "$WORK/server-$running.log" SECKILL_MODE="$running"

iso() { date -u -d "$1" +%Y-%m-%dT%H:%M:%S.%3NZ; }
create() { # title stock [room-json]
	local room=""
	[[ -n ${3:-} ]] && room=",\"room\":$3"
	curl -sS --max-time 10 -X POST "http://$SERVER_ADDR/vouchers" \
		-H "Authorization: Bearer $admin" -H 'Content-Type: application/json' \
		-d "{\"title\":\"$1\",\"stock\":$2,\"begin_time\":\"$(iso '-1 min')\",\"end_time\":\"$(iso '+6 hour')\"$room}" |
		jq -r '.id // error("creating a voucher: \(.)")'
}
# answer URL-PATH TOKEN: one POST, printed as "status error-code".
answer() {
	curl -sS --max-time 10 -X POST -H "Authorization: Bearer $2" -w ' %{http_code}' "http://$SERVER_ADDR$1" |
		python3 -c 'import json, sys; body, _, code = sys.stdin.read().rpartition(" "); print(code, (json.loads(body or "{}").get("error") or {}).get("code", "-"))'
}

log "admin login, two vouchers, $CYCLE_USERS users who each buy the second one"
timeout 60 "$WORK/tokens" -base "http://$SERVER_ADDR" -first 13800000000 -n 1 -out "$WORK/admin.txt" 2>/dev/null
admin=$(head -1 "$WORK/admin.txt")
sold_out_id=$(create "tail: sold out" 0)
ordered_id=$(create "tail: already ordered" $((CYCLE_USERS + 1000)))
timeout 900 "$WORK/tokens" -base "http://$SERVER_ADDR" -first "$FIRST_USER" -n "$CYCLE_USERS" -c 32 \
	-timeout 15m -buy "$ordered_id" -out "$WORK/tokens.txt"
cp "$WORK/tokens.txt" "$WORK/cycle.txt"

# ensure_users N: at least N users in tokens.txt, logging in those missing.
ensure_users() {
	local have
	have=$(wc -l <"$WORK/tokens.txt")
	((have >= $1)) && return 0
	log "logging in $(($1 - have)) more users (a user a request: $1 in all)"
	timeout 1800 "$WORK/tokens" -base "http://$SERVER_ADDR" -first $((FIRST_USER + have)) -n $(($1 - have)) -c 32 \
		-timeout 30m -out "$WORK/more.txt"
	cat "$WORK/more.txt" >>"$WORK/tokens.txt"
}

# target PATH sets what a run of PATH sends: url, tokens (the file) and
# unique (a user a request), and the voucher it sends to: a fresh one a run
# for the paths that sell or queue, which the admin's own request warms
# (the first request of a voucher reads MySQL).
target() {
	unique=0 tokens=$WORK/cycle.txt
	case $1 in
	sold_out) vid=$sold_out_id ;;
	already_ordered) vid=$ordered_id ;;
	async | sync) vid=$(create "tail: $1" "$STOCK") unique=1 tokens=$WORK/tokens.txt ;;
	join) vid=$(create "tail: join" "$STOCK" '{"admit_per_second":1,"hold_for":60}') unique=1 tokens=$WORK/tokens.txt ;;
	esac
	url=/seckill/$vid
	[[ $1 == join ]] && url=/vouchers/$vid/room
	local want got who=$admin
	case $1 in
	sold_out) want="409 sold_out" who=$(head -1 "$WORK/cycle.txt") ;;
	already_ordered) want="409 already_ordered" who=$(head -1 "$WORK/cycle.txt") ;;
	*) want="200 -" ;;
	esac
	got=$(answer "$url" "$who")
	[[ $got == "$want" ]] || { echo "tail.sh: $1: POST $url answered $got, want $want" >&2; exit 1; }
}

# settle PATH waits after a run: for the async path, until every order
# accepted is in MySQL (at most 60 s), so that the queue's writes do not
# weigh on the next run; then PAUSE seconds.
settle() {
	if [[ $1 == async ]]; then
		local left accepted orders
		left=$(curl -fsS --max-time 10 "http://$SERVER_ADDR/vouchers/$vid" | jq -r .stock)
		accepted=$((STOCK - left))
		for _ in $(seq 600); do
			orders=$(sql "SELECT COUNT(*) FROM voucher_orders WHERE voucher_id = $vid")
			((orders >= accepted)) && break
			sleep 0.1
		done
		((orders >= accepted)) || log "async: after 60 s, $orders of $accepted accepted orders in MySQL"
	fi
	sleep "$PAUSE"
}

# peak PATH: one closed-loop wrk run; prints its requests a second. A
# path of a user a request whose run sent more requests than there were
# users (some asked twice, answered already_ordered or "in line already",
# cheaper) logs more users in and runs again.
peak() {
	target "$1"
	local out n args=("$tokens" "$vid")
	# reject.lua's third argument shares the file out among wrk's threads,
	# so that no user is sent twice; the fourth is the path.
	((unique)) && args+=("$THREADS")
	[[ $1 == join ]] && args+=("/vouchers/%d/room")
	out=$(timeout 120 wrk -t"$THREADS" -c"$CONNS" -d"$PEAK_DURATION" -s loadtest/reject.lua \
		"http://$SERVER_ADDR" -- "${args[@]}")
	grep -q 'Socket errors' <<<"$out" && log "$1 peak: $(grep 'Socket errors' <<<"$out")"
	n=$(awk '/requests in/ { print $1 }' <<<"$out")
	if ((unique && n > $(wc -l <"$tokens"))); then
		log "$1 peak: $n requests for $(wc -l <"$tokens") users: some asked twice; again with more users"
		ensure_users $((n + n / 4))
		settle "$1"
		peak "$1"
		return
	fi
	awk '/^Requests\/sec:/ { printf "%.0f\n", $2 }' <<<"$out"
	settle "$1"
}

# open PATH PEAK FRACTION: one open-loop run at FRACTION of PEAK; prints
# its row of the table.
open_loop() {
	local path=$1 peak=$2 f=$3 rate json flags=()
	rate=$(python3 -c 'import sys; print(max(1, round(float(sys.argv[1]) * float(sys.argv[2]))))' "$peak" "$f")
	if [[ $path == async || $path == sync || $path == join ]]; then
		ensure_users "$(python3 -c 'import sys; r, w, d = map(float, sys.argv[1:]); print(int(r * (w + d)) + 1)' "$rate" "${WARMUP%s}" "${DURATION%s}")"
	fi
	target "$path"
	((unique)) && flags+=(-unique)
	json=$WORK/$path-$f.json
	[[ $path == async || $path == sync ]] && stages >"$WORK/stages-before.txt"
	timeout 900 "$WORK/openloop" -url "http://$SERVER_ADDR$url" -method POST -rate "$rate" \
		-warmup "$WARMUP" -duration "$DURATION" -conns "$OPEN_CONNS" -tokens "$tokens" "${flags[@]}" -json >"$json"
	[[ $path == async || $path == sync ]] && stages >"$WORK/stages-after.txt"
	jq -r --arg path "$path" --arg peak "$peak" --arg f "$f" '
		[$path, $peak, $f, .rate, .achieved_rate, (.latency_ms | .p50, .p99, .["p99.9"], .max), .send_lag_ms.p99, .queued,
		 ([.statuses, (.errors // {}) | to_entries[] | "\(.key):\(.value)"]
		  + (if .unsent > 0 then ["unsent:\(.unsent)"] else [] end) | join(" "))]
		| @tsv' "$json" |
		awk -F'\t' '{ printf "%-16s %7d %4s %7d %8.0f %8.2f %8.2f %8.2f %8.2f %8.2f %7d  %s\n", $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12 }'
	if [[ $path == async || $path == sync ]]; then
		python3 loadtest/stages_quantiles.py "$WORK/stages-before.txt" "$WORK/stages-after.txt" >"$WORK/$path-$f.stages.txt"
		stage_rows+=("$(printf '%-16s %4s  %s' "$path" "$f" "$(cat "$WORK/$path-$f.stages.txt")")")
	fi
	settle "$path"
}

# stages prints the server's histograms of a selling request's stages
# (seckill_stage_duration_seconds: the stock script, the lock, the
# commit, the confirm: one observation a batch), which the admin may read
# on the main port.
# A scrape that failed prints nothing (never a part: a histogram without
# its last buckets would give wrong quantiles), and the run's row of
# stages says so.
stages() {
	local m
	m=$(curl -fsS --max-time 10 -H "Authorization: Bearer $admin" "http://$SERVER_ADDR/metrics") || return 0
	grep '^seckill_stage_duration_seconds_bucket' <<<"$m" || true
}

# fsync_probe prints the disk's latency of a durable write where
# MariaDB's redo log is (the same filesystem as $WORK, checked): a sync
# order's 200 waits for a COMMIT, which waits for one, so the disk's tail
# is a floor under that path's. As InnoDB writes its log: into a file
# allocated beforehand, 512 bytes at a time in place, each made durable
# with fdatasync (no change of the file's size to journal), 2,000 times.
fsync_probe() {
	local datadir
	datadir=$(timeout 10 mysql -uroot -N -B -e 'SELECT @@datadir')
	if [[ $(stat -c %d "$WORK") != $(stat -c %d "$datadir" 2>/dev/null || echo none) ]]; then
		echo "not measured: $WORK is not on MariaDB's filesystem ($datadir)"
		return
	fi
	python3 - "$WORK/fsync-probe" <<'PY'
import os, sys, time
n, size = 2000, 512
fd = os.open(sys.argv[1], os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
os.write(fd, b"\0" * (n * size))
os.fsync(fd)
ms = []
for i in range(n):
    os.pwrite(fd, b"x" * size, i * size)
    t = time.perf_counter()
    os.fdatasync(fd)
    ms.append((time.perf_counter() - t) * 1000)
os.close(fd)
os.unlink(sys.argv[1])
ms.sort()
q = lambda p: ms[min(len(ms) - 1, int(p * len(ms)))]
print("p50 %.2f ms, p99 %.2f ms, p99.9 %.2f ms, max %.2f ms (fdatasync of 512 bytes written in place)" % (q(0.5), q(0.99), q(0.999), ms[-1]))
PY
}

stage_rows=()
echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(go version | cut -d' ' -f3), $(wrk -v 2>&1 | head -1 | cut -d' ' -f1-2), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "server: $server_desc"
echo "peak: wrk -t$THREADS -c$CONNS -d$PEAK_DURATION; open loop: openloop -conns $OPEN_CONNS -warmup $WARMUP -duration $DURATION at $FRACTIONS of the peak"
echo "disk: fsync $(fsync_probe)"
printf '%-16s %7s %4s %7s %8s %8s %8s %8s %8s %8s %7s  %s\n' path peak f rate achieved p50 p99 p99.9 max lag-p99 queued statuses
for path in "${paths[@]}"; do
	mode=$(mode_of "$path")
	if [[ $mode != "$running" ]]; then
		server_down
		server_up "$WORK/server-$mode.log" SECKILL_MODE="$mode"
		running=$mode
	fi
	if [[ $path == async || $path == sync || $path == join ]]; then
		ensure_users "$USERS"
	fi
	p=$(peak "$path")
	for f in $FRACTIONS; do
		open_loop "$path" "$p" "$f"
	done
done
if ((${#stage_rows[@]})); then
	echo "stages of the selling runs, from the server's histograms (ms; doubling buckets from 0.5 ms, so a quantile is the bucket's interpolation; the warm-up's requests included):"
	printf '%s\n' "${stage_rows[@]}"
fi
