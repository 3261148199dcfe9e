package lock

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// waiters lets goroutines of this process sleep until a lock they wait for
// is released. A holder's release script publishes on the lock's channel;
// one shared subscription receives it and wakes one waiter for that lock,
// who retries. One subscription serves every waiter, so a thousand waiters
// cost Redis one connection, and a release wakes one of them instead of the
// herd. The subscription is opened by the first waiter and closed by the
// last, so an idle process keeps no connection and no goroutine.
type waiters struct {
	rdb redis.UniversalClient

	mu     sync.Mutex
	ps     *redis.PubSub     // nil while nobody waits
	topics map[string]*topic // by channel
	count  int               // waiters across all topics
}

// topic is the subscription to one lock's release channel.
type topic struct {
	wake map[chan struct{}]struct{}
	// SUBSCRIBE and UNSUBSCRIBE are answered in order. subscribed says which
	// one was sent last, pending how many answers are still to come; once
	// none are and the last was SUBSCRIBE, Redis is delivering to us.
	subscribed bool
	pending    int
	ready      chan struct{} // closed when Redis confirmed the subscription
}

// wakeAll is the message that wakes every waiter of a channel, not one:
// scripts publish it when the change may let several of them in at once
// (a writer left and all readers may enter, a latch opened). Any other
// message wakes one waiter, who is the only one a released mutex can admit.
const wakeAll = "all"

// waiter is one goroutine waiting for one lock.
type waiter struct {
	w       *waiters
	channel string
	t       *topic
	wake    chan struct{} // holds a wake-up, if one arrived
}

func newWaiters(rdb redis.UniversalClient) *waiters {
	return &waiters{rdb: rdb}
}

// join registers a waiter for channel and returns once Redis confirmed the
// subscription: a release after join returns is never missed.
func (w *waiters) join(ctx context.Context, channel string) (*waiter, error) {
	w.mu.Lock()
	if w.ps == nil {
		w.ps = w.rdb.Subscribe(ctx) // no channels yet: no connection yet
		w.topics = make(map[string]*topic)
		go w.read(w.ps)
	}
	t := w.topics[channel]
	if t == nil {
		t = &topic{wake: make(map[chan struct{}]struct{})}
		w.topics[channel] = t
	}
	me := &waiter{w: w, channel: channel, t: t, wake: make(chan struct{}, 1)}
	t.wake[me.wake] = struct{}{}
	w.count++
	if !t.subscribed {
		t.subscribed = true
		t.pending++
		t.ready = make(chan struct{})
		if err := w.ps.Subscribe(ctx, channel); err != nil {
			t.subscribed = false // Redis will not answer a command it never got
			t.pending--
			w.mu.Unlock()
			me.leave()
			return nil, err
		}
	}
	ready := t.ready
	w.mu.Unlock()

	select {
	case <-ready:
		return me, nil
	case <-ctx.Done():
		me.leave()
		return nil, ctx.Err()
	}
}

// leave unregisters the waiter. A wake-up it received but did not use is
// handed to another waiter, so a release is never swallowed by a waiter
// that gave up.
func (me *waiter) leave() {
	w := me.w
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := me.t.wake[me.wake]; !ok {
		return
	}
	delete(me.t.wake, me.wake)
	w.count--
	if w.count == 0 {
		// Nobody waits: drop the connection and with it every subscription.
		_ = w.ps.Close()
		w.ps, w.topics = nil, nil
		return
	}
	select {
	case <-me.wake:
		wakeOne(me.t)
	default:
	}
	if len(me.t.wake) == 0 && me.t.subscribed {
		me.t.subscribed = false
		me.t.pending++
		_ = w.ps.Unsubscribe(context.Background(), me.channel)
	}
}

// read delivers what the subscription receives until it is closed.
func (w *waiters) read(ps *redis.PubSub) {
	for {
		msg, err := ps.Receive(context.Background())
		w.mu.Lock()
		if w.ps != ps {
			w.mu.Unlock()
			return // closed by the last waiter to leave
		}
		if err != nil {
			// The connection broke (go-redis redials and subscribes again).
			// Releases may have been missed meanwhile, so every waiter
			// re-checks its lock rather than wait for the fallback poll,
			// and nobody waits for confirmations that may never come.
			for _, t := range w.topics {
				t.pending = 0
				markReady(t)
				for c := range t.wake {
					notify(c)
				}
			}
			w.mu.Unlock()
			time.Sleep(50 * time.Millisecond) // don't spin while Redis is down
			continue
		}
		switch m := msg.(type) {
		case *redis.Subscription:
			if t := w.topics[m.Channel]; t != nil {
				if t.pending > 0 {
					t.pending--
				}
				if t.pending == 0 {
					if t.subscribed {
						markReady(t)
					} else if len(t.wake) == 0 {
						delete(w.topics, m.Channel)
					}
				}
			}
		case *redis.Message:
			if t := w.topics[m.Channel]; t != nil {
				if m.Payload == wakeAll {
					for c := range t.wake {
						notify(c)
					}
				} else {
					wakeOne(t)
				}
			}
		}
		w.mu.Unlock()
	}
}

// wakeOne wakes one waiter of t that has no wake-up pending.
func wakeOne(t *topic) {
	for c := range t.wake {
		if notify(c) {
			return
		}
	}
}

func notify(c chan struct{}) bool {
	select {
	case c <- struct{}{}:
		return true
	default:
		return false
	}
}

func markReady(t *topic) {
	select {
	case <-t.ready:
	default:
		close(t.ready)
	}
}

// retry calls try until it succeeds, and returns nil then. Without wait it
// calls try once and returns ErrNotAcquired if that failed. With wait it
// sleeps between tries until a message on channel wakes it, or until
// pollDelay(retryIn) passes, where retryIn is what the last try said about
// when things may change (-1: no idea). It returns ctx.Err() itself when ctx
// ends, and other errors prefixed with op and name: "lock: obtain "k": ...".
//
// The first failed try comes before the subscription, so an uncontended
// acquisition costs no subscription; the try right after subscribing
// catches a release announced in between. Every synchronizer of [Redis]
// waits through here, on the one shared subscription.
func (r *Redis) retry(ctx context.Context, op, name, channel string, wait bool,
	try func(ctx context.Context) (ok bool, retryIn time.Duration, err error)) error {
	var w *waiter
	defer func() {
		if w != nil {
			w.leave()
		}
	}()
	var poll *time.Timer
	for {
		ok, retryIn, err := try(ctx)
		switch {
		case err != nil && ctx.Err() != nil:
			return ctx.Err()
		case err != nil:
			return fmt.Errorf("lock: %s %q: %w", op, name, err)
		case ok:
			return nil
		case !wait:
			return ErrNotAcquired
		case w == nil:
			if w, err = r.waiters.join(ctx, channel); err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				return fmt.Errorf("lock: %s %q: wait: %w", op, name, err)
			}
			continue
		}
		d := pollDelay(retryIn, r.maxPoll)
		if poll == nil {
			poll = time.NewTimer(d)
			defer poll.Stop()
		} else {
			poll.Reset(d)
		}
		select {
		case <-w.wake:
		case <-poll.C:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
