package lock

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"seckill/internal/testenv"
	"seckill/internal/testenv/faultproxy"
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
		// A renewal is two requests (KeepAliveOnce, then a Get).
		watchTTL: time.Second,
		newKey:   func(t *testing.T) string { return testKey(t) },
		steal: func(t *testing.T, key string) {
			// As an operator would: delete the holder's key.
			resp, err := admin.Delete(context.Background(), e.base(key)+"/", clientv3.WithPrefix())
			if err != nil {
				t.Fatal(err)
			}
			if resp.Deleted == 0 {
				t.Fatalf("lock %q is not held", key)
			}
		},
		clients: func(t *testing.T, n int) []Locker {
			lockers := make([]Locker, n)
			for i := range lockers {
				lockers[i] = NewEtcd(srv.Client(t))
			}
			return lockers
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

// etcdThrough returns a client that reaches srv through proxy, closed when
// the test ends: the holder's side of a network the test can break.
func etcdThrough(t *testing.T, srv *testenv.EtcdServer) (*clientv3.Client, *faultproxy.Proxy) {
	t.Helper()
	proxy := faultproxy.Start(t, srv.Addr())
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"http://" + proxy.Addr()}, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli, proxy
}

// obtained is what a waiting Obtain returned, and when.
type obtained struct {
	lk  Lock
	err error
	at  time.Time
}

// A lock on etcd lives as long as its lease, whatever ttl Extend asked for:
// a holder cut off from etcd stops refreshing the lease, and etcd hands the
// lock on when the lease runs out (2 s here). The holder must have stopped
// trusting it by then: its Done must be closed when the newcomer gets the
// lock. While in touch, the holder keeps the lock for the whole ttl.
func TestEtcdHolderTrustsNoLongerThanItsLease(t *testing.T) {
	srv := testenv.StartEtcd(t)
	cli, proxy := etcdThrough(t, srv)
	ctx := context.Background()
	key := testKey(t)
	lk, err := NewEtcd(cli).Obtain(ctx, key, time.Second) // a lease of 2 s, the server's minimum
	if err != nil {
		t.Fatal(err)
	}
	if err := lk.Extend(ctx, 20*time.Second); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2200 * time.Millisecond) // past the lease, had nobody renewed it
	if !isOpen(lk.Done()) {
		t.Fatalf("a holder in touch with etcd lost its extended lock: %v", context.Cause(lk.Context()))
	}
	proxy.Blackhole()
	cut := time.Now()
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	next, err := NewEtcd(srv.Client(t)).Obtain(wctx, key, time.Second, Wait())
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(cut)
	if isOpen(lk.Done()) {
		t.Errorf("two holders: a newcomer got the lock %v after the holder was cut off, and the holder's Done is still open", took)
	}
	t.Logf("the newcomer got the lock %v after the holder was cut off", took)
	mustRelease(t, next)
}

// A waiter's lease was last refreshed up to a third of its ttl (plus the
// client's 500 ms tick) before the lock is handed to it, so its ttl cannot
// count from the handover. Here the handover comes just before the
// waiter's next keepalive and the waiter is cut off at once: etcd hands
// the lock on 2 s after the last keepalive it got, and the waiter must
// have stopped trusting it by then.
func TestEtcdWaiterTrustsNoLongerThanItsLease(t *testing.T) {
	srv := testenv.StartEtcd(t)
	cli, proxy := etcdThrough(t, srv)
	direct := srv.Client(t)
	e := NewEtcd(direct)
	ctx := context.Background()
	key := testKey(t)
	first := mustObtain(t, e, key, 10*time.Second)
	got := make(chan obtained, 1)
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	go func() {
		lk, err := NewEtcd(cli).Obtain(wctx, key, 2*time.Second, Wait())
		got <- obtained{lk, err, time.Now()}
	}()
	// The waiter's key is the second under the lock's prefix. Listening to
	// its lease's keepalives shares the waiter's stream: it sends nothing.
	var lease clientv3.LeaseID
	for lease == 0 {
		resp, err := direct.Get(ctx, e.base(key)+"/", clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) == 2 {
			lease = clientv3.LeaseID(resp.Kvs[1].Lease)
		}
		time.Sleep(10 * time.Millisecond)
	}
	kctx, stop := context.WithCancel(ctx)
	defer stop()
	alive, err := cli.KeepAlive(kctx, lease)
	if err != nil {
		t.Fatal(err)
	}
	<-alive
	// The next keepalive leaves 2/3 s after this one's answer at the soonest.
	time.Sleep(550 * time.Millisecond)
	mustRelease(t, first)
	r := <-got
	proxy.Blackhole()
	if r.err != nil {
		t.Fatal(r.err)
	}
	next, err := e.Obtain(wctx, key, time.Second, Wait())
	if err != nil {
		t.Fatal(err)
	}
	if isOpen(r.lk.Done()) {
		t.Errorf("two holders: a newcomer got the lock %v after the waiter did, and the waiter's Done is still open", time.Since(r.at))
	}
	mustRelease(t, next)
}

// Obtain gives up when its ctx ends, even when etcd does not answer: while
// it is granted a lease, and while it waits (the recipe's Mutex deletes a
// waiter's key with no deadline of its own when its wait is cut short).
func TestEtcdObtainHonoursDeadline(t *testing.T) {
	for _, tt := range []struct {
		name string
		wait bool
	}{
		{"try", false},
		{"wait", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv := testenv.StartEtcd(t)
			cli, proxy := etcdThrough(t, srv)
			key := testKey(t)
			if _, err := cli.Get(context.Background(), "ping"); err != nil {
				t.Fatal(err) // connected before the partition
			}
			var opts []Option
			if tt.wait {
				holder := mustObtain(t, NewEtcd(srv.Client(t)), key, 10*time.Second)
				t.Cleanup(func() { holder.Release(context.Background()) })
				opts = append(opts, Wait())
			} else {
				proxy.Blackhole()
			}
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			defer cancel()
			done := make(chan error, 1)
			go func() {
				_, err := NewEtcd(cli).Obtain(ctx, key, 2*time.Second, opts...)
				done <- err
			}()
			if tt.wait {
				time.Sleep(200 * time.Millisecond) // waiting by now
				proxy.Blackhole()
			}
			select {
			case err := <-done:
				if err != context.DeadlineExceeded {
					t.Errorf("Obtain: got %v, want context.DeadlineExceeded", err)
				}
			case <-time.After(2 * time.Second):
				t.Fatal("Obtain with a 500 ms deadline still blocked 1.5 s after it")
			}
		})
	}
}
