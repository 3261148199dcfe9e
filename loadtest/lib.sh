# lib.sh is what the load scripts share: sourced, never run. It expects
# WORK (where generated files go) and sets up:
#
#   pids        processes to stop on exit (append with pids+=("$!"))
#   log MSG     a progress line on stderr
#   need TOOL…  installs wrk if named and missing (Debian), then fails unless every
#               TOOL is on PATH
#   build_server builds cmd/server into $WORK/server, from the commit
#               SERVER_REV names (git archive: edits in progress in the
#               tree never leak into figures) or from the working tree,
#               and sets server_desc to say which
#   build_tools builds the yardstick and the token maker into $WORK, and
#               each loadtest tool named (build_tools openloop)
#   redis_up PORT  starts a private redis-server (no persistence) on PORT
#               and points REDIS_ADDR at it; fails if a Redis answers there
#               already (the script would flush it)
#   fresh_stores checks that Redis ($REDIS_ADDR) and MySQL answer, drops
#               and creates database $DB, flushes Redis database
#               $REDIS_DB (only that one), and defines rcli: redis-cli on it
#   server_up LOG [NAME=VALUE…]  starts $WORK/server on $SERVER_ADDR (see
#               below), sets server_pid, waits for /readyz; server_down
#               stops it
#   ticks PID   a process's CPU so far, in clock ticks (user + system;
#               getconf CLK_TCK a second); store_pids sets redis_pid and
#               mysql_pid, the processes of the Redis ($REDIS_ADDR) and the
#               MariaDB the scripts use, to read theirs
#   pair_line, pairs_summary print paired runs: one pair's two rates and
#               their ratio, and a file of pairs' ratios and medians

mkdir -p "$WORK"
pids=()
cleanup() {
	for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
	for pid in "${pids[@]}"; do
		# Bounded: a process that ignores TERM for 10s is killed.
		for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
		kill -KILL "$pid" 2>/dev/null || true
	done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log() { printf '== %s\n' "$*" >&2; }

need() {
	if [[ " $* " == *" wrk "* ]] && ! command -v wrk >/dev/null; then
		log "wrk missing: installing it"
		timeout 300 apt-get install -y wrk >/dev/null 2>&1 ||
			{ timeout 120 apt-get update >/dev/null 2>&1 && timeout 300 apt-get install -y wrk >/dev/null; }
	fi
	for tool in "$@"; do
		command -v "$tool" >/dev/null || { echo "$(basename "$0"): $tool is required" >&2; exit 1; }
	done
}

build_server() {
	if [[ -n ${SERVER_REV:-} ]]; then
		local rev
		rev=$(git rev-parse --verify "$SERVER_REV^{commit}")
		rm -rf "$WORK/src" && mkdir -p "$WORK/src"
		git archive "$rev" | tar -x -C "$WORK/src"
		(cd "$WORK/src" && timeout 600 go build -o "$WORK/server" ./cmd/server)
		server_desc="commit $rev"
	else
		timeout 600 go build -o "$WORK/server" ./cmd/server
		server_desc="working tree at $(git rev-parse --short HEAD)"
		if [[ -n $(git status --porcelain -- cmd internal migrations go.mod go.sum) ]]; then
			server_desc+=" with uncommitted changes"
		fi
	fi
}

# shellcheck disable=SC2120 # the tools named are optional
build_tools() { # [tool…]: more of loadtest/'s commands
	local tool
	for tool in yardstick tokens "$@"; do
		timeout 600 go build -o "$WORK/$tool" "./loadtest/$tool"
	done
}

# redis_up PORT: a Redis of the script's own, so that Redis' figures (INFO:
# commands, CPU) count this server's calls alone.
redis_up() {
	REDIS_ADDR=127.0.0.1:$1
	if rcli PING >/dev/null 2>&1; then
		# Someone's Redis: the script would flush it.
		echo "$(basename "$0"): port $1 is taken by a Redis already; choose another" >&2
		exit 1
	fi
	redis-server --bind 127.0.0.1 --port "$1" --save "" --appendonly no >"$WORK/redis.log" 2>&1 &
	pids+=("$!")
	for _ in $(seq 50); do rcli PING >/dev/null 2>&1 && return 0; sleep 0.1; done
	echo "$(basename "$0"): redis-server on port $1 did not answer; see $WORK/redis.log" >&2
	exit 1
}

rcli() { timeout 10 redis-cli -h "${REDIS_ADDR%:*}" -p "${REDIS_ADDR#*:}" -n "$REDIS_DB" "$@"; }

fresh_stores() {
	timeout 5 redis-cli -h "${REDIS_ADDR%:*}" -p "${REDIS_ADDR#*:}" ping >/dev/null
	timeout 10 mysql -uroot -e "SELECT 1" >/dev/null
	log "database $DB afresh, Redis db $REDIS_DB flushed"
	timeout 30 mysql -uroot -e "DROP DATABASE IF EXISTS $DB; CREATE DATABASE $DB"
	rcli FLUSHDB >/dev/null
}

# pair_line NAME I A-LABEL "A-REQ/S A-CPU" B-LABEL "B-REQ/S B-CPU" prints one
# pair of runs, each as requests a second and CPU µs a request, and the
# ratio of B's rate to A's.
pair_line() {
	# shellcheck disable=SC2086 # the rates are two words each, on purpose
	python3 -c 'import sys; n, i, al, ar, ac, bl, br, bc = sys.argv[1:]; ar, ac, br, bc = map(float, (ar, ac, br, bc)); print(f"{n:<16} pair {i}: {al} {ar:8.0f} req/s {ac:5.1f} cpu-us/req   {bl} {br:8.0f} req/s {bc:5.1f} cpu-us/req   ratio {br / ar:.3f}")' \
		"$1" "$2" "$3" $4 "$5" $6
}

# pairs_summary NAME FILE A-LABEL B-LABEL prints the ratios B/A of a file of
# pairs (lines "I A-REQ/S A-CPU B-REQ/S B-CPU") and their median.
pairs_summary() {
	python3 - "$@" <<-'EOF'
		import statistics, sys
		name, path, a, b = sys.argv[1:]
		rows = [tuple(map(float, l.split()[1:])) for l in open(path) if l.strip()]
		ratios = [br / ar for ar, _, br, _ in rows]
		med = statistics.median
		print(f"{name:<16} ratios: {' '.join(f'{r:.3f}' for r in ratios)}")
		print(f"{name:<16} median ratio {b}/{a}: {med(ratios):.3f}"
		      f"  (median req/s: {a} {med(r[0] for r in rows):.0f}, {b} {med(r[2] for r in rows):.0f};"
		      f" median cpu-us/req: {a} {med(r[1] for r in rows):.1f}, {b} {med(r[3] for r in rows):.1f})")
	EOF
}

ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }

