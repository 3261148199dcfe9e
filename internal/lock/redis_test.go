package lock

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/testenv/faultproxy"
)

func redisBackend(t *testing.T) (backend, *Redis, *redis.Client) {
	rdb := testRedis(t)
	r := NewRedis(rdb)
	// A waiter that relied on polling would take seconds, and fail the
	// wake-up tests, instead of passing them slowly.
	r.maxPoll = 30 * time.Second
	return backend{
		locker: r,
		ttl:    300 * time.Millisecond,
		newKey: func(t *testing.T) string { return testKey(t, rdb) },
		steal: func(t *testing.T, key string) {
			if err := rdb.Del(context.Background(), keysFor(key).lock).Err(); err != nil {
				t.Fatal(err)
			}
		},
		reentrant: true,
		fencing:   true,
		wakes:     true,
		waiting:   func(t *testing.T, n int) { waitSubscribed(t, r, n) },
	}, r, rdb
}

func TestRedis(t *testing.T) {
	b, _, _ := redisBackend(t)
	testConformance(t, b)
}

func TestRedisOnce(t *testing.T) {
	ctx := context.Background()
	_, r, rdb := redisBackend(t)
	key := testKey(t, rdb)
	if err := r.Once(ctx, key, 500*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := r.Once(ctx, key, 500*time.Millisecond); err != ErrNotAcquired {
		t.Fatalf("repeat within the ttl: got %v, want ErrNotAcquired", err)
	}
	// Nothing renews it: it lives its ttl, and only that long.
	if pttl := rdb.PTTL(ctx, keysFor(key).lock).Val(); pttl <= 0 || pttl > 500*time.Millisecond {
		t.Errorf("PTTL = %v, want within the ttl", pttl)
	}
	time.Sleep(500*time.Millisecond - time.Since(start) + 20*time.Millisecond)
	if err := r.Once(ctx, key, time.Second); err != nil {
		t.Fatalf("after the ttl: %v", err)
	}
	// A one-shot key is a lock like any other.
	if _, err := r.Obtain(ctx, key, time.Second); err != ErrNotAcquired {
		t.Errorf("Obtain while a one-shot lock is set: got %v, want ErrNotAcquired", err)
	}
}

// TestRedisErrorsStayApart checks that a failing Redis is reported as such,
// never as "not acquired" or "not held".
func TestRedisErrorsStayApart(t *testing.T) {
	ctx := context.Background()
	b, r, rdb := redisBackend(t)
	key := b.newKey(t)
	lk := mustObtain(t, r, key, 10*time.Second)

	down := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialerRetries: 1})
	defer down.Close()
	dead := NewRedis(down)
	for _, opts := range [][]Option{nil, {WithFencing()}, {Wait()}} {
		_, err := dead.Obtain(ctx, key, time.Second, opts...)
		if err == nil || errors.Is(err, ErrNotAcquired) || !strings.HasPrefix(err.Error(), "lock: obtain") {
			t.Errorf("Obtain(%d opts) on a dead Redis: got %v, want a wrapped Redis error", len(opts), err)
		}
	}
	if err := dead.Once(ctx, key, time.Second); err == nil || errors.Is(err, ErrNotAcquired) {
		t.Errorf("Once on a dead Redis: got %v", err)
	}

	// The same holder on a client that went away: release and extend fail
	// as Redis errors, and the lock itself stays where it was.
	lost := &handle{key: key, holder: &redisHolder{rdb: down, keys: keysFor(key), token: "x"},
		done: make(chan struct{}), expiry: time.NewTimer(time.Hour)}
	lost.ctx, lost.cancel = context.WithCancelCause(ctx)
	if err := lost.Extend(ctx, time.Second); err == nil || errors.Is(err, ErrNotHeld) {
		t.Errorf("Extend on a dead Redis: got %v", err)
	}
	if err := lost.Release(ctx); err == nil || errors.Is(err, ErrNotHeld) {
		t.Errorf("Release on a dead Redis: got %v", err)
	}
	if n := rdb.Exists(ctx, keysFor(key).lock).Val(); n != 1 {
		t.Errorf("the held lock is gone")
	}
	mustRelease(t, lk)
}

