package stock

import (
	"context"
	_ "embed"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// This file gives back the unit of an order that was cancelled or
// refunded (Return), once. It uses buckets.go and keys.go.

var (
	//go:embed return.lua
	returnSrc    string
	returnScript = redis.NewScript(returnSrc)
)

// Returned is a unit MySQL took back (package order's stock_returns) that
// is bound for bucket Bucket of its voucher.
type Returned struct {
	Order  int64
	Bucket int
}

// ReturnResult is what Return did.
type ReturnResult int

// Return's results; the values are return.lua's codes.
const (
	ReturnAdded   ReturnResult = 1 // the unit is back on sale
	ReturnMadeOld ReturnResult = 0 // it was added before (or counted by Load): nothing changed
	ReturnNoStock ReturnResult = 3 // the bucket's stock key is missing: reload, then return again
)

// Return puts the units of rs back in their buckets of voucherID (of n
// buckets), each unless it was put back before: a bucket remembers each
// order returned to it (Keys.Returned), so that a return retried after a
// lost answer, or made by two instances at once, adds one unit. Where the
// stock key is missing (Redis lost it) it changes nothing and says so:
// the reload from MySQL counts the unit, and the return must be made again
// after it. It answers a result per return, or an error for them all
// (each may or may not have been made: making them again is safe).
//
// The first goes alone: it loads the script on a server that lacks it
// (EVALSHA, then EVAL), so that the rest can share one pipeline of
// EVALSHA, which cannot fall back. One that still meets NOSCRIPT (another
// master of a cluster) goes alone again.
func (s *Store) Return(ctx context.Context, voucherID int64, n int, rs []Returned) ([]ReturnResult, error) {
	out := make([]ReturnResult, len(rs))
	keys := func(r Returned) []string {
		k := BucketKeys(voucherID, n, r.Bucket)
		return []string{k.Stock, k.Returned}
	}
	alone := func(i int) error {
		code, err := returnScript.Run(ctx, s.rdb, keys(rs[i]), rs[i].Order).Int()
		if err != nil {
			return fmt.Errorf("return the unit of order %d to voucher %d: %w", rs[i].Order, voucherID, err)
		}
		out[i] = ReturnResult(code)
		return nil
	}
	if len(rs) == 0 {
		return out, nil
	}
	if err := alone(0); err != nil {
		return nil, err
	}
	pipe := s.rdb.Pipeline()
	cmds := make([]*redis.Cmd, len(rs))
	for i := 1; i < len(rs); i++ {
		cmds[i] = returnScript.EvalSha(ctx, pipe, keys(rs[i]), rs[i].Order)
	}
	if len(rs) > 1 {
		pipe.Exec(ctx) // each command's error is read below
	}
	for i := 1; i < len(rs); i++ {
		code, err := cmds[i].Int()
		switch {
		case err != nil && redis.HasErrorPrefix(err, "NOSCRIPT"):
			if err := alone(i); err != nil {
				return nil, err
			}
		case err != nil:
			return nil, fmt.Errorf("return the unit of order %d to voucher %d: %w", rs[i].Order, voucherID, err)
		default:
			out[i] = ReturnResult(code)
		}
	}
	return out, nil
}

// markReturned remembers returns as made, in their buckets, without adding
// their units (Load, whose figure from MySQL counts them).
func (s *Store) markReturned(ctx context.Context, voucherID int64, n int, returned []Returned) error {
	if len(returned) == 0 {
		return nil
	}
	pipe := s.rdb.Pipeline()
	for _, r := range returned {
		pipe.SAdd(ctx, BucketKeys(voucherID, n, r.Bucket).Returned, r.Order)
	}
	_, err := pipe.Exec(ctx)
	return err
}
