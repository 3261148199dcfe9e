package queue

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/redis/go-redis/v9"

	"seckill/internal/stock"
)

// What package order asks of the queue about the orders in it.

// Find looks up an accepted order not yet written to MySQL, in every
// shard (an order ID does not tell its voucher). found is false when no
// shard knows it; failed is true once it was dead-lettered.
func (q *Queue) Find(ctx context.Context, orderID int64) (e Entry, failed, found bool, err error) {
	pipe := q.rdb.Pipeline()
	cmds := make([]*redis.StringCmd, stock.Shards)
	for k := range cmds {
		cmds[k] = pipe.HGet(ctx, pendingKey(k), strconv.FormatInt(orderID, 10))
	}
	pipe.Exec(ctx) // each command's own error is read below
	v := ""
	for _, c := range cmds {
		if err := answered(c); err != nil {
			return Entry{}, false, false, fmt.Errorf("find pending order %d: %w", orderID, err)
		}
		if c.Err() == nil {
			v = c.Val()
		}
	}
	if v == "" {
		return Entry{}, false, false, nil
	}
	e, status, ok := parseMarker(orderID, v)
	if !ok {
		return Entry{}, false, false, fmt.Errorf("find pending order %d: malformed %q", orderID, v)
	}
	return e, status == markFailed, true, nil
}

// Queued returns the orders of voucherID (of n buckets) that are in its
// streams and still marked pending: accepted, not yet written (a
// dead-lettered entry stays in the stream until trimmed, but its order
// will never be written). Some may be written meanwhile; the caller tells
// them apart in MySQL.
func (q *Queue) Queued(ctx context.Context, voucherID int64, n int) ([]Entry, error) {
	var out []Entry
	for _, shard := range shardsOf(voucherID, n) {
		var mine []Entry
		seen := map[int64]bool{}
		err := q.eachEntry(ctx, StreamKey(shard), func(m redis.XMessage) {
			// An order appears twice after its dead letter was replayed (the
			// first entry stays until the stream is trimmed): it is one order.
			if e, err := parseEntry(m); err == nil && e.VoucherID == voucherID && !seen[e.OrderID] {
				seen[e.OrderID] = true
				mine = append(mine, e)
			}
		})
		if err != nil {
			return nil, fmt.Errorf("read stream: %w", err)
		}
		for chunk := range slices.Chunk(mine, 1000) {
			fields := make([]string, len(chunk))
			for i, e := range chunk {
				fields[i] = strconv.FormatInt(e.OrderID, 10)
			}
			vals, err := q.rdb.HMGet(ctx, pendingKey(shard), fields...).Result()
			if err != nil {
				return nil, fmt.Errorf("read pending markers: %w", err)
			}
			for i, v := range vals {
				str, _ := v.(string)
				if _, status, ok := parseMarker(chunk[i].OrderID, str); ok && status == markPending {
					out = append(out, chunk[i])
				}
			}
		}
	}
	return out, nil
}

// shardsOf lists the shards whose streams take the orders of voucherID
// (of n buckets): one per bucket.
func shardsOf(voucherID int64, n int) []int {
	shards := make([]int, max(n, 1))
	for b := range shards {
		shards[b] = stock.BucketShard(voucherID, n, b)
	}
	return shards
}

// Quiet reports whether every order of voucherID (of n buckets) accepted
// in the streams has been written: each bucket's count of queued orders is
// zero, and, where its stream holds entries at all, the consumer group
// exists. A stream without the group is not quiet: after Redis restarted
// empty, accept.lua recreates the stream (and the count) before any
// consumer recreates the group, and orders wait that nobody has seen.
func (q *Queue) Quiet(ctx context.Context, voucherID int64, n int) (bool, error) {
	for b, shard := range shardsOf(voucherID, n) {
		stream := StreamKey(shard)
		pipe := q.rdb.Pipeline()
		queued := pipe.Get(ctx, Entry{VoucherID: voucherID, Buckets: n, Bucket: b}.queuedKey())
		length := pipe.XLen(ctx, stream)
		pipe.Exec(ctx) // each command's own error is read below
		if err := errors.Join(answered(queued), answered(length)); err != nil {
			return false, err
		}
		if n, _ := queued.Int64(); n > 0 {
			return false, nil
		}
		if length.Val() == 0 {
			continue
		}
		groups, err := q.rdb.XInfoGroups(ctx, stream).Result()
		if err != nil {
			return false, err
		}
		if !slices.ContainsFunc(groups, func(g redis.XInfoGroup) bool { return g.Name == GroupName }) {
			return false, nil
		}
	}
	return true, nil
}

// AcceptedOf returns the orders of voucherID (of n buckets) that users had
// accepted in Redis, by user (0 for none): in any bucket, whether written
// to MySQL since or not, but for those dead-lettered. What the sweeper
// asks, besides MySQL, before it forgets a buyer whose claim expired: the
// request may have died after queueing the order with a unit of another
// bucket, and before closing the claim.
func (q *Queue) AcceptedOf(ctx context.Context, voucherID int64, n int, users []int64) (map[int64]int64, error) {
	fields := make([]string, len(users))
	for i, u := range users {
		fields[i] = strconv.FormatInt(u, 10)
	}
	out := make(map[int64]int64, len(users))
	for b := range max(n, 1) {
		key := Entry{VoucherID: voucherID, Buckets: n, Bucket: b}.acceptedKey()
		vals, err := q.rdb.HMGet(ctx, key, fields...).Result()
		if err != nil {
			return nil, fmt.Errorf("read accepted orders of voucher %d: %w", voucherID, err)
		}
		for i, v := range vals {
			if str, ok := v.(string); ok {
				if id, err := strconv.ParseInt(str, 10, 64); err == nil {
					out[users[i]] = id
				}
			}
		}
	}
	return out, nil
}

// EachOrderID calls fn with the order ID of every entry in every stream
// and every dead letter (accepted, or dead-lettered and perhaps replayed
// later): where package order looks, besides MySQL, for the highest ID in
// use after Redis lost the ID sequence.
func (q *Queue) EachOrderID(ctx context.Context, fn func(id int64)) error {
	for k := range stock.Shards {
		for _, key := range []string{StreamKey(k), deadKey(k)} {
			err := q.eachEntry(ctx, key, func(m redis.XMessage) {
				if id, err := strconv.ParseInt(field(m, fieldOrder), 10, 64); err == nil {
					fn(id)
				}
			})
			if err != nil {
				return fmt.Errorf("order IDs in %s: %w", key, err)
			}
		}
	}
	return nil
}

// eachEntry calls fn with every entry of the stream key, oldest first, a
// thousand at a time.
func (q *Queue) eachEntry(ctx context.Context, key string, fn func(redis.XMessage)) error {
	from := "-"
	for {
		msgs, err := q.rdb.XRangeN(ctx, key, from, "+", 1000).Result()
		if err != nil {
			return err
		}
		for _, m := range msgs {
			fn(m)
		}
		if len(msgs) < 1000 {
			return nil
		}
		from = "(" + msgs[len(msgs)-1].ID
	}
}

// answered returns cmd's error unless it is redis.Nil (a key that does
// not exist, which is an answer). A pipeline's Exec reports only its first
// error: a Nil there would hide a failure of a later command, so each
// command is asked.
func answered(cmd redis.Cmder) error {
	if err := cmd.Err(); err != nil && !errors.Is(err, redis.Nil) {
		return err
	}
	return nil
}
