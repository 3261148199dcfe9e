package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/lock"
)

// Experiment 18: waiters poll for a lock, sleeping between tries.
//
// Some work must wait for a lock rather than give up: requests that
// adjust one voucher's stock one after another, say. The course's first
// retry is a loop: try, sleep a little, try again. Redisson does not poll:
// a waiter subscribes to the lock's channel, the holder's release
// publishes on it, and the waiter tries again when told. Polling costs
// twice. Every waiter asks Redis once per interval for as long as the lock
// is held, whether or not anything changed: a thousand waiters polling
// every 10 ms are 100,000 commands a second that tell nobody anything.
// And a release goes unnoticed until the next poll: the lock lies free
// while a waiter sleeps, half an interval on average. A shorter interval
// trades the second cost for more of the first. Package lock's Wait is
// Redisson's way: its release script publishes, and the waiter's shared
// subscription wakes one waiter at once.
//
// The lab times the story on a clock of its own (stepClock): the work
// under the lock and the pollers' sleeps take its time, not the real one,
// so the counts are the same on every run however busy the machine.
var lockWaitPolling = experiment{
	name:   "lock-wait-polling",
	title:  "waiters poll for the lock, sleeping between tries",
	counts: "late handoff",
	lesson: "wait to be told: subscribe to the release (lock.Wait), don't sleep and try again",
	broken: func(ctx context.Context) (outcome, error) { return handoffs(ctx, obtainPolling) },
	fixed:  func(ctx context.Context) (outcome, error) { return handoffs(ctx, obtainWoken) },
}

// The story: A holds the lock; four waiters arrive and queue for it; each
// holder works for pollWork, then releases. The pollers sleep pollEvery
// between tries.
const (
	pollWaiters = 4
	pollEvery   = 50 * time.Millisecond
	pollWork    = 120 * time.Millisecond
	pollKey     = "voucher:1:restock"
)

// waitFunc obtains the lock named pollKey, waiting as long as it takes.
// sleep is the lab's clock: where a service would call time.Sleep(d), the
// variant calls sleep(d).
type waitFunc func(ctx context.Context, locks *lock.Redis, sleep func(time.Duration) error) (lock.Lock, error)

// handoffs runs the story and counts, for each release, how long the lock
// lay free on the lab's clock before the next waiter had it: a handoff
// later than at once is a violation. It also counts every try of the
// lock the waiters made (looks), on the client they share.
func handoffs(ctx context.Context, obtain waitFunc) (outcome, error) {
	_, rdb, closeRedis, err := openRedis()
	if err != nil {
		return outcome{}, err
	}
	defer closeRedis()
	looks := &lookCounter{}
	rdb.AddHook(looks)
	locks := lock.NewRedis(rdb)
	clk := newStepClock()

	a, err := locks.Obtain(ctx, pollKey, lockTTL)
	if err != nil {
		return outcome{}, fmt.Errorf("holder A: %w", err)
	}
	clk.enter(0) // A holds the lab's clock until every waiter waits

	var (
		mu       sync.Mutex
		released time.Duration   // when the last release happened
		gaps     []time.Duration // release to next acquisition, each handoff
	)
	work := func(id int, lk lock.Lock) error {
		if err := clk.sleep(ctx, id, pollWork); err != nil {
			return err
		}
		mu.Lock()
		released = clk.now()
		mu.Unlock()
		err := lk.Release(context.WithoutCancel(ctx))
		clk.exit(id)
		return err
	}
	errs := make([]error, pollWaiters)
	var wg sync.WaitGroup
	for i := range pollWaiters {
		id := i + 1
		wg.Go(func() {
			wctx := context.WithValue(ctx, waiterKey{}, id)
			lk, err := obtain(wctx, locks, func(d time.Duration) error { return clk.sleep(ctx, id, d) })
			if err != nil {
				errs[i] = fmt.Errorf("waiter %d: %w", id, err)
				clk.exit(id)
				return
			}
			clk.enter(id)
			mu.Lock()
			gaps = append(gaps, clk.now()-released)
			mu.Unlock()
			errs[i] = work(id, lk)
		})
	}
	// Every waiter waits before A's work may end: a poller once it sleeps
	// on the clock, a woken waiter once it has tried twice (once before it
	// subscribed, once after). Real time, briefly: the lab's own harness.
	for !waiting(clk, looks) {
		if ctx.Err() != nil {
			wg.Wait()
			return outcome{}, ctx.Err()
		}
		time.Sleep(time.Millisecond)
	}
	if err := work(0, a); err != nil {
		return outcome{}, fmt.Errorf("holder A: %w", err)
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return outcome{}, err
	}

	late, idle := 0, time.Duration(0)
	for _, g := range gaps {
		if g > 0 {
			late++
			idle += g
		}
	}
	n := int(looks.total.Load())
	summary := fmt.Sprintf("%d waiters tried %d times; each woken as the lock was released", pollWaiters, n)
	if late > 0 {
		summary = fmt.Sprintf("%d waiters tried %d times; the lock lay free %v in all", pollWaiters, n, idle)
	}
	return outcome{
		violations: late,
		summary:    summary,
		measures: map[string]int{
			"handoffs": len(gaps), "tries": n, "refused_tries": n - len(gaps),
			"free_ms": int(idle / time.Millisecond),
		},
	}, nil
}

