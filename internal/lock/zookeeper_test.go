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
	z := NewZooKeeper(srv.Connect(t, 2*time.Second)).WithSessionTimeout(2 * time.Second)
	admin := srv.Connect(t, 2*time.Second)
	testConformance(t, backend{
		locker: z,
		ttl:    300 * time.Millisecond,
		// A renewal is two requests (Sync, then Exists) to a JVM.
		watchTTL: time.Second,
		newKey:   func(t *testing.T) string { return testKey(t) },
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
		clients: func(t *testing.T, n int) []Locker {
			lockers := make([]Locker, n)
			for i := range lockers {
				lockers[i] = NewZooKeeper(srv.Connect(t, 2*time.Second)).WithSessionTimeout(2 * time.Second)
			}
			return lockers
		},
		fencing: true,
		wakes:   true,
	})
}

// zkThrough connects to srv through a faultproxy, with a session of
// timeout, and closes the connection when the test ends: the holder's side
// of a network the test can break.
func zkThrough(t *testing.T, srv *testenv.ZooKeeperServer, timeout time.Duration) (*zk.Conn, *faultproxy.Proxy) {
	t.Helper()
	proxy := faultproxy.Start(t, srv.Addr())
	conn, _, err := zk.Connect([]string{proxy.Addr()}, timeout, zk.WithLogInfo(false), zk.WithLogger(quiet{}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	return conn, proxy
}

// A holder whose process dies (no more heartbeats: its connection goes
// silent, as when its host vanishes) keeps the lock until the ensemble
// expires its session; then the waiter, which watched the holder's node,
// gets it at once. The ensemble keeps the session, not the ttl: the
// holder, whose ttl is a minute, must have stopped trusting its lock (its
// Done closed) by the time the waiter has it. While in touch, it keeps the
// lock past the session timeout.
func TestZooKeeperHolderDies(t *testing.T) {
	// The holder confirms its node every third of the session, each time
	// with a third to answer: with a session of 1 s, two answers slower
	// than 333 ms on a loaded machine would end its lock.
	const session = 2 * time.Second
	srv := testenv.StartZooKeeper(t)
	holder, proxy := zkThrough(t, srv, session)
	key := testKey(t)
	lk, err := NewZooKeeper(holder).WithSessionTimeout(session).Obtain(t.Context(), key, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(session + session/4) // past the session timeout
	if !isOpen(lk.Done()) {
		t.Fatalf("a holder in touch with ZooKeeper lost its lock: %v", context.Cause(lk.Context()))
	}
	proxy.Blackhole()
	died := time.Now()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	next, err := NewZooKeeper(srv.Connect(t, time.Second)).Obtain(ctx, key, time.Second, Wait())
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(died)
	t.Logf("a waiter got the lock %v after its holder went silent (session timeout %v)", took, session)
	if took < session/2 {
		t.Errorf("the lock passed on after %v, before the session could have expired", took)
	}
	if isOpen(lk.Done()) {
		t.Errorf("two holders: the waiter got the lock while the silent holder's Done was still open")
	}
	mustRelease(t, next)
}

// Obtain gives up when its ctx ends, even when ZooKeeper does not answer
// (the zk client's calls take no context, and give up only when the
// connection is declared dead, two thirds of the session timeout later):
// while it creates its node, and while it waits.
func TestZooKeeperObtainHonoursDeadline(t *testing.T) {
	for _, tt := range []struct {
		name string
		wait bool
	}{
		{"try", false},
		{"wait", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv := testenv.StartZooKeeper(t)
			conn, proxy := zkThrough(t, srv, 8*time.Second)
			z := NewZooKeeper(conn).WithSessionTimeout(8 * time.Second)
			key := testKey(t)
			if _, _, err := conn.Exists("/"); err != nil {
				t.Fatal(err) // connected before the partition
			}
			var opts []Option
			if tt.wait {
				holder := mustObtain(t, NewZooKeeper(srv.Connect(t, 8*time.Second)), key, 10*time.Second)
				t.Cleanup(func() { holder.Release(context.Background()) })
				opts = append(opts, Wait())
			} else {
				proxy.Blackhole()
			}
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			defer cancel()
			done := make(chan error, 1)
			go func() {
				_, err := z.Obtain(ctx, key, 2*time.Second, opts...)
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

// A lock's directory is a container node, which the ensemble deletes once
// its last child is gone: the order flow takes a lock per user, and
// persistent directories would pile up, one per buyer, forever. The same
// key can be taken again afterwards.
func TestZooKeeperDirectoryGoes(t *testing.T) {
	srv := testenv.StartZooKeeper(t)
	conn := srv.Connect(t, 2*time.Second)
	z := NewZooKeeper(conn).WithSessionTimeout(2 * time.Second)
	key := testKey(t)
	lk := mustObtain(t, z, key, 10*time.Second)
	if exists, _, err := conn.Exists(z.dir(key)); err != nil || !exists {
		t.Fatalf("the lock's directory: exists %v, %v", exists, err)
	}
	mustRelease(t, lk)
	released := time.Now()
	for {
		exists, _, err := conn.Exists(z.dir(key))
		if err != nil {
			t.Fatal(err)
		}
		if !exists {
			break
		}
		if time.Since(released) > 3*time.Second {
			t.Fatal("the lock's directory is still there 3 s after its last node went")
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("the directory went %v after the release", time.Since(released).Round(time.Millisecond))
	mustRelease(t, mustObtain(t, z, key, 10*time.Second))
}

type quiet struct{}

func (quiet) Printf(string, ...any) {}
