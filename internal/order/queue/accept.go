package queue

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/idworker"
	"seckill/internal/stock"
)

// Accepting an order: the whole of async mode's buy button in Redis. A 200
// then promises that the order is in Redis, as durable as Redis is (run it
// with an append-only file), and in MySQL within moments.

var (
	//go:embed accept.lua
	acceptSrc    string
	acceptScript = redis.NewScript(acceptSrc)

	//go:embed lost.lua
	lostSrc    string
	lostScript = redis.NewScript(lostSrc)
)

// Result is what accept.lua decided; the values are its return codes.
type Result int

const (
	Queued        Result = 0 // the unit is taken and the order is in the stream
	SoldOut       Result = 1 // no unit left in Redis
	AlreadyBought Result = 2 // the user holds an order (or a queued one)
	StockMissing  Result = 3 // the voucher's stock key is missing: reload it, then try again
	// Voided: the request was declared lost (Lost) before the script ran:
	// its caller was already answered, and it did nothing.
	Voided Result = 4
	// noDeadLetter: a replayed dead letter is no longer there (replayed
	// already). Replay's only.
	noDeadLetter Result = 5
	// Lapsed: the buyer's claim in their home bucket was too old to take
	// a unit elsewhere for it (the request stalled for half a hold):
	// nothing was taken, and the claim is dropped.
	Lapsed Result = 6
	// AlreadyBuying: another request of the user holds a claim in their
	// home bucket; if it fails, the user may buy again.
	AlreadyBuying Result = 7
	// NotAdmitted: the voucher has a waiting room (Entry.Room), and the
	// user is not admitted, or their hold has ended.
	NotAdmitted Result = 8
)

// Accept takes a unit of e's voucher for e's user and appends the order to
// the stream, in one step, unless the voucher is sold out in Redis or the
// user already bought it.
//
// A voucher split into buckets (e.Buckets > 1) is asked at the user's
// home bucket first, as Take does in sync mode. Only when that is empty
// does Accept look at the others, claim the user at home (package stock's
// Claim: the one place that says who bought, across buckets), and queue
// the order with a unit of the first bucket that has one, in that
// bucket's shard's stream: each order is still one script, in one slot,
// whichever bucket its unit came from. Accept sets e.Bucket to the bucket
// it asked last.
//
// An error that is ErrRefused means Redis refused the script (or the
// claim) at its first write: nothing was accepted, for certain. Any other
// error (Redis' own, unwrapped) means nothing was accepted, or only the
// answer was lost after the script ran, or the script may still run (the
// command sits in a stalled connection): whoever must tell the buyer asks
// Lost, with e as Accept left it.
func (q *Queue) Accept(ctx context.Context, e *Entry) (Result, error) {
	e.Bucket = e.home()
	res, err := q.run(ctx, *e, e.voidKey(), "", 0)
	if err != nil || e.Buckets <= 1 || res != SoldOut {
		return res, err
	}
	return q.elsewhere(ctx, e, "", Entry.voidKey)
}

// elsewhere queues e's order with a unit of a bucket other than its
// user's home, which said sold out, claiming the user at home first. A
// replay (replay, a dead letter's ID) is asked only at e.Bucket, where the
// dead letter is; a new order at every bucket with units left. last names
// accept.lua's last key for an entry of the bucket asked.
func (q *Queue) elsewhere(ctx context.Context, e *Entry, replay string, last func(Entry) string) (Result, error) {
	buckets := []int{e.Bucket}
	if replay == "" {
		var missing bool
		var err error
		buckets, missing, err = q.stocks.Elsewhere(ctx, e.VoucherID, e.Buckets, e.UserID)
		switch {
		case err != nil:
			return 0, err // only read: nothing taken
		case missing:
			return StockMissing, nil
		case len(buckets) == 0:
			return SoldOut, nil
		}
	}
	claimed, claim, err := q.stocks.Claim(ctx, e.VoucherID, e.Buckets, e.UserID)
	if err != nil {
		// The claim may have been made: it expires, and the sweeper,
		// finding no order, forgets the buyer. Unless Redis refused it.
		return 0, refusal(err)
	}
	switch claim {
	case stock.Taken:
	case stock.AlreadyBought:
		return AlreadyBought, nil
	case stock.AlreadyBuying:
		return AlreadyBuying, nil
	case stock.Missing:
		return StockMissing, nil
	default:
		return 0, fmt.Errorf("claim buyer: unknown answer %d", claim)
	}
	e.claim = claimed
	for _, b := range buckets {
		e.Bucket = b
		res, err := q.run(ctx, *e, last(*e), replay, claimed.Until)
		switch {
		case errors.Is(err, ErrRefused):
			q.unclaim(ctx, *e) // nothing taken in this bucket: as SoldOut's end
			return 0, err
		case err != nil:
			// The claim stays: Lost (or, for a replay, the sweeper) knows
			// whether to keep it.
			return 0, err
		case res == Queued:
			q.keepClaim(ctx, *e)
			return Queued, nil
		case res != SoldOut:
			q.unclaim(ctx, *e)
			return res, nil
		}
	}
	q.unclaim(ctx, *e)
	return SoldOut, nil
}

