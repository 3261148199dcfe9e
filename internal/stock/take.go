package stock

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// This file takes a unit for a user (Take): from their home bucket, or,
// when home is empty, from another bucket, then claims the user at home
// (claim). Async mode, whose unit and order are taken and queued by a
// script of package order/queue, claims first and takes after: Elsewhere,
// Claim, KeepClaim and Unclaim are its part here. It uses holds.go (a
// failed claim gives its unit back with giveBackUnit), buckets.go, keys.go
// and stock.go. No other file uses it.

var (
	//go:embed take.lua
	takeSrc    string
	takeScript = redis.NewScript(takeSrc)

	//go:embed unit.lua
	unitSrc    string
	unitScript = redis.NewScript(unitSrc)
)

// Take takes one unit of voucherID (of n buckets) for user if there is
// stock and user has not taken one, and records a hold: in one round trip,
// or, when the user's home bucket is empty, one more to look at every other
// bucket at once, one per bucket with stock asked for a unit, and one to
// claim the user at home.
func (s *Store) Take(ctx context.Context, voucherID int64, n int, userID int64) (Hold, Result, error) {
	return s.take(ctx, voucherID, n, userID, false)
}

// TakeAdmitted is Take for a voucher with a waiting room (package room),
// which is never split: the unit goes only to a user whose admission has
// not ended (else NotAdmitted), checked in the same script that takes it.
func (s *Store) TakeAdmitted(ctx context.Context, voucherID int64, userID int64) (Hold, Result, error) {
	return s.take(ctx, voucherID, 1, userID, true)
}

