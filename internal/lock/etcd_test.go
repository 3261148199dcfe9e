package lock

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"seckill/internal/testenv"
)

func TestEtcd(t *testing.T) {
	srv := testenv.StartEtcd(t)
	cli := srv.Client(t)
	// The thief has a client of its own.
	admin := srv.Client(t)
	e := NewEtcd(cli)
	testConformance(t, backend{
		locker: e,
		ttl:    300 * time.Millisecond,
		newKey: func(t *testing.T) string { return testKey(t) },
		steal: func(t *testing.T, key string) {
			// As an operator would: delete the holder's key.
			resp, err := admin.Delete(context.Background(), e.prefix+key+"/", clientv3.WithPrefix())
			if err != nil {
				t.Fatal(err)
			}
			if resp.Deleted == 0 {
				t.Fatalf("lock %q is not held", key)
			}
		},
		fencing: true,
		wakes:   true,
	})
}

// A holder that dies (its client gone, nothing revoked) keeps the lock
// until its lease runs out on the server: at most the lease's whole
// seconds, and then a waiter gets it.
func TestEtcdHolderDies(t *testing.T) {
	srv := testenv.StartEtcd(t)
	dying, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint()}, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	key := testKey(t)
	if _, err := NewEtcd(dying).Obtain(context.Background(), key, time.Second); err != nil {
		t.Fatal(err)
	}
	died := time.Now()
	dying.Close() // no more keepalives, no revoke
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	lk, err := NewEtcd(srv.Client(t)).Obtain(ctx, key, time.Second, Wait())
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(died)
	t.Logf("a waiter got the lock %v after its holder died (lease of %d s)", took, leaseSeconds(time.Second))
	if took < 500*time.Millisecond {
		t.Errorf("the lock passed on after %v, before the lease could have run out", took)
	}
	mustRelease(t, lk)
}
