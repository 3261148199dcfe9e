// Package stock keeps each voucher's sellable stock in Redis, where a
// flash sale's thousands of requests a second can be answered without
// touching MySQL.
//
// Per voucher it keeps these keys, all with the hash tag of the voucher's
// shard (shard.go) so that they live in one Redis Cluster slot and one Lua
// script may touch them all, with the other keys of that shard (async
// mode's stream of orders):
//
//	seckill:{s7.43}:v7:stock   units left
//	seckill:{s7.43}:v7:buyers  users who took a unit (one order per user)
//	seckill:{s7.43}:v7:holds   user -> deadline: units taken whose order
//	                           row is not written yet
//	seckill:{s7.43}:v7:claims  user -> deadline: buyers whose unit came
//	                           from another bucket (empty unless split)
//
// A hot voucher may be split into buckets, each a set of these keys in a
// slot of its own (buckets.go).
//
// A request takes a unit with Take. Once its order row is committed it calls
// Confirm; if anything fails it calls GiveBack. A hold is what makes the
// unit recoverable when the process dies in between (SIGKILL, OOM, power):
// the Sweeper in package order finds expired holds with Expired and returns
// their units with Settle, unless the order row exists after all.
//
// MySQL stays the truth. Redis may lose keys (a flush, a restart without
// persistence): Take then reports Missing and the caller reloads the voucher
// from MySQL with Load.
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

// Result is what Take decided.
type Result int

// Take's results; the values are the script's return codes.
const (
	Taken         Result = 0
	SoldOut       Result = 1 // nothing left, and nothing can come back
	AlreadyBought Result = 2 // the user's order is settled
	Missing       Result = 3
	// SoldOutForNow: nothing left, but requests still hold units that
	// come back if they fail.
	SoldOutForNow Result = 4
	// AlreadyBuying: a request of the user holds a unit; if it fails,
	// the user may buy again.
	AlreadyBuying Result = 5
)

var (
	//go:embed take.lua
	takeSrc    string
	takeScript = redis.NewScript(takeSrc)

	//go:embed giveback.lua
	givebackSrc    string
	givebackScript = redis.NewScript(givebackSrc)

	//go:embed expired.lua
	expiredSrc    string
	expiredScript = redis.NewScript(expiredSrc)

	//go:embed reconcile.lua
	reconcileSrc    string
	reconcileScript = redis.NewScript(reconcileSrc)

	//go:embed unit.lua
	unitSrc    string
	unitScript = redis.NewScript(unitSrc)

	//go:embed claim.lua
	claimSrc    string
	claimScript = redis.NewScript(claimSrc)

	//go:embed confirm.lua
	closeSrc    string
	closeScript = redis.NewScript(closeSrc)
)

// Keys names one voucher's keys (or one bucket's: see buckets.go).
type Keys struct {
	Stock, Buyers, Holds string
	// Claims: user -> deadline, buyers of a bucketed voucher whose unit
	// came from another bucket than their home. Always empty with one
	// bucket.
	Claims string
}

// KeysOf builds the keys of voucher id, of a voucher in one bucket. This
// and BucketKeys are the only places that spell them.
func KeysOf(id int64) Keys {
	return Keys{Stock: KeyOf(id, "stock"), Buyers: KeyOf(id, "buyers"), Holds: KeyOf(id, "holds"), Claims: KeyOf(id, "claims")}
}

// KeyOf names another key of voucher id, in the same Redis Cluster slot as
// its stock keys (its shard's), so that one script may touch them all.
func KeyOf(id int64, name string) string {
	return ShardKey(ShardOf(id), "v"+strconv.FormatInt(id, 10)+":"+name)
}

func (k Keys) all() []string { return []string{k.Stock, k.Buyers, k.Holds, k.Claims} }

// indexKey lists the vouchers that have stock keys, for the sweeper.
const indexKey = "seckill:vouchers"

// Store reads and changes stock in Redis. It is safe for concurrent use.
//
// Every method takes the voucher's bucket count n (1 for a voucher not
// split: see buckets.go); all instances must agree on it, so it is part of
// the voucher's row in MySQL.
type Store struct {
	rdb  redis.UniversalClient
	hold time.Duration
}

// NewStore returns a Store whose holds last hold: longer than any request
// can take between Take and Confirm (the order service bounds that), short
// enough that a dead process's units come back soon.
func NewStore(rdb redis.UniversalClient, hold time.Duration) *Store {
	return &Store{rdb: rdb, hold: hold}
}

// A Hold is a unit Take took for a user: which bucket it came from, and
// the user's home bucket, where they are remembered as a buyer. With one
// bucket both are 0.
type Hold struct {
	Voucher, User int64
	Buckets       int // the voucher's
	Home, From    int
}

