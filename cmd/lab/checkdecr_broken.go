package main

import "context"

// takeGetDecr reads the stock in Redis, and if some is left, takes a unit
// with DECR: two commands, and other buyers' commands in between.
//
// DECR always decrements; nothing in it says "only if there is still
// some". Redis runs each command alone, but not the pair.
func takeGetDecr(ctx context.Context, st *redisStock, _ int64, pause func()) error {
	left, err := st.rdb.Get(ctx, st.keys.Stock).Int()
	if err != nil {
		return err
	}
	if left <= 0 {
		return errSoldOut
	}

	pause() // the lab: every buyer has read the stock before anyone takes

	return st.rdb.Decr(ctx, st.keys.Stock).Err()
}
