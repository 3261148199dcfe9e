package lock

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"seckill/internal/testenv"
	"seckill/internal/testenv/faultproxy"
)

// BenchmarkContended is the comparison of docs/locks.md: contenders
// goroutines (1, 16, 64) each take one lock (waiting for it) and give it
// back, in a loop, on each backend. It reports pairs a second and the
// 99th percentile of the time an Obtain took, waiting included.
//
//	SECKILL_TEST_REDIS_ADDR=127.0.0.1:6379 SECKILL_TEST_MYSQL_DSN='root:@tcp(127.0.0.1:3306)/seckill_ci' \
//	  go test -run '^$' -bench BenchmarkContended -benchtime 3s ./internal/lock/
func BenchmarkContended(b *testing.B) {
	backends := []struct {
		name   string
		locker func(b *testing.B) Locker
	}{
		{"redis", func(b *testing.B) Locker { return NewRedis(testRedis(b)) }},
		{"redlock-5", func(b *testing.B) Locker {
			var clients []redis.UniversalClient
			for _, s := range startRedisServers(b, 5) {
				clients = append(clients, s.client(b))
			}
			return NewRedLock(clients)
		}},
		{"mysql", func(b *testing.B) Locker { return NewMySQL(testMySQLPool(b, 80)) }},
		{"etcd", func(b *testing.B) Locker { return NewEtcd(testenv.StartEtcd(b).Client(b)) }},
		{"zookeeper", func(b *testing.B) Locker { return NewZooKeeper(testenv.StartZooKeeper(b).Connect(b, 4*time.Second)) }},
		{"local", func(*testing.B) Locker { return NewLocal() }},
	}
	for _, be := range backends {
		b.Run(be.name, func(b *testing.B) {
			locker := be.locker(b)
			for _, n := range []int{1, 16, 64} {
				b.Run(fmt.Sprintf("contenders=%d", n), func(b *testing.B) { contend(b, locker, n) })
			}
		})
	}
}

func contend(b *testing.B, locker Locker, contenders int) {
	ctx := context.Background()
	key := testKey(b)
	var (
		mu      sync.Mutex
		waits   []time.Duration
		next    atomic.Int64
		failure atomic.Value
	)
	b.ResetTimer()
	var wg sync.WaitGroup
	for range contenders {
		wg.Go(func() {
			var mine []time.Duration
			for next.Add(1) <= int64(b.N) {
				start := time.Now()
				lk, err := locker.Obtain(ctx, key, 10*time.Second, Wait())
				if err != nil {
					failure.Store(err)
					return
				}
				mine = append(mine, time.Since(start))
				if err := lk.Release(ctx); err != nil {
					failure.Store(err)
					return
				}
			}
			mu.Lock()
			waits = append(waits, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	b.StopTimer()
	if err, _ := failure.Load().(error); err != nil {
		b.Fatal(err)
	}
	slices.Sort(waits)
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "pairs/s")
	b.ReportMetric(float64(waits[len(waits)*99/100].Microseconds())/1000, "p99-ms")
	b.ReportMetric(0, "ns/op") // per pair, across contenders: pairs/s says it better
}

// BenchmarkTakeover measures how long a waiter waits for a lock whose
// holder died without releasing it: on Redis until the key's ttl (1 s
// here) runs out, on etcd until the holder's lease does, on ZooKeeper
// until the ensemble expires the holder's session (1 s), on MySQL until the server notices the holder's
// connection is gone (here: killed, as when its process exits; a
// machine that vanishes takes the TCP timeout). Run it with -benchtime 3x.
func BenchmarkTakeover(b *testing.B) {
	ctx := context.Background()
	const ttl = time.Second
	measure := func(b *testing.B, waiter Locker, die func(key string) error) {
		var total time.Duration
		for b.Loop() {
			key := testKey(b)
			if err := die(key); err != nil {
				b.Fatal(err)
			}
			start := time.Now()
			lk, err := waiter.Obtain(ctx, key, ttl, Wait())
			if err != nil {
				b.Fatal(err)
			}
			total += time.Since(start)
			lk.Release(ctx)
		}
		b.ReportMetric(float64(total.Microseconds())/1000/float64(b.N), "ms-to-takeover")
		b.ReportMetric(0, "ns/op")
	}
	b.Run("redis", func(b *testing.B) {
		rdb := testRedis(b)
		measure(b, NewRedis(rdb), func(key string) error {
			_, err := NewRedis(rdb).Obtain(ctx, key, ttl) // and never released
			return err
		})
	})
	b.Run("etcd", func(b *testing.B) {
		srv := testenv.StartEtcd(b)
		waiter := NewEtcd(srv.Client(b))
		measure(b, waiter, func(key string) error {
			// The holder's process dies: its client goes without revoking
			// the lease, which then runs out on the server (etcd's
			// minimum lease, 2 s with its default election timeout, for
			// the 1 s asked).
			holder, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint()}, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
			if err != nil {
				return err
			}
			defer holder.Close()
			_, err = NewEtcd(holder).Obtain(ctx, key, ttl)
			return err
		})
	})
	b.Run("zookeeper", func(b *testing.B) {
		srv := testenv.StartZooKeeper(b)
		waiter := NewZooKeeper(srv.Connect(b, time.Second))
		proxy := faultproxy.Start(b, srv.Addr())
		measure(b, waiter, func(key string) error {
			// The holder's host vanishes: its connection goes silent, and
			// the ensemble expires its session (1 s) and its node.
			proxy.Heal()
			holder, _, err := zk.Connect([]string{proxy.Addr()}, ttl, zk.WithLogInfo(false), zk.WithLogger(quiet{}))
			if err != nil {
				return err
			}
			b.Cleanup(holder.Close)
			_, err = NewZooKeeper(holder).Obtain(ctx, key, time.Minute)
			proxy.Blackhole()
			return err
		})
	})
	b.Run("mysql", func(b *testing.B) {
		waiter := NewMySQL(testMySQLPool(b, 4))
		admin := testMySQLPool(b, 1)
		var dead []Lock
		defer func() {
			for _, lk := range dead {
				lk.Release(ctx) // fails (the connection is gone), and hands the connection back to be closed
			}
		}()
		measure(b, waiter, func(key string) error {
			holder := testMySQLPool(b, 2)
			lk, err := NewMySQL(holder).Obtain(ctx, key, ttl)
			if err != nil {
				return err
			}
			dead = append(dead, lk)
			// The holder's process dies: its connection goes, as the
			// server sees it (KILL, which a process exiting also causes).
			var id int64
			if err := admin.QueryRowContext(ctx, "SELECT IS_USED_LOCK(?)", mysqlName(key)).Scan(&id); err != nil {
				return err
			}
			_, err = admin.ExecContext(ctx, "KILL ?", id)
			return err
		})
	})
}