// Take takes one unit of voucherID (of n buckets) for user if there is
// stock and user has not taken one, and records a hold: in one round trip,
// or, when the user's home bucket is empty, one more to look at every other
// bucket at once, one per bucket with stock asked for a unit, and one to
// claim the user at home.
func (s *Store) Take(ctx context.Context, voucherID int64, n int, userID int64) (Hold, Result, error) {
	n = max(n, 1)
	h := Hold{Voucher: voucherID, User: userID, Buckets: n, Home: Home(userID, n)}
	h.From = h.Home
	res, err := s.run(ctx, takeScript, BucketKeys(voucherID, n, h.Home).all(), userID, s.hold.Milliseconds())
	if n == 1 || err != nil || (res != SoldOut && res != SoldOutForNow) {
		return h, res, err
	}
	// Home is empty. Look at the others in one pipeline (on a cluster, one
	// round trip to each master, all at once), rather than asking bucket
	// after bucket: near the end of a sale every request of a user whose
	// home is empty passes here, and N scripts in a row would put the
	// whole flood on every master.
	others, err := s.othersState(ctx, voucherID, h)
	if err != nil {
		return h, 0, err
	}
	forNow := res == SoldOutForNow
	for _, o := range others {
		switch {
		case o.stock < 0:
			return h, Missing, nil
		case o.held > 0:
			forNow = true
		}
	}
	for _, o := range others {
		if o.stock <= 0 {
			continue
		}
		k := BucketKeys(voucherID, n, o.bucket)
		res, err := s.run(ctx, unitScript, []string{k.Stock, k.Holds}, userID, s.hold.Milliseconds())
		switch {
		case err != nil:
			return h, 0, err
		case res == Taken:
			h.From = o.bucket
			return s.claim(ctx, h)
		case res == SoldOutForNow:
			forNow = true // sold since the look, with its holds still open
		case res != SoldOut:
			return h, res, nil // Missing, AlreadyBuying
		}
	}
	if forNow {
		return h, SoldOutForNow, nil
	}
	return h, SoldOut, nil
}

// other is what Take saw of a bucket other than the user's home.
type other struct {
	bucket      int
	stock, held int64 // stock -1: the key is missing
}

// othersState reads the stock and the open holds of every bucket but h's
// home, in the order Take asks them: from the one after home onwards.
func (s *Store) othersState(ctx context.Context, voucherID int64, h Hold) ([]other, error) {
	pipe := s.rdb.Pipeline()
	gets := make([]*redis.StringCmd, 0, h.Buckets-1)
	cards := make([]*redis.IntCmd, 0, h.Buckets-1)
	for i := 1; i < h.Buckets; i++ {
		k := BucketKeys(voucherID, h.Buckets, (h.Home+i)%h.Buckets)
		gets = append(gets, pipe.Get(ctx, k.Stock))
		cards = append(cards, pipe.ZCard(ctx, k.Holds))
	}
	pipe.Exec(ctx) // every command's error is read below: a missing key's redis.Nil must not hide a failed bucket
	out := make([]other, len(gets))
	for i, get := range gets {
		out[i].bucket = (h.Home + i + 1) % h.Buckets
		v, err := get.Int64()
		switch {
		case errors.Is(err, redis.Nil):
			v = -1
		case err != nil:
			return nil, fmt.Errorf("read stock of voucher %d: %w", voucherID, err)
		}
		if err := cards[i].Err(); err != nil {
			return nil, fmt.Errorf("read holds of voucher %d: %w", voucherID, err)
		}
		out[i].stock, out[i].held = v, cards[i].Val()
	}
	return out, nil
}

// claim remembers h's user as a buyer in their home bucket, for the unit
// h took in another; if that fails, the unit goes back.
func (s *Store) claim(ctx context.Context, h Hold) (Hold, Result, error) {
	res, err := s.run(ctx, claimScript, BucketKeys(h.Voucher, h.Buckets, h.Home).all(), h.User, s.hold.Milliseconds())
	if err == nil && res == Taken {
		return h, Taken, nil
	}
	// Already bought or buying, the home keys lost, or Redis failed (the
	// claim may have been made: then it expires, and the sweeper forgets
	// the buyer, there being no order).
	if _, gerr := s.giveBackUnit(ctx, h, false); gerr != nil {
		err = errors.Join(err, gerr)
	}
	return h, res, err
}

func (s *Store) run(ctx context.Context, script *redis.Script, keys []string, args ...any) (Result, error) {
	code, err := script.Run(ctx, s.rdb, keys, args...).Int()
	if err != nil {
		return 0, fmt.Errorf("stock script on %s: %w", keys[0], err)
	}
	return Result(code), nil
}

