package lock

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// redlockBackend returns a RedLock over servers, with clients of its own:
// two calls make two service instances sharing the same five servers.
func redlockBackend(t *testing.T, servers []*redisServer) backend {
	clients := make([]redis.UniversalClient, len(servers))
	for i, s := range servers {
		clients[i] = s.client(t)
	}
	return backend{
		locker: NewRedLock(clients),
		ttl:    500 * time.Millisecond,
		// A renewal waits for all five servers to answer.
		watchTTL: time.Second,
		newKey:   func(t *testing.T) string { return testKey(t) }, // servers are thrown away
		// Contenders may each win a minority of the servers and all be
		// refused (see RedLock).
		splitVotes: true,
		steal: func(t *testing.T, key string) {
			for _, c := range clients {
				c.Del(context.Background(), keysFor(key).lock) // dead servers fail; fine
			}
		},
	}
}

func TestRedLock(t *testing.T) {
	testConformance(t, redlockBackend(t, startRedisServers(t, 5)))
}

// TestRedLockQuorum kills servers one by one: with 2 of 5 gone the lock
// still works and still excludes, with 3 gone it is refused.
func TestRedLockQuorum(t *testing.T) {
	ctx := context.Background()
	servers := startRedisServers(t, 5)
	instance1 := redlockBackend(t, servers)
	instance2 := redlockBackend(t, servers)
	key := testKey(t)

	servers[0].kill()
	servers[1].kill()

	lk := mustObtain(t, instance1.locker, key, 2*time.Second)
	if _, err := instance2.locker.Obtain(ctx, key, 2*time.Second); err != ErrNotAcquired {
		t.Fatalf("second instance with 3 of 5 servers up: got %v, want ErrNotAcquired", err)
	}
	if err := lk.Extend(ctx, 2*time.Second); err != nil {
		t.Fatalf("Extend with 3 of 5 servers up: %v", err)
	}
	mustRelease(t, lk)

	// Two instances, 20 goroutines each, on the 3 servers left: never two
	// holders at once.
	var inside atomic.Int32
	var overlapped atomic.Bool
	var wg sync.WaitGroup
	start := make(chan struct{})
	for _, l := range []Locker{instance1.locker, instance2.locker} {
		for range 20 {
			wg.Go(func() {
				<-start
				wctx, cancel := context.WithTimeout(ctx, time.Minute)
				defer cancel()
				lk, err := l.Obtain(wctx, key, 5*time.Second, Wait())
				if err != nil {
					t.Error(err)
					return
				}
				if inside.Add(1) > 1 {
					overlapped.Store(true)
				}
				time.Sleep(time.Millisecond)
				inside.Add(-1)
				if err := lk.Release(ctx); err != nil {
					t.Error(err)
				}
			})
		}
	}
	close(start)
	wg.Wait()
	if overlapped.Load() {
		t.Fatal("two holders at once")
	}

	servers[2].kill()
	_, err := instance1.locker.Obtain(ctx, key, 2*time.Second)
	if err == nil {
		t.Fatal("obtained a lock with 2 of 5 servers up")
	}
	// Unreachable servers are a Redis failure, not a lock somebody holds.
	if errors.Is(err, ErrNotAcquired) {
		t.Errorf("with 3 of 5 servers down: got ErrNotAcquired, want a Redis error: %v", err)
	}
	// A waiter ends at its deadline here, before the outage has lasted the
	// ttl (TestRedLockWaitRidesOutABlip sees it give up on an outage).
	wctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if _, err := instance1.locker.Obtain(wctx, key, 2*time.Second, Wait()); err == nil {
		t.Error("Wait obtained a lock with 2 of 5 servers up")
	}
}

// TestRedLockWaitRidesOutABlip: with 2 of 5 servers dead, a third that
// stalls for a moment leaves no majority. A waiter keeps trying through
// that (a CI run on a loaded machine failed 9 of 40 waiters at once); an
// outage that outlasts the ttl is still reported as one.
func TestRedLockWaitRidesOutABlip(t *testing.T) {
	ctx := context.Background()
	servers := startRedisServers(t, 5)
	rl := redlockBackend(t, servers).locker
	key := testKey(t)
	servers[0].kill()
	servers[1].kill()
	mustRelease(t, mustObtain(t, rl, key, 2*time.Second)) // connections made

	// A server has 100 ms (5% of the ttl) to answer.
	servers[2].pause(t)
	_, err := rl.Obtain(ctx, key, 2*time.Second)
	servers[2].resume()
	if err == nil || errors.Is(err, ErrNotAcquired) {
		t.Fatalf("without Wait, 3 of 5 servers silent: got %v, want the Redis error at once", err)
	}

	// Stalled for 300 ms: the first attempts fail, a later one succeeds.
	servers[2].pause(t)
	resumed := make(chan struct{})
	time.AfterFunc(300*time.Millisecond, func() { servers[2].resume(); close(resumed) })
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	start := time.Now()
	lk, err := rl.Obtain(wctx, key, 2*time.Second, Wait())
	if err != nil {
		t.Fatalf("Wait through a 300 ms stall of the third server: %v", err)
	}
	if waited := time.Since(start); waited < 300*time.Millisecond {
		t.Fatalf("obtained after %v, while a majority could not answer", waited)
	}
	mustRelease(t, lk)
	<-resumed

	// Stalled for good: the waiter gives up with the Redis error once the
	// outage has lasted a ttl (2 s), long before its own deadline.
	servers[2].pause(t)
	defer servers[2].resume()
	start = time.Now()
	_, err = rl.Obtain(wctx, key, 2*time.Second, Wait())
	if err == nil || errors.Is(err, ErrNotAcquired) || errors.Is(err, context.DeadlineExceeded) && wctx.Err() != nil {
		t.Fatalf("Wait with 3 of 5 servers silent for good: got %v, want the Redis error", err)
	}
	if d := time.Since(start); d < 2*time.Second {
		t.Errorf("gave up after %v, before the outage had lasted the ttl (2s)", d)
	}
	t.Logf("gave up after %v: %v", time.Since(start).Round(time.Millisecond), err)
}
