package queue

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/idworker"
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
)

// Accept takes a unit of e's voucher for e's user and appends the order to
// the stream, in one step, unless the voucher is sold out in Redis or the
// user already bought it.
//
// An error (Redis' own, unwrapped) means nothing was accepted, or only
// the answer was lost after the script ran, or the script may still run
// (the command sits in a stalled connection). Whoever must tell the buyer
// asks Lost.
func (q *Queue) Accept(ctx context.Context, e Entry) (Result, error) {
	code, err := acceptScript.Run(ctx, q.rdb, e.keys(voidKey(e.VoucherID, e.OrderID)), e.args()...).Int()
	if err != nil {
		return 0, err
	}
	return Result(code), nil
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
func (q *Queue) Lost(ctx context.Context, e Entry) (int64, bool, error) {
	keys := []string{acceptedKey(e.VoucherID), voidKey(e.VoucherID, e.OrderID)}
	delay := 20 * time.Millisecond
	for {
		v, err := lostScript.Run(ctx, q.rdb, keys, e.UserID, voidFor.Milliseconds()).Result()
		switch {
		case errors.Is(err, redis.Nil):
			return 0, false, nil
		case err == nil:
			id, err := idworker.FromScript(v)
			if err != nil {
				return 0, false, err
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