// Confirm closes h once its order row is committed, and makes sure the
// user is remembered as a buyer (a reload from MySQL may have happened
// while the order was being written). It reports whether the hold was
// still open.
func (s *Store) Confirm(ctx context.Context, h Hold) (bool, error) {
	home, from := s.keys(h)
	if h.From == h.Home {
		removed, err := s.close(ctx, home.Holds, home.Buyers, h.User, true)
		if err != nil {
			return false, fmt.Errorf("confirm hold of user %d on voucher %d: %w", h.User, h.Voucher, err)
		}
		return removed, nil
	}
	// The unit came from another bucket: its hold there, and the claim at
	// home, in two slots, so two scripts. Each on its own (package
	// autopipe may still send them together): in a pipeline, a script the
	// server does not know yet fails NOSCRIPT with no EVAL to fall back on.
	removed, err := s.close(ctx, from.Holds, from.Buyers, h.User, false)
	if err == nil {
		_, err = s.close(ctx, home.Claims, home.Buyers, h.User, true)
	}
	if err != nil {
		return false, fmt.Errorf("confirm hold of user %d on voucher %d: %w", h.User, h.Voucher, err)
	}
	return removed, nil
}

// close runs confirm.lua: it closes user's entry in entries (holds or
// claims) and, if remember, adds the user to buyers.
func (s *Store) close(ctx context.Context, entries, buyers string, userID int64, remember bool) (bool, error) {
	n, err := closeScript.Run(ctx, s.rdb, []string{entries, buyers}, userID, flag(remember)).Int()
	return n == 1, err
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
// the caller asked MySQL whether the user's order exists. ordered: the
// process died after COMMIT; the entry is closed and the user stays a
// buyer. Not ordered: the unit goes back on sale (for a hold) and the user
// is forgotten as a buyer (in their home bucket), but only if the entry
// is still expired by Redis' clock: a unit goes back at most once, however
// many sweep. It reports whether a unit went back.
func (s *Store) Settle(ctx context.Context, voucherID int64, n int, l Lapse, ordered bool) (bool, error) {
	k := BucketKeys(voucherID, n, l.Bucket)
	home := l.Bucket == Home(l.User, n)
	entries := k.Holds
	if l.Claim {
		entries = k.Claims
	}
	if !ordered {
		back, err := s.giveBack(ctx, k, entries, l.User, home, true, !l.Claim)
		return back && !l.Claim, err
	}
	if _, err := s.close(ctx, entries, k.Buyers, l.User, home); err != nil {
		return false, fmt.Errorf("close hold of user %d on voucher %d: %w", l.User, voucherID, err)
	}
	return false, nil
}

// Init sets a new voucher's stock, split evenly over its n buckets, and
// lists it for the sweeper.
func (s *Store) Init(ctx context.Context, voucherID, stock int64, n int) error {
	n = max(n, 1)
	// A plain pipeline, not MULTI: the index and the buckets live in other
	// cluster slots.
	pipe := s.rdb.Pipeline()
	for b := range n {
		k := BucketKeys(voucherID, n, b)
		pipe.Del(ctx, k.Buyers, k.Holds, k.Claims)
		pipe.Set(ctx, k.Stock, share(stock, n, b), 0)
	}
	pipe.SAdd(ctx, indexKey, voucherID)
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("init stock of voucher %d: %w", voucherID, err)
	}
	return nil
}

// share is bucket b's share of units split over n buckets: the remainder
// goes one each to the first buckets.
func share(units int64, n, b int) int64 {
	s := units / int64(n)
	if int64(b) < units%int64(n) {
		s++
	}
	return s
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
// (left: units left in MySQL; buyers: users with an order), unless another
// instance already did. Buyers go in first and the stock last: until the
// stock key exists every Take answers Missing, so no request is judged
// against a half-loaded set. A bucketed voucher may lose some buckets and
// keep others (one master of a cluster lost its data): the lost ones share
// what MySQL has left beyond the units the others hold or are selling,
// and reconciliation corrects what that misjudges. It reports whether it
// loaded.
func (s *Store) Load(ctx context.Context, voucherID int64, n int, left int64, buyers []int64) (bool, error) {
	n = max(n, 1)
	stocks, held, _, err := s.bucketState(ctx, voucherID, n)
	if err != nil {
		return false, wrapLoad(voucherID, err)
	}
	var lost []int
	for b, v := range stocks {
		if v < 0 {
			lost = append(lost, b)
		} else {
			left -= v
		}
	}
	if len(lost) == 0 {
		return false, nil
	}
	// Units under holds will be orders in MySQL or come back to their
	// bucket: not the lost buckets' to sell.
	left = max(left-held, 0)
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
		keys = append(keys, BucketKeys(voucherID, n, b).all()...)
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
