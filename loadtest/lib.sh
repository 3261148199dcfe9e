# lib.sh is what the load scripts share: sourced, never run. It expects
# WORK (where generated files go) and sets up:
#
#   pids        processes to stop on exit (append with pids+=("$!"))
#   log MSG     a progress line on stderr
#   need TOOL…  installs wrk if missing (Debian), then fails unless every
#               TOOL is on PATH
#   build_server builds cmd/server into $WORK/server, from the commit
#               SERVER_REV names (git archive: edits in progress in the
#               tree never leak into figures) or from the working tree,
#               and sets server_desc to say which
#   build_tools builds the yardstick and the token maker into $WORK
#   fresh_stores checks that Redis ($REDIS_ADDR) and MySQL answer, drops
#               and creates database $DB, flushes Redis database
#               $REDIS_DB (only that one), and defines rcli: redis-cli on it
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
	if ! command -v wrk >/dev/null; then
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

build_tools() {
	timeout 600 go build -o "$WORK/yardstick" ./loadtest/yardstick
	timeout 600 go build -o "$WORK/tokens" ./loadtest/tokens
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
