package stock

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// This file fills Redis from MySQL's figures and checks it against them:
// Init for a new voucher, Load after keys were lost, Reconcile when the
// count drifted, and Left, Forget and Vouchers around them. It uses
// buckets.go, keys.go and stock.go; never take.go or holds.go.

// Init sets a new voucher's stock, split evenly over its n buckets, and
// lists it for the sweeper.
func (s *Store) Init(ctx context.Context, voucherID, stock int64, n int) error {
	n = max(n, 1)
	// A plain pipeline, not MULTI: the index and the buckets live in other
	// cluster slots.
	pipe := s.rdb.Pipeline()
	for b := range n {
		k := BucketKeys(voucherID, n, b)
		pipe.Del(ctx, k.Buyers, k.Holds, k.Claims, k.Returned, k.Dropped)
		pipe.Set(ctx, k.Stock, share(stock, n, b), 0)
	}
	pipe.SAdd(ctx, indexKey, voucherID)
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("init stock of voucher %d: %w", voucherID, err)
	}
	return nil
}

// bucketState reads each bucket's stock (-1: key missing), the units
// under holds (taken, not yet orders), and how many holds and claims are
// open in all.
func (s *Store) bucketState(ctx context.Context, voucherID int64, n int) (stocks []int64, held, open int64, err error) {
	pipe := s.rdb.Pipeline()
	gets := make([]*redis.StringCmd, n)
	cards := make([]*redis.IntCmd, 0, 2*n)
	for b := range n {
		k := BucketKeys(voucherID, n, b)
		gets[b] = pipe.Get(ctx, k.Stock)
		cards = append(cards, pipe.ZCard(ctx, k.Holds), pipe.ZCard(ctx, k.Claims))
	}
	// Every command's error is read: the first one (a missing key's
	// redis.Nil) must not hide a failed bucket.
	pipe.Exec(ctx)
	stocks = make([]int64, n)
	for b, get := range gets {
		v, err := get.Int64()
		switch {
		case errors.Is(err, redis.Nil):
			stocks[b] = -1
		case err != nil:
			return nil, 0, 0, fmt.Errorf("read stock of voucher %d: %w", voucherID, err)
		default:
			stocks[b] = v
		}
	}
	for i, c := range cards {
		if c.Err() != nil {
			return nil, 0, 0, fmt.Errorf("read holds of voucher %d: %w", voucherID, c.Err())
		}
		open += c.Val()
		if i%2 == 0 { // a holds key; the claims, in between, carry no unit
			held += c.Val()
		}
	}
	return stocks, held, open, nil
}

// Load rebuilds a voucher's lost buckets from the database's figures
// (left: units left in MySQL; buyers: users with an order; returned: the
// units MySQL took back whose return to Redis is still to be made, all
// read in one snapshot), unless another instance already did. Buyers and
// the returns go in first and the stock last: until the stock key exists
// every Take answers Missing, so no request is judged against a
// half-loaded set, and Return adds nothing (returns.go); once it exists,
// the returns counted in left are marked made, so that none is added
// twice. A bucketed voucher may lose some buckets and
// keep others (one master of a cluster lost its data): the lost ones share
// what MySQL has left beyond the units the others hold or are selling,
// and reconciliation corrects what that misjudges. It reports whether it
// loaded.
//
// seen, if not nil, is each bucket's stock (Levels) as read before the
// database's figures were: the higher of what a kept bucket had then and
// has now is subtracted from left. Async mode needs it: its orders taken
// from the kept buckets after the snapshot are in no snapshot (they were
// not yet queued), and subtracting only the lower stock of now would hand
// their units to the lost buckets a second time. (Sync mode passes nil:
// its orders in flight are units under holds, read here, now.)
func (s *Store) Load(ctx context.Context, voucherID int64, n int, left int64, buyers []int64, returned []Returned, seen []int64) (bool, error) {
	n = max(n, 1)
	stocks, held, _, err := s.bucketState(ctx, voucherID, n)
	if err != nil {
		return false, wrapLoad(voucherID, err)
	}
	var lost []int
	for b, v := range stocks {
		switch {
		case v < 0:
			lost = append(lost, b)
		case len(seen) == n && seen[b] >= 0:
			// The higher of then and now: a unit given back to a kept
			// bucket since (a dead letter, a return) is in its stock now
			// and in no snapshot's count; an order it took since is in
			// its stock then. Either way the lost buckets get no unit
			// twice; what this misjudges the other way (an order taken
			// between the read and the snapshot, counted in both) is a
			// unit too few, which reconciliation puts back.
			left -= max(seen[b], v)
		default:
			left -= v
		}
	}
	if len(lost) == 0 {
		return false, nil
	}
	// Units under holds will be orders in MySQL or come back to their
	// bucket: not the lost buckets' to sell.
	left = max(left-held, 0)
	// The returns MySQL counted in left are in left: none of them may be
	// added again, to whichever bucket it was bound for.
	if err := s.markReturned(ctx, voucherID, n, returned); err != nil {
		return false, wrapLoad(voucherID, err)
	}
	loaded := false
	for i, b := range lost {
		k := BucketKeys(voucherID, n, b)
		var members []any
		for _, u := range buyers {
			if Home(u, n) == b {
				members = append(members, u)
			}
		}
		const chunk = 1000
		for len(members) > 0 {
			c := min(chunk, len(members))
			if err := s.rdb.SAdd(ctx, k.Buyers, members[:c]...).Err(); err != nil {
				return false, wrapLoad(voucherID, err)
			}
			members = members[c:]
		}
		set, err := s.rdb.SetNX(ctx, k.Stock, share(left, len(lost), i), 0).Result()
		if err != nil {
			return false, wrapLoad(voucherID, err)
		}
		loaded = loaded || set
	}
	if err := s.rdb.SAdd(ctx, indexKey, voucherID).Err(); err != nil {
		return false, wrapLoad(voucherID, err)
	}
	return loaded, nil
}