store_pids() {
	redis_pid=$(timeout 5 redis-cli -h "${REDIS_ADDR%:*}" -p "${REDIS_ADDR#*:}" INFO server | tr -d '\r' | awk -F: '$1 == "process_id" { print $2 }' || true)
	# MariaDB's, from the server the scripts use: its pid file (the oldest
	# mariadbd on the machine may be another, a test's own).
	mysql_pid=$(cat "$(timeout 10 mysql -uroot -N -B -e 'SELECT @@pid_file')" 2>/dev/null || true)
	[[ -n $mysql_pid && -r /proc/$mysql_pid/stat && -n $redis_pid && -r /proc/$redis_pid/stat ]] || {
		echo "$(basename "$0"): Redis and MariaDB must run on this machine (their CPU is read from /proc)" >&2
		exit 1
	}
}

# server_up LOG [NAME=VALUE…] starts $WORK/server on $SERVER_ADDR with the
# script's MYSQL_DSN, REDIS_ADDR, REDIS_DB and JWT_SECRET, the admin phone
# 13800000000, development login codes and the login code limits off
# (every user logs in from this one address), and the environment given;
# its output goes to LOG. It sets server_pid and returns once /readyz
# answers.
server_up() {
	local log=$1
	shift
	env HTTP_ADDR="$SERVER_ADDR" MYSQL_DSN="$MYSQL_DSN" REDIS_ADDR="$REDIS_ADDR" REDIS_DB="$REDIS_DB" \
		JWT_SECRET="$JWT_SECRET" PAYMENT_WEBHOOK_SECRET="$JWT_SECRET" ADMIN_PHONES=13800000000 AUTH_DEV_CODES=true \
		AUTH_CODE_INTERVAL=0 AUTH_CODES_PER_DAY=0 AUTH_CODES_PER_ADDR_PER_MIN=0 "$@" \
		"$WORK/server" >"$log" 2>&1 &
	server_pid=$!
	pids+=("$server_pid")
	for _ in $(seq 300); do
		curl -fsS -o /dev/null --max-time 1 "http://$SERVER_ADDR/readyz" 2>/dev/null && return 0
		kill -0 "$server_pid" 2>/dev/null || break
		sleep 0.1
	done
	echo "$(basename "$0"): the server did not come up in 30s; see $log" >&2
	exit 1
}

# server_down stops the server server_up started: TERM, KILL after 30s.
server_down() {
	kill -TERM "$server_pid" 2>/dev/null || true
	for _ in $(seq 300); do kill -0 "$server_pid" 2>/dev/null || break; sleep 0.1; done
	kill -KILL "$server_pid" 2>/dev/null || true
	wait "$server_pid" 2>/dev/null || true
}
