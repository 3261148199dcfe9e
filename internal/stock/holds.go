package stock

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"sync"

	"github.com/redis/go-redis/v9"
)

// This file closes holds and claims: Confirm (ConfirmAll, for many) once
// the order row is committed, GiveBack or Drop when the request failed,
// Expired and Settle for the sweeper. It uses buckets.go, keys.go and
// stock.go; never take.go.

// Confirm closes h once its order row is committed, and makes sure the
// user is remembered as a buyer (a reload from MySQL may have happened
// while the order was being written). It reports whether the hold was
// still open.
func (s *Store) Confirm(ctx context.Context, h Hold) (bool, error) {
	home, from := s.keys(h)
	if h.From == h.Home {
		removed, err := s.close(ctx, home.Holds, home, h.User, true)
		if err != nil {
			return false, fmt.Errorf("confirm hold of user %d on voucher %d: %w", h.User, h.Voucher, err)
		}
		return removed, nil
	}
	// The unit came from another bucket: its hold there, and the claim at
	// home, in two slots, so two scripts. Each on its own (package
	// autopipe may still send them together): in a pipeline, a script the
	// server does not know yet fails NOSCRIPT with no EVAL to fall back on.
	removed, err := s.close(ctx, from.Holds, from, h.User, false)
	if err == nil {
		_, err = s.close(ctx, home.Claims, home, h.User, true)
	}
	if err != nil {
		return false, fmt.Errorf("confirm hold of user %d on voucher %d: %w", h.User, h.Voucher, err)
	}
	return removed, nil
}

var (
	//go:embed confirm.lua
	closeSrc    string
	closeScript = redis.NewScript(closeSrc)
)

// close runs confirm.lua: it closes user's entry in entries (holds or
// claims, of k's bucket) and, if remember, adds the user to k's buyers
// and ends their admission to a waiting room.
func (s *Store) close(ctx context.Context, entries string, k Keys, userID int64, remember bool) (bool, error) {
	n, err := closeScript.Run(ctx, s.rdb, []string{entries, k.Buyers, k.Admitted}, userID, flag(remember)).Int()
	return n == 1, err
}

var (
	//go:embed confirmall.lua
	closeAllSrc    string
	closeAllScript = redis.NewScript(closeAllSrc)
)

