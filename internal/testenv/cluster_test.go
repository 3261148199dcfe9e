package testenv_test

import (
	"context"
	"testing"
	"time"

	"seckill/internal/testenv"
)

// StartCluster makes a working cluster, and a killed master's replica
// takes over its slots with what was replicated to it.
func TestClusterFailsOver(t *testing.T) {
	c := testenv.StartCluster(t)
	rdb := c.Client(t)
	ctx := context.Background()
	for _, k := range []string{"a", "b", "c"} {
		if err := rdb.Set(ctx, k, "before", 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(c.Masters(t)); n != 3 {
		t.Fatalf("%d masters, want 3", n)
	}
	m := c.MasterOf(t, "a")
	// WAIT, on the connection that wrote (one pipeline): the replica has
	// the key before its master dies.
	pipe := m.Client(t).Pipeline()
	pipe.Set(ctx, "a", "before", 0)
	wait := pipe.Do(ctx, "WAIT", 1, 5000)
	if _, err := pipe.Exec(ctx); err != nil || wait.Val() != int64(1) {
		t.Fatalf("WAIT = %v, %v", wait.Val(), err)
	}
	replica := c.ReplicaOf(t, m)
	m.Kill()
	c.WaitFailover(t, m, 20*time.Second)
	if got := c.MasterOf(t, "a"); got != replica {
		t.Fatalf("slot of a served by %s, want its old replica %s", got.Addr(), replica.Addr())
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		v, err := rdb.Get(ctx, "a").Result()
		if err == nil {
			if v != "before" {
				t.Fatalf("a = %q after the failover, want %q", v, "before")
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("a not readable 10s after the failover: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
