package lock

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestObtainAllCrossed runs two processes (two backends on their own
// clients) with 4 goroutines each. Every goroutine takes 10 times a random
// set of 2 to 4 of 4 keys, listed in a random order, so crossed requests
// ("a then b" against "b then a") are common. Had they deadlocked, a
// waiter would hit its deadline; so would one whose wake-up was lost, as
// the holders' ttl and the poll are 30 s. The whole run must also stay
// well under that. No key may ever have two holders.
func TestObtainAllCrossed(t *testing.T) {
	const procs, workers, rounds = 2, 4, 10
	_, rdb := syncRedis(t)
	keys := []string{testKey(t, rdb), testKey(t, rdb), testKey(t, rdb), testKey(t, rdb)}
	var inside [4]atomic.Int32
	var overlap atomic.Bool
	start := make(chan struct{})
	errs := make(chan error, procs*workers*rounds)
	var wg sync.WaitGroup
	for range procs {
		r := NewRedis(otherClient(t, rdb))
		r.maxPoll = 30 * time.Second
		for range workers {
			wg.Go(func() {
				<-start
				for range rounds {
					idx := rand.Perm(len(keys))[:2+rand.IntN(3)]
					set := make([]string, len(idx))
					for i, k := range idx {
						set[i] = keys[k]
					}
					lk, err := ObtainAll(waitCtx(t, 12*time.Second), r, set, 30*time.Second, Wait())
					if err != nil {
						errs <- err
						return
					}
					for _, k := range idx {
						if inside[k].Add(1) > 1 {
							overlap.Store(true)
						}
					}
					time.Sleep(time.Millisecond)
					for _, k := range idx {
						inside[k].Add(-1)
					}
					errs <- lk.Release(context.Background())
				}
			})
		}
	}
	began := time.Now()
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("%v (a deadlock waits until the deadline)", err)
		}
	}
	if overlap.Load() {
		t.Error("a key had two holders")
	}
	if d := time.Since(began); d > 12*time.Second {
		t.Errorf("%d acquisitions took %v", procs*workers*rounds, d)
	}
}

func TestObtainAll(t *testing.T) {
	ctx := context.Background()
	r, rdb := syncRedis(t)
	free := func(t *testing.T, key string) {
		t.Helper()
		mustRelease(t, mustObtain(t, r, key, time.Second))
	}
	taken := func(t *testing.T, key string) {
		t.Helper()
		if lk, err := r.Obtain(ctx, key, time.Second); err != ErrNotAcquired {
			if err == nil {
				_ = lk.Release(ctx)
			}
			t.Errorf("%s: got %v, want ErrNotAcquired", key, err)
		}
	}

	t.Run("AllOrNone", func(t *testing.T) {
		a, b, c := testKey(t, rdb), testKey(t, rdb), testKey(t, rdb)
		other := mustObtain(t, r, b, 10*time.Second)
		if _, err := ObtainAll(ctx, r, []string{c, b, a}, 10*time.Second); err != ErrNotAcquired {
			t.Fatalf("one taken: got %v, want ErrNotAcquired", err)
		}
		free(t, a)
		free(t, c)
		wctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		defer cancel()
		if _, err := ObtainAll(wctx, r, []string{c, b, a}, 10*time.Second, Wait()); err != context.DeadlineExceeded {
			t.Fatalf("waiting past the deadline: got %v", err)
		}
		free(t, a)
		free(t, c)
		mustRelease(t, other)

		lk, err := ObtainAll(ctx, r, []string{c, b, a, b}, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range []string{a, b, c} {
			taken(t, k)
		}
		mustRelease(t, lk)
		for _, k := range []string{a, b, c} {
			free(t, k)
		}
		if err := lk.Release(ctx); err != ErrNotHeld {
			t.Errorf("second Release: got %v, want ErrNotHeld", err)
		}
		if isOpen(lk.Done()) || lk.Context().Err() != context.Canceled {
			t.Errorf("after Release: Done open or Context.Err() = %v", lk.Context().Err())
		}
	})

	t.Run("MemberLost", func(t *testing.T) {
		// The watchdog renews every ttl/3, each renewal with ttl/3 to
		// answer. Without its report, b's deadline would end the lock a
		// ttl after it was obtained: the bound, counted from then too,
		// leaves two renewals time to find b gone and comes well before.
		const ttl = 3 * time.Second
		a, b := testKey(t, rdb), testKey(t, rdb)
		start := time.Now()
		lk, err := ObtainAll(ctx, r, []string{a, b}, ttl, WithWatchdog(0))
		if err != nil {
			t.Fatal(err)
		}
		rdb.Del(ctx, keysFor(b).lock) // b is lost behind its holder's back
		within(t, time.Until(start.Add(ttl*5/6)), lk.Done(), "Done after a member was lost")
		if !errors.Is(context.Cause(lk.Context()), ErrNotHeld) {
			t.Errorf("cause = %v, want ErrNotHeld", context.Cause(lk.Context()))
		}
		if err := lk.Release(ctx); err != ErrNotHeld {
			t.Errorf("Release with a lost member: got %v, want ErrNotHeld", err)
		}
		free(t, a) // the members still held were released
	})

	t.Run("StartsOverIfAMemberExpires", func(t *testing.T) {
		// a is taken, then b is waited for longer than a's ttl: a expires
		// meanwhile, so ObtainAll starts over rather than hand out a Lock
		// with a lost member. The ttl must outlive the checks below, three
		// round trips, on a loaded machine too.
		a, b := testKey(t, rdb), testKey(t, rdb)
		if b < a {
			a, b = b, a // a is taken first
		}
		if _, err := r.Obtain(ctx, b, time.Second); err != nil {
			t.Fatal(err)
		}
		lk, err := ObtainAll(waitCtx(t, 5*time.Second), r, []string{a, b}, 500*time.Millisecond, Wait())
		if err != nil {
			t.Fatal(err)
		}
		if !isOpen(lk.Done()) {
			t.Fatalf("obtained with a lost member: %v", context.Cause(lk.Context()))
		}
		taken(t, a)
		taken(t, b)
		mustRelease(t, lk)
	})

	t.Run("Extend", func(t *testing.T) {
		a, b := testKey(t, rdb), testKey(t, rdb)
		// Extend must land within the ttl, on a loaded machine too.
		lk, err := ObtainAll(ctx, r, []string{a, b}, 500*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if err := lk.Extend(ctx, 10*time.Second); err != nil {
			t.Fatal(err)
		}
		time.Sleep(600 * time.Millisecond) // past the first ttl
		taken(t, a)
		taken(t, b)
		if !isOpen(lk.Done()) {
			t.Error("extended multi-lock reported lost")
		}
		mustRelease(t, lk)
	})

	t.Run("Unsupported", func(t *testing.T) {
		if _, err := ObtainAll(ctx, r, []string{testKey(t, rdb)}, time.Second, WithFencing()); !errors.Is(err, ErrUnsupported) {
			t.Errorf("got %v, want ErrUnsupported", err)
		}
	})
}