// ConfirmAll is Confirm for the holds of orders committed together (a
// group commit's batch): it closes each as Confirm would, in one script
// call per shard whose slot holds their entries, instead of one or two
// calls a hold. On a Redis Cluster a script may touch keys of one slot
// only, and every key of a shard, whatever the voucher or bucket, is in
// its slot (shard.go), so each call stays in one slot; the calls for
// different shards go out together (on a cluster, to their masters at
// once). It returns how many entries (holds and claims) were still open.
//
// Each call runs whole or not at all, as Confirm's does; a call that
// fails (Redis down, the reply lost) leaves its entries open, and the
// Sweeper closes them once they expire, having seen the orders' rows: as
// after a Confirm that failed. The error, an *UnconfirmedError, joins
// every failed call's and says how many of hs they leave open.
func (s *Store) ConfirmAll(ctx context.Context, hs []Hold) (int, error) {
	calls := closeCalls(hs)
	if len(calls) == 1 {
		closed, err := calls[0].run(ctx, s.rdb)
		if err != nil {
			return 0, &UnconfirmedError{Holds: len(hs), err: err}
		}
		return closed, nil
	}
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		closed int
		errs   []error
		failed = map[int]bool{} // shards whose call failed
	)
	for _, c := range calls {
		wg.Go(func() {
			n, err := 0, error(nil)
			func() {
				// A panic of the Redis client's code becomes this call's
				// error: on a goroutine of its own, it would end the
				// process.
				defer func() {
					if r := recover(); r != nil {
						err = fmt.Errorf("confirm holds: panic: %v", r)
					}
				}()
				n, err = c.run(ctx, s.rdb)
			}()
			mu.Lock()
			closed += n
			if err != nil {
				errs = append(errs, err)
				failed[c.shard] = true
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	if len(errs) == 0 {
		return closed, nil
	}
	// A hold is left open if any of its entries was in a failed call:
	// the hold where its unit was taken, or its claim at home.
	left := 0
	for _, h := range hs {
		if failed[BucketShard(h.Voucher, h.Buckets, h.From)] || failed[BucketShard(h.Voucher, h.Buckets, h.Home)] {
			left++
		}
	}
	return closed, &UnconfirmedError{Holds: left, err: errors.Join(errs...)}
}

// An UnconfirmedError is ConfirmAll's error when a call failed: Holds of
// the holds it was given may still be open, each with an entry in a
// failed call (one whose reply alone was lost may have closed them after
// all). The Sweeper closes those that are.
type UnconfirmedError struct {
	Holds int
	err   error
}

func (e *UnconfirmedError) Error() string { return e.err.Error() }
func (e *UnconfirmedError) Unwrap() error { return e.err }

// A closeGroup is the users whose entries ConfirmAll closes in one set of
// a bucket's keys, alike: a bucket's holds or its claims, its buyers
// remembered or not.
type closeGroup struct {
	voucher          int64
	buckets, bucket  int
	claims, remember bool
	users            []int64
}

// A closeCall is one run of confirmall.lua: the groups of one shard.
type closeCall struct {
	shard  int
	groups []*closeGroup
}

// closeCalls sorts the entries of hs into groups and the groups into
// calls, one per shard, in the order first met.
func closeCalls(hs []Hold) []*closeCall {
	var calls []*closeCall
	add := func(h Hold, bucket int, claims, remember bool) {
		shard := BucketShard(h.Voucher, h.Buckets, bucket)
		var c *closeCall
		for _, x := range calls {
			if x.shard == shard {
				c = x
				break
			}
		}
		if c == nil {
			c = &closeCall{shard: shard}
			calls = append(calls, c)
		}
		for _, g := range c.groups {
			if g.voucher == h.Voucher && g.buckets == h.Buckets && g.bucket == bucket && g.claims == claims && g.remember == remember {
				g.users = append(g.users, h.User)
				return
			}
		}
		c.groups = append(c.groups, &closeGroup{voucher: h.Voucher, buckets: h.Buckets, bucket: bucket, claims: claims, remember: remember, users: []int64{h.User}})
	}
	for _, h := range hs {
		// As Confirm: the unit's hold where it was taken, and, for a
		// unit of another bucket, the claim at home; the buyer remembered
		// at home.
		add(h, h.From, false, h.From == h.Home)
		if h.From != h.Home {
			add(h, h.Home, true, true)
		}
	}
	return calls
}

// run runs confirmall.lua for c's groups.
func (c *closeCall) run(ctx context.Context, rdb redis.Scripter) (int, error) {
	keys := make([]string, 0, 3*len(c.groups))
	n := 0
	for _, g := range c.groups {
		n += 2 + len(g.users)
	}
	args := make([]any, 0, n)
	for _, g := range c.groups {
		k := BucketKeys(g.voucher, g.buckets, g.bucket)
		entries := k.Holds
		if g.claims {
			entries = k.Claims
		}
		keys = append(keys, entries, k.Buyers, k.Admitted)
		args = append(args, flag(g.remember), len(g.users))
		for _, u := range g.users {
			args = append(args, u)
		}
	}
	closed, err := closeAllScript.Run(ctx, rdb, keys, args...).Int()
	if err != nil {
		return 0, fmt.Errorf("confirm %d holds and claims in shard %d: %w", n-2*len(c.groups), c.shard, err)
	}
	return closed, nil
}

func (s *Store) keys(h Hold) (home, from Keys) {
	return BucketKeys(h.Voucher, h.Buckets, h.Home), BucketKeys(h.Voucher, h.Buckets, h.From)
}

// GiveBack returns the unit h took, after the request failed. forget says
// whether to forget the user as a buyer: not when the failure was that the
// user already holds an order. It reports whether a unit went back (false:
// the hold was already gone).
func (s *Store) GiveBack(ctx context.Context, h Hold, forget bool) (bool, error) {
	if h.From == h.Home {
		k := BucketKeys(h.Voucher, h.Buckets, h.Home)
		return s.giveBack(ctx, k, k.Holds, h.User, forget, false, true)
	}
	back, err := s.giveBackUnit(ctx, h, false)
	home := BucketKeys(h.Voucher, h.Buckets, h.Home)
	if _, cerr := s.giveBack(ctx, home, home.Claims, h.User, forget, false, false); cerr != nil {
		err = errors.Join(err, cerr)
	}
	return back, err
}

// giveBackUnit returns the unit of a hold in a bucket other than the
// user's home, leaving the claim at home alone.
func (s *Store) giveBackUnit(ctx context.Context, h Hold, onlyExpired bool) (bool, error) {
	k := BucketKeys(h.Voucher, h.Buckets, h.From)
	return s.giveBack(ctx, k, k.Holds, h.User, false, onlyExpired, true)
}

var (
	//go:embed giveback.lua
	givebackSrc    string
	givebackScript = redis.NewScript(givebackSrc)
)

// giveBack runs giveback.lua on entries (k's holds or claims).
func (s *Store) giveBack(ctx context.Context, k Keys, entries string, userID int64, forget, onlyExpired, unit bool) (bool, error) {
	n, err := givebackScript.Run(ctx, s.rdb, []string{k.Stock, k.Buyers, entries}, userID, flag(forget), flag(onlyExpired), flag(unit)).Int()
	if err != nil {
		return false, fmt.Errorf("give back on %s: %w", entries, err)
	}
	return n == 1, nil
}

func flag(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

// A Lapse is an expired hold or claim: a request that took a unit (or
// claimed a buyer) and neither confirmed nor gave it back in time.
type Lapse struct {
	User   int64
	Bucket int
	Claim  bool // a claim in the user's home bucket, not a unit's hold
}

var (
	//go:embed expired.lua
	expiredSrc    string
	expiredScript = redis.NewScript(expiredSrc)
)

// Expired lists up to limit expired holds and claims of each of
// voucherID's n buckets.
func (s *Store) Expired(ctx context.Context, voucherID int64, n, limit int) ([]Lapse, error) {
	var out []Lapse
	for b := range max(n, 1) {
		k := BucketKeys(voucherID, n, b)
		lists, err := expiredScript.Run(ctx, s.rdb, []string{k.Holds, k.Claims}, limit).Slice()
		if err != nil {
			return nil, fmt.Errorf("list expired holds of voucher %d: %w", voucherID, err)
		}
		for i, list := range lists {
			members, _ := list.([]any)
			for _, m := range members {
				str, _ := m.(string)
				id, err := strconv.ParseInt(str, 10, 64)
				if err != nil {
					return nil, fmt.Errorf("stock: malformed user ID %q in %s", str, k.Holds)
				}
				out = append(out, Lapse{User: id, Bucket: b, Claim: i == 1})
			}
		}
	}
	return out, nil
}

// Settle closes an expired hold or claim of voucherID (of n buckets) once
// the caller asked MySQL (and, in async mode, the queue) whether the
// user's order exists: order is its ID, 0 for none. An order: the process
// died after COMMIT (or after queueing it); the entry is closed and the
// user stays a buyer, unless, for a claim, the order was dead-lettered
// since the caller looked (DropBuyer's mark, keepclaim.lua). No order:
// the unit goes back on sale (for a hold) and the user is forgotten as a
// buyer (in their home bucket), but only if the entry is still expired by
// Redis' clock: a unit goes back at most once, however many sweep. It
// reports whether a unit went back.
func (s *Store) Settle(ctx context.Context, voucherID int64, n int, l Lapse, order int64) (bool, error) {
	k := BucketKeys(voucherID, n, l.Bucket)
	home := l.Bucket == Home(l.User, n)
	entries := k.Holds
	if l.Claim {
		entries = k.Claims
	}
	if order == 0 {
		back, err := s.giveBack(ctx, k, entries, l.User, home, true, !l.Claim)
		return back && !l.Claim, err
	}
	var err error
	if l.Claim {
		// Any claim of the user's: "" stands for its deadline.
		err = keepClaimScript.Run(ctx, s.rdb, []string{k.Claims, k.Buyers, k.Dropped}, l.User, "", order).Err()
	} else {
		_, err = s.close(ctx, entries, k, l.User, home)
	}
	if err != nil {
		return false, fmt.Errorf("close hold of user %d on voucher %d: %w", l.User, voucherID, err)
	}
	return false, nil
}

// Drop closes h without giving its unit back, and forgets the user as a
// buyer: for when MySQL said sold out although Redis had counted a unit,
// so Redis' count was too high.
func (s *Store) Drop(ctx context.Context, h Hold) error {
	home, from := s.keys(h)
	pipe := s.rdb.Pipeline()
	if h.From == h.Home {
		pipe = s.rdb.TxPipeline()
	}
	pipe.ZRem(ctx, from.Holds, h.User)
	if h.From != h.Home {
		pipe.ZRem(ctx, home.Claims, h.User)
	}
	pipe.SRem(ctx, home.Buyers, h.User)
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("drop hold of user %d on voucher %d: %w", h.User, h.Voucher, err)
	}
	return nil
}
