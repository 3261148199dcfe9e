package autopipe_test

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"seckill/internal/autopipe"
	"seckill/internal/testenv"
)

// BenchmarkSenders runs a script from 32 goroutines a core at once (64 on
// two cores, as wrk's connections in loadtest/success.sh) through 1, 2
// and 4 senders, on a redis-server of its own, and reports the commands a
// round trip carried, what Redis spent a command (INFO cpu, its main
// thread and the rest) and what this process spent one (getrusage: the
// callers, the senders, go-redis and the Go scheduler): fewer senders,
// bigger batches, fewer system calls on both sides. On a shared machine
// the two CPU figures are steadier than ns/op, which is wall time.
//
//	SECKILL_INTEGRATION=1 go test -run '^$' -bench Senders -benchmem ./internal/autopipe
func BenchmarkSenders(b *testing.B) {
	srv := testenv.StartRedis(b)
	for _, senders := range []int{1, 2, 4} {
		b.Run(strconv.Itoa(senders), func(b *testing.B) {
			rdb := srv.Client(b)
			p, err := autopipe.Attach(rdb, senders, 128)
			if err != nil {
				b.Fatal(err)
			}
			defer p.Close()
			ctx := context.Background()
			if err := incr.Load(ctx, rdb).Err(); err != nil {
				b.Fatal(err)
			}
			cpu0, self0 := redisCPU(b, rdb), processCPU()
			b.SetParallelism(32) // 32 goroutines a core: 64 on the 2-core machine of BENCHMARKS.md
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				// A context of its own that can end, as a request's: a
				// caller then waits for its reply or its context (a
				// select), the wait the server's callers pay.
				ctx, cancel := context.WithCancel(ctx)
				defer cancel()
				for pb.Next() {
					if err := incr.Run(ctx, rdb, []string{"bench"}, 1).Err(); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			self := processCPU() - self0
			batches, commands := p.Stats()
			b.ReportMetric(float64(commands)/float64(max(batches, 1)), "cmds/trip")
			b.ReportMetric((redisCPU(b, rdb)-cpu0)*1e6/float64(b.N), "redis-µs/op")
			b.ReportMetric(float64(self.Microseconds())/float64(b.N), "client-µs/op")
		})
	}
}

// redisCPU is the seconds of CPU the server has used (INFO cpu).
func redisCPU(b *testing.B, rdb *redis.Client) float64 {
	info, err := rdb.Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var sum float64
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (k == "used_cpu_sys" || k == "used_cpu_user") {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				b.Fatal(err)
			}
			sum += f
		}
	}
	return sum
}
