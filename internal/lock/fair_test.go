package lock

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func fairKey(t *testing.T, rdb redis.UniversalClient) string {
	return testName(t, rdb, func(key string) []string {
		k := fairKeysFor(key)
		return []string{k.lock, k.queue, k.alive, k.fence}
	})
}

// TestFair runs the conformance suite on the fair lock: it is a Locker
// like any other.
func TestFair(t *testing.T) {
	r, rdb := syncRedis(t)
	testConformance(t, backend{
		locker: r.Fair(),
		ttl:    300 * time.Millisecond,
		newKey: func(t *testing.T) string { return fairKey(t, rdb) },
		steal: func(t *testing.T, key string) {
			if err := rdb.Del(context.Background(), fairKeysFor(key).lock).Err(); err != nil {
				t.Fatal(err)
			}
		},
		reentrant: true,
		fencing:   true,
		wakes:     true,
		waiting:   func(t *testing.T, n int) { waitSubscribed(t, r, n) },
	})
}

// waitInLine waits until key's line holds n waiters.
func waitInLine(t *testing.T, rdb redis.UniversalClient, key string, n int64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for rdb.LLen(context.Background(), fairKeysFor(key).queue).Val() != n {
		if time.Now().After(deadline) {
			t.Fatalf("the line never held %d waiters", n)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// TestFairArrivalOrder lines up 20 waiters one after another behind a
// holder and checks they get the lock in that order. They all poll, so a
// free moment is contested by whoever looks: only the line keeps the order.
func TestFairArrivalOrder(t *testing.T) {
	const n = 20
	_, rdb := syncRedis(t)
	r := NewRedis(rdb)
	// A waiter stays in line three polls without trying (fair.go). With
	// polls of 20 ms, a stall of 40 ms on a loaded CI machine would drop
	// it from the line and send it to the back.
	r.maxPoll = 200 * time.Millisecond
	fair := r.Fair()
	key := fairKey(t, rdb)
	first := mustObtain(t, fair, key, 10*time.Second)

	var mu sync.Mutex
	var order []int
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			lk, err := fair.Obtain(waitCtx(t, 20*time.Second), key, 10*time.Second, Wait())
			if err != nil {
				errs <- err
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			time.Sleep(2 * time.Millisecond)
			errs <- lk.Release(context.Background())
		})
		waitInLine(t, rdb, key, int64(i+1)) // i arrived before i+1
	}
	mustRelease(t, first)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	want := make([]int, n)
	for i := range want {
		want[i] = i
	}
	if !slices.Equal(order, want) {
		t.Errorf("granted in order %v, want arrival order", order)
	}
}

// TestFairDeadWaiter kills the first in line (its client closes, so it
// neither tries again nor leaves) and checks the second gets the lock once
// the dead one's time in line has run out, not never.
func TestFairDeadWaiter(t *testing.T) {
	ctx := context.Background()
	_, rdb := syncRedis(t)
	r := NewRedis(rdb)
	r.maxPoll = 100 * time.Millisecond
	key := fairKey(t, rdb)
	holder := mustObtain(t, r.Fair(), key, 10*time.Second)

	other := otherClient(t, rdb)
	dr := NewRedis(other)
	dr.maxPoll = r.maxPoll
	deadErr := make(chan error, 1)
	go func() {
		_, err := dr.Fair().Obtain(waitCtx(t, 10*time.Second), key, time.Second, Wait())
		deadErr <- err
	}()
	waitInLine(t, rdb, key, 1)
	dead := rdb.LIndex(ctx, fairKeysFor(key).queue, 0).Val()

	got := make(chan error, 1)
	go func() {
		lk, err := r.Fair().Obtain(waitCtx(t, 10*time.Second), key, time.Second, Wait())
		if err == nil {
			err = lk.Release(ctx)
		}
		got <- err
	}()
	waitInLine(t, rdb, key, 2)
	other.Close() // the first in line dies
	if err := <-deadErr; err == nil {
		t.Fatal("the dead waiter got the lock")
	}
	end, err := rdb.ZScore(ctx, fairKeysFor(key).alive, dead).Result()
	if err != nil {
		t.Fatalf("the dead waiter left the line: %v", err)
	}
	mustRelease(t, holder)
	released := time.Now()
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if now := redisNow(t, rdb); now < int64(end) {
		t.Errorf("the second got the lock %dms before the first's time in line ran out", int64(end)-now)
	}
	// The dead one's time in line ends 300 ms after its last try at
	// most; one never dropped would keep the second out for good. 2 s
	// tells the two apart on a loaded machine.
	if d := time.Since(released); d > 2*time.Second {
		t.Errorf("the second waited %v behind a dead waiter", d)
	}
}

// TestFairGivingUpLeavesLine checks a waiter whose ctx ends leaves the line
// at once, and a try-once caller never gets in line.
func TestFairGivingUpLeavesLine(t *testing.T) {
	ctx := context.Background()
	r, rdb := syncRedis(t)
	key := fairKey(t, rdb)
	holder := mustObtain(t, r.Fair(), key, 10*time.Second)
	defer mustRelease(t, holder)
	if _, err := r.Fair().Obtain(ctx, key, time.Second); err != ErrNotAcquired {
		t.Fatalf("try once: got %v, want ErrNotAcquired", err)
	}
	waitInLine(t, rdb, key, 0)
	wctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if _, err := r.Fair().Obtain(wctx, key, time.Second, Wait()); err != context.DeadlineExceeded {
		t.Fatalf("waiter at its deadline: got %v", err)
	}
	if n := rdb.LLen(ctx, fairKeysFor(key).queue).Val() + rdb.ZCard(ctx, fairKeysFor(key).alive).Val(); n != 0 {
		t.Errorf("%d entries left in line after the waiter gave up", n)
	}
}
