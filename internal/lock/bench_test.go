package lock

import (
	"context"
	"testing"
	"time"

	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"
)

// rawRelease is the compare-and-delete every hand-rolled Redis lock uses.
var rawRelease = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0`)

// BenchmarkObtainRelease measures an uncontended Obtain and Release against
// the two round trips a careful hand-rolled lock makes (SET NX PX, then
// EVALSHA compare-and-delete) and against redsync on one server, in the
// same run so the noise of the machine hits them alike.
func BenchmarkObtainRelease(b *testing.B) {
	ctx := context.Background()
	rdb := testRedis(b)
	r := NewRedis(rdb)
	rs := redsync.New(goredis.NewPool(rdb))
	const ttl = 10 * time.Second

	lock := func(opts ...Option) func(b *testing.B) {
		return func(b *testing.B) {
			key := testKey(b, rdb)
			for b.Loop() {
				lk, err := r.Obtain(ctx, key, ttl, opts...)
				if err != nil {
					b.Fatal(err)
				}
				if err := lk.Release(ctx); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	b.Run("raw", func(b *testing.B) {
		name := keysFor(testKey(b, rdb)).lock
		for b.Loop() {
			token := newToken()
			if ok, err := rdb.SetNX(ctx, name, token, ttl).Result(); !ok || err != nil {
				b.Fatal(ok, err)
			}
			if n, err := rawRelease.Run(ctx, rdb, []string{name}, token).Int(); n != 1 || err != nil {
				b.Fatal(n, err)
			}
		}
	})
	b.Run("lock", lock())
	b.Run("lock-fencing", lock(WithFencing()))
	b.Run("lock-watchdog", lock(WithWatchdog(0)))
	b.Run("redsync-1node", func(b *testing.B) {
		name := keysFor(testKey(b, rdb)).lock
		for b.Loop() {
			m := rs.NewMutex(name, redsync.WithExpiry(ttl), redsync.WithTries(1))
			if err := m.TryLockContext(ctx); err != nil {
				b.Fatal(err)
			}
			if ok, err := m.UnlockContext(ctx); !ok || err != nil {
				b.Fatal(ok, err)
			}
		}
	})
}

// BenchmarkInterleaved runs the hand-rolled lock, this package's lock and
// redsync in turn within each iteration, in a rotating order, and reports
// each one's time per obtain+release and the ratios. On a shared, noisy
// machine a burst of load then slows all three alike instead of whichever
// ran at that moment.
func BenchmarkInterleaved(b *testing.B) {
	ctx := context.Background()
	rdb := testRedis(b)
	r := NewRedis(rdb)
	rs := redsync.New(goredis.NewPool(rdb))
	const ttl = 10 * time.Second
	rawName := keysFor(testKey(b, rdb)).lock
	lockKey := testKey(b, rdb)
	redsyncName := keysFor(testKey(b, rdb)).lock

	contenders := []func(){
		func() {
			token := newToken()
			if ok, err := rdb.SetNX(ctx, rawName, token, ttl).Result(); !ok || err != nil {
				b.Fatal(ok, err)
			}
			if n, err := rawRelease.Run(ctx, rdb, []string{rawName}, token).Int(); n != 1 || err != nil {
				b.Fatal(n, err)
			}
		},
		func() {
			lk, err := r.Obtain(ctx, lockKey, ttl)
			if err != nil {
				b.Fatal(err)
			}
			if err := lk.Release(ctx); err != nil {
				b.Fatal(err)
			}
		},
		func() {
			m := rs.NewMutex(redsyncName, redsync.WithExpiry(ttl), redsync.WithTries(1))
			if err := m.TryLockContext(ctx); err != nil {
				b.Fatal(err)
			}
			if ok, err := m.UnlockContext(ctx); !ok || err != nil {
				b.Fatal(ok, err)
			}
		},
	}
	var spent [3]time.Duration // raw, lock, redsync
	i := 0
	for b.Loop() {
		for j := range contenders {
			c := (i + j) % len(contenders)
			start := time.Now()
			contenders[c]()
			spent[c] += time.Since(start)
		}
		i++
	}
	n := float64(b.N)
	raw, lock, rsync := spent[0], spent[1], spent[2]
	b.ReportMetric(float64(raw.Nanoseconds())/n, "raw-ns/op")
	b.ReportMetric(float64(lock.Nanoseconds())/n, "lock-ns/op")
	b.ReportMetric(float64(rsync.Nanoseconds())/n, "redsync-ns/op")
	b.ReportMetric(float64(lock)/float64(raw), "lock/raw")
	b.ReportMetric(float64(rsync)/float64(raw), "redsync/raw")
}
