package lock

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// syncRedis returns a backend for the synchronizer tests on the shared test
// Redis. Its fallback poll is long, so a test that needs a wake-up fails
// instead of passing slowly by polling.
func syncRedis(t *testing.T) (*Redis, *redis.Client) {
	t.Helper()
	rdb := testRedis(t)
	r := NewRedis(rdb)
	r.maxPoll = 30 * time.Second
	return r, rdb
}

// testName returns a name no other test uses, and deletes the keys that
// keysOf names for it when the test ends.
func testName(t *testing.T, rdb redis.UniversalClient, keysOf func(name string) []string) string {
	t.Helper()
	name := testKey(t)
	t.Cleanup(func() { rdb.Del(context.Background(), keysOf(name)...) })
	return name
}

// otherClient returns a second client of the test Redis, standing for
// another process. Closing it is that process dying: its watchdogs can no
// longer renew, its waiters stop trying, its releases never arrive.
func otherClient(t *testing.T, rdb *redis.Client) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: rdb.Options().Addr, MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	return c
}

// redisNow returns the Redis server's clock in milliseconds, the clock
// the scripts use.
func redisNow(t *testing.T, rdb redis.UniversalClient) int64 {
	t.Helper()
	now, err := rdb.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return now.UnixMilli()
}

// waitCtx returns a context for a test's waits, cancelled when it ends.
func waitCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// must returns the Lock of an acquisition, failing t if it failed:
// must(t)(rw.ObtainRead(ctx, ttl)).
func must(t *testing.T) func(Lock, error) Lock {
	return func(lk Lock, err error) Lock {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return lk
	}
}

// TestSynchronizerKeysShareHashSlot checks that the keys each script of a
// synchronizer touches hash to one Redis Cluster slot.
func TestSynchronizerKeysShareHashSlot(t *testing.T) {
	families := map[string]func(name string) []string{
		"semaphore": func(name string) []string {
			k := semaphoreKeysFor(name)
			return []string{k.leases, k.counts}
		},
		"rwlock": func(name string) []string { return rwKeysFor(name).list() },
		"fair": func(name string) []string {
			k := fairKeysFor(name)
			return []string{k.lock, k.queue, k.alive, k.fence}
		},
	}
	for family, keysOf := range families {
		for _, name := range []string{"voucher:7", "a{b}c", "{x}", "}x", ""} {
			keys := keysOf(name)
			for _, k := range keys[1:] {
				if hashTag(k) != hashTag(keys[0]) {
					t.Errorf("%s %q: %q and %q hash differently", family, name, keys[0], k)
				}
			}
		}
	}
}
