package lock

import (
	"context"
	"testing"
	"time"
)

func localBackend() backend {
	l := NewLocal()
	return backend{
		locker: l,
		ttl:    300 * time.Millisecond,
		newKey: func(t *testing.T) string { return testKey(t) },
		steal: func(t *testing.T, key string) {
			l.mu.Lock()
			defer l.mu.Unlock()
			if e := l.locks[key]; e != nil {
				l.free(key, e)
			}
		},
		reentrant: true,
		fencing:   true,
		wakes:     true,
	}
}

func TestLocal(t *testing.T) {
	testConformance(t, localBackend())
}

// TestLocalAcrossInstances shows why Local is for teaching only: two
// instances of the service each have their own, and both "hold" the lock.
func TestLocalAcrossInstances(t *testing.T) {
	ctx := context.Background()
	instance1, instance2 := NewLocal(), NewLocal()
	a, err := instance1.Obtain(ctx, "order:voucher:7:user:42", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Release(ctx)
	b, err := instance2.Obtain(ctx, "order:voucher:7:user:42", time.Minute)
	if err != nil {
		t.Fatalf("the second instance was refused (%v); Local cannot know of the first", err)
	}
	defer b.Release(ctx)
}
