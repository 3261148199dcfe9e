package lock

import (
	"context"
	"sync"
	"testing"
	"time"
)

// stuckHolder's renewals wait until their context ends, as a request to a
// server that stopped answering does; it records what happened in order.
// A fake, because the case is a moment: a renewal in flight at the very
// instant Release is called, which a real server produces only by chance.
type stuckHolder struct {
	mu      sync.Mutex
	events  []string
	renewed chan struct{} // closed when the first renewal is in flight
}

func (h *stuckHolder) log(e string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.events = append(h.events, e)
}

func (h *stuckHolder) extend(ctx context.Context, _ time.Duration) error {
	h.log("extend")
	select {
	case <-h.renewed:
	default:
		close(h.renewed)
	}
	<-ctx.Done()
	h.log("extend ended")
	return ctx.Err()
}

func (h *stuckHolder) release(context.Context) error {
	h.log("release")
	return nil
}

// TestReleaseCutsRenewalShort: Release stops the watchdog first, cutting a
// renewal in flight short and waiting for it to end, so that no renewal
// reaches the server after the release (it would put back a lock that is
// gone, or lengthen another holder's). Without the wait, "extend ended"
// comes after "release"; without the cut, Release waits out the
// renewal's own timeout (ttl/3, 10 s here).
func TestReleaseCutsRenewalShort(t *testing.T) {
	const ttl = 30 * time.Second
	h := &stuckHolder{renewed: make(chan struct{})}
	start := time.Now()
	lk := newHandle(context.Background(), "k", 0, start, ttl, h, options{watchdog: true})
	// Renew at once rather than in ttl/3: the renewal starts and sticks.
	lk.watchdog.mu.Lock()
	lk.watchdog.timer.Reset(0)
	lk.watchdog.mu.Unlock()
	select {
	case <-h.renewed:
	case <-time.After(5 * time.Second):
		t.Fatal("the watchdog did not renew")
	}

	released := time.Now()
	if err := lk.Release(context.Background()); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if took := time.Since(released); took > ttl/6 {
		t.Errorf("Release took %v: it waited out the renewal instead of cutting it short", took)
	}
	time.Sleep(50 * time.Millisecond) // a renewal wrongly left armed would run now
	h.mu.Lock()
	defer h.mu.Unlock()
	want := []string{"extend", "extend ended", "release"}
	if len(h.events) != len(want) {
		t.Fatalf("events %q, want %q", h.events, want)
	}
	for i := range want {
		if h.events[i] != want[i] {
			t.Fatalf("events %q, want %q", h.events, want)
		}
	}
}

// countingHolder counts renewals; it answers at once.
type countingHolder struct {
	mu      sync.Mutex
	renewed int
}

func (h *countingHolder) extend(context.Context, time.Duration) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.renewed++
	return nil
}

func (h *countingHolder) release(context.Context) error { return nil }

func (h *countingHolder) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.renewed
}

// TestWatchdogRenewsEveryThird: the timer is set again after each renewal,
// ttl/3 apart, and stops at Release. (The backends' conformance tests show
// the same against real servers; this one counts.)
func TestWatchdogRenewsEveryThird(t *testing.T) {
	const ttl = 300 * time.Millisecond
	h := &countingHolder{}
	lk := newHandle(context.Background(), "k", 0, time.Now(), ttl, h, options{watchdog: true})
	time.Sleep(ttl*3 + ttl/6) // renewals due at 100, 200, ... 900 ms
	n := h.count()
	if n < 6 || n > 10 {
		t.Errorf("%d renewals in %v, want about 9 (one every %v)", n, ttl*3+ttl/6, ttl/3)
	}
	if err := lk.Release(context.Background()); err != nil {
		t.Fatalf("Release: %v", err)
	}
	after := h.count()
	time.Sleep(ttl)
	if got := h.count(); got != after {
		t.Errorf("%d renewals after Release", got-after)
	}
	select {
	case <-lk.Done():
	default:
		t.Error("Done not closed after Release")
	}
}
