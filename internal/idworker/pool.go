package idworker

import (
	"context"
	"errors"
	"sync"
	"time"
)

// Pool hands out IDs from sequence numbers reserved in Redis a block at a
// time: one INCRBY serves Block IDs, so most IDs cost no round trip at all.
//
// It is also what lets the stock scripts run on Redis Cluster. A script
// may touch only keys of one slot, and the day's sequence is one key for
// every voucher: a script that drew the ID itself would touch two slots.
// Drawing it here, outside the script, leaves each script with its
// voucher's keys alone.
//
// An ID is made when it is handed out: the seconds of that moment, and a
// number reserved for the same UTC day. Numbers are unique within their
// day and the seconds tell the days apart, so IDs stay unique however long
// a number waited in the pool; numbers of a past day are dropped.
//
// Numbers reserved and never used are lost (a restart, a new day, a block
// older than MaxAge): gaps in the sequence, harmless. Numbers out in pools
// are why Seed starts a lost sequence SeedGap above its floor.
//
// A block is used for at most MaxAge. That keeps an ID's seconds close to
// when its number was reserved, so that the highest sequence number in use
// is found among the IDs of the last couple of minutes (order.IDFloor
// reads only those): a number reserved at 8:00 and handed out at 10:30
// would hide below newer IDs with higher numbers.
type Pool struct {
	w      *Worker
	prefix string
	block  int
	seed   func(ctx context.Context, t time.Time) error
	turn   chan struct{} // one reservation in flight at a time

	mu     sync.Mutex
	day    int64     // the UTC day (since 1970) of the numbers in free
	filled time.Time // when the numbers in free were reserved
	free   []int64   // reserved, not handed out; the next one last
}

// MaxAge is how long reserved numbers are handed out before the rest are
// dropped (see Pool).
const MaxAge = time.Minute

// Block is how many sequence numbers a Pool reserves at a time.
const Block = 128

// NewPool returns a Pool of prefix's IDs. When the day's sequence is
// missing it calls seed, then reserves again; seed nil means w.Seed.
func (w *Worker) NewPool(prefix string, seed func(ctx context.Context, t time.Time) error) *Pool {
	if seed == nil {
		seed = func(ctx context.Context, t time.Time) error { return w.Seed(ctx, prefix, t) }
	}
	return &Pool{w: w, prefix: prefix, block: Block, seed: seed, turn: make(chan struct{}, 1), free: make([]int64, 0, Block)}
}

// Next returns a new ID. It makes a round trip only when the pool is empty,
// and then only one caller of the instance does while the others wait for
// its block.
func (p *Pool) Next(ctx context.Context) (int64, error) {
	for attempt := 0; ; attempt++ {
		if id, ok, err := p.take(); ok || err != nil {
			return id, err
		}
		select {
		case p.turn <- struct{}{}:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
		id, err := p.refill(ctx)
		<-p.turn
		if !errors.Is(err, ErrSequenceMissing) || attempt == 2 {
			return id, err
		}
		if err := p.seed(ctx, p.w.now()); err != nil {
			return 0, err
		}
	}
}

// take hands out a free number, if there is one for today.
func (p *Pool) take() (int64, bool, error) {
	now := p.w.now()
	secs, err := seconds(now)
	if err != nil {
		return 0, false, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if day := dayOf(now); day != p.day || now.Sub(p.filled) > MaxAge {
		p.day, p.free = day, p.free[:0]
	}
	n := len(p.free)
	if n == 0 {
		return 0, false, nil
	}
	seq := p.free[n-1]
	p.free = p.free[:n-1]
	return secs<<sequenceBits | seq, true, nil
}

// refill reserves a block and hands out its first number, unless another
// caller refilled the pool while this one waited for its turn.
func (p *Pool) refill(ctx context.Context) (int64, error) {
	if id, ok, err := p.take(); ok || err != nil {
		return id, err
	}
	now := p.w.now()
	secs, err := seconds(now)
	if err != nil {
		return 0, err
	}
	first, last, err := p.w.reserve(ctx, p.prefix, now, p.block)
	if err != nil {
		return 0, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.day, p.filled, p.free = dayOf(now), now, p.free[:0]
	for seq := last; seq > first; seq-- {
		p.free = append(p.free, seq)
	}
	return secs<<sequenceBits | first, nil
}

// Return gives back an ID that Next handed out and that was not used (the
// buyer was turned away): it is handed out again, with the time of then.
// An ID of another day is dropped.
func (p *Pool) Return(id int64) {
	day := dayOf(Epoch.Add(time.Duration(id>>sequenceBits) * time.Second))
	p.mu.Lock()
	defer p.mu.Unlock()
	if day == p.day {
		p.free = append(p.free, id&maxSequence)
	}
}

func dayOf(t time.Time) int64 { return t.Unix() / 86400 }