// unclaim drops the claim of e's user whose unit was not taken. If that
// fails, the claim expires, and the sweeper, finding no order, forgets
// the buyer: until then they are told "already bought".
func (q *Queue) unclaim(ctx context.Context, e Entry) {
	q.stocks.Unclaim(context.WithoutCancel(ctx), e.VoucherID, e.Buckets, e.UserID, e.claim)
}

// keepClaim closes the claim of e's user once e's order is queued, on a
// context of its own: a client that hangs up must not leave the claim
// open, which tells the user "busy" until the sweeper closes it. If it
// fails all the same, the claim expires, and the sweeper, finding the
// order accepted, keeps the buyer.
func (q *Queue) keepClaim(ctx context.Context, e Entry) {
	q.stocks.KeepClaim(context.WithoutCancel(ctx), e.VoucherID, e.Buckets, e.UserID, e.claim, e.OrderID)
}

// run runs accept.lua for e in e.Bucket.
func (q *Queue) run(ctx context.Context, e Entry, last, replay string, until int64) (Result, error) {
	code, err := acceptScript.Run(ctx, q.rdb, e.keys(last), e.args(replay, until)...).Int()
	if err != nil {
		return 0, refusal(err)
	}
	return Result(code), nil
}

// ErrRefused: Redis refused the script (or the claim before it) at its
// first write, so it wrote nothing. Unlike an answer lost on the way, this
// one is certain: the buyer can be told 503 at once, with nothing to ask
// Lost (whose void mark, a write, Redis would refuse too, until the
// request's time ran out).
var ErrRefused = errors.New("queue: Redis refused the order before taking anything")

// refusal marks err as ErrRefused when it is one of Redis' refusals of a
// write: OOM (full, at maxmemory), MISCONF (it cannot save to disk),
// READONLY (a replica) or NOREPLICAS (min-replicas-to-write not met).
// Redis checks them at a script's first write, and once a script has
// written it is let finish (OOM is not checked again; the others cannot
// change while a script runs), so such an error means the script wrote
// nothing.
//
// Two conditions make that true. Redis 7 or later: Redis 6 wraps a
// script's refusal as "ERR Error running script ...", which is not
// matched, and goes to Lost as before (safe, only slow). And a client that
// never sends a command again by itself (MaxRetries -1, as the server's
// is): a command sent again after a broken connection and refused the
// second time may have run the first.
func refusal(err error) error {
	for _, prefix := range []string{"OOM", "MISCONF", "READONLY", "NOREPLICAS"} {
		if redis.HasErrorPrefix(err, prefix) {
			return fmt.Errorf("%w: %w", ErrRefused, err)
		}
	}
	return err
}

// voidFor is how long a void mark outlives its request: longer than a
// request could plausibly sit in a stalled connection.
const voidFor = 10 * time.Minute

// ErrUnknown: Redis could not be asked, within the caller's time, whether
// an order whose answer was lost was accepted. It may have been.
var ErrUnknown = errors.New("queue: whether the order was accepted is unknown")

// Lost tells what became of an Accept of e that returned an error. If
// Redis holds an accepted order of e's user for e's voucher, it returns
// its ID and true: the buyer gets a 200 and that ID, as the script would
// have said. If not, it voids the request (see lost.lua), so that the
// script does nothing should it reach Redis later, and returns false: a
// 503 then keeps its promise that nothing was taken. Redis may be away for
// a while: it asks until ctx ends, and then returns ErrUnknown.
//
// For a unit asked in a bucket other than the user's home, the claim at
// home is settled by the answer: kept if the order was accepted, dropped
// if it was voided (and left to expire if either step fails: the sweeper
// then asks where the order is, and finds the same answer).
func (q *Queue) Lost(ctx context.Context, e Entry) (int64, bool, error) {
	keys := []string{e.acceptedKey(), e.voidKey()}
	delay := 20 * time.Millisecond
	for {
		v, err := lostScript.Run(ctx, q.rdb, keys, e.UserID, voidFor.Milliseconds()).Result()
		switch {
		case errors.Is(err, redis.Nil):
			if e.Bucket != e.home() {
				q.unclaim(ctx, e)
			}
			return 0, false, nil
		case err == nil:
			id, err := idworker.FromScript(v)
			if err != nil {
				return 0, false, err
			}
			if e.Bucket != e.home() {
				q.keepClaim(ctx, e)
			}
			return id, true, nil
		}
		if ctx.Err() != nil {
			return 0, false, fmt.Errorf("%w: %w", ErrUnknown, err)
		}
		sleep(ctx, delay)
		delay = min(2*delay, 500*time.Millisecond)
	}
}

// sleep waits d, or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
