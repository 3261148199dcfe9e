package lock

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func latchName(t *testing.T, r *Redis) string {
	return testName(t, r.rdb, func(name string) []string { return []string{latchKeysFor(name).count} })
}

// TestLatchWakesAllWaiters puts 20 waiters on a latch of 5, counts it down
// from 5 goroutines one after another, and checks every waiter goes on
// right after the last count, and none before it.
func TestLatchWakesAllWaiters(t *testing.T) {
	const waiters, count = 20, 5
	ctx := context.Background()
	r, _ := syncRedis(t)
	latch := r.Latch(latchName(t, r))
	if ok, err := latch.Set(ctx, count, 10*time.Second); !ok || err != nil {
		t.Fatalf("Set: %v, %v", ok, err)
	}
	var counted atomic.Int64 // count downs begun
	woke := make(chan time.Time, waiters)
	var wg sync.WaitGroup
	for range waiters {
		wg.Go(func() {
			// The latch's ttl is 10s and the poll 30s: only its opening
			// wakes the waiters in time.
			if err := latch.Wait(waitCtx(t, 3*time.Second)); err != nil {
				t.Error(err)
				return
			}
			if n := counted.Load(); n < count {
				t.Errorf("a waiter went on after %d of %d count downs", n, count)
			}
			woke <- time.Now()
		})
	}
	waitSubscribed(t, r, waiters)

	var sent [count]time.Time
	var left [count]int64
	var cwg sync.WaitGroup
	for i := range count {
		cwg.Go(func() {
			time.Sleep(time.Duration(i) * 20 * time.Millisecond)
			counted.Add(1)
			sent[i] = time.Now()
			var err error
			if left[i], err = latch.CountDown(ctx); err != nil {
				t.Error(err)
			}
		})
	}
	cwg.Wait()
	wg.Wait()
	var opened time.Time // when the count down that opened the latch was sent
	for i := range count {
		if left[i] == 0 && (opened.IsZero() || sent[i].Before(opened)) {
			opened = sent[i]
		}
	}
	close(woke)
	n := 0
	for at := range woke {
		n++
		// Bound loose enough for a loaded CI machine, far under the poll.
		if lag := at.Sub(opened); lag > 2*time.Second {
			t.Errorf("a waiter went on %v after the latch opened", lag)
		}
	}
	if n != waiters {
		t.Errorf("%d of %d waiters went on", n, waiters)
	}
	if c, err := latch.Count(ctx); c != 0 || err != nil {
		t.Errorf("Count after opening: %d, %v", c, err)
	}
}

// waitSubscribed waits until n goroutines wait on r's subscription.
func waitSubscribed(t *testing.T, r *Redis, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		r.waiters.mu.Lock()
		count := r.waiters.count
		r.waiters.mu.Unlock()
		if count == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d waiters subscribed", count, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestLatch(t *testing.T) {
	ctx := context.Background()
	r, _ := syncRedis(t)

	t.Run("SetOnce", func(t *testing.T) {
		latch := r.Latch(latchName(t, r))
		if ok, err := latch.Set(ctx, 2, 10*time.Second); !ok || err != nil {
			t.Fatalf("Set: %v, %v", ok, err)
		}
		if ok, err := latch.Set(ctx, 7, 10*time.Second); ok || err != nil {
			t.Fatalf("Set of a set latch: %v, %v", ok, err)
		}
		for want := int64(1); want >= 0; want-- {
			if left, err := latch.CountDown(ctx); left != want || err != nil {
				t.Fatalf("CountDown: %d, %v; want %d", left, err, want)
			}
		}
		if left, err := latch.CountDown(ctx); left != 0 || err != nil {
			t.Errorf("CountDown of an open latch: %d, %v", left, err)
		}
		if _, err := latch.Set(ctx, 0, time.Second); err == nil {
			t.Error("Set(0): no error")
		}
	})

	t.Run("OpenAtOnce", func(t *testing.T) {
		if err := r.Latch(latchName(t, r)).Wait(waitCtx(t, time.Second)); err != nil {
			t.Errorf("Wait on a latch never set: %v", err)
		}
	})

	t.Run("WaitUntilDeadline", func(t *testing.T) {
		latch := r.Latch(latchName(t, r))
		if _, err := latch.Set(ctx, 1, 10*time.Second); err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		defer cancel()
		if err := latch.Wait(wctx); err != context.DeadlineExceeded {
			t.Errorf("Wait at the deadline: got %v", err)
		}
	})

	t.Run("OpensAtTTL", func(t *testing.T) {
		// Its counters died: the latch opens by its ttl, and the waiter,
		// who polls only every 30s, looks again right then.
		latch := r.Latch(latchName(t, r))
		if _, err := latch.Set(ctx, 3, 200*time.Millisecond); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		// Within 2s (far under the poll) or the ctx ends the wait.
		if err := latch.Wait(waitCtx(t, 2*time.Second)); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d < 150*time.Millisecond {
			t.Errorf("opened after %v, ttl 200ms", d)
		}
	})
}
