package stock

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// LeftOf is Left for many vouchers at once, in one pipeline: a list of
// vouchers (GET /vouchers) shows each one's stock for one round trip, not
// one per row. ids[i] has parts[i] buckets; left[i] and ok[i] are what
// Left would answer for it (ok false: a bucket's key is missing).
func (s *Store) LeftOf(ctx context.Context, ids []int64, parts []int) (left []int64, ok []bool, err error) {
	pipe := s.rdb.Pipeline()
	gets := make([][]*redis.StringCmd, len(ids))
	for i, id := range ids {
		n := max(parts[i], 1)
		for b := range n {
			gets[i] = append(gets[i], pipe.Get(ctx, BucketKeys(id, n, b).Stock))
		}
	}
	if len(ids) > 0 {
		pipe.Exec(ctx) // each command's error is read below: a missing key's redis.Nil is no failure
	}
	left, ok = make([]int64, len(ids)), make([]bool, len(ids))
	for i, cmds := range gets {
		ok[i] = true
		for _, get := range cmds {
			v, err := get.Int64()
			switch {
			case errors.Is(err, redis.Nil):
				ok[i] = false
			case err != nil:
				return nil, nil, fmt.Errorf("read stock of voucher %d: %w", ids[i], err)
			}
			left[i] += v
		}
		if !ok[i] {
			left[i] = 0
		}
	}
	return left, ok, nil
}
