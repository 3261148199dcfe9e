package testenv

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// The set fails over as production does: the master dies, the sentinels
// promote the replica, and what the master had replicated is there.
func TestSentinelFailsOver(t *testing.T) {
	s := StartSentinel(t)
	ctx := context.Background()
	rdb := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: s.Name, SentinelAddrs: s.Addrs(), MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	if err := rdb.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	// WAIT: the replica has it before the master dies.
	if n, err := rdb.Wait(ctx, 1, time.Second).Result(); err != nil || n != 1 {
		t.Fatalf("WAIT 1: %d, %v", n, err)
	}
	old := s.Master(t)
	old.Kill()
	m := s.WaitFailover(t, old, 20*time.Second)
	if m == old {
		t.Fatal("same master")
	}
	var v string
	var err error
	for range 50 {
		if v, err = rdb.Get(ctx, "k").Result(); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if v != "v" {
		t.Fatalf("after the failover: %q, %v; want the replicated value", v, err)
	}
}
