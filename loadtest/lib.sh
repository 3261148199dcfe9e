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
