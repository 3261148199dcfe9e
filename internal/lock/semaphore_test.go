package lock

import (
	"context"
	"errors"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func semaphoreName(t *testing.T, r *Redis) string {
	return testName(t, r.rdb, func(name string) []string {
		k := semaphoreKeysFor(name)
		return []string{k.leases, k.counts}
	})
}

// TestSemaphoreNeverOversubscribed releases 40 goroutines at once on a
// semaphore of 3 permits, each taking 1 or 2 of them, and asserts that no
// more than 3 permits are ever out, and that holders did overlap.
func TestSemaphoreNeverOversubscribed(t *testing.T) {
	const size, n = 3, 40
	r, _ := syncRedis(t)
	sem := r.Semaphore(semaphoreName(t, r), size)
	var out, most atomic.Int64
	start := make(chan struct{})
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			want := 1 + rand.IntN(2)
			<-start
			lk, err := sem.Acquire(waitCtx(t, 30*time.Second), want, 10*time.Second, Wait())
			if err != nil {
				errs <- err
				return
			}
			now := out.Add(int64(want))
			for m := most.Load(); now > m && !most.CompareAndSwap(m, now); m = most.Load() {
			}
			runtime.Gosched()
			time.Sleep(time.Millisecond)
			out.Add(-int64(want))
			errs <- lk.Release(context.Background())
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if got := most.Load(); got > size {
		t.Errorf("%d permits out at once, of %d", got, size)
	} else if got < 2 {
		t.Errorf("at most %d permit out at once: the holders never overlapped", got)
	}
}

// TestSemaphoreDeadHolder kills a holder of two permits (its client
// closes, so its watchdog stops renewing) and checks they come back when
// its lease ends, and not before. A live holder keeps the third permit
// meanwhile, so the semaphore's keys cannot simply expire: the dead
// holder's permits must be handed back by themselves.
func TestSemaphoreDeadHolder(t *testing.T) {
	const lease = 300 * time.Millisecond
	r, rdb := syncRedis(t)
	name := semaphoreName(t, r)
	sem := r.Semaphore(name, 3)
	live, err := sem.Acquire(context.Background(), 1, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer mustRelease(t, live)

	other := otherClient(t, rdb)
	dead, err := NewRedis(other).Semaphore(name, 3).Acquire(context.Background(), 2, lease, WithWatchdog(0))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(lease / 2) // a renewal or so
	if _, err := sem.Acquire(context.Background(), 1, lease); err != ErrNotAcquired {
		t.Fatalf("Acquire while the holder lives: got %v, want ErrNotAcquired", err)
	}
	other.Close() // the holder's process dies
	token := dead.(*handle).holder.(*semaphoreHolder).token
	leaseEnd, err := rdb.ZScore(context.Background(), semaphoreKeysFor(name).leases, token).Result()
	if err != nil {
		t.Fatal(err)
	}

	closed := time.Now()
	lk, err := sem.Acquire(waitCtx(t, 5*time.Second), 2, lease, Wait())
	if err != nil {
		t.Fatalf("Acquire after the holder died: %v", err)
	}
	defer mustRelease(t, lk)
	if now := redisNow(t, rdb); now < int64(leaseEnd) {
		t.Errorf("got the permits %dms before the dead holder's lease ended", int64(leaseEnd)-now)
	}
	// Nobody published anything: the waiter looked when the lease ended,
	// not at its 30 s poll (2 s tells the two apart on a loaded machine).
	if d := time.Since(closed); d > 2*time.Second {
		t.Errorf("got the permits %v after the holder died, lease %v", d, lease)
	}
	// The dead holder, had it lived on, would have been told.
	within(t, lease, dead.Done(), "the dead holder's Done")
	if !errors.Is(context.Cause(dead.Context()), ErrNotHeld) {
		t.Errorf("dead holder's cause = %v, want ErrNotHeld", context.Cause(dead.Context()))
	}
}

func TestSemaphore(t *testing.T) {
	ctx := context.Background()
	r, _ := syncRedis(t)

	t.Run("ReleaseGivesBack", func(t *testing.T) {
		sem := r.Semaphore(semaphoreName(t, r), 3)
		a, err := sem.Acquire(ctx, 2, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := sem.Acquire(ctx, 2, 10*time.Second); err != ErrNotAcquired {
			t.Fatalf("2 of 1 free: got %v, want ErrNotAcquired", err)
		}
		b, err := sem.Acquire(ctx, 1, 10*time.Second)
		if err != nil {
			t.Fatalf("1 of 1 free: %v", err)
		}
		mustRelease(t, a)
		if err := a.Release(ctx); err != ErrNotHeld {
			t.Errorf("second Release: got %v, want ErrNotHeld", err)
		}
		c, err := sem.Acquire(ctx, 2, 10*time.Second)
		if err != nil {
			t.Fatalf("2 of 2 free: %v", err)
		}
		mustRelease(t, b)
		mustRelease(t, c)
	})

	t.Run("WakesOnRelease", func(t *testing.T) {
		sem := r.Semaphore(semaphoreName(t, r), 1)
		a, err := sem.Acquire(ctx, 1, 30*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan time.Time, 1)
		go func() {
			lk, err := sem.Acquire(waitCtx(t, 10*time.Second), 1, 10*time.Second, Wait())
			if err != nil {
				t.Error(err)
				got <- time.Time{}
				return
			}
			got <- time.Now()
			_ = lk.Release(ctx)
		}()
		waitSubscribed(t, r, 1) // it asked, was turned away, and waits
		released := time.Now()
		mustRelease(t, a)
		// The lease is 30s and so is the poll: only the release wakes it
		// (within 5s on a loaded machine, far under the poll).
		if lag := (<-got).Sub(released); lag < 0 || lag > 5*time.Second {
			t.Errorf("waiter got the permit %v after its release", lag)
		}
	})

	t.Run("ExtendAndExpiry", func(t *testing.T) {
		sem := r.Semaphore(semaphoreName(t, r), 1)
		a, err := sem.Acquire(ctx, 1, 200*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if err := a.Extend(ctx, time.Second); err != nil {
			t.Fatal(err)
		}
		time.Sleep(300 * time.Millisecond)
		if _, err := sem.Acquire(ctx, 1, time.Second); err != ErrNotAcquired {
			t.Fatalf("Acquire of an extended permit: got %v, want ErrNotAcquired", err)
		}
		if err := a.Extend(ctx, 50*time.Millisecond); err != nil {
			t.Fatal(err)
		}
		within(t, time.Second, a.Done(), "Done after the lease")
		// Redis' lease ends up to a round trip after the local deadline
		// that closed Done: wait for it rather than guess how long.
		wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		b, err := sem.Acquire(wctx, 1, time.Second, Wait())
		if err != nil {
			t.Fatalf("Acquire after the lease: %v", err)
		}
		if err := a.Extend(ctx, time.Second); err != ErrNotHeld {
			t.Errorf("Extend after the lease: got %v, want ErrNotHeld", err)
		}
		if err := a.Release(ctx); err != ErrNotHeld {
			t.Errorf("Release after the lease: got %v, want ErrNotHeld", err)
		}
		mustRelease(t, b)
	})

	t.Run("BadArguments", func(t *testing.T) {
		sem := r.Semaphore(semaphoreName(t, r), 2)
		for _, n := range []int{0, 3} {
			if _, err := sem.Acquire(ctx, n, time.Second); err == nil {
				t.Errorf("Acquire(%d) of 2: no error", n)
			}
		}
		for _, o := range []Option{WithOwner("a"), WithFencing()} {
			if _, err := sem.Acquire(ctx, 1, time.Second, o); !errors.Is(err, ErrUnsupported) {
				t.Errorf("got %v, want ErrUnsupported", err)
			}
		}
	})
}
