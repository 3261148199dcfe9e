package lock

import (
	"context"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"seckill/internal/testenv"
	"seckill/internal/testenv/faultproxy"
)

func TestZooKeeper(t *testing.T) {
	srv := testenv.StartZooKeeper(t)
	z := NewZooKeeper(srv.Connect(t, 2*time.Second))
	admin := srv.Connect(t, 2*time.Second)
	testConformance(t, backend{
		locker: z,
		ttl:    300 * time.Millisecond,
		newKey: func(t *testing.T) string { return testKey(t) },
		steal: func(t *testing.T, key string) {
			// As an operator would: delete the holder's node.
			dir := z.dir(key)
			children, _, err := admin.Children(dir)
			if err != nil || len(children) == 0 {
				t.Fatalf("lock %q is not held: %v %v", key, children, err)
			}
			for _, c := range children {
				if err := admin.Delete(dir+"/"+c, -1); err != nil {
					t.Fatal(err)
				}
			}
		},
		fencing: true,
		wakes:   true,
	})
}

// A holder whose process dies (no more heartbeats: its connection goes
// silent, as when its host vanishes) keeps the lock until the ensemble
// expires its session; then the waiter, which watched the holder's node,
// gets it at once.
func TestZooKeeperHolderDies(t *testing.T) {
	srv := testenv.StartZooKeeper(t)
	proxy := faultproxy.Start(t, srv.Addr())
	key := testKey(t)
	holder, _, err := zk.Connect([]string{proxy.Addr()}, time.Second, zk.WithLogInfo(false), zk.WithLogger(quiet{}))
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	if _, err := NewZooKeeper(holder).Obtain(t.Context(), key, time.Minute); err != nil {
		t.Fatal(err)
	}
	proxy.Blackhole()
	died := time.Now()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	lk, err := NewZooKeeper(srv.Connect(t, time.Second)).Obtain(ctx, key, time.Second, Wait())
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(died)
	t.Logf("a waiter got the lock %v after its holder went silent (session timeout 1 s)", took)
	if took < 500*time.Millisecond {
		t.Errorf("the lock passed on after %v, before the session could have expired", took)
	}
	mustRelease(t, lk)
}

type quiet struct{}

func (quiet) Printf(string, ...any) {}