func wrapLoad(voucherID int64, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("load stock of voucher %d: %w", voucherID, err)
}

// Levels reads each of the voucher's n buckets' stock, -1 where the key
// is missing: what Load's seen wants.
func (s *Store) Levels(ctx context.Context, voucherID int64, n int) ([]int64, error) {
	stocks, _, _, err := s.bucketState(ctx, voucherID, max(n, 1))
	return stocks, err
}

// Left returns the units left over all of the voucher's n buckets; ok is
// false when a bucket's key is missing.
func (s *Store) Left(ctx context.Context, voucherID int64, n int) (left int64, ok bool, err error) {
	if n <= 1 {
		left, err = s.rdb.Get(ctx, KeysOf(voucherID).Stock).Int64()
		if errors.Is(err, redis.Nil) {
			return 0, false, nil
		}
		if err != nil {
			return 0, false, fmt.Errorf("read stock of voucher %d: %w", voucherID, err)
		}
		return left, true, nil
	}
	stocks, _, _, err := s.bucketState(ctx, voucherID, n)
	if err != nil {
		return 0, false, err
	}
	for _, v := range stocks {
		if v < 0 {
			return 0, false, nil
		}
		left += v
	}
	return left, true, nil
}

// Forget takes a voucher off the sweeper's list, and lets its keys (and
// others given, of the same voucher) expire after keep: its sale is over,
// and no request reads them any more (the sale window is checked first),
// but a reader of GET /vouchers may for a while.
func (s *Store) Forget(ctx context.Context, voucherID int64, n int, keep time.Duration, others ...string) error {
	pipe := s.rdb.Pipeline()
	pipe.SRem(ctx, indexKey, voucherID)
	keys := others
	for b := range max(n, 1) {
		k := BucketKeys(voucherID, n, b)
		keys = append(keys, append(k.all(), k.Returned, k.Dropped)...)
	}
	for _, key := range keys {
		pipe.Expire(ctx, key, keep)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("forget voucher %d: %w", voucherID, err)
	}
	return nil
}

// Vouchers lists the vouchers that have stock keys.
func (s *Store) Vouchers(ctx context.Context) ([]int64, error) {
	members, err := s.rdb.SMembers(ctx, indexKey).Result()
	if err != nil {
		return nil, fmt.Errorf("list vouchers with stock: %w", err)
	}
	return parseIDs(members)
}

// ErrNotNow, returned by Reconcile's truth function, says the database's
// figure cannot be trusted at this moment (writes are still queued).
var ErrNotNow = errors.New("stock: not a quiet moment")

var (
	//go:embed reconcile.lua
	reconcileSrc    string
	reconcileScript = redis.NewScript(reconcileSrc)
)

// Reconcile sets voucher's stock (the sum over its n buckets) to the
// database's figure, which truth reads, if it drifted and nothing moved
// meanwhile (see reconcile.lua). Drift has rare causes: a Redis flush or a
// failover while requests were between Take and Confirm, or a stalled
// request whose hold was reclaimed before it committed. It reports whether
// it corrected anything.
//
// With one bucket, the script checks that the count it corrects is the one
// read before the truth. With several, no script sees them all: they are
// read again after the truth, and the correction is made only if none moved
// and no hold or claim was open at either reading; each bucket's script
// still checks its own count before changing it.
func (s *Store) Reconcile(ctx context.Context, voucherID int64, n int, truth func(context.Context) (int64, error)) (bool, error) {
	n = max(n, 1)
	before, _, open, err := s.bucketState(ctx, voucherID, n)
	if err != nil {
		return false, fmt.Errorf("reconcile stock of voucher %d: %w", voucherID, err)
	}
	if open > 0 || slices.Contains(before, -1) {
		return false, nil // a sale moving, or a key missing: the next Take reloads it
	}
	want, err := truth(ctx)
	if errors.Is(err, ErrNotNow) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if n > 1 {
		after, _, open, err := s.bucketState(ctx, voucherID, n)
		if err != nil {
			return false, fmt.Errorf("reconcile stock of voucher %d: %w", voucherID, err)
		}
		if open > 0 || !slices.Equal(before, after) {
			return false, nil
		}
	}
	var sum int64
	for _, v := range before {
		sum += v
	}
	diff := want - sum
	fixed := false
	// Units missing go to the first bucket; units too many come off the
	// buckets in order.
	for b := 0; b < n && diff != 0; b++ {
		change := diff
		if diff < 0 {
			change = -min(before[b], -diff)
		}
		if change == 0 {
			continue
		}
		k := BucketKeys(voucherID, n, b)
		done, err := reconcileScript.Run(ctx, s.rdb, []string{k.Stock, k.Holds}, before[b], before[b]+change).Int()
		if err != nil {
			return fixed, fmt.Errorf("reconcile stock of voucher %d: %w", voucherID, err)
		}
		if done != 1 {
			return fixed, nil // it moved: the next round tries again
		}
		fixed = true
		diff -= change
	}
	return fixed, nil
}

func parseIDs(members []string) ([]int64, error) {
	ids := make([]int64, 0, len(members))
	for _, m := range members {
		id, err := strconv.ParseInt(m, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("stock: malformed ID %q in Redis", m)
		}
		ids = append(ids, id)
	}
	return ids, nil
}