// waiting reports whether every waiter waits: asleep on the lab's clock
// (a poller), or done with its first two tries (lock.Wait: one to find
// the lock taken, one after subscribing, then it sleeps until told).
func waiting(clk *stepClock, looks *lookCounter) bool {
	for id := 1; id <= pollWaiters; id++ {
		if !clk.asleep(id) && looks.of(id) < 2 {
			return false
		}
	}
	return true
}

// waiterKey tags a waiter's context with its number, for lookCounter.
type waiterKey struct{}

// lookCounter counts the tries of the lock a waiter made: the commands
// that set the lock's key (SET NX, or package lock's obtain script, which
// a waiting Obtain runs for the holder's remaining ttl). A command Redis
// refused to run (NOSCRIPT, before the script is loaded) is not a try.
type lookCounter struct {
	total atomic.Int64
	mu    sync.Mutex
	by    map[int]int
}

func (c *lookCounter) of(id int) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.by[id]
}

func (c *lookCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *lookCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		id, ok := ctx.Value(waiterKey{}).(int)
		if ok && err == nil && slices.Contains([]string{"set", "eval", "evalsha"}, cmd.Name()) {
			c.total.Add(1)
			c.mu.Lock()
			if c.by == nil {
				c.by = map[int]int{}
			}
			c.by[id]++
			c.mu.Unlock()
		}
		return err
	}
}

func (c *lookCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// A stepClock is the lab's clock for experiment 18: its time moves only
// when every participant sleeps on it, and then straight to the earliest
// wake-up. Participants (A and the waiters, while they work, and pollers,
// while they poll) run one at a time from one instant to the next, so the
// story comes out the same on every run, however slow the machine. A
// waiter blocked in lock.Wait is no participant: it sleeps on its
// subscription, and nothing on the clock can move while the only holder
// releases the lock and the next one is woken.
type stepClock struct {
	mu       sync.Mutex
	t        time.Duration
	seq      int
	running  map[int]bool // participants at work: time stands still
	sleepers []*sleeper   // by wake-up, then by order of arrival
}

type sleeper struct {
	id   int
	at   time.Duration
	seq  int
	wake chan struct{}
}

func newStepClock() *stepClock { return &stepClock{running: map[int]bool{}} }

func (c *stepClock) now() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// enter makes id a participant at work: time stands still until it sleeps
// or exits.
func (c *stepClock) enter(id int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.running[id] = true
}

// exit ends id's part.
func (c *stepClock) exit(id int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.running, id)
	c.advance()
}

// asleep reports whether id sleeps on the clock.
func (c *stepClock) asleep(id int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.ContainsFunc(c.sleepers, func(s *sleeper) bool { return s.id == id })
}

// sleep returns once the clock has moved d on and it is id's turn; id is
// a participant at work again then.
func (c *stepClock) sleep(ctx context.Context, id int, d time.Duration) error {
	c.mu.Lock()
	c.seq++
	s := &sleeper{id: id, at: c.t + d, seq: c.seq, wake: make(chan struct{})}
	c.sleepers = append(c.sleepers, s)
	slices.SortFunc(c.sleepers, func(x, y *sleeper) int {
		if x.at != y.at {
			return int(x.at - y.at)
		}
		return x.seq - y.seq
	})
	delete(c.running, id)
	c.advance()
	c.mu.Unlock()
	select {
	case <-s.wake:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// advance wakes the earliest sleeper if nobody is at work. c.mu is held.
func (c *stepClock) advance() {
	if len(c.running) > 0 || len(c.sleepers) == 0 {
		return
	}
	s := c.sleepers[0]
	c.sleepers = c.sleepers[1:]
	c.t = s.at
	c.running[s.id] = true
	close(s.wake)
}