// TestRedisValidityFromRequestStart checks the local deadline counts from
// before the request, not from the reply. Redis is reached through a proxy
// that delays each way by 50 ms, so that counting from the reply would
// put the deadline 100 ms later than counting from the request; the
// machine's own delays (a loaded runner, the race detector) stay well
// inside that.
func TestRedisValidityFromRequestStart(t *testing.T) {
	rdb := testRedis(t)
	proxy := faultproxy.Start(t, rdb.Options().Addr)
	slow := redis.NewClient(&redis.Options{Addr: proxy.Addr()})
	t.Cleanup(func() { slow.Close() })
	r := NewRedis(slow)
	key := testKey(t, rdb)
	if err := slow.Ping(context.Background()).Err(); err != nil { // connected before the clock starts
		t.Fatal(err)
	}
	proxy.Latency(50 * time.Millisecond)
	before := time.Now()
	lk := mustObtain(t, r, key, time.Second)
	defer mustRelease(t, lk)
	h := lk.(*handle)
	h.mu.Lock()
	until := h.until
	h.mu.Unlock()
	want := before.Add(time.Second - drift(time.Second))
	if until.Before(before) || until.After(want.Add(50*time.Millisecond)) {
		t.Errorf("until = start%+v, want at most %v (counted from the request, not its reply 100 ms later)", until.Sub(before), want.Sub(before))
	}
}

// TestRedisMixedHolders checks plain and reentrant holders, which Redis
// stores as a string and as a hash, exclude each other and do not confuse
// the scripts into Redis errors.
func TestRedisMixedHolders(t *testing.T) {
	ctx := context.Background()
	_, r, rdb := redisBackend(t)
	key := testKey(t, rdb)
	owner := mustObtain(t, r, key, 10*time.Second, WithOwner("alice"))
	plain := &handle{key: key, holder: &redisHolder{rdb: rdb, keys: keysFor(key), token: newToken()},
		done: make(chan struct{}), expiry: time.NewTimer(time.Hour)}
	plain.ctx, plain.cancel = context.WithCancelCause(ctx)
	if err := plain.Extend(ctx, time.Second); err != ErrNotHeld {
		t.Errorf("plain Extend on an owner's lock: got %v, want ErrNotHeld", err)
	}
	if err := plain.Release(ctx); err != ErrNotHeld {
		t.Errorf("plain Release on an owner's lock: got %v, want ErrNotHeld", err)
	}
	mustRelease(t, owner)
}

// TestRedisWaitersShareOneSubscription checks that many waiters cost one
// subscription, and that the last to leave closes it.
func TestRedisWaitersShareOneSubscription(t *testing.T) {
	ctx := context.Background()
	b, r, _ := redisBackend(t)
	key := b.newKey(t)
	holder := mustObtain(t, r, key, 30*time.Second)
	const n = 20
	done := make(chan error, n)
	for range n {
		go func() {
			wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			lk, err := r.Obtain(wctx, key, 10*time.Second, Wait())
			if err == nil {
				err = lk.Release(ctx)
			}
			done <- err
		}()
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		r.waiters.mu.Lock()
		count, topics := r.waiters.count, len(r.waiters.topics)
		r.waiters.mu.Unlock()
		if count == n {
			if topics != 1 {
				t.Errorf("%d waiters on one key use %d subscriptions", n, topics)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d waiters subscribed", count, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	mustRelease(t, holder)
	for range n {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	r.waiters.mu.Lock()
	defer r.waiters.mu.Unlock()
	if r.waiters.ps != nil || r.waiters.count != 0 {
		t.Errorf("subscription left open with %d waiters", r.waiters.count)
	}
}

func TestKeysShareHashSlot(t *testing.T) {
	for _, key := range []string{"voucher:7", "a{b}c", "{x}", "}x", ""} {
		k := keysFor(key)
		if hashTag(k.lock) != hashTag(k.fence) {
			t.Errorf("%q: lock %q and fence %q hash differently", key, k.lock, k.fence)
		}
	}
}

// hashTag returns what Redis Cluster hashes of a key: the part inside the
// first {...}, if not empty, else the whole key.
func hashTag(key string) string {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			return key[i+1 : i+1+j]
		}
	}
	return key
}
