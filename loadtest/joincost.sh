#!/usr/bin/env bash
# joincost.sh measures what a waiting room's join costs Redis against what
# a sold-out answer (take.lua finding no unit) costs it: the benchmarks of
# internal/room (BenchmarkJoin, BenchmarkJoinAfterBegin, BenchmarkSoldOut)
# on a private redis-server, each alone after a FLUSHALL and for the same
# number of operations (the draw's sorted set grows to the same size), the
# test binaries of this tree and of BASE_REV alternating, ROUNDS times.
# BASE_REV's binary is built with this tree's bench_test.go, so both run
# the same benchmark.
#
# It prints, a benchmark a line: redis-µs/op (the Redis server's CPU, user
# and system of its main thread, per operation: INFO cpu), how many
# operations a script call carried (joins share calls), and the script's
# time per operation by INFO commandstats (wall time inside the script:
# it grows when the machine is busy, the CPU figure less so).
#
#   loadtest/joincost.sh
#   BASE_REV=de61f87 ROUNDS=4 OPS=150000 loadtest/joincost.sh
#
# Needs go, git, redis-server, redis-cli, bc.
set -euo pipefail

cd "$(dirname "$0")/.."
export LC_ALL=C # printf's decimal point

BASE_REV=${BASE_REV:-HEAD}
ROUNDS=${ROUNDS:-4}
OPS=${OPS:-150000}
WORK=${WORK:-/tmp/seckill-joincost}
PORT=${PORT:-16392}
REDIS_DB=0

# shellcheck source=loadtest/lib.sh
. loadtest/lib.sh

need go git redis-server redis-cli bc
log "building the test binaries into $WORK"
timeout 600 go test -c -o "$WORK/this.test" ./internal/room/
rm -rf "$WORK/base" && mkdir -p "$WORK/base"
git archive "$(git rev-parse --verify "$BASE_REV^{commit}")" | tar -x -C "$WORK/base"
cp internal/room/bench_test.go "$WORK/base/internal/room/"
(cd "$WORK/base" && timeout 600 go test -c -o "$WORK/base.test" ./internal/room/)
redis_up "$PORT"
r() { redis-cli -p "$PORT" "$@"; }

run() { # binary benchmark
	r flushall >/dev/null
	r config resetstat >/dev/null
	local out calls usec
	out=$(SECKILL_TEST_REDIS_ADDR=$REDIS_ADDR "$WORK/$1.test" -test.run '^$' \
		-test.bench "^Benchmark$2\$" -test.benchtime "${OPS}x" | grep "^Benchmark")
	read -r calls usec < <(r info commandstats | sed -n 's/^cmdstat_evalsha:calls=\([0-9]*\),usec=\([0-9]*\),.*/\1 \2/p')
	printf '%-5s %-15s %6s redis-µs/op  %5.1f ops a call  script %6.2f µs/op\n' "$1" "$2" \
		"$(awk '{print $5}' <<<"$out")" "$(bc -l <<<"$OPS / $calls")" "$(bc -l <<<"$usec / $OPS")"
}

log "base: $BASE_REV; this: the working tree; $OPS operations a benchmark"
for round in $(seq "$ROUNDS"); do
	log "round $round"
	for bin in base this; do
		for bench in Join JoinAfterBegin SoldOut; do
			run "$bin" "$bench"
		done
	done
done