func (s *Store) take(ctx context.Context, voucherID int64, n int, userID int64, room bool) (Hold, Result, error) {
	n = max(n, 1)
	h := Hold{Voucher: voucherID, User: userID, Buckets: n, Home: Home(userID, n)}
	h.From = h.Home
	k := BucketKeys(voucherID, n, h.Home)
	res, err := s.run(ctx, takeScript, append(k.all(), k.Admitted), userID, s.hold.Milliseconds(), flag(room))
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

var (
	//go:embed claim.lua
	claimSrc    string
	claimScript = redis.NewScript(claimSrc)
)

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

// Elsewhere lists the buckets of voucherID (of n > 1) other than user's
// home that have units left, in the order Take asks them, for async mode
// once the home bucket said sold out. missing: a bucket's stock key is
// gone (Redis lost it), and the voucher must be reloaded first.
func (s *Store) Elsewhere(ctx context.Context, voucherID int64, n int, userID int64) (buckets []int, missing bool, err error) {
	others, err := s.othersState(ctx, voucherID, Hold{Voucher: voucherID, User: userID, Buckets: n, Home: Home(userID, n)})
	if err != nil {
		return nil, false, err
	}
	for _, o := range others {
		switch {
		case o.stock < 0:
			return nil, true, nil
		case o.stock > 0:
			buckets = append(buckets, o.bucket)
		}
	}
	return buckets, false, nil
}

// A Claimed is a claim Claim made: its Deadline (Redis' clock, ms), which
// also names it, and Until, the last moment at which a unit may be taken
// for it.
type Claimed struct{ Deadline, Until int64 }

// Claim remembers user as a buyer in their home bucket of voucherID (of n
// buckets), for a unit async mode is about to take in another bucket: the
// claim is what makes one order per user hold across buckets, as in Take.
// It answers Taken, AlreadyBought, AlreadyBuying or Missing, and, when
// Taken, the claim. Until is half a hold before the claim expires: past
// its expiry the sweeper may forget the buyer (no order having been
// found), and a unit taken after that would be a second order's for all
// the home bucket knows. The half is room for the masters' clocks to
// disagree.
func (s *Store) Claim(ctx context.Context, voucherID int64, n int, userID int64) (Claimed, Result, error) {
	v, err := claimScript.Run(ctx, s.rdb, BucketKeys(voucherID, n, Home(userID, n)).all(), userID, s.hold.Milliseconds(), "deadline").Int64()
	if err != nil {
		return Claimed{}, 0, fmt.Errorf("claim user %d on voucher %d: %w", userID, voucherID, err)
	}
	if v < 10 { // a code: a deadline in ms is a large number
		return Claimed{}, Result(v), nil
	}
	return Claimed{Deadline: v, Until: v - s.hold.Milliseconds()/2}, Taken, nil
}

var (
	//go:embed keepclaim.lua
	keepClaimSrc    string
	keepClaimScript = redis.NewScript(keepClaimSrc)

	//go:embed dropbuyer.lua
	dropBuyerSrc    string
	dropBuyerScript = redis.NewScript(dropBuyerSrc)
)

// KeepClaim closes claim c of user once their order orderID is queued:
// they stay a buyer, as after Confirm, and are remembered again should a
// reload or a failover have lost them. Unless a consumer dead-lettered the
// order in the moment between (DropBuyer left a mark): then the buyer is
// forgotten, or they would hold no order and be told "already bought" for
// good. A newer request's claim of the same user is left alone
// (keepclaim.lua).
func (s *Store) KeepClaim(ctx context.Context, voucherID int64, n int, userID int64, c Claimed, orderID int64) error {
	home := BucketKeys(voucherID, n, Home(userID, n))
	if err := keepClaimScript.Run(ctx, s.rdb, []string{home.Claims, home.Buyers, home.Dropped}, userID, c.Deadline, orderID).Err(); err != nil {
		return fmt.Errorf("keep claim of user %d on voucher %d: %w", userID, voucherID, err)
	}
	return nil
}

// Unclaim drops claim c of user when no unit was taken for it, and
// forgets them as a buyer, if that claim is still there (one the sweeper
// closed meanwhile, or a newer request's, is left alone).
func (s *Store) Unclaim(ctx context.Context, voucherID int64, n int, userID int64, c Claimed) error {
	home := BucketKeys(voucherID, n, Home(userID, n))
	err := givebackScript.Run(ctx, s.rdb, []string{home.Stock, home.Buyers, home.Claims}, userID, "1", "0", "0", c.Deadline).Err()
	if err != nil {
		return fmt.Errorf("unclaim user %d on voucher %d: %w", userID, voucherID, err)
	}
	return nil
}

// Undrop removes DropBuyer's mark of user's order orderID, before a
// replay queues that order again under its ID: its KeepClaim must
// remember the buyer.
func (s *Store) Undrop(ctx context.Context, voucherID int64, n int, userID, orderID int64) error {
	home := BucketKeys(voucherID, n, Home(userID, n))
	if err := undropScript.Run(ctx, s.rdb, []string{home.Dropped}, userID, orderID).Err(); err != nil {
		return fmt.Errorf("clear the dead letter mark of user %d on voucher %d: %w", userID, voucherID, err)
	}
	return nil
}

// undropScript deletes a hash field if it holds the value given.
var undropScript = redis.NewScript(`
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then
  return redis.call('HDEL', KEYS[1], ARGV[1])
end
return 0`)

// DropBuyer forgets user as a buyer in their home bucket of voucherID (of
// n buckets) once their order orderID, whose unit came from another
// bucket and which waits in its stream as entry, is to be dead-lettered;
// if the request that queued it has not yet closed its claim, it leaves a
// mark that makes KeepClaim forget them instead. It also keeps note, for
// the entry: once its buyer is forgotten (they may buy again), the entry
// must never be written, and a consumer that finds it still pending (the
// dead letter's next step failed) finishes its dead letter with the note
// (DropNotes) instead. Made twice for one entry, it changes nothing the
// second time. A package function, not a method: the queue's consumers,
// which call it, hold a client and no Store.
func DropBuyer(ctx context.Context, rdb redis.UniversalClient, voucherID int64, n int, userID, orderID int64, entry, note string) error {
	home := BucketKeys(voucherID, n, Home(userID, n))
	if err := dropBuyerScript.Run(ctx, rdb, []string{home.Claims, home.Buyers, home.Dropped}, userID, orderID, dropField(orderID, entry), note).Err(); err != nil {
		return fmt.Errorf("forget buyer %d of voucher %d: %w", userID, voucherID, err)
	}
	return nil
}

// A DropOf names a stream entry of an order whose buyer DropBuyer may have
// forgotten: its voucher (of Buckets), its user and order, and its ID in
// its stream.
type DropOf struct {
	Voucher     int64
	Buckets     int
	User, Order int64
	Entry       string
}

// A DropNote is what DropNotes found of a stream entry in its buyer's
// home bucket. Begun: DropBuyer forgot the buyer for the entry's order,
// so the entry must never be written. Note: what the dead letter decided,
// as DropBuyer was given it; "" when begun by a level-7 instance (up to
// 94b3afe), whose DropBuyer kept only the mark user -> order ID.
type DropNote struct {
	Begun bool
	Note  string
}

// DropNotes returns, for each of drops, whether DropBuyer ran for it, and
// the note it kept: one round trip (a pipeline; the entries' homes may
// lie in several slots).
//
// An entry without a note counts as begun when its user's mark names its
// order: a level-7 DropBuyer, in a rolling upgrade, leaves that mark
// alone, and the mark means what the note does, for the order instead of
// the entry. Only DropBuyer sets it, as it forgets the buyer for that
// order; only Undrop clears it, before a replay queues the order again
// (the sweeper and KeepClaim read it, never write it; Init deletes the
// hash of a voucher made anew, Forget lets it expire with the sale's
// keys). So while the mark names the order, no entry of that order may be
// written: the buyer may have bought again. A newer dead letter of the
// same user's overwrites the mark; then an entry begun by level 7 and
// never finished is not known as begun (see docs/upgrading.md).
func DropNotes(ctx context.Context, rdb redis.UniversalClient, drops []DropOf) ([]DropNote, error) {
	pipe := rdb.Pipeline()
	notes := make([]*redis.StringCmd, len(drops))
	marks := make([]*redis.StringCmd, len(drops))
	for i, d := range drops {
		home := BucketKeys(d.Voucher, d.Buckets, Home(d.User, d.Buckets))
		notes[i] = pipe.HGet(ctx, home.Dropped, dropField(d.Order, d.Entry))
		marks[i] = pipe.HGet(ctx, home.Dropped, strconv.FormatInt(d.User, 10))
	}
	pipe.Exec(ctx) // every command's error is read below: a missing field's redis.Nil must not hide a failed one
	out := make([]DropNote, len(drops))
	for i, d := range drops {
		note, err := notes[i].Result()
		if err == nil {
			out[i] = DropNote{Begun: true, Note: note}
			continue
		}
		if !errors.Is(err, redis.Nil) {
			return nil, fmt.Errorf("read dead letter marks of voucher %d: %w", d.Voucher, err)
		}
		switch mark, err := marks[i].Result(); {
		case errors.Is(err, redis.Nil):
		case err != nil:
			return nil, fmt.Errorf("read dead letter marks of voucher %d: %w", d.Voucher, err)
		default:
			out[i].Begun = mark == strconv.FormatInt(d.Order, 10)
		}
	}
	return out, nil
}

// dropField names the mark DropBuyer keeps of a stream entry in its
// buyer's home bucket's Dropped hash: "order@entry". A user's own mark
// there is a bare user ID, so the two never meet.
func dropField(orderID int64, entry string) string {
	return strconv.FormatInt(orderID, 10) + "@" + entry
}
