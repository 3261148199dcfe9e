package room_test

import (
	"context"
	"errors"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/room"
)

// scriptHook counts the script calls a client sends and, while gate is
// set, holds each one until gate is closed: a way to keep a call "on its
// way" as long as a test needs, on the real Redis.
type scriptHook struct {
	calls atomic.Int64
	gate  atomic.Pointer[chan struct{}]
}

func (h *scriptHook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) { return next(ctx, network, addr) }
}

func (h *scriptHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if name := cmd.Name(); name == "evalsha" || name == "eval" {
			h.calls.Add(1)
			if g := h.gate.Load(); g != nil {
				<-*g
			}
		}
		return next(ctx, cmd)
	}
}

func (h *scriptHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// Joins that arrive together share script calls, and each is answered as
// if it had come alone: every user numbered once, in 1..n, a second press
// of the same user answered with the same place, never a second number.
func TestJoinsShareCalls(t *testing.T) {
	r := newRig(t, 1000, 1, -time.Second, time.Minute)
	hook := &scriptHook{}
	r.rdb.AddHook(hook)
	const users, twice = 400, 100 // users 1..twice press twice at once
	start := make(chan struct{})
	var joinedNow [users + 1]atomic.Int64
	var wg sync.WaitGroup
	for i := 0; i < users+twice; i++ {
		u := int64(i%users + 1)
		wg.Go(func() {
			<-start
			joined, p, err := r.store.JoinPlace(context.Background(), r.sale, u)
			if err != nil || p.State != room.StateWaiting || p.Number == nil {
				t.Errorf("user %d: %+v %v", u, p, err)
				return
			}
			if joined {
				joinedNow[u].Add(1)
			}
		})
	}
	close(start)
	wg.Wait()
	calls := hook.calls.Load()
	numbers := map[string]int64{}
	for u := int64(1); u <= users; u++ {
		if n := joinedNow[u].Load(); n != 1 {
			t.Errorf("user %d told %d times that they joined now, want once", u, n)
		}
		p := r.place(t, u)
		if p.Number == nil {
			t.Fatalf("user %d has no number: %+v", u, p)
		}
		if other, dup := numbers[*p.Number]; dup {
			t.Errorf("number %s given to users %d and %d", *p.Number, other, u)
		}
		numbers[*p.Number] = u
	}
	for n := 1; n <= users; n++ {
		if _, ok := numbers[strconv.Itoa(n)]; !ok {
			t.Errorf("number %d given to no one", n)
		}
	}
	t.Logf("%d joins in %d script calls", users+twice, calls)
	if calls >= users+twice {
		t.Errorf("%d script calls for %d joins: none shared a call", calls, users+twice)
	}
}

// A joiner who gives up while waiting for the call on its way leaves the
// line of joins: the joins behind them still go, and theirs does not.
func TestJoinGivingUpWhileWaiting(t *testing.T) {
	r := newRig(t, 1000, 1, -time.Second, time.Minute)
	hook := &scriptHook{}
	gate := make(chan struct{})
	hook.gate.Store(&gate)
	r.rdb.AddHook(hook)
	ctx := context.Background()

	first := make(chan error, 1)
	go func() { _, err := r.store.Join(ctx, r.sale, 1); first <- err }()
	for hook.calls.Load() == 0 { // user 1's call is out, held at the gate
		time.Sleep(time.Millisecond)
	}
	hook.gate.Store(nil) // the calls after it go through
	quit, cancel := context.WithCancel(ctx)
	gaveUp := make(chan error, 1)
	go func() { _, err := r.store.Join(quit, r.sale, 2); gaveUp <- err }()
	third := make(chan error, 1)
	time.Sleep(20 * time.Millisecond) // user 2 waits first, user 3 behind them
	go func() { _, err := r.store.Join(ctx, r.sale, 3); third <- err }()
	time.Sleep(20 * time.Millisecond)
	cancel()
	if err := <-gaveUp; !errors.Is(err, context.Canceled) {
		t.Fatalf("user 2 gave up: %v, want context.Canceled", err)
	}
	close(gate)
	for user, ch := range map[int64]chan error{1: first, 3: third} {
		select {
		case err := <-ch:
			if err != nil {
				t.Errorf("user %d: %v", user, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("user %d's join never came back: the line of joins stalled", user)
		}
	}
	if p := r.place(t, 2); p.State != room.StateNone {
		t.Errorf("user 2, who gave up before their call: %+v, want none", p)
	}
	if p := r.place(t, 3); p.Number == nil || *p.Number != "2" {
		t.Errorf("user 3: %+v, want number 2", p)
	}
}
